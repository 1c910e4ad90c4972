"""The engine pods an LLMDeployment's own Deployment made, found by uids, not names.

A pod counts when its controlling owner is a ReplicaSet whose controlling owner is the
Deployment this CR controls, with that ReplicaSet's pod-template hash. Labels and
annotations, which anyone who can create a pod in the namespace can copy, decide
nothing: the operator's admin token and the tuning loop's ready count go by these pods
only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slopilot.operator.crd import KIND
from slopilot.operator.kubeapi import Kube
from slopilot.operator.owned_meta import selector
from slopilot.operator.ownership import controlled_by, controller_ref

TEMPLATE_HASH = "pod-template-hash"


@dataclasses.dataclass(frozen=True)
class OwnedPods:
    """The CR's Deployment (None: none, or another's), its own ReplicaSets, and the
    engine pods they made, ready or not, by name."""

    deployment: dict[str, Any] | None
    replica_sets: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def owned_pods(kube: Kube, namespace: str, name: str, uid: Any) -> OwnedPods:
    """The objects of LLMDeployment ``namespace/name`` of ``uid`` (module docstring)."""
    dep = kube.get("apps/v1", "deployments", namespace, name)
    if dep is None or not controlled_by(dep, KIND, uid):
        return OwnedPods(None, [], [])
    sel = ",".join(f"{k}={v}" for k, v in selector(name).items())
    sets = {rs["metadata"]["uid"]: rs for rs in kube.list(
        "apps/v1", "replicasets", namespace, label_selector=sel)
        if controlled_by(rs, "Deployment", dep["metadata"].get("uid"))}
    out = []
    for pod in kube.list("v1", "pods", namespace, label_selector=sel):
        ref = controller_ref(pod)
        rs = sets.get(str(ref.get("uid"))) if ref and ref.get("kind") == "ReplicaSet" \
            else None
        if rs is None:
            continue
        want = (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)
        if want is None or (pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH) != want:
            continue
        out.append(pod)
    return OwnedPods(dep, list(sets.values()), sorted(out, key=lambda p: p["metadata"]["name"]))


def ready_replicas(kube: Kube, namespace: str, name: str, uid: Any) -> int:
    """The ready replicas of the CR's own Deployment, as its controller counts them
    (``status.readyReplicas``): what ``kubectl get`` shows while no tuning daemon counts
    the pods (``status.readyReplicas`` of the CR), for one GET. 0 where the Deployment is
    none or another's: none of this CR's pods serve."""
    dep = kube.get("apps/v1", "deployments", namespace, name)
    if dep is None or not controlled_by(dep, KIND, uid):
        return 0
    count = (dep.get("status") or {}).get("readyReplicas")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
