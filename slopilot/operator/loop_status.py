"""The tuning loop's state as the LLMDeployment's status holds it.

Each step writes ``status`` (phase, replicas, config, bestTrial, trials, lastAction, the
``Tuning`` condition) and the controller's whole loop state in ``status.controller``
(``status_after``). Resumable: a restarted operator builds the controller from the
persisted state, so a scale or a trial already done is resumed (cooling down, or
measuring the running trial), not done again (a scale whose record was lost: its stamp
on the Deployment, scale_stamp.py); an edit of ``spec.engine`` or
``spec.slo`` rebases what it resumes (``rebase_episode``). One writer of the loop's
state: each write of ``status.controller`` is made only over the state the daemon built
its controller from or last wrote there, as a merge patch leaves it (``on_record``).
Tuning turned off ends the episode (the running trial failed, the loop to STEADY: turned
on again, it waits for an alert); where no daemon saw it turned off, the reconcile ends
it (``ended_episode``). While tuning is off (``tuning_enabled``), the phase and the
``Tuning`` condition are the reconcile's to write.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from slopilot.operator.conditions import ConditionType, condition, merge_conditions
from slopilot.operator.daemon import PHASES
from slopilot.operator.engine_switch import RanOn
from slopilot.operator.knobs import tuned_on, tuned_overlay
from slopilot.operator.merge_patch import replacing
from slopilot.operator.reconcile import config_status
from slopilot.operator.spec import Phase, SpecError, parse_spec
from slopilot.operator.study_cleanup import with_storage
from slopilot.operator.tuned_base import target_of
from slopilot.operator.twin_status import check_patch
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.loop.transitions import Event, check
from slopilot.tuner.study.study_family import LeftTrial
from slopilot.tuner.study.study_target import StudyTarget

log = logging.getLogger(__name__)


def rebase_episode(loop: LoopState, body: Mapping[str, Any]) -> RanOn | None:
    """The loop's configs after an edit of ``spec.engine`` or ``spec.slo``.

    The baseline is the whole config the episode began on, laid over the spec on a
    rollback (a trial failed, no config held, tuning turned off); kept after an edit, it
    undid the edit on every pod and recorded the old knobs as the new spec's tuned
    config. The edit makes ``status.tunedConfig`` stale (it is keyed by those two
    sections), and then the spec as it is now is what the deployment runs without the
    episode's trials. A valid tuned config means no such edit: the baseline stays (with
    one replica the trials themselves are recorded there, so the spec is not the
    baseline then).

    Outside an episode the best config kept is the last commit, which belonged to the
    spec it was committed under as the tuned config did: it is forgotten with it, and so
    is what its rollout would be reverted to. An open
    episode's best is its own trials' and stays (laid over the spec as it is now).

    Returns what the loop last ran on (None where nothing says), with the trial a switch
    ended, for the study's open to fail it in its own study (``engine_switch.py``).
    """
    ran_on = _end_on_switch(loop, body)
    if tuned_overlay(body) is not None:
        return ran_on
    if not loop.episode_open:
        loop.best_config = loop.best_goodput = None
    if loop.rollout is not None:
        # The edit's template replaced the commit's: reverted where that one stuck, the
        # config committed before it undid the edit (rollout_wait.cooling).
        loop.rollout.revert_to = None
    if loop.baseline_config is not None:
        loop.baseline_config = parse_spec(body).engine.to_dict()
    return ran_on


def _end_on_switch(loop: LoopState, body: Mapping[str, Any]) -> RanOn | None:
    """The episode ends where ``spec.backend`` or the model switched since the loop was
    last built: its trial's number was asked in the other backend's study, and resumed
    in this one's it was an error or another trial's; its best and baseline are the other
    engine's knobs. Its trial is returned, to be told failed in that study. Stamps the
    current target; returns the one before (None where nothing says)."""
    now = target_of(body)
    target = now.key
    saved, loop.target = loop.target, target
    # A state from before the target was kept: the committed config's record, where
    # it names another backend or model, says what the loop's last episode ran on.
    then = StudyTarget.from_key(saved) if saved is not None else tuned_on(body)
    if then is None or then == now:
        return None if then is None else RanOn(then)
    if loop.state is ControllerState.STEADY and loop.trial is None \
            and loop.pending_restore is None and loop.best_config is None:
        return RanOn(then)
    check(loop.state, ControllerState.STEADY, Event.ENGINE_SWITCHED)
    t = loop.trial
    trial = None if t is None else LeftTrial(t.number, t.study, dict(t.config))
    loop.state, loop.trial, loop.pending_restore = ControllerState.STEADY, None, None
    loop.best_config = loop.best_goodput = loop.baseline_config = None
    loop.rollout = loop.replica_wait = None
    loop.reason = (f"{Event.ENGINE_SWITCHED.value}: {then.key} -> {target}; the episode's "
                   "trials and configs were the other engine's")
    meta = body.get("metadata") or {}
    log.warning("%s/%s: the loop goes to steady: %s", meta.get("namespace"), meta.get("name"),
                loop.reason)
    return RanOn(then, trial, loop.reason)


def tuning_enabled(spec: Mapping[str, Any], **_: Any) -> bool:
    return bool((spec.get("tuning") or {}).get("enabled", True))


def ended_episode(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """``status.controller``'s episode ended, as ``Controller.stop`` ends it (STEADY, no
    trial), for the reconcile to write while tuning is off; None with none under way.
    Where no daemon saw tuning turned off (the operator was down, and its resume handler
    reconciles), nothing else would end it, and tuning turned on again resumed the old
    episode with no alert asking. The trial's study entry goes stale (its process is
    gone); a daemon still running ends the trial itself, from its own copy."""
    saved = status.get("controller")
    if not isinstance(saved, Mapping):
        return None
    try:
        state = ControllerState(saved.get("state", ControllerState.STEADY.value))
    except ValueError:
        return None  # not a state this operator wrote: the daemon's build says so
    if saved.get("trial") is None and saved.get("pending_restore") is None \
            and state is ControllerState.STEADY:
        return None
    check(state, ControllerState.STEADY, Event.TUNING_OFF)
    # An owed restore ends too, as ``Controller.stop`` ends it: the sync restores the pods.
    return {"state": ControllerState.STEADY.value, "trial": None, "pending_restore": None,
            "reason": f"{Event.TUNING_OFF.value}: spec.tuning.enabled is false"}


def status_after(body: Mapping[str, Any], controller: Controller, decision: Decision,
                 action_time: str, storage: str | None = None,
                 ready: int | None = None) -> dict[str, Any]:
    """The status after ``decision``; ``storage``: the storage the CR names
    (``OperatorPolicy.named_storage``) the controller's study was opened in, put on
    record for the CR's deletion; ``ready``: the replicas that serve now
    (``status.readyReplicas`` beside the ``replicas`` asked; None: not read, left as
    it is)."""
    status = body.get("status") or {}
    loop = controller.loop
    phase = PHASES.get(decision.state, Phase.RUNNING)
    if decision.prometheus_unavailable:
        phase = Phase.DEGRADED
    tuning = decision.state in (ControllerState.TUNING, ControllerState.COMMIT)
    out: dict[str, Any] = {
        "phase": phase.value, "replicas": decision.replicas, "trials": loop.episode_trials,
        # What a restarted operator resumes from: replaced whole, not merged into the last.
        "controller": replacing(controller.to_dict(), status.get("controller")),
        "conditions": merge_conditions(status.get("conditions"), [condition(
            ConditionType.TUNING, tuning, decision.state.value.capitalize(), decision.reason,
            body["metadata"].get("generation"))])}
    if not tuning_enabled(body.get("spec") or {}):
        # Turned off since the tick read the CR: the daemon is ending, and the phase and
        # Tuning condition are the reconcile's now (spec_status.status_of); written, a
        # tick in flight left "Tuning" on a deployment that no longer tunes.
        del out["phase"], out["conditions"]
        ready = None  # the reconcile clears it: no daemon keeps it true from now on
    with contextlib.suppress(SpecError):  # an invalid spec: the reconcile handler says so
        out["config"] = config_status(parse_spec(body).engine)
    if ready is not None:
        out["readyReplicas"] = ready
    if loop.twin is not None:  # merged: status.twin.profile is the TwinTracker's to write
        out["twin"] = check_patch(loop.twin, status.get("twin"))
    if loop.best_config is not None:
        out["bestTrial"] = {"config": loop.best_config, "goodputTokS": loop.best_goodput}
    if decision.action is not Action.NONE:
        out["lastAction"] = {"action": decision.action.value, "reason": decision.reason,
                             "time": action_time}
    if storage is not None:
        out["studyStorages"] = with_storage(status, storage)
    return out


def on_record(saved: Any) -> Any:
    """``status.controller`` as a JSON merge patch leaves what the daemon wrote: without
    its null fields (the patch deletes them), at every level of its maps."""
    if isinstance(saved, Mapping):
        return {k: on_record(v) for k, v in saved.items() if v is not None}
    return saved
