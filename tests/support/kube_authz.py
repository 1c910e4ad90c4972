"""RBAC for the emulator: a caller (by bearer token) limited to the rules it was bound.

A real API server refuses a call no rule of the caller's allows (403 ``Forbidden``, the
message naming user, verb, resource, group and namespace), and answers a
``SelfSubjectAccessReview`` from the same rules. Tests of a command run by someone with
less than cluster-admin need both: the refusal, to show what a call half-way does, and
the review, which a client asks before it changes anything. A token with no rules on
record is unrestricted (the tests' own admin client).

The rules are read as RBAC reads them: a ClusterRole bound by a ClusterRoleBinding
reaches every namespace and the cluster scope; a Role, or a ClusterRole bound by a
RoleBinding, only its namespace; ``resourceNames`` narrows by object name (never a list
or a create, which name no object). ``granted_to`` reads a set of manifests' bindings
for one ServiceAccount, as the API server resolves them.

``owner_reference_checks`` is what the OwnerReferencesPermissionEnforcement admission
plugin (on in OpenShift and other hardened clusters) asks the authorizer before a write:
``delete`` on the object to change its ownerReferences at all (not on create), and
``update`` on the owner's ``finalizers`` subresource for each new ``blockOwnerDeletion``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kmock import KubernetesError, Request, method

VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True)
class Rule:
    """One RBAC rule as bound: ``namespace`` None for a ClusterRoleBinding's."""

    namespace: str | None
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str] | None = None


@dataclass(frozen=True)
class Attributes:
    """What a call does, as the authorizer sees it (a SelfSubjectAccessReview's
    ``resourceAttributes``); ``namespace`` None for the cluster scope."""

    namespace: str | None
    group: str
    resource: str
    verb: str
    name: str | None = None


def bound(role: Mapping[str, Any], namespace: str | None = None) -> list[Rule]:
    """The rules of ``role`` (a ClusterRole or Role manifest) as a binding grants them:
    ``namespace`` None for a ClusterRoleBinding, else a RoleBinding's namespace."""
    if role["kind"] == "Role":
        namespace = role["metadata"]["namespace"]
    return [Rule(namespace, frozenset(r["apiGroups"]), frozenset(r["resources"]),
                 frozenset(r["verbs"]),
                 frozenset(r["resourceNames"]) if "resourceNames" in r else None)
            for r in role["rules"]]


def granted_to(manifests: Iterable[Mapping[str, Any]], namespace: str,
               account: str) -> list[Rule]:
    """The rules ``manifests``' ClusterRoleBindings and RoleBindings grant the
    ServiceAccount ``namespace/account``. A binding whose role is not among the manifests
    grants nothing (the API server cannot resolve it either)."""
    docs = [d for d in manifests if d]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("ClusterRole", "Role")}
    out: list[Rule] = []
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or not any(
                s.get("kind") == "ServiceAccount" and s.get("name") == account
                and s.get("namespace") == namespace for s in binding.get("subjects") or ()):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" \
            else None
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        if role is not None:
            out += bound(role, where)
    return out


def allowing(rules: Iterable[Rule], call: Attributes) -> list[Rule]:
    """The rules that allow ``call`` (none: refused)."""
    return [rule for rule in rules
            if (rule.namespace is None or rule.namespace == call.namespace)
            and (call.group in rule.groups or "*" in rule.groups)
            and (call.resource in rule.resources or "*" in rule.resources)
            and (call.verb in rule.verbs or "*" in rule.verbs)
            and (rule.names is None or call.name in rule.names)]


def allows(rules: Iterable[Rule], call: Attributes) -> bool:
    return bool(allowing(rules, call))


def owner_reference_checks(call: Attributes, old: Mapping[str, Any] | None,
                           new: Mapping[str, Any],
                           resource_of: Callable[[str, str], tuple[str, str] | None]
                           ) -> list[Attributes]:
    """What the OwnerReferencesPermissionEnforcement plugin authorizes before ``call``
    writes ``new`` over ``old`` (None: a create), as its Validate does: nothing where the
    ownerReferences do not change; ``delete`` on the object where an update changes them;
    ``update`` on ``<owner>/finalizers`` for each reference newly ``blockOwnerDeletion``.
    ``resource_of(apiVersion, kind)`` is (group, plural), None for a kind not served."""
    refs = list((new.get("metadata") or {}).get("ownerReferences") or ())
    before = list(((old or {}).get("metadata") or {}).get("ownerReferences") or ())
    changing = bool(refs) if old is None else refs != before
    if not changing:
        return []
    resource = call.resource.partition("/")[0]
    checks = [] if old is None else [
        Attributes(call.namespace, call.group, resource, "delete", call.name)]
    blocking = {r.get("uid") for r in before if r.get("blockOwnerDeletion")}
    for ref in refs:
        if not ref.get("blockOwnerDeletion") or ref.get("uid") in blocking:
            continue
        found = resource_of(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
        if found is not None:
            checks.append(Attributes(call.namespace, found[0], f"{found[1]}/finalizers",
                                     "update", ref.get("name")))
    return checks


def attributes(request: Request) -> Attributes | None:
    """The call ``request`` makes on a resource; None for discovery and the like."""
    res = request.resource
    if res is None or not res.plural:
        return None
    verb = VERBS.get(request.method.value)
    if request.method == method.DELETE:
        verb = "delete" if request.name else "deletecollection"
    elif verb is None:
        verb = "watch" if request.params.get("watch") in ("true", "1") else (
            "get" if request.name else "list")
    plural = res.plural + (f"/{request.subresource}" if request.subresource else "")
    return Attributes(request.namespace, res.group or "", plural, verb, request.name)


def forbidden(user: str, call: Attributes) -> KubernetesError:
    """The API server's refusal, word for word as it builds it."""
    what = f"{call.resource}.{call.group}" if call.group else call.resource
    subject = f'{what} "{call.name}"' if call.name else what
    where = f' in the namespace "{call.namespace}"' if call.namespace else \
        " at the cluster scope"
    return KubernetesError(
        status=403, reason="Forbidden",
        message=f'{subject} is forbidden: User "{user}" cannot {call.verb} resource '
                f'"{call.resource}" in API group "{call.group}"{where}',
        details={"name": call.name, "group": call.group, "kind": call.resource})


def is_access_review(request: Request) -> bool:
    res = request.resource
    return (request.method == method.POST and res is not None
            and res.group == "authorization.k8s.io"
            and res.plural == "selfsubjectaccessreviews")


def review(rules: Iterable[Rule] | None, body: Any) -> dict[str, Any]:
    """The answer to a SelfSubjectAccessReview ``body`` (``rules`` None: unrestricted)."""
    spec = (body or {}).get("spec") or {}
    asked = spec.get("resourceAttributes") or {}
    resource = str(asked.get("resource", ""))
    if asked.get("subresource"):
        resource += f"/{asked['subresource']}"
    call = Attributes(asked.get("namespace") or None, str(asked.get("group", "")),
                      resource, str(asked.get("verb", "")), asked.get("name") or None)
    allowed = rules is None or allows(rules, call)
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "metadata": {}, "spec": spec,
            "status": {"allowed": allowed} | ({} if allowed else {"reason": ""})}
