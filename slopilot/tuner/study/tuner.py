"""The ask/tell ``Tuner`` the controller and the CLI drive, over a study ``storage.py`` opened.

Trials store what they measured in user attributes (the config, goodput, constraints,
the summary; ``results.py`` reads them back), so a study read back from storage needs
neither the space's encoding nor the process that ran it. A study in a database has
heartbeats (``heartbeat.py``): a trial a dead process left RUNNING is failed when the
study is opened or a trial is asked; it stays in the history and the trial count
continues past it. The queue of warm starts, judged against the space, is
``warm_starts.py``'s.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from slopilot.tuner.study.evaluator import Evaluator, WindowRejected
from slopilot.tuner.study.heartbeat import TrialHeartbeat, fail_stale, heartbeat_of
from slopilot.tuner.study.held_stops import whole
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.results import rank, result_of
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import StudyStorageError, storage_of
from slopilot.tuner.study.study_family import family_trials
from slopilot.tuner.study.warm_starts import WarmStarts

log = logging.getLogger(__name__)
STARTED_ATTR = "slopilot_started_at"
"""The user attribute a live trial's start is kept in (``Tuner.mark_started``): seconds
on the clock of the loop that applied it, not Optuna's ``datetime_start`` (the host's
local wall clock, stamped at the ask)."""


class Tuner(WarmStarts):
    """Ask/tell over one study and one search space."""

    def __init__(self, study: optuna.Study, space: SearchSpace) -> None:
        self.study = study
        self.space = space
        self._asked: dict[int, optuna.Trial] = {}
        self.heartbeat: TrialHeartbeat | None = None
        """Beats for the open trials when the study's storage has heartbeats."""

    @property
    def name(self) -> str:
        return self.study.study_name

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next config to try, with its trial number (for ``tell``).

        A queued config (``warm_start``) runs as itself or not at all: the study may have
        been queued in another space (the bounds or the budget's alignment edited since,
        an earlier slopilot's encoding). Outside this space's bounds, or off its grid, it
        is skipped, told failed with the reason, as Optuna would run it as it was queued
        (it only warns of a value outside a distribution) and the bounds are the user's;
        inside them, but written in another encoding, it is queued again in this one.
        """
        with whole():  # a stop waits until the trial is made, held and its config set
            return self._ask()

    def _ask(self) -> tuple[int, dict[str, Any]]:
        fail_stale(self.study)  # as Study.optimize does before each trial
        while True:  # each pass takes one queued trial off the queue, or samples one
            with warnings.catch_warnings():
                # Optuna warns that its heartbeat expects Study.optimize: TrialHeartbeat
                # is the same record, kept for ask/tell. A queued value outside this
                # space is judged below.
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                warnings.filterwarnings("ignore", message="Fixed parameter .* out of range")
                trial = self.study.ask()
                self._hold(trial)
                try:
                    config = self.space.suggest(trial)
                    skip, again = self._not_as_queued(trial, config)
                    if skip is None:
                        trial.set_user_attr("config", config)
                except BaseException as exc:  # told, not left running (and beating) unasked
                    self.tell_failed(trial.number, f"{type(exc).__name__}: {exc}")
                    raise
            if skip is None:
                return trial.number, config
            log.warning("study %s: trial %d skipped: %s", self.study.study_name,
                        trial.number, skip)
            self.tell_failed(trial.number, f"skipped: {skip}")
            if again is not None:
                self._enqueue(again, skip_if_exists=False)  # the same warm start, moved

    def mark_started(self, number: int, at: float) -> None:
        """Record, on trial ``number`` (asked here and not yet told), that it starts at
        ``at`` on the loop's clock: in the study's storage, before its config is applied,
        so that a loop restarted after a crash counts it in the hour's trials
        (``started_since``) though its own record of it was lost."""
        try:
            trial = self._asked[number]
        except KeyError:
            raise KeyError(f"trial {number} is not open in this tuner (asked by another "
                           "process, or already told): its start is not recorded") from None
        trial.set_user_attr(STARTED_ATTR, float(at))

    def started_since(self, since: float) -> list[float]:
        """The live trials' starts (``mark_started``) at ``since`` or later, whatever their
        state now (told, failed, stale or still running): this study's and its family's
        (``family_trials``), so that a space moved to a successor study does not forget
        the starts stamped in the one before."""
        out = []
        for t in family_trials(self.study):
            at = t.user_attrs.get(STARTED_ATTR)
            # Read from a storage anyone with the database's password may write: a value
            # that is no time is no start.
            if isinstance(at, (int, float)) and not isinstance(at, bool) \
                    and math.isfinite(at) and at >= since:
                out.append(float(at))
        return out

    def fail_stale(self) -> None:
        """Fail the study's trials that no process beats for any longer (stale past the
        storage's grace period), as an ask does first (``ports.StaleTrials``)."""
        fail_stale(self.study)

    def resume(self, number: int) -> None:
        """Go on with trial ``number``, asked by an earlier tuner of this study (the trial
        a restarted controller resumes): while it is RUNNING in storage, this tuner holds
        it open as if asked here, and beats for it. Not held, a window longer than the
        grace period failed it as stale, and its result became another trial. A trial
        that is finished, or unknown, is left as it is."""
        if number in self._asked:
            return
        try:
            trial = self._reopened(number)
            if trial is not None:
                self._hold(trial)
        except Exception as exc:  # the database: the trial may go stale, and is told anyway
            log.warning("study %s: trial %d not resumed here (%s: %s); with no heartbeat it "
                        "is failed as stale after the grace period", self.study.study_name,
                        number, type(exc).__name__, exc)

    def _reopened(self, number: int) -> optuna.Trial | None:
        """Trial ``number`` as an open ``optuna.Trial`` while it is RUNNING in storage."""
        storage = storage_of(self.study)
        if storage is None:
            return None
        study_id = storage.get_study_id_from_name(self.study.study_name)
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:
            return None
        if storage.get_trial(trial_id).state != TrialState.RUNNING:
            return None
        return optuna.Trial(self.study, trial_id)

    def _hold(self, trial: optuna.Trial) -> None:
        if self.heartbeat is None:
            self.heartbeat = heartbeat_of(self.study, trial)
        if self.heartbeat is not None:
            self.heartbeat.hold(trial.number)
        self._asked[trial.number] = trial

    def _pop(self, number: int) -> optuna.Trial:
        try:
            trial = self._asked.pop(number)
        except KeyError:
            raise KeyError(f"trial {number} is not open in this tuner (asked by another "
                           "process, or already told)") from None
        if self.heartbeat is not None:
            self.heartbeat.release(number)
        return trial

    def tell(self, number: int, result: TrialResult) -> None:
        with whole():  # a stop waits until the trial is recorded whole
            self._tell(number, result)

    def _tell(self, number: int, result: TrialResult) -> None:
        trial = self._pop(number)
        trial.set_user_attr("config", dict(result.config) or trial.user_attrs.get("config"))
        trial.set_user_attr("goodput_tok_s", result.goodput_tok_s)
        trial.set_user_attr("constraints", list(result.constraints))
        trial.set_user_attr("constraint_names", list(result.constraint_names))
        trial.set_user_attr("feasible", result.feasible)
        if result.margin:
            trial.set_user_attr("margin", result.margin)
        if result.objective is not None:
            trial.set_user_attr("objective", result.objective)
        if result.summary is not None:
            trial.set_user_attr("summary", result.summary.to_dict())
        if result.windows:
            trial.set_user_attr("windows", [
                {"name": w.name, "span": w.span, "goodput_tok_s": w.result.goodput_tok_s,
                 "constraints": list(w.result.constraints), "feasible": w.result.feasible,
                 "summary": None if w.result.summary is None else w.result.summary.to_dict()}
                for w in result.windows])
        names = result.constraint_names or tuple(f"c{i}" for i in range(len(result.constraints)))
        # Optuna counts a trial feasible when every value is <= 0: the terms shifted by
        # the headroom, so that its feasibility is the result's.
        for key, value in zip(names, result.optuna_constraints, strict=True):
            trial.set_constraint(key, value)
        self.study.tell(trial, result.value)

    def tell_failed(self, number: int, reason: str) -> None:
        with whole():
            trial = self._pop(number)
            trial.set_user_attr("fail_reason", str(reason))
            self.study.tell(trial, state=TrialState.FAIL)

    def fail_running(self, reason: str) -> list[int]:
        """Tell FAIL, with ``reason``, for every trial this tuner asked and has not told
        (its deployment is gone, or the process is stopping); returns their numbers.
        A trial asked by an earlier tuner (``LoopState.trial`` after a restart) is told
        with ``tell_failed`` on a ``ResumableTuner``."""
        numbers = sorted(self._asked)
        for number in numbers:
            self.tell_failed(number, reason)
        self.close()
        return numbers

    def close(self) -> None:
        """Stop the heartbeat; trials still open go stale after the grace period."""
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def delete_study(self) -> None:
        """Delete the study, with every trial, from its storage (its deployment is gone:
        nothing resumes it). Another process may have deleted it first: nothing to do then.
        The heartbeat stops first; it would beat on for trials no longer there."""
        self.close()
        self._asked.clear()
        storage = storage_of(self.study)
        if storage is None:
            raise StudyStorageError(
                f"study {self.study.study_name!r} was not opened by open_study, so its "
                "storage is not known: delete it with optuna.delete_study and its storage")
        try:
            optuna.delete_study(study_name=self.study.study_name, storage=storage)
        except KeyError:
            log.info("study %s: already deleted", self.study.study_name)

    def results(self) -> list[tuple[int, TrialResult]]:
        """(trial number, result) of every completed trial, in trial order."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            r = result_of(t)
            if r is not None:
                out.append((t.number, r))
        return out

    def best(self) -> TrialResult | None:
        """Best feasible by goodput; if none is feasible, the least infeasible."""
        best = self.best_trial()
        return None if best is None else best[1]

    def best_trial(self) -> tuple[int, TrialResult] | None:
        results = self.results()
        return max(results, key=lambda nr: rank(nr[1])) if results else None

    def run(self, evaluator: Evaluator, n_trials: int,
            callback: Callable[[int, TrialResult | None], None] | None = None, *,
            max_rejections: int = 5) -> TrialResult | None:
        """Offline loop: ``n_trials`` more trials (failed ones count); returns ``best()``.

        A rejected window is repeated up to ``max_rejections`` times, then the trial
        fails. An evaluator error other than a rejection fails the trial and propagates.
        """
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0:
            raise ValueError(f"n_trials={n_trials!r}: expected a count >= 0")
        held_before = set(self._asked)
        for _ in range(n_trials):
            result: TrialResult | None = None
            try:
                number, config = self.ask()
                reason = ""
                for _attempt in range(max_rejections + 1):
                    try:
                        result = evaluator.evaluate(config)
                        break
                    except WindowRejected as exc:
                        reason = exc.reason
                if result is None:
                    self.tell_failed(number, f"window rejected {max_rejections + 1} times: "
                                     f"{reason}")
                else:
                    self.tell(number, result)
            except BaseException as exc:
                # Asked here and not told (an evaluator error; a stop, Ctrl-C or SIGTERM,
                # which held_stops may raise as ask or tell returns): failed, not left
                # running.
                for asked in sorted(set(self._asked) - held_before):
                    self.tell_failed(asked, f"{type(exc).__name__}: {exc}")
                raise
            if callback is not None:
                callback(number, result)
        return self.best()

