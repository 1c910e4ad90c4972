"""What one ``slopilot tune`` run found (``TuneOutcome``), the configs it chose among
(``Candidate``: the study's trials and the start config) and what it cost (``Timing``):
the run builds it, the text and JSON output and the report read it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slopilot.tuner.loop.settings import DEFAULT_CLASS_REQUESTS
from slopilot.tuner.sim.robust import WindowPlan
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import Violation, term_label, term_requests, worst_share
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


TIE_MARGIN = 0.05
"""How much further from its limit (a share of it: 5 percentage points) a trial's closest
term must be than the start config's for a tie on goodput to go to the trial. The
study's order gives a tie to more headroom by any amount, and a reviewer's tune of the
conversation trace recommended nine knob changes for 56 % against 59 %, another term
worse: three points of one window's P99, which a few requests more or less move."""


def ties(a: TrialResult, b: TrialResult) -> bool:
    """The same objective (goodput), to float noise."""
    return math.isclose(a.value, b.value, rel_tol=1e-9, abs_tol=1e-12)


def _lead(trial: TrialResult, start: TrialResult) -> float:
    """How much further from its limit the trial's closest term is than the start
    config's, as a share of the limit."""
    return max(start.constraints, default=0.0) - max(trial.constraints, default=0.0)


def _short_of_margin(trial: TrialResult, start: TrialResult) -> bool:
    """A trial that holds, ties the start config (which holds too) and is ahead only on
    headroom, by less than ``TIE_MARGIN``: within noise, so no win."""
    return (trial.feasible and start.feasible and ties(trial, start)
            and _lead(trial, start) < TIE_MARGIN)


def candidates(start: TrialResult, trials: Sequence[tuple[int, TrialResult]]
               ) -> list[Candidate]:
    """The start config and ``trials``, best first by the study's own order (``rank``),
    but a trial that ties the start config on goodput goes above it only with its closest
    term ``TIE_MARGIN`` further from its limit: knob changes that buy nothing, or a
    P99's noise, are not recommended. The start config comes first among equals. It is
    compared, not queued as a trial: it is evaluated anyway, may lie outside the space
    the trials are drawn from, and queued it would take one of the ``--trials`` asked for
    (and one more at each resume of a stored study)."""
    every = [Candidate(start), *(Candidate(r, n) for n, r in trials)]
    ranked = sorted(every, key=lambda c: rank(c.result), reverse=True)  # stable: start first
    # The trials above it that only tie it, ranked by headroom, are the ones just above it:
    # those short of the margin go below it.
    i = j = next(k for k, c in enumerate(ranked) if c.is_start)
    while j > 0 and _short_of_margin(ranked[j - 1].result, start):
        j -= 1
    ranked.insert(j, ranked.pop(i))
    return ranked


def _goodput(r: TrialResult) -> str:
    """The objective a tie is on, as a person reads it."""
    if r.objective is not None:
        return f"goodput share {r.objective:.1%}"  # the lowest window's, what is ranked
    return f"mean goodput over the windows {r.goodput_tok_s:,.1f} tok/s"


def _closest(r: TrialResult) -> str:
    return f"{max(r.constraints, default=-1.0) + 1:.0%}"


def _few(r: TrialResult) -> str:
    """Where the trial's closest term is a P99 over fewer requests than the live loop
    judges a class on: so said, as the tie rests on it."""
    name = worst_share(r)[1]
    counted = None if name is None else term_requests(r, name)
    if counted is None or counted[1] >= DEFAULT_CLASS_REQUESTS:
        return ""
    return (f"; that term, {term_label(name or '')[0]}, is judged on few requests: "
            f"{counted[0]}'s {counted[1]:,.0f}, fewer than the {DEFAULT_CLASS_REQUESTS} the "
            "live loop judges a class on")


def tie_clause(trial: TrialResult, start: TrialResult) -> str | None:
    """Where a recommended trial ties the start config on goodput and wins on headroom,
    that said (the rule, not only its outcome); None where it has more goodput."""
    if not ties(trial, start):
        return None
    return (f"It ties the start config on goodput ({_goodput(trial)}); its closest term is "
            f"{_lead(trial, start) * 100:.0f} pp further from its limit ({_closest(trial)} "
            f"against {_closest(start)}; a tie goes to a trial {TIE_MARGIN * 100:.0f} pp or "
            f"more further){_few(trial)}.")


def kept_clause(start: TrialResult, best_trial: tuple[int, TrialResult] | None) -> str:
    """Why no trial replaces the start config, in the verdict's words."""
    if best_trial is None:
        return "no trial completed"
    n, r = best_trial
    if not r.feasible:
        return "no trial holds it"
    if ties(r, start) and _lead(r, start) > 0:
        return (f"no trial beats it (the best, trial {n}, ties it on goodput, "
                f"{_goodput(r)}; its closest term, at {_closest(r)} of its limit against "
                f"its {_closest(start)}, is {_lead(r, start) * 100:.0f} pp further from it, "
                f"less than the {TIE_MARGIN * 100:.0f} pp a tie must win by{_few(r)})")
    return (f"no trial beats it (the best, trial {n}: mean goodput over the windows "
            f"{r.goodput_tok_s:,.1f} tok/s "
            f"against its {start.goodput_tok_s:,.1f}, closest term at {_closest(r)} of its "
            "limit)")


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
