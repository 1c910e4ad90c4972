"""A ``Tuner`` that can tell a trial asked by an earlier controller (resumed state).

The controller persists the running trial's number (``LoopState.trial``); after a
restart a fresh ``Tuner`` over the same storage has no open ``optuna.Trial`` for it.
This one reopens it from storage when it is still RUNNING (the same process rebuilt its
controller, or a restarted one within the heartbeat's grace period); when it has already
been failed as stale (its process died and stopped beating, ``heartbeat.py``), the
measured result is added as a new completed trial with the same parameters, so the live
measurement is not lost. A trial already told (the controller that told it stopped before
its status said so) is not told again: its window would count twice.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.tuner import Tuner, storage_of

log = logging.getLogger(__name__)


class ResumableTuner(Tuner):
    def _stored(self, number: int) -> optuna.trial.FrozenTrial | None:
        for t in self.study.get_trials(deepcopy=False):
            if t.number == number:
                return t
        return None

    def _pop(self, number: int) -> optuna.Trial:
        if number not in self._asked:
            stored = self._stored(number)
            storage = storage_of(self.study)
            if stored is not None and stored.state == TrialState.RUNNING and storage:
                study_id = storage.get_study_id_from_name(self.study.study_name)
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
                return optuna.Trial(self.study, trial_id)
        return super()._pop(number)

    def tell(self, number: int, result: TrialResult) -> None:
        stored = None if number in self._asked else self._stored(number)
        if stored is None or stored.state == TrialState.RUNNING:
            super().tell(number, result)
            return
        if stored.state != TrialState.FAIL or "fail_reason" in stored.user_attrs:
            # Told already, by a controller whose status write was lost before its
            # process stopped (the status still had the trial running): a second
            # trial of the same config counted its window twice. Only a trial failed
            # as stale (no reason: Optuna failed it) lacks the measurement.
            log.info("study %s: trial %d was already told (%s); not told again",
                     self.study.study_name, number, stored.state.name)
            return
        names = result.constraint_names or tuple(f"c{i}" for i in range(len(result.constraints)))
        attrs = {**stored.user_attrs, "config": dict(result.config),
                 "goodput_tok_s": result.goodput_tok_s,
                 "constraints": list(result.constraints),
                 "constraint_names": list(names), "feasible": result.feasible,
                 "resumed_from_trial": number}
        if result.summary is not None:
            attrs["summary"] = result.summary.to_dict()
        self.study.add_trial(optuna.trial.create_trial(
            params=stored.params, distributions=stored.distributions,
            value=result.goodput_tok_s, user_attrs=attrs,
            constraints=dict(zip(names, result.constraints, strict=True))))

    def tell_failed(self, number: int, reason: str) -> None:
        stored = None if number in self._asked else self._stored(number)
        if stored is not None and stored.state != TrialState.RUNNING:
            return  # already failed (stale) in storage: nothing more to record
        super().tell_failed(number, reason)
