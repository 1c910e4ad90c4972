"""The ``PodsConfigured`` condition: whether every ready pod runs what the spec says.

The built-in engine reads its knobs and SLO from the ConfigMap at start only, and the
operator's sync (``KubeDeploymentHandle.sync_config``) sends them to the running pods.
A pod it cannot bring over (one from an older pod template, an image without
``/admin/slo``, a pod that refuses the token) was only in the operator's log, while
``status.config`` told the user what every pod ran. The condition names such pods and
why; it is written when it changes, not once a minute.

"Changes" is its meaning: its status, its reason, its generation and the pods it names
(kept in ``status.pods.notConfigured``), not its message. The message quotes what each
pod answered (a restart knob's value, an error's content type), and the image is the
tenant's: one that answered something new each time had the status written at every
sync. So the message stays as first written while the pods named stay the same.

A pod is named at the first sync that finds it wrong, and named no more once
``CONFIRM_SYNCS`` (2) syncs in a row find it right, more for one that keeps coming back
(pod_memory.py): a pod right and wrong by turns had the condition flip, and the status
written, at every sync. A named pod that is not ready now is not checked and stays
named ("not ready"), with its holds, until a sync finds it ready and right; one that is
gone (deleted, or another pod of the name) leaves the list at the next sync. A sync with
no ready pod while pods are there leaves a condition already written as it is (a right
pod ready and not by turns flipped it between Unknown and True at every sync).

A CR whose sync has waited an interval for a slot of the pod syncs' pool
(pod_sync_pool.py: the slots others' slow pods hold) has it Unknown (``SyncDeferred``),
saying why: the pods were not checked, and what the status names of them is the last
sync's. The sync's own condition replaces it once it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slopilot.operator.conditions import ConditionType, condition, merge_conditions
from slopilot.operator.config_sync import ConfigSync
from slopilot.operator.kubeapi import Kube
from slopilot.operator.pod_holds import MAX_HOLDS
from slopilot.operator.spec import Backend, SpecError, parse_spec
from slopilot.operator.status_writer import write_status

log = logging.getLogger(__name__)
MAX_LISTED = 5
"""Pods named in the message at most (the rest counted): status is no log."""
MAX_REASON = 400
"""Characters of one pod's reason at most: it quotes what the pod answered (the restart
knobs it runs), and the image is the tenant's."""
MAX_TRACKED = 64
"""Pods kept in ``status.pods.notConfigured`` at most (``spec.replicas.max``)."""
_COMPARED = ("status", "reason", "observedGeneration")
SYNC_DEFERRED = "SyncDeferred"


def _clip(why: str) -> str:
    return why if len(why) <= MAX_REASON else why[:MAX_REASON] + " ..."


def pods_condition(done: ConfigSync, generation: int | None) -> dict[str, Any] | None:
    """The condition one sync's answer makes; None for a backend with no live config."""
    if done.pods is None:
        return None
    if why := (*done.left, *done.confirming, *done.resting):
        more = len(why) - MAX_LISTED
        message = "; ".join(map(_clip, why[:MAX_LISTED])) + (
            f"; and {more} more" if more > 0 else "")
        return condition(ConditionType.PODS_CONFIGURED, False, "PodsNotConfigured",
                         message, generation)
    if done.pods == 0:
        return condition(ConditionType.PODS_CONFIGURED, None, "NoReadyPods",
                         "no ready pod to check yet", generation)
    # No count of pods: the message is written again only when the meaning changes, and
    # a count would go stale with every scale.
    return condition(ConditionType.PODS_CONFIGURED, True, "PodsConfigured",
                     "every ready pod runs the spec's live knobs and SLO (a running "
                     "trial's pod, the trial's knobs)", generation)


def record_pods_condition(kube: Kube, namespace: str, name: str, uid: str,
                          done: ConfigSync, generation: int | None) -> None:
    """Merge the condition into the CR's status if it changed; never into another CR of
    the same name (``uid``). Failures are logged: the next sync writes it again."""
    cond = pods_condition(done, generation)
    if cond is None:
        return
    named = list(done.not_configured[:MAX_TRACKED])
    held = [h.to_dict() for h in done.held[:MAX_HOLDS]]
    # No pod ready to check, but pods there: nothing learnt, so a condition already
    # written stands. Written over, a right pod that failed its readiness probe at every
    # other sync flipped it between Unknown and True, a status write at every sync.
    learnt_nothing = done.pods == 0 and done.not_ready > 0 and not named

    def build(fresh: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = fresh["metadata"]
        if str(meta.get("uid")) != uid or meta.get("deletionTimestamp"):
            return None
        status = fresh.get("status") or {}
        conditions = status.get("conditions") or []
        now = next((c for c in conditions if c.get("type") == cond["type"]), None)
        recorded = status.get("pods")
        pods: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
        if now is not None and pods.get("notConfigured") == named and \
                pods.get("held", []) == held and (
                    all(now.get(k) == cond.get(k) for k in _COMPARED) or learnt_nothing):
            return None
        return {"conditions": merge_conditions(conditions, [cond]),
                "pods": {"notConfigured": named, "held": held}}

    try:
        write_status(kube, namespace, name, build)
    except Exception as exc:  # an API error: the next sync writes it again
        log.warning("%s/%s: the PodsConfigured condition was not written: %s: %s",
                    namespace, name, type(exc).__name__, exc)


def record_sync_deferred(kube: Kube, namespace: str, name: str, uid: str, why: str,
                         generation: int | None) -> None:
    """``PodsConfigured`` Unknown (``SyncDeferred``, ``why``): the pods were not checked.
    Written once per generation, as any change of meaning; ``status.pods`` (the pods the
    last sync named, its holds) stands until a sync runs. Not for a backend without a
    live config (vLLM): no sync writes the condition there, so this one would stay."""
    cond = condition(ConditionType.PODS_CONFIGURED, None, SYNC_DEFERRED, why, generation)

    def build(fresh: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = fresh["metadata"]
        if str(meta.get("uid")) != uid or meta.get("deletionTimestamp"):
            return None
        try:
            if parse_spec(fresh).backend is not Backend.BUILTIN:
                return None
        except SpecError:
            return None  # the reconcile says what is wrong with it
        conditions = (fresh.get("status") or {}).get("conditions") or []
        now = next((c for c in conditions if c.get("type") == cond["type"]), None)
        if now is not None and all(now.get(k) == cond.get(k) for k in _COMPARED):
            return None
        return {"conditions": merge_conditions(conditions, [cond])}

    try:
        write_status(kube, namespace, name, build)
    except Exception as exc:  # an API error: the sync, once it runs, writes its own
        log.warning("%s/%s: the PodsConfigured condition was not written: %s: %s",
                    namespace, name, type(exc).__name__, exc)
