"""What a drift repair says in the ``Reconciled`` condition, and when it says nothing.

A repair runs on every event of an owned object, the operator's own writes included, and
almost every one finds nothing to do: the status is written only when the condition's
meaning changes, so the events of a busy deployment cost no status writes.

- something put back: ``True``, ``DriftRepaired``, "repaired at <time>: created
  PrometheusRule/slopilot-chat" (the time is in the message: the status stays True, so
  ``lastTransitionTime`` does not move);
- something that could not be (the API server failed the write; an object of the name
  is not the CR's; it refused the CR's own owner reference put right, the rest of the
  object repaired; what to render waits on the study's answer whether the trial on
  record was told failed, ``vllm_take_back.RenderDeferred``, nothing applied):
  ``False``, ``DriftNotRepaired``, which object and why. Its
  ``lastTransitionTime`` is when the repair first failed; the same failure found again
  is not written again. A timer looks again (``RETRY_S``) while it is so;
- nothing to do: no write, unless the condition says ``False`` (then ``True``,
  ``OwnedObjectsInSync``).

A spec the reconcile refuses is the spec handler's to report (``Valid=False``, or its
own ``Reconciled=False``, which it retries): a repair finding the same refusal writes
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.operator.conditions import (
    ConditionType,
    DriftReason,
    condition,
    merge_conditions,
    now_rfc3339,
)
from slopilot.operator.disruption_budget import budget_conditions
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.reconcile import RETRY_NAME_TAKEN_S, Change, Outcome, WriteFailed
from slopilot.operator.status_writer import write_status
from slopilot.operator.vllm_take_back import RenderDeferred

RETRY_S = RETRY_NAME_TAKEN_S
"""How soon a repair that could not be done is tried again: no event of an object the
operator does not manage (one that took the name) reaches it, and a failed write has no
event at all."""
IN_SYNC = "OwnedObjectsInSync"


def reconciled_condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or ():
        if c.get("type") == ConditionType.RECONCILED:
            return dict(c)
    return None


def unrepaired(status: Mapping[str, Any]) -> bool:
    """Whether the last drift repair left something it could not put back."""
    c = reconciled_condition(status) or {}
    return c.get("status") == "False" and c.get("reason") == DriftReason.NOT_REPAIRED


def not_repaired_message(why: str) -> str:
    return f"{why}; the operator tries again every {RETRY_S:g} s"


def drift_condition(current: Mapping[str, Any] | None,
                    found: Outcome | ApiError | RenderDeferred,
                    generation: int | None) -> dict[str, Any] | None:
    """The Reconciled condition after a repair that ``found`` this (its outcome, the API
    error it stopped on, or its deferral); None where the condition already says so."""
    if isinstance(found, RenderDeferred):
        new = condition(ConditionType.RECONCILED, False, DriftReason.NOT_REPAIRED,
                        not_repaired_message(f"the owned objects not repaired: {found}"),
                        generation)
    elif isinstance(found, ApiError):
        what = found.what if isinstance(found, WriteFailed) else "the owned objects"
        new = condition(ConditionType.RECONCILED, False, DriftReason.NOT_REPAIRED,
                        not_repaired_message(f"{what} not repaired: {found}"), generation)
    elif not found.valid:
        if not found.refusal.of_objects or (
                current is not None and current.get("status") == "False"
                and current.get("reason") == found.refusal.value):
            return None  # the spec handler's refusal, reported (and retried) there
        new = condition(ConditionType.RECONCILED, False, DriftReason.NOT_REPAIRED,
                        not_repaired_message("; ".join(found.problems)), generation)
    elif found.not_restored:
        new = condition(ConditionType.RECONCILED, False, DriftReason.NOT_REPAIRED,
                        not_repaired_message("; ".join(found.not_restored)), generation)
    elif done := [f"{change.value} {what}" for what, change in found.changes.items()
                  if change is not Change.UNCHANGED]:
        return condition(ConditionType.RECONCILED, True, DriftReason.REPAIRED,
                         f"repaired at {now_rfc3339()}: {'; '.join(done)}", generation)
    elif current is None or current.get("status") == "True":
        return None  # in sync, and it says so (or the spec reconcile is about to)
    else:
        new = condition(ConditionType.RECONCILED, True, IN_SYNC,
                        "every owned object matches the spec", generation)
    same = current is not None and all(current.get(k) == new.get(k) for k in (
        "status", "reason", "message", "observedGeneration"))
    return None if same else new


def record_repair(kube: Kube, namespace: str, name: str, uid: str,
                  found: Outcome | ApiError | RenderDeferred, *,
                  ready: int | None = None) -> None:
    """Write the repair's Reconciled condition where it changes, on the CR of ``uid``
    only (a successor of the name is not this repair's); and ``ready`` (the replicas
    that serve, read where tuning is off) as ``status.readyReplicas`` where it changed."""

    def build(body: dict[str, Any]) -> dict[str, Any] | None:
        if str(body["metadata"].get("uid")) != uid:
            return None
        status = body.get("status") or {}
        generation = body["metadata"].get("generation")
        new = drift_condition(reconciled_condition(status), found, generation)
        updates, removed = [new] if new is not None else [], []
        if isinstance(found, Outcome) and found.valid:
            # A repair makes the operator's budget where another's is gone: said there,
            # the condition named a budget no longer left alone until a spec edit.
            said, gone = budget_conditions(found.left_alone, generation)
            if said != _current(status, said) or any(
                    _current(status, [{"type": t.value}]) for t in gone):
                updates += said
                removed += gone
        out: dict[str, Any] = {}
        if ready is not None and not tuning_enabled(body.get("spec") or {}) \
                and status.get("readyReplicas") != ready:
            # No daemon counts them while tuning is off: a pod that became ready (or
            # went) is a status write of the Deployment, whose event brought this repair.
            out["readyReplicas"] = ready
        if updates or removed:
            out["conditions"] = merge_conditions(status.get("conditions"), updates,
                                                 remove=removed)
        return out or None

    write_status(kube, namespace, name, build)


def _current(status: Mapping[str, Any], like: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conditions of ``status`` of the types in ``like``, as ``like`` writes them
    (without their times): what a write of ``like`` would change."""
    types = {c["type"] for c in like}
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in status.get("conditions") or () if c.get("type") in types]
