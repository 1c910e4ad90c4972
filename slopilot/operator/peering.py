"""The kopf peering object the operator's replicas meet in, created by the operator.

Shipped in manifests/, it would be refused on a first ``kubectl apply -k`` (its CRD is
not established yet when kubectl maps the object), and without it kopf's keep-alives go
nowhere: each replica would think itself alone and act. So ``slopilot operator`` makes
sure it exists before kopf starts: a ClusterKopfPeering for ``--all-namespaces``, a
KopfPeering in each named namespace otherwise (a glob has no namespace to put it in).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
API_VERSION = "kopf.dev/v1"


def ensure_peering(kube: Kube, name: str, *, namespaces: Sequence[str]) -> list[str]:
    """Create the peering object(s) ``name`` where missing; returns what was created."""
    if not namespaces:
        targets: list[tuple[str | None, str, str]] = [
            (None, "clusterkopfpeerings", "ClusterKopfPeering")]
    else:
        targets = [(ns, "kopfpeerings", "KopfPeering") for ns in namespaces
                   if not any(c in ns for c in "*?[")]
    created = []
    for namespace, plural, kind in targets:
        if kube.get(API_VERSION, plural, namespace, name) is not None:
            continue
        meta: dict[str, str] = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        try:
            kube.create(API_VERSION, plural, namespace,
                        {"apiVersion": API_VERSION, "kind": kind, "metadata": meta})
        except ApiError as exc:
            if exc.reason != "AlreadyExists":  # another replica was first
                raise
            continue
        where = f"{namespace}/{name}" if namespace else name
        log.info("created the %s %s", kind, where)
        created.append(f"{kind}/{where}")
    return created
