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
or a create, which name no object).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def allows(rules: Iterable[Rule], call: Attributes) -> bool:
    return any(
        (rule.namespace is None or rule.namespace == call.namespace)
        and (call.group in rule.groups or "*" in rule.groups)
        and (call.resource in rule.resources or "*" in rule.resources)
        and (call.verb in rule.verbs or "*" in rule.verbs)
        and (rule.names is None or call.name in rule.names)
        for rule in rules)


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
