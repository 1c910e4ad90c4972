"""The whole trace replayed with tune's answer before the verdict says "holds".

The windows (``engine/sim/windows.py``) are chosen so that a config that holds in each
usually holds over the whole trace, but usually is not what a capacity planner acts on: a
reviewer's trace held in its three 45 s windows on 1 replica (P1 TTFT p99 447 / 436 /
425 ms) while its whole replay, the check command tune printed, read 528 ms against
500 ms. Its worst minute was one on-burst holding several 7,000-token prompts, the
busiest by neither arrivals nor tokens, and no longer a prompt than every window's
P99-rank one. So the recommended config is replayed over the whole trace, and where it
misses, on one replica more at a time up to ``--max-replicas``: the verdict is the whole
trace's.

The replay is judged as the live alerts judge a deployment: over a sliding window, the
study's window length (``--duration``) every third of it (``HOPS``), each window by the
same terms and headroom as a study window, the worst deciding (``robust_verdict``). One
P99 over the whole file let a quiet tail hide the burst: the reviewer's trace with two
hours of light traffic after it read 436 ms over the file on 1 replica, where its burst
minutes read 528 ms. The windows come from the one replay (``engine/sim/window_stats``),
not a replay each; the whole file's P99s are kept beside them for the verdict.

The simulator replays a trace in seconds (the shipped Azure conversation trace, 1 hour
and 19,366 requests, on one replica: docs/tuning.md gives the figure), once per count
tried, against the study's dozens of window runs per trial.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.window_stats import Sliding
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.sim.robust import RobustEvaluator, WindowPlan
from slopilot.tuner.study.objective import NO_SAMPLES, TrialResult, WindowResult, score
from slopilot.tuner.study.verdict import robust_verdict, term_label, term_limit, violations

HOPS = 3
"""Sliding windows start every ``length / HOPS``: a burst shorter than two thirds of a
window lies whole in one of them, at three times the counting (not the simulating) cost."""


@dataclass(frozen=True)
class WholeRun:
    """The config replayed over the whole trace on ``replicas`` replicas."""

    replicas: int
    result: TrialResult
    """Judged over its sliding windows, the worst deciding."""
    wall_s: float
    whole: TrialResult | None = None
    """The whole file judged as one window (one P99 over every request), for the record."""

    @property
    def holds(self) -> bool:
        return self.result.feasible


@dataclass(frozen=True)
class WholeCheck:
    """The whole replays, in the order run: from the count the windows chose, one more
    each time it misses, up to ``max_replicas``."""

    runs: tuple[WholeRun, ...]
    max_replicas: int
    slo: SLOSpec
    window_s: float = 0.0
    """The sliding windows' length (the study's); 0: judged as one window."""

    @property
    def holds(self) -> bool:
        return self.runs[-1].holds

    @property
    def replicas(self) -> int | None:
        """The fewest replicas over which the whole trace holds; None when none tried does."""
        return self.runs[-1].replicas if self.holds else None

    @property
    def first(self) -> WholeRun:
        return self.runs[0]

    def figures(self, run: WholeRun) -> str:
        """Each P99 term the replay measured: ``P1 TTFT p99 352 ms of 500 ms``, closest
        to its limit first; a term over it (or short of the headroom) as ``violations``
        words it."""
        missed = violations(run.result, self.slo)
        if missed:
            if not run.result.windows:  # one window, the whole trace: no span to name
                missed = [dataclasses.replace(v, window=None) for v in missed]
            return "; ".join(v.text() for v in missed) + self._file(run)
        return self._terms(run.result) + self._file(run)

    def _file(self, run: WholeRun) -> str:
        """The whole file's P99s beside the worst window's, where they differ."""
        if run.whole is None or not run.result.windows:
            return ""
        return f"; over the whole file as one window: {self._terms(run.whole, span=False)}"

    def _terms(self, r: TrialResult, span: bool = True) -> str:
        order = sorted(range(len(r.constraints)), key=lambda i: r.constraints[i],
                       reverse=True)
        parts = []
        for i in order:
            term = r.constraint_names[i]
            if term == "preemptions_per_min" or r.constraints[i] == NO_SAMPLES:
                continue
            limit = term_limit(self.slo, term)
            where = ""
            if span and r.windows:
                worst = max(r.windows, key=lambda w: w.result.constraints[i])
                where = f" (worst {self.window_s:,.0f} s window: {worst.span})"
            parts.append(f"{term_label(term)[0]} {_ms((r.constraints[i] + 1) * limit)} "
                         f"of {_ms(limit)}{where}")
        return ", ".join(parts) or "no P99 term measured"

    def clause(self, windows_replicas: int) -> str:
        """What the whole replay adds to a verdict that the windows held on
        ``windows_replicas`` replicas."""
        first = self.first
        if first.holds:
            return (f"Replayed over the whole trace on {_count(first.replicas)} it holds "
                    f"too: {self.figures(first)}.")
        missed = (f"Replayed over the whole trace on {_count(windows_replicas)} it misses: "
                  f"{self.figures(first)}")
        if self.holds:
            last = self.runs[-1]
            return (f"{missed}; the whole trace holds on {_count(last.replicas)}: "
                    f"{self.figures(last)}.")
        last = self.runs[-1]
        more = "" if last is first else (
            f", and on {_count(last.replicas)}, --max-replicas, still misses: "
            f"{self.figures(last)}")
        return (f"{missed}{more}. The windows held and the whole trace did not: nothing is "
                f"recommended; raise --max-replicas (it is {self.max_replicas}) or relax "
                "the SLO.")

    def to_dict(self) -> dict[str, Any]:
        return {"holds": self.holds, "replicas": self.replicas,
                "max_replicas": self.max_replicas, "window_s": self.window_s,
                "tried": [{"replicas": w.replicas, "holds": w.holds, "wall_s": w.wall_s,
                           "figures": self.figures(w), "windows": len(w.result.windows),
                           "worst_window": _worst(w.result),
                           "constraints": _terms(w.result),
                           "whole_file_constraints": None if w.whole is None
                           else _terms(w.whole)}
                          for w in self.runs]}


def _terms(r: TrialResult) -> dict[str, float]:
    return dict(zip(r.constraint_names, r.constraints, strict=True))


def _worst(r: TrialResult) -> str | None:
    """The window whose closest term is nearest its limit (or furthest over it)."""
    if not r.windows:
        return None
    return max(r.windows, key=lambda w: max(w.result.constraints, default=-1.0)).span


def _ms(v: float) -> str:
    return f"{v / 1000:.1f} s" if v >= 1000 else f"{v:.0f} ms"


def _count(n: int) -> str:
    return f"{n} replica{'s' if n != 1 else ''}"


def whole_check(evaluator: RobustEvaluator, plan: WindowPlan, config: Mapping[str, Any],
                replicas: int, max_replicas: int,
                note: Callable[[str], None] = lambda _: None,
                window_s: float | None = None) -> WholeCheck:
    """Replay ``config`` over the whole trace (``plan``: ``plan_windows(whole=True)``) on
    ``replicas``, then on one more while it misses, up to ``max_replicas``, judged over
    sliding windows of ``window_s`` (the study's window length; None: the whole file as
    one window). One more at a time: the windows held on ``replicas``, so the whole
    trace misses by little."""
    if plan.kind != "whole":
        raise ValueError(f"plan.kind={plan.kind!r}: the whole-trace check replays the "
                         "whole trace (plan_windows(..., whole=True))")
    judge = RobustEvaluator(evaluator.scenario, plan, replicas=replicas,
                            margin=evaluator.margin, slo=evaluator.slo)
    runs: list[WholeRun] = []
    for n in range(replicas, max(replicas, max_replicas) + 1):
        note(f"whole trace: replaying the answer on {_count(n)} ...")
        t0 = time.perf_counter()
        if window_s is None:
            result, whole = judge.at_replicas(n).evaluate(config), None
        else:
            result, whole = _judged(judge.at_replicas(n), config, window_s)
        runs.append(WholeRun(n, result, time.perf_counter() - t0, whole))
        note(f"whole trace on {_count(n)}: {'holds' if result.feasible else 'misses'}")
        if result.feasible:
            break
    return WholeCheck(tuple(runs), max_replicas, evaluator.slo, window_s or 0.0)


def _judged(judge: RobustEvaluator, config: Mapping[str, Any], window_s: float
            ) -> tuple[TrialResult, TrialResult]:
    """The replay judged over its sliding windows, and over the whole file."""
    run = judge.replay(config, Sliding(window_s, window_s / HOPS))
    cfg = dict(config)
    whole = dataclasses.replace(
        robust_verdict(config, [WindowResult("whole trace", "the whole trace",
                                             score(run.summary, judge.slo, config=cfg))],
                       judge.margin), windows=())
    windows = [WindowResult("window", f"{w.start_s:,.0f}-{w.end_s:,.0f} s",
                            score(w.summary, judge.slo, config=cfg)) for w in run.windows]
    return robust_verdict(config, windows, judge.margin), whole
