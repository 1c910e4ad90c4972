"""The status fields a spec reconcile owns, from its ``Outcome``: the phase, the
``Valid``, ``Reconciled``, ``KnobsIgnored``, ``DisruptionBudget``, ``AdminToken`` and
``Tuning`` conditions, the config, and ``readyReplicas`` while tuning is off (the daemon
owns the rest)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slopilot.engine.server.admin_credential import ADMIN_TOKEN_SHA256_ENV
from slopilot.operator.conditions import (
    ConditionType,
    DriftReason,
    condition,
    merge_conditions,
)
from slopilot.operator.cr_locks import key_of
from slopilot.operator.disruption_budget import budget_conditions
from slopilot.operator.drift import not_repaired_message
from slopilot.operator.knobs import left_trial_reduced, unstamped_target
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.loop_status import ended_episode, tuning_enabled
from slopilot.operator.owned_pods import ready_replicas
from slopilot.operator.reconcile import Change, Outcome, config_status
from slopilot.operator.spec import Phase

DAEMON_PHASES = {Phase.TUNING.value, Phase.SCALING.value, Phase.DEGRADED.value}
log = logging.getLogger(__name__)


def accepted(outcome: Outcome) -> str:
    """The Valid=True condition's message: the spec's warnings, where it has any."""
    if not outcome.warnings:
        return "the spec passed every check"
    return "the spec passed every check, with warnings: " + "; ".join(outcome.warnings)


def status_of(body: Mapping[str, Any], outcome: Outcome,
              ready: int | None = None) -> dict[str, Any]:
    """The status fields one reconcile owns (the daemon owns the others); ``ready``: the
    replicas that serve (``untuned_ready``), written while tuning is off."""
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    current = status.get("conditions")
    tuned = tuning_enabled(body.get("spec") or {})
    # The tuning daemon counts them at each tick; none runs now, so the reconcile does,
    # and the repair at each status write of the Deployment (drift.py), a refused spec's
    # too: its pods serve on.
    untuned: dict[str, Any] = {} if tuned or ready is None else {"readyReplicas": ready}
    if not outcome.valid:
        message = "; ".join(outcome.problems)
        if outcome.refusal.of_objects:
            updates = [
                condition(ConditionType.VALID, True, "SpecAccepted", accepted(outcome),
                          generation),
                condition(ConditionType.RECONCILED, False, outcome.refusal.value, message,
                          generation)]
        else:
            updates = [condition(ConditionType.VALID, False, outcome.refusal.value, message,
                                 generation)]
        return {"phase": Phase.INVALID.value, "observedGeneration": generation,
                "conditions": merge_conditions(current, updates), **untuned}
    done = [f"{change.value} {what}" for what, change in outcome.changes.items()
            if change is not Change.UNCHANGED]
    updates = [
        condition(ConditionType.VALID, True, "SpecAccepted", accepted(outcome), generation),
        # An owner reference the API server would not let be put right: the drift timer
        # looks again (the tuning controller runs on, as for any drift not repaired).
        condition(ConditionType.RECONCILED, False, DriftReason.NOT_REPAIRED,
                  not_repaired_message("; ".join(outcome.not_restored)), generation)
        if outcome.not_restored else
        condition(ConditionType.RECONCILED, True, "OwnedObjectsInSync",
                  "; ".join(done) if done else "every owned object matches the spec",
                  generation)]
    removed = []
    if outcome.unsupported_knobs:
        updates.append(condition(
            ConditionType.KNOBS_IGNORED, True, "BackendLacksKnobs",
            f"vLLM has no argument for {', '.join(outcome.unsupported_knobs)}: left out; "
            "use backend: builtin to tune them", generation))
    else:
        removed.append(ConditionType.KNOBS_IGNORED)
    said, gone = budget_conditions(outcome.left_alone, generation)
    updates += said
    removed += gone
    if outcome.admin_token:
        updates.append(condition(
            ConditionType.ADMIN_TOKEN, True, "OperatorMinted",
            "the engines admit the operator's admin token by its SHA-256, which the pod "
            f"template carries ({ADMIN_TOKEN_SHA256_ENV}); no Secret holds the token",
            generation))
    else:
        # No admin API (vLLM): no sync runs to write PodsConfigured again, and one from
        # the built-in backend would name its pods for as long as the CR lived.
        removed += [ConditionType.ADMIN_TOKEN, ConditionType.PODS_CONFIGURED]
    phase = status.get("phase")
    if not tuned:
        # No daemon runs now to move the phase or the Tuning condition on: kept, a
        # deployment whose tuning was turned off mid-trial said "Tuning" (trial N
        # running) for good, while its pods ran the restored config.
        updates.append(condition(ConditionType.TUNING, False, "Disabled",
                                 "spec.tuning.enabled is false: no trials, no scaling",
                                 generation))
        # The daemon's reading (scrape_status.py): none is taken now, and a False one
        # kept would say for good that a loop not running never acts.
        removed.append(ConditionType.SCRAPE_INTERVAL)
    ended = None if tuned else ended_episode(status)
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": phase if tuned and phase in DAEMON_PHASES else Phase.RUNNING.value,
        "replicas": outcome.replicas,
        "conditions": merge_conditions(current, updates, remove=removed)}
    if outcome.config is not None:
        out["config"] = config_status(outcome.config)
    if not outcome.admin_token:
        out["pods"] = None  # what the sync found goes with its condition
    if ended is not None:
        out["controller"] = ended
    if (stamp := unstamped_target(body)) is not None:
        # Merged into the record (the write is conditional on the version read): kopf's
        # resume handler reconciles every CR at the start, before any switch is judged.
        out["tunedConfig"] = stamp
    out.update(left_trial_reduced(body))  # a record the stamp belongs to is never left
    return out | untuned


def untuned_ready(kube: Kube, body: Mapping[str, Any]) -> int | None:
    """The replicas that serve, for ``status.readyReplicas``, where tuning is off (None
    where it is on: the daemon's to count). An API error leaves the count as it is
    (None) and fails nothing."""
    if tuning_enabled(body.get("spec") or {}):
        return None
    meta = body["metadata"]
    try:
        return ready_replicas(kube, meta["namespace"], meta["name"], meta.get("uid"))
    except ApiError as exc:
        log.warning("%s: ready replicas not read (%s)", key_of(body), exc)
        return None
