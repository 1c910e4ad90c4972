"""The kopf peering object the operator's replicas meet in, created by the operator.

Shipped in manifests/, it would be refused on a first ``kubectl apply -k`` (its CRD is
not established yet when kubectl maps the object), and without it kopf's keep-alives go
nowhere: each replica would think itself alone and act. So ``slopilot operator`` makes
sure it exists before kopf starts: a ClusterKopfPeering for ``--all-namespaces``, a
KopfPeering in each namespace named exactly otherwise. The namespaces a glob matches,
and a namespace deleted and created again, get theirs from peering_keeper.py while kopf
runs: kopf holds every namespace it serves paused until it sees the peering object of
each one, so one namespace without it would pause them all.

A namespace that is gone, or being deleted (the API server refuses any create in it),
is skipped with a warning: it needs no peering object, and the operator must start
there too, or the CR holding that namespace would never be released.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
API_VERSION = "kopf.dev/v1"
# Only for an answer without the Status's details (a proxy's, an old API server's): the
# wording of the NamespaceLifecycle admission's messages.
_GONE = re.compile(r'namespaces "[^"]*" not found')
_TERMINATING = "because it is being terminated"


def namespace_closed(exc: ApiError) -> str | None:
    """Why a create was refused for its namespace's sake (gone, or being deleted: the
    NamespaceLifecycle admission's answers), or None where it was refused for another
    reason (RBAC, a CRD not installed).

    Told by the Status's structured parts: a 403 ``Forbidden`` with the cause
    ``NamespaceTerminating``, a 404 ``NotFound`` of the kind ``namespaces`` (not of the
    created object's: a missing CRD). The message is read only where the answer has no
    details at all."""
    if exc.details:
        causes = exc.details.get("causes") or []
        if exc.status == 403 and any(isinstance(c, dict) and c.get("reason") ==
                                     "NamespaceTerminating" for c in causes):
            return "is being deleted (Terminating)"
        if exc.status == 404 and exc.details.get("kind") == "namespaces":
            return "is gone"
        return None
    if exc.status == 404 and _GONE.search(exc.message):
        return "is gone"
    if exc.status == 403 and _TERMINATING in exc.message:
        return "is being deleted (Terminating)"
    return None


def is_glob(pattern: str) -> bool:
    """Whether a ``--namespace`` pattern may match other namespaces than its own text
    (kopf's syntax: ``*``, ``?``, ``!`` exclusions, comma-separated parts)."""
    return any(c in pattern for c in "*?[!,")


def ensure_one(kube: Kube, name: str, namespace: str | None) -> bool:
    """Create the peering object ``name`` in ``namespace`` (None: the ClusterKopfPeering)
    where missing; True where created here. ApiError where the API server refuses."""
    plural, kind = (("kopfpeerings", "KopfPeering") if namespace is not None
                    else ("clusterkopfpeerings", "ClusterKopfPeering"))
    if kube.get(API_VERSION, plural, namespace, name) is not None:
        return False
    meta: dict[str, str] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    try:
        kube.create(API_VERSION, plural, namespace,
                    {"apiVersion": API_VERSION, "kind": kind, "metadata": meta})
    except ApiError as exc:
        if exc.reason != "AlreadyExists":  # another replica was first
            raise
        return False
    log.info("created the %s %s", kind, f"{namespace}/{name}" if namespace else name)
    return True


@dataclass
class Ensured:
    """What ``ensure_peering`` did."""

    created: list[str] = field(default_factory=list)
    """``Kind/namespace/name`` of each object created."""
    closed: dict[str, str] = field(default_factory=dict)
    """namespace -> why none could be (gone, or being deleted)."""


def ensure_peering(kube: Kube, name: str, *, namespaces: Sequence[str]) -> Ensured:
    """Create the peering object(s) ``name`` where missing. Namespaces given by a glob
    are left to peering_keeper.py; one gone or being deleted is skipped with a warning
    (``closed``). ApiError for any other refusal."""
    targets: list[str | None] = (
        [None] if not namespaces else [ns for ns in namespaces if not is_glob(ns)])
    done = Ensured()
    for namespace in dict.fromkeys(targets):
        try:
            made = ensure_one(kube, name, namespace)
        except ApiError as exc:
            if namespace is None or (why := namespace_closed(exc)) is None:
                raise
            log.warning("slopilot operator: namespace %s %s: no peering object made "
                        "there (%s)", namespace, why, exc)
            done.closed[namespace] = why
            continue
        if made:
            kind = "KopfPeering" if namespace else "ClusterKopfPeering"
            done.created.append(f"{kind}/{namespace}/{name}" if namespace
                                else f"{kind}/{name}")
    return done


def terminating_namespaces(kube: Kube, served: Callable[[str], bool]) -> dict[str, str]:
    """The served namespaces being deleted now (namespace -> why), from a list of
    namespaces; none where the list is refused (peering_keeper.py warns of that)."""
    try:
        listed = kube.list("v1", "namespaces", None)
    except ApiError as exc:
        log.debug("namespaces not listed (%s)", exc)
        return {}
    return {ns["metadata"]["name"]: "is being deleted (Terminating)" for ns in listed
            if ns.get("metadata", {}).get("deletionTimestamp")
            and served(ns["metadata"]["name"])}
