"""Why a Deployment's asked replicas are not ready, as the API tells it.

The loop waits for the replicas a scale bought before it judges capacity
(``tuner/loop/scale_wait.py``); when they do not come, what it reports names the cause
where Kubernetes records one: a ReplicaSet's (or the Deployment's) ``ReplicaFailure``
condition, which holds a pod the API refused to create (``FailedCreate``: a namespace
quota exceeded, an admission webhook), a pod the scheduler placed nowhere
(``PodScheduled=False``, ``Unschedulable``: no node has the GPU), or a container that
cannot start (``ImagePullBackOff``, ``CrashLoopBackOff``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CAUSES_SAID = 3
"""Causes quoted at most: one per kind is enough to act on, and a condition's message
stays readable."""


def why_not_ready(deployment: Mapping[str, Any], replica_sets: Iterable[Mapping[str, Any]],
                  pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The causes the objects record, most specific first, joined; None where none is."""
    causes: list[str] = []
    for obj in (*replica_sets, deployment):
        kind = obj.get("kind") or ("ReplicaSet" if obj is not deployment else "Deployment")
        for cond in (obj.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                causes.append(f"{kind}/{(obj.get('metadata') or {}).get('name')} "
                              f"{cond.get('reason') or 'ReplicaFailure'}: "
                              f"{cond.get('message') or 'no message'}")
    for pod in pods:
        causes.extend(_pod_causes(pod))
    unique = list(dict.fromkeys(causes))
    return "; ".join(unique[:CAUSES_SAID]) or None


def _pod_causes(pod: Mapping[str, Any]) -> list[str]:
    name = (pod.get("metadata") or {}).get("name")
    status = pod.get("status") or {}
    out = []
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(f"pod {name} {cond.get('reason') or 'not scheduled'}: "
                       f"{cond.get('message') or 'no message'}")
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            out.append(f"pod {name} container {container.get('name')} "
                       f"{waiting['reason']}: {waiting.get('message') or 'no message'}")
    return out
