"""Trials the operator ends without a controller's verdict, and their end in their study.

A trial is left on the pods only while a controller watches it. Two ends come from the
operator rather than from the loop's steps:

- No controller can be built for the CR (its study's storage unreadable, a spec or an
  operator's policy that refuses it): the trial on record is ended in the loop state
  (``end_unbuilt``), as ``Controller._hold`` ends one Prometheus cannot watch. Left on
  record, its config served unwatched for as long as the build failed (hours of a
  storage outage, an edit the operator refuses), and a controller built afterwards
  resumed it and judged it on a window that had measured nothing it tuned: a stale
  trial was committed. Ended, it counts as a failed trial of its episode, and the
  episode's config is owed to the pods (``pending_restore``): the daemon's sync brings
  them to the committed config at once where the spec is accepted, and where it is not,
  to the episode's config over the last spec the operator accepted
  (``DeploymentLoop._take_back``; on vLLM, the Deployment's arguments:
  vllm_take_back.py); the controller built next applies it before anything
  else (``restore.py``) and the episode goes on.
- The study's storage switched (``spec.tuning.storage`` edited, or
  ``SLOPILOT_DEFAULT_STORAGE`` changed under a CR that names none) while a trial or an
  episode was under way (``end_on_storage_switch``): its trial's number was asked in the
  old storage's study, and resumed in the new one it was no trial of that study (a
  controller error, a rollback and a whole cooldown). The episode ends as a backend
  switch ends it (``storage_switched``, to STEADY, no cooldown); the next alert starts
  one in the new storage. One edit that switches the backend (or model) too has
  ended the episode already (``rebase_episode``): the trial it hands on is kept for the
  old storage's study the same way, not told failed in the new one.

- The loop's status took no write for ``STATUS_GIVE_UP_S`` (deployment_loop.py): the
  loop itself ended its trial (told failed, ``UNWRITTEN``) and put the episode's config
  back, with no status to say so. A build that finds that trial still on record ends it
  in the loop state (``end_told``), as ``end_unbuilt`` does, and does not resume it.

Either way the trial is kept in ``LoopState.ended_trial`` (its storage, as the CR named
it, its study, number, config and target) and told failed in its own study by the next
build (``fail_ended``), the end its ``fail_reason``; a storage the policy no longer
allows is never opened for it, and a trial not told (a storage still down) goes stale
there, as a switch's does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from slopilot.operator.daemon import study_name
from slopilot.operator.engine_switch import RanOn
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.study_cleanup import recorded_storages
from slopilot.operator.study_storage import StorageRefused, resolve_storage
from slopilot.operator.tuned_base import target_of
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state import (
    ControllerState,
    EndedTrial,
    LoopState,
    PendingRestore,
    RunningTrial,
)
from slopilot.tuner.loop.transitions import Event, check
from slopilot.tuner.study.results import result_of
from slopilot.tuner.study.storage import StudyStorageError, stored_trial
from slopilot.tuner.study.storage_url import shown
from slopilot.tuner.study.study_family import LeftTrial, fail_left_trial, in_family, told_failed
from slopilot.tuner.study.study_target import StudyTarget

log = logging.getLogger(__name__)

UNBUILT = "no_controller"
"""How an ended trial's ``fail_reason`` begins where no controller could be built."""

UNWRITTEN = "status_unwritable"
"""How the reason of a trial begins that a loop ended because its status took no write
(``DeploymentLoop._end_unrecorded_trial``), its ``fail_reason`` too."""


def trial_storage(status: Mapping[str, Any] | None) -> str | None:
    """The storage (as the CR names it) the loop state's study was last opened in: the
    newest of ``status.studyStorages``, which each status write of the daemon keeps.
    None where none is on record (a status from before the field)."""
    storages = recorded_storages(status)
    return storages[-1] if storages else None


UNREADABLE_KEPT = (
    "until it is, no trial is kept on the pods: they run the committed config "
    "(status.tunedConfig.committed; the spec's where none was committed)")
"""What the ``Tuning`` condition adds where the loop state on record cannot be read and
the spec is accepted (``DeploymentLoop._running_trial``)."""


def unreadable(saved: Any) -> bool:
    """Whether ``saved`` (``status.controller``) is a loop state this version cannot read
    (another slopilot's, or a hand edit's): no trial of it is watched, nor ended in it."""
    if saved is None:
        return False
    try:
        LoopState.from_dict(saved)
    except ControllerError:
        return True
    return False


def end_unbuilt(saved: Any, why: str, storage: str | None, now: float) -> LoopState | None:
    """The loop state on record (``saved``) with its trial ended because no controller
    can be built (``why``), its episode's config owed to the pods; None where no trial
    is on record, or the state cannot be read (the build's error says so)."""
    if not isinstance(saved, Mapping):
        return None
    try:
        state = LoopState.from_dict(saved)
    except ControllerError:
        return None
    t = state.trial
    if t is None:
        return None
    reason = (f"{UNBUILT}: no controller could be built to watch the trial ({why}); its "
              "config was taken off the pods")
    state.ended_trial = EndedTrial(t.number, reason, storage=storage, study=t.study,
                                   config=dict(t.config), target=state.target)
    state.trial = None
    state.episode_trials += 1  # a failed trial of its episode, as any other
    if state.pending_restore is None:
        # On the loop's clock, which the build has none of: owed since the trial began
        # (its end is not on record), tried at once.
        state.pending_restore = PendingRestore(
            since=t.started_at, attempts=0, retry_at=t.started_at, trial=t.number,
            error=f"trial {t.number} ended with no controller to watch it")
    state.reason = f"{UNBUILT}: trial {t.number} ended, its config taken off the pods"
    return state


def end_on_storage_switch(state: LoopState, body: Mapping[str, Any], named: str,
                          ran_on: RanOn | None = None) -> RanOn | None:
    """End ``state``'s episode where the study's storage is no longer the one it ran in
    (``named``, the storage the CR names now, against ``trial_storage``): its trial is
    kept in ``ended_trial`` for the old storage's study (module docstring).

    ``ran_on`` is ``rebase_episode``'s answer: where one edit switched the backend (or
    model) too, that switch has ended the episode already, and the trial it hands on
    is the old storage's. It goes to ``ended_trial`` with that storage, and the answer
    returned no longer carries it: told failed by the study's open, it was looked for
    in the new storage, where it never was, and stayed RUNNING in its own."""
    then = trial_storage(body.get("status"))
    if then is None or then == named:
        return ran_on
    if ran_on is not None and ran_on.trial is not None:
        left = ran_on.trial
        state.ended_trial = EndedTrial(
            left.number, ran_on.reason, storage=then, study=left.study,
            config=None if left.config is None else dict(left.config),
            target=ran_on.target.key)
        return replace(ran_on, trial=None)
    if not (state.trial is not None or state.episode_open):
        return ran_on
    check(state.state, ControllerState.STEADY, Event.STORAGE_SWITCHED)
    reason = (f"{Event.STORAGE_SWITCHED.value}: {shown(then)} -> {shown(named)}; the "
              "episode's trials were the other storage's study's")
    t = state.trial
    if t is not None:
        state.ended_trial = EndedTrial(t.number, reason, storage=then, study=t.study,
                                       config=dict(t.config), target=state.target)
    state.state, state.trial, state.reason = ControllerState.STEADY, None, reason
    state.rollout = state.replica_wait = None
    meta = body.get("metadata") or {}
    log.warning("%s/%s: the loop goes to steady: %s", meta.get("namespace"), meta.get("name"),
                reason)
    return ran_on


def fail_ended(state: LoopState, body: Mapping[str, Any], policy: OperatorPolicy,
               named: str) -> None:
    """Tell ``state.ended_trial`` failed in its own study, and forget it: a storage the
    policy refuses is not opened, and one that cannot be reached leaves the trial to go
    stale (said in the log)."""
    ended, state.ended_trial = state.ended_trial, None
    if ended is None:
        return
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    if _is_running(state, ended):
        # Every end clears the trial it keeps here: both on record is no state the
        # operator wrote (a hand-made or forged status). Failed, the trial the loop
        # goes on measuring was committed afterwards against its study's record.
        log.warning("%s: status.controller.ended_trial names trial %d, the trial still "
                    "running on record: ignored, the trial goes on (%s)", key,
                    ended.number, ended.reason)
        return
    storage = ended.storage if ended.storage is not None else named
    target = StudyTarget.from_key(ended.target) if ended.target is not None \
        else target_of(body)
    left = LeftTrial(ended.number, ended.study, ended.config)
    try:
        url = resolve_storage(storage, policy.storage_rules, meta["namespace"])
        failed = fail_left_trial(url, study_name(meta["namespace"], meta["name"],
                                                 str(meta.get("uid") or "")),
                                 target, left, ended.reason)
    except (StorageRefused, StudyStorageError) as exc:
        log.warning("%s: trial %d, ended without a verdict, not told failed (it goes "
                    "stale): %s", key, ended.number, exc)
        return
    if failed is not None:
        log.info("%s: trial %d told failed in study %s: %s", key, ended.number, failed,
                 ended.reason)


def _is_running(state: LoopState, ended: EndedTrial) -> bool:
    """Whether ``ended`` may be the trial ``state`` still runs (same number, and the same
    study where both name one)."""
    t = state.trial
    return t is not None and t.number == ended.number and (
        t.study is None or ended.study is None or t.study == ended.study)


def _readable(t: RunningTrial, body: Mapping[str, Any], policy: OperatorPolicy,
              named: str) -> str | None:
    """The URL of storage ``named`` where trial ``t`` (of the loop state in ``body``'s
    status) may be looked for in it; None where it names no study or another CR's, or
    the policy refuses the storage."""
    if t.study is None:
        return None
    meta = body["metadata"]
    # The status is writable by whoever may write it: another CR's study named there is
    # not read (its trials' failure reasons would be written into this CR's status).
    if not in_family(study_name(meta["namespace"], meta["name"], meta.get("uid") or ""),
                     t.study):
        log.warning("%s/%s: the trial on record names study %r, not this CR's: not read",
                    meta["namespace"], meta["name"], t.study)
        return None
    try:
        return resolve_storage(named, policy.storage_rules, meta["namespace"])
    except StorageRefused:
        return None


def _told(t: RunningTrial, body: Mapping[str, Any], policy: OperatorPolicy,
          named: str) -> FrozenTrial | None:
    """Trial ``t`` (of the loop state in ``body``'s status) as its study in storage
    ``named`` holds it, where it was told there (COMPLETE, or FAIL); None where it still
    runs, is not there, names no study or another CR's, or the storage cannot be read."""
    url = _readable(t, body, policy, named)
    if url is None or t.study is None:
        return None
    try:
        told = stored_trial(url, t.study, t.number)
    except StudyStorageError as exc:
        log.warning("%s/%s: trial %d's end not read in its study (%s): resumed",
                    body["metadata"]["namespace"], body["metadata"]["name"], t.number, exc)
        return None
    return told if told is not None and told.state in (TrialState.COMPLETE,
                                                       TrialState.FAIL) else None


@dataclass(frozen=True)
class TrialOnRecord:
    """The trial a CR's loop state on record still runs, where its study may be read."""

    storage: str = field(repr=False)
    """The study's storage, its URL (not in the repr: a PostgreSQL one's password)."""
    study: str
    number: int


def trial_on_record(body: Mapping[str, Any], policy: OperatorPolicy) -> TrialOnRecord | None:
    """The trial ``body``'s loop state (``status.controller``) still runs, in the storage
    its spec names; None where none runs, the state or the spec cannot be read, or its
    study may not be read (another CR's named, a storage the policy refuses)."""
    saved = (body.get("status") or {}).get("controller")
    try:
        state = LoopState.from_dict(saved) if isinstance(saved, Mapping) else None
        spec = parse_spec(body)
    except (ControllerError, SpecError):
        return None
    if state is None or state.trial is None:
        return None
    named = policy.named_storage(spec.tuning.storage, body["metadata"]["namespace"])
    url = _readable(state.trial, body, policy, named)
    if url is None or state.trial.study is None:
        return None
    return TrialOnRecord(url, state.trial.study, state.trial.number)


def failed_in_study(trial: TrialOnRecord) -> bool:
    """Whether ``trial`` was told failed in its study already (``end_told``'s test: a
    loop ended it). False where the study does not say so, or cannot be read."""
    try:
        return told_failed(trial.storage, trial.study, trial.number) is not None
    except StudyStorageError:
        return False


def end_told(state: LoopState, body: Mapping[str, Any], policy: OperatorPolicy,
             named: str) -> None:
    """End ``state``'s trial where its study was told its end already, so that it is
    not resumed (a study that cannot be read leaves the state as it is: the factory's own
    open says why; a trial failed as stale, with no reason, is resumed: its window is
    not in the study yet, ``ResumableTuner.tell``).

    - Told failed with a reason: a loop whose status took no write ended it
      (``UNWRITTEN``) and put the episode's config back on the pods, or its loop told it
      failed and was killed before the status said so. Resumed, its config went back on
      its pod and its window, which had measured the episode's config since, was judged
      (and committed over its study's FAIL). It is ended as ``end_unbuilt`` ends one,
      its episode's config owed to the pods.
    - Told its window (``_told_window``): the loop was killed after the tell, before the
      status said so."""
    t = state.trial
    if t is None:
        return
    told = _told(t, body, policy, named)
    if told is None:
        return
    if told.state is TrialState.COMPLETE:
        _told_window(state, body, t, told)
        return
    reason = told.user_attrs.get("fail_reason")
    if not isinstance(reason, str):
        return  # failed as stale: resumed, and its window told as a trial of its own
    meta = body["metadata"]
    state.trial = None
    state.episode_trials += 1
    if state.pending_restore is None:
        # On the loop's clock, which the build has none of: owed since the trial began
        # (its end is not on record), tried at once.
        state.pending_restore = PendingRestore(
            since=t.started_at, attempts=0, retry_at=t.started_at, trial=t.number,
            error=f"trial {t.number} was ended in its study ({reason})")
    state.reason = f"trial {t.number} was told failed in its study: {reason}"
    log.warning("%s/%s: the trial on record, %d, was ended already (%s): not resumed, "
                "the episode's config owed to the pods", meta["namespace"], meta["name"],
                t.number, reason)


def _told_window(state: LoopState, body: Mapping[str, Any], t: RunningTrial,
                 told: FrozenTrial) -> None:
    """Trial ``t`` on record was told its window's verdict (``told``) by a loop killed
    before its status said so. Resumed, it was judged again on a window measured up to
    the restarted tick (after the cut of a breach, on a pod that ran the restored config
    meanwhile, or at a load that moved): a trial the study holds infeasible was
    committed, or one it holds feasible, and committed already, was followed by the next
    trial; and its config went back on its pod for that window. The study's verdict is
    the loop's, as at the tell (``trial_window._scored``): a window that held makes the
    trial the episode's best and resumes its commit (COMMIT); one that missed ends the
    trial, and the episode asks its next one. A completed trial whose result this
    version cannot read ends as one told failed does, its episode's config owed."""
    meta = body["metadata"]
    result = result_of(told)
    state.trial = None
    state.episode_trials += 1
    if result is None:
        if state.pending_restore is None:
            state.pending_restore = PendingRestore(
                since=t.started_at, attempts=0, retry_at=t.started_at, trial=t.number,
                error=f"trial {t.number} was told in its study, its result unread")
        state.reason = f"trial {t.number} was told in its study; its result unread"
    elif result.feasible and state.state is ControllerState.TUNING:
        state.count_measured()
        state.episode_feasible += 1
        if state.best_goodput is None or result.goodput_tok_s > state.best_goodput:
            state.best_config, state.best_goodput = dict(t.config), result.goodput_tok_s
        check(state.state, ControllerState.COMMIT, Event.TRIAL_HOLDS)
        state.state = ControllerState.COMMIT
        state.reason = (f"trial {t.number} holds the SLO (goodput "
                        f"{result.goodput_tok_s:.0f} tok/s), as told to its study before "
                        "a restart")
    else:
        state.count_measured()
        state.reason = (f"trial {t.number} {'holds' if result.feasible else 'infeasible'}"
                        ", as told to its study before a restart")
    log.warning("%s/%s: the trial on record, %d, was told in its study already: not "
                "resumed nor judged again (%s)", meta["namespace"], meta["name"], t.number,
                state.reason)
