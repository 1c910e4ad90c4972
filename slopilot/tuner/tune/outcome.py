"""What one ``slopilot tune`` run found (``TuneOutcome``), the configs it chose among
(``Candidate``: the study's trials and the start config) and what it cost (``Timing``):
the run builds it, the text and JSON output and the report read it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slopilot.tuner.sim.robust import WindowPlan
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import Violation
from slopilot.tuner.tune.capacity import CapacityOutcome
from slopilot.tuner.tune.settings import TuneSettings
from slopilot.tuner.tune.whole_check import WholeCheck


@dataclass(frozen=True)
class Timing:
    """What the run cost, in a form that transfers between machines: simulated seconds
    per wall second of the study (the capacity search's N-replica runs are slower)."""

    evaluations: int
    simulated_s: float
    study_s: float
    total_s: float = 0.0

    @property
    def sim_s_per_wall_s(self) -> float:
        return self.simulated_s / self.study_s if self.study_s > 0 else 0.0

    def line(self) -> str:
        from slopilot.engine.sim.progress import duration_text

        text = (f"{self.evaluations} evaluations, {self.simulated_s:,.0f} simulated s in "
                f"{duration_text(self.study_s)} ({self.sim_s_per_wall_s:,.1f} sim-s/s)")
        if self.total_s > self.study_s + 1:
            text += (f"; {duration_text(self.total_s)} in all (the capacity search and the "
                     "whole-trace replays included)")
        return text

    def to_dict(self) -> dict[str, float]:
        return {"evaluations": self.evaluations, "simulated_s": self.simulated_s,
                "study_s": self.study_s, "total_s": self.total_s,
                "sim_s_per_wall_s": self.sim_s_per_wall_s}


@dataclass(frozen=True)
class Candidate:
    """A config the run may recommend: one of the study's trials, or the start config."""

    result: TrialResult
    trial: int | None = None
    """The trial's number; None: the start config."""

    @property
    def is_start(self) -> bool:
        return self.trial is None

    @property
    def label(self) -> str:
        return "the start config" if self.trial is None else f"trial {self.trial}"


def candidates(start: TrialResult, trials: Sequence[tuple[int, TrialResult]]
               ) -> list[Candidate]:
    """The start config and ``trials``, best first by the study's own order (``rank``).
    The start config comes first among equals: a trial that only ties it would be knob
    changes that buy nothing. It is compared, not queued as a trial: it is evaluated
    anyway, may lie outside the space the trials are drawn from, and queued it would take
    one of the ``--trials`` asked for (and one more at each resume of a stored study)."""
    every = [Candidate(start), *(Candidate(r, n) for n, r in trials)]
    return sorted(every, key=lambda c: rank(c.result), reverse=True)  # stable: start first


@dataclass(frozen=True)
class TuneOutcome:
    settings: TuneSettings
    plan: WindowPlan
    tuner: Tuner
    start: TrialResult
    best: Candidate
    """The best config on the replicas tuned at: a trial, or the start config when no
    trial ranks above it."""
    best_trial: tuple[int, TrialResult] | None
    """The best of the study's trials (None when none completed), which the start config
    is compared with."""
    violations: tuple[Violation, ...]
    """What the best (least violating) config misses; empty when it holds."""
    sentence: str
    """The verdict in one sentence."""
    capacity: CapacityOutcome | None
    recommended_replicas: int | None
    config: Mapping[str, Any] | None
    changes: Mapping[str, Any] | None
    """The knobs ``config`` changes from the start config (empty: keep it as it is);
    None when nothing is recommended."""
    command: str
    check_command: str | None
    timing: Timing
    warnings: tuple[str, ...] = ()
    """What the user asked for that may keep the verdict from transferring (a --warmup
    shorter than the trace's requests live), each naming the flag and the fix."""
    whole: WholeCheck | None = None
    """The answer replayed over the whole trace (``whole_check.py``); None where windows
    did not choose it (a trace judged whole, a generated workload) or nothing is
    recommended."""

    @property
    def feasible(self) -> bool:
        """The windows' verdict: the best config holds in every window on --replicas."""
        return self.best.result.feasible

    @property
    def holds(self) -> bool:
        """The run's verdict: a config and a count are recommended that hold the SLO (in
        every window, and over the whole trace where it was replayed); False where
        nothing is, whichever judgement found nothing."""
        return self.recommended_replicas is not None and self.config is not None
