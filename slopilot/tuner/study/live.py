"""A ``Tuner`` that can tell a trial asked by an earlier controller (resumed state).

The controller persists the running trial's number (``LoopState.trial``); after a
restart a fresh ``Tuner`` over the same storage has no open ``optuna.Trial`` for it.
A controller built on that state resumes it at once (``Tuner.resume``): reopened while
still RUNNING (the same process rebuilt its controller, or a restarted one within the
heartbeat's grace period), and beaten for by this process from then on, however long its
window. This one also tells a trial it did not resume, or one that was failed meanwhile:
reopened from storage when it is still RUNNING; when it has already
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
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.tuner import STARTED_ATTR, Tuner

log = logging.getLogger(__name__)


class ResumableTuner(Tuner):
    def __init__(self, study: optuna.Study, space: SearchSpace) -> None:
        super().__init__(study, space)
        self._resumed: set[int] = set()
        """Trials held by ``resume``: storage says whether they are still running (one
        may have been failed as stale while the database was out of reach)."""

    def resume(self, number: int) -> None:
        super().resume(number)
        if number in self._asked:
            self._resumed.add(number)

    def _stored(self, number: int) -> optuna.trial.FrozenTrial | None:
        for t in self.study.get_trials(deepcopy=False):
            if t.number == number:
                return t
        return None

    def _stored_unless_asked(self, number: int) -> optuna.trial.FrozenTrial | None:
        """The stored trial, unless this tuner asked it (then it is open here)."""
        if number in self._asked and number not in self._resumed:
            return None
        return self._stored(number)

    def _pop(self, number: int) -> optuna.Trial:
        self._resumed.discard(number)
        if number not in self._asked:
            trial = self._reopened(number)
            if trial is not None:
                return trial
        return super()._pop(number)

    def _forget(self, number: int) -> None:
        """A trial finished in storage is no longer held here."""
        self._resumed.discard(number)
        self._asked.pop(number, None)
        if self.heartbeat is not None:
            self.heartbeat.release(number)

    def tell(self, number: int, result: TrialResult) -> None:
        stored = self._stored_unless_asked(number)
        if stored is None or stored.state == TrialState.RUNNING:
            super().tell(number, result)
            return
        self._forget(number)
        if stored.state != TrialState.FAIL or "fail_reason" in stored.user_attrs:
            # Told already, by a controller whose status write was lost before its
            # process stopped (the status still had the trial running): a second
            # trial of the same config counted its window twice. Only a trial failed
            # as stale (no reason: Optuna failed it) lacks the measurement.
            log.info("study %s: trial %d was already told (%s); not told again",
                     self.study.study_name, number, stored.state.name)
            return
        names = result.constraint_names or tuple(f"c{i}" for i in range(len(result.constraints)))
        # Not a start of its own: its start is the stale trial's, counted there.
        kept = {k: v for k, v in stored.user_attrs.items() if k != STARTED_ATTR}
        attrs = {**kept, "config": dict(result.config),
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
        stored = self._stored_unless_asked(number)
        if stored is not None and stored.state != TrialState.RUNNING:
            self._forget(number)
            return  # already failed (stale) in storage: nothing more to record
        super().tell_failed(number, reason)
