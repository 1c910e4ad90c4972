"""The engine pods an LLMDeployment's own Deployment made, found by uids, not names.

A pod counts when its controlling owner is a ReplicaSet whose controlling owner is the
Deployment this CR controls, with that ReplicaSet's pod-template hash. Labels and
annotations, which anyone who can create a pod in the namespace can copy, decide
nothing: the operator's admin token and the tuning loop's ready count go by these pods
only.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from slopilot.operator.crd import KIND
from slopilot.operator.kubeapi import Kube
from slopilot.operator.owned_meta import selector
from slopilot.operator.ownership import controlled_by, controller_ref

TEMPLATE_HASH = "pod-template-hash"

log = logging.getLogger(__name__)


REPLICA_SETS_KEPT = 12
"""The Deployment's ReplicaSets kept at most: apps/v1's ``revisionHistoryLimit`` (10, which
the operator leaves as it is), the new one and the one a rollout scales down."""


PODS_KEPT_FLOOR = 16
"""The engine pods kept at the least, whatever ``replicas.max``: a few pods cost the
operator nothing to hold, and a small CR's pods are not cut short (a hand scale past the
spec's max, say, until the loop scales it back)."""


def kept_pods(max_replicas: int) -> int:
    """The engine pods kept at most: a rollout runs ``max + 1`` (maxSurge 1,
    engine_deployment.ROLLING), and pods being deleted stay listed until they are gone, as
    many again at most; ``PODS_KEPT_FLOOR`` at the least."""
    return max(2 * max_replicas + 1, PODS_KEPT_FLOOR)


@dataclasses.dataclass(frozen=True)
class OwnedPods:
    """The CR's Deployment (None: none, or another's), its own ReplicaSets, and the
    engine pods they made, ready or not, by name; ``unkept``: how many more passed the
    checks past the bounds (``REPLICA_SETS_KEPT``, ``kept_pods``), none of them kept."""

    deployment: dict[str, Any] | None
    replica_sets: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    unkept: int = 0


def owned_pods(kube: Kube, namespace: str, name: str, uid: Any, *,
               max_replicas: int) -> OwnedPods:
    """The objects of LLMDeployment ``namespace/name`` of ``uid`` (module docstring).

    Both lists select labels anyone may copy onto a ReplicaSet or a pod in the namespace:
    each is judged a page at a time (``Kube.select``), so junk costs one page of memory,
    and what passes the checks is kept up to a bound from ``spec.replicas.max``
    (``max_replicas``), the rest counted and said in the log."""
    dep = kube.get("apps/v1", "deployments", namespace, name)
    if dep is None or not controlled_by(dep, KIND, uid):
        return OwnedPods(None, [], [])
    sel = ",".join(f"{k}={v}" for k, v in selector(name).items())
    dep_uid = dep["metadata"].get("uid")
    found_sets = kube.select("apps/v1", "replicasets", namespace, label_selector=sel,
                             keep=lambda rs: controlled_by(rs, "Deployment", dep_uid),
                             most=REPLICA_SETS_KEPT)
    sets = {rs["metadata"]["uid"]: rs for rs in found_sets.items}

    def made_by_one(pod: dict[str, Any]) -> bool:
        ref = controller_ref(pod)
        rs = sets.get(str(ref.get("uid"))) if ref and ref.get("kind") == "ReplicaSet" \
            else None
        if rs is None:
            return False
        want = (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)
        return want is not None and \
            (pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH) == want

    found_pods = kube.select("v1", "pods", namespace, label_selector=sel, keep=made_by_one,
                             most=kept_pods(max_replicas))
    unkept = found_sets.unkept + found_pods.unkept
    if unkept:
        log.warning("LLMDeployment %s/%s: %d ReplicaSets and %d pods past the bound not "
                    "kept (%d ReplicaSets, %d pods at spec.replicas.max=%d): objects "
                    "made to look like its Deployment's (a controller reference to it, "
                    "its labels); delete them, or the ready count and the config syncs "
                    "go by the first ones listed", namespace, name, found_sets.unkept,
                    found_pods.unkept, REPLICA_SETS_KEPT, kept_pods(max_replicas),
                    max_replicas)
    return OwnedPods(dep, found_sets.items,
                     sorted(found_pods.items, key=lambda p: p["metadata"]["name"]), unkept)


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
