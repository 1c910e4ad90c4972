"""What ``slopilot operator uninstall`` may do, asked before it does any of it.

The command lists, deletes, reads and patches LLMDeployments; the operator's own account
may not delete them, and a tenant may act in its namespace only. Run by someone short of
one verb, it deleted the CRs it could, then stopped on the first 403: those stayed
Terminating with the operator's finalizer, which no operator was running to release.
So it asks the API server first, one SelfSubjectAccessReview per verb and namespace
(the server's own authorizer answers, whatever grants it: RBAC, webhooks), and changes
nothing unless every answer is yes; the refusal names each verb and namespace missing
and the binding of the shipped ClusterRole ``slopilot-uninstaller`` that grants them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slopilot.operator.crd import GROUP, PLURAL
from slopilot.operator.kubeapi import ApiError, Kube

UNINSTALLER_ROLE = "slopilot-uninstaller"
"""The ClusterRole (manifests/uninstaller-rbac.yaml) that grants what the command needs."""
LISTING = ("list",)
ENDING = ("get", "delete", "patch")
"""Per namespace holding a CR: whether the operator ended it, its deletion, and the
release of the operator's finalizer where none did."""


@dataclass(frozen=True)
class Access:
    """One verb on LLMDeployments, in ``namespace`` (None: every namespace)."""

    verb: str
    namespace: str | None

    def __str__(self) -> str:
        where = f'in namespace "{self.namespace}"' if self.namespace else "in every namespace"
        return f"{self.verb} {PLURAL}.{GROUP} {where}"


class UninstallRefused(RuntimeError):
    """The caller may not do all the command needs; nothing was changed."""

    def __init__(self, missing: Sequence[Access], *, all_namespaces: bool = False,
                 why: str = "") -> None:
        self.missing = list(missing)
        super().__init__(why or _explain(self.missing, all_namespaces))


def needed(namespaces: Sequence[str] | None, holding: Iterable[str] | None = None
           ) -> list[Access]:
    """The access to ask for: ``namespaces`` given, every verb in each of them. None
    (``-A``): the list at the cluster scope, then (``holding``: the namespaces the list,
    read only, found CRs in) the rest in each of those."""
    if namespaces is not None:
        return [Access(v, ns) for ns in dict.fromkeys(namespaces) for v in (*LISTING, *ENDING)]
    if holding is None:
        return [Access(v, None) for v in LISTING]
    return [Access(v, ns) for ns in sorted(set(holding)) for v in ENDING]


def missing(kube: Kube, wanted: Sequence[Access]) -> list[Access]:
    """Those of ``wanted`` the API server says the caller may not do. UninstallRefused
    where it cannot be asked at all (nothing done on a guess)."""
    out = []
    for access in wanted:
        attributes = {"group": GROUP, "resource": PLURAL, "verb": access.verb}
        if access.namespace:
            attributes["namespace"] = access.namespace
        try:
            review = kube.request(
                "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1",
                      "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": attributes}})
        except ApiError as exc:
            raise UninstallRefused([access], why=(
                f"slopilot operator uninstall: nothing was changed: the API server was "
                f"not able to say whether you may {access} (SelfSubjectAccessReview: "
                f"{exc}); run it again, or as a cluster administrator")) from None
        if not (review.get("status") or {}).get("allowed"):
            out.append(access)
    return out


def _explain(gaps: Sequence[Access], all_namespaces: bool) -> str:
    lines = [f"  you may not {a}" for a in gaps]
    namespaces = sorted({a.namespace for a in gaps if a.namespace})
    if all_namespaces or not namespaces:
        fix = [f"kubectl create clusterrolebinding {UNINSTALLER_ROLE} "
               f"--clusterrole={UNINSTALLER_ROLE} --user=<you>"]
    else:
        fix = [f"kubectl -n {ns} create rolebinding {UNINSTALLER_ROLE} "
               f"--clusterrole={UNINSTALLER_ROLE} --user=<you>" for ns in namespaces]
    return ("slopilot operator uninstall: nothing was changed: it lists, deletes, reads "
            "and patches LLMDeployments (the operator's finalizer is released where no "
            "operator ends a CR), and\n" + "\n".join(lines) + "\n"
            f"Bind the ClusterRole {UNINSTALLER_ROLE} (manifests/uninstaller-rbac.yaml, "
            "installed with the operator) to yourself (`kubectl auth whoami` names you), "
            "run the command again, then delete the binding:\n  " + "\n  ".join(fix)
            + "\nor run it as a cluster administrator.")
