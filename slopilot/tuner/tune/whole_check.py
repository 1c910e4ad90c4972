"""The whole trace replayed with tune's answer before the verdict says "holds".

The windows (``engine/sim/windows.py``) are chosen so that a config that holds in each
usually holds over the whole trace, but usually is not what a capacity planner acts on: a
reviewer's trace held in its three 45 s windows on 1 replica (P1 TTFT p99 447 / 436 /
425 ms) while its whole replay, the check command tune printed, read 528 ms against
500 ms. Its worst minute was one on-burst holding several 7,000-token prompts, the
busiest by neither arrivals nor tokens, and no longer a prompt than every window's
P99-rank one. So the recommended config is replayed over the whole trace, and where it
misses, on more replicas up to ``--max-replicas``: the verdict is the whole trace's.

The replay is judged as the live alerts judge a deployment: over windows of the study's
length (``--duration``), each by the same terms and headroom as a study window, the worst
deciding (``robust_verdict``), beside the whole file as one window (what the check command
prints). Windows start every third of the length (``HOPS``), and a burst longer than two
thirds of a window is split between two on the grid, each reading it diluted; so the
replay is swept for the windows between them (``engine/sim/window_sweep``): where a
sweep of every request's first token finds a window from an arrival whose TTFT P99 is
higher than all of theirs, and where a sweep of every request's token gaps finds one
whose TBT P99 is over its limit with the headroom (counted per request against it:
a TBT burst of long prefills stretching every running request's gaps, which each grid
window read diluted under the target), that window is measured in full and judged too:
the verdict is the worst window of that length anywhere in the trace, by TTFT and by TBT
against its limit (exactly: where no window's P99 rank lies among the gaps over the
limit, those whose P99 reads between a gap under it and one over are read from those two
gaps, kept per request, and the highest is measured where it misses). One P99 over the
whole file let a quiet tail hide the burst: the reviewer's trace with two hours of light
traffic after it read 436 ms over the file on 1 replica, where its burst minutes read
528 ms. The grid's windows come from the one replay (``engine/sim/window_stats``), not a
replay each; the worst windows between them cost a second replay (one for all), and only
where a sweep finds one worse.

A window that misses only on classes it holds fewer requests of than the live loop judges
a trial on (``DEFAULT_CLASS_REQUESTS``, 100: its P99 is its slowest request or next to
it) is set aside and said, as the study says of its own windows (``run.few_requests``);
the whole file, which holds every request, still judges each class. Without that, a
quiet minute of 24 requests failed a config on one 478 ms first token.

Where the answer misses, the replica counts are searched from one more, galloping (1, 2,
4, ... more) until one holds, then bisected (``fewest_holding``): a fleet that needs 12
replicas costs 8 replays from 1, not 12. That takes holding as monotone in the count, and
it is not quite: a window's P99 rests on where its few largest requests land, which moves
with the count, so N may hold while N + 1 misses and the bisection land on N. So the
count it finds is checked as the windows' capacity answer is (``loop/steady_count.py``):
its next count is replayed too (one replay more, none where the bisection replayed it or
it is ``--max-replicas``), and the answer is the smallest count that holds with its next
count holding; a count that held while the next missed is named (``lucky``). The count
the windows chose is not checked so when it holds: the capacity answer ran its next count
on the windows already (or it is the ``--replicas`` tune was asked about), and a replay
more on every trace would double the check's cost where it holds.

The simulator replays a trace in seconds (the shipped Azure conversation trace, 1 hour
and 19,366 requests, on one replica: docs/tuning.md gives the figure), once per count
tried, against the study's dozens of window runs per trial.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from slopilot.engine.sim.simulator import SimRun
from slopilot.engine.sim.window_stats import Sliding, SlidingStats, WindowFigures
from slopilot.engine.sim.window_sweep import ttft_p99s, worst_gap_starts, worst_starts
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.loop.settings import DEFAULT_CLASS_REQUESTS
from slopilot.tuner.loop.steady_count import SteadyCount, given_up, steady_count
from slopilot.tuner.sim.robust import RobustEvaluator, WindowPlan
from slopilot.tuner.study.objective import NO_SAMPLES, TrialResult, WindowResult, score
from slopilot.tuner.study.sample_floor import judged_counts, shortfall, starved
from slopilot.tuner.study.verdict import (
    replicas_text,
    robust_verdict,
    term_label,
    term_limit,
    violations,
)

HOPS = 3
"""Sliding windows start every ``length / HOPS``: a burst shorter than two thirds of a
window lies whole in one of them, at three times the counting (not the simulating) cost;
a longer one is found by the sweep (``window_sweep``)."""


class ReplayProgress(Protocol):
    """Where the whole replays show (``TuneProgress.replay``)."""

    def replay(self, status: str, planned_s: float) -> Callable[[float], None]:
        """A replay of ``planned_s`` simulated seconds begins; the feed it returns is
        told the seconds simulated so far in it."""
        ...


@dataclass(frozen=True)
class ThinWindow:
    """A window that missed only on classes it held a handful of requests of."""

    span: str
    missed: str
    """``P1 TTFT p99 478 ms``: its worst term."""
    short: str
    """``P1 24 of 100 requests in 45 s`` (``Shortfall.describe``)."""


@dataclass(frozen=True)
class WholeRun:
    """The config replayed over the whole trace on ``replicas`` replicas."""

    replicas: int
    result: TrialResult
    """Judged over its sliding windows, the worst deciding."""
    wall_s: float
    whole: TrialResult | None = None
    """The whole file judged as one window (one P99 over every request); it is among
    ``result``'s windows too."""
    thin: tuple[ThinWindow, ...] = ()
    """Windows set aside: they missed on fewer requests of a class than the floor."""
    replays: int = 1
    """Simulations run for it: a second where the sweep found a window off the grid."""

    @property
    def holds(self) -> bool:
        return self.result.feasible


@dataclass(frozen=True)
class WholeCheck:
    """The whole replays, in the order run: from the count the windows chose, then
    galloping and bisecting up to ``max_replicas`` (``fewest_holding``), the count found
    checked against its next (``steady_count``)."""

    runs: tuple[WholeRun, ...]
    max_replicas: int
    slo: SLOSpec
    window_s: float = 0.0
    """The sliding windows' length (the study's); 0: judged as one window."""
    answer: int | None = None
    """The fewest replicas that hold with the next count holding too (or that are the
    windows' count, or ``max_replicas``); None where no count tried does."""
    lucky: tuple[int, ...] = ()
    """Counts that held while their next count missed (``steady_count``)."""
    gave_up: bool = False
    """Holding flipped at ``steady_count.RECHECKS`` + 1 counts: ``answer`` is the smallest
    count that holds above the largest count replayed that missed, its next count not
    checked."""

    @property
    def holds(self) -> bool:
        return self.answer is not None

    @property
    def held(self) -> WholeRun | None:
        """The run of the answer; None when no count tried holds (with its next)."""
        return next((r for r in self.runs if r.replicas == self.answer), None)

    @property
    def highest(self) -> WholeRun:
        """The run on the most replicas tried."""
        return max(self.runs, key=lambda r: r.replicas)

    @property
    def replicas(self) -> int | None:
        """The fewest replicas over which the whole trace holds (with the next count
        holding too); None when none tried does."""
        return self.answer

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
            return "; ".join(v.text() for v in missed) + self._file(run) + self._thin(run)
        return self._terms(run.result) + self._file(run) + self._thin(run)

    def _file(self, run: WholeRun) -> str:
        """The whole file's P99s beside the worst window's, where they differ."""
        if run.whole is None or not run.result.windows:
            return ""
        return f"; over the whole file as one window: {self._terms(run.whole, span=False)}"

    def _thin(self, run: WholeRun) -> str:
        if not run.thin:
            return ""
        worst = run.thin[0]
        n = len(run.thin)
        return (f"; {n} {self.window_s:,.0f} s window{'s' if n != 1 else ''} set aside that "
                f"missed on fewer than {DEFAULT_CLASS_REQUESTS} requests of a class (worst: "
                f"{worst.missed} in {worst.span}, {worst.short}), as the live loop judges "
                "no trial on fewer (min_class_requests)")

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
            return (f"Replayed over the whole trace on {replicas_text(first.replicas)} it holds "
                    f"too: {self.figures(first)}.")
        missed = (f"Replayed over the whole trace on {replicas_text(windows_replicas)} it misses: "
                  f"{self.figures(first)}")
        held = self.held
        if held is not None:
            return (f"{missed}; the whole trace holds on {replicas_text(held.replicas)}: "
                    f"{self.figures(held)}.{self._flips()}")
        last = self.highest
        more = "" if last is first else (
            f", and on {replicas_text(last.replicas)}, --max-replicas, still misses: "
            f"{self.figures(last)}")
        return (f"{missed}{more}.{self._flips()} The windows held and the whole trace did "
                f"not: nothing is recommended; raise --max-replicas (it is "
                f"{self.max_replicas}) or relax the SLO.")

    def _flips(self) -> str:
        """Where a count held and its next missed, a sentence saying so (after a
        space); "" where holding was monotone over the counts replayed."""
        if not self.lucky:
            return ""
        pairs = "; ".join(f"{replicas_text(n)} held but {n + 1} missed" for n in self.lucky)
        stopped = (f"; after {len(self.lucky)} such counts the climb stopped"
                   if self.gave_up else "")
        if self.answer is None:
            end = "and no count replayed holds with the count above it holding too"
        elif self.gave_up:
            end = given_up(self.answer, {w.replicas: w.holds for w in self.runs},
                           "replayed")
        else:
            end = (f"so the answer is {self.answer}, the smallest count replayed that "
                   "holds with its next count holding too")
        return (f" Over the whole trace holding is not monotonic in the count: {pairs} (a "
                f"window's P99 rests on where its few largest requests land){stopped}, "
                f"{end}.")

    def to_dict(self) -> dict[str, Any]:
        return {"holds": self.holds, "replicas": self.replicas,
                "max_replicas": self.max_replicas, "window_s": self.window_s,
                "monotonic": not self.lucky, "lucky": list(self.lucky),
                "gave_up": self.gave_up,
                "tried": [{"replicas": w.replicas, "holds": w.holds, "wall_s": w.wall_s,
                           "replays": w.replays,
                           "figures": self.figures(w), "windows": len(w.result.windows),
                           "thin_windows": len(w.thin),
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


def fewest_holding(first: int, last: int, holds: Callable[[int], bool]) -> int | None:
    """The fewest replicas in ``[first, last]`` for which ``holds``; None where ``last``
    misses. ``first`` first (the windows' count: the whole trace usually misses by
    little), then one more, two, four ... past the last that missed until one holds (or
    ``last``), then bisected between them; each count asked once."""
    if holds(first):
        return first
    missed, step = first, 1
    while True:
        n = min(missed + step, last)
        if n <= missed:
            return None
        if holds(n):
            held = n
            break
        if n == last:
            return None
        missed, step = n, 2 * step
    while held - missed > 1:
        mid = (missed + held) // 2
        if holds(mid):
            held = mid
        else:
            missed = mid
    return held


def whole_check(evaluator: RobustEvaluator, plan: WindowPlan, config: Mapping[str, Any],
                replicas: int, max_replicas: int,
                note: Callable[[str], None] = lambda _: None,
                window_s: float | None = None,
                progress: ReplayProgress | None = None) -> WholeCheck:
    """Replay ``config`` over the whole trace (``plan``: ``plan_windows(whole=True)``) on
    ``replicas``, and where it misses the fewest replicas up to ``max_replicas`` over which
    it holds (``fewest_holding``) with its next count holding too (``steady_count``),
    judged over windows of ``window_s`` (the study's window length; None: the whole file
    as one window). ``progress`` is shown each replay."""
    if plan.kind != "whole":
        raise ValueError(f"plan.kind={plan.kind!r}: the whole-trace check replays the "
                         "whole trace (plan_windows(..., whole=True))")
    judge = RobustEvaluator(evaluator.scenario, plan, replicas=replicas,
                            margin=evaluator.margin, slo=evaluator.slo)
    runs: dict[int, WholeRun] = {}

    def holds(n: int) -> bool:
        if n in runs:  # the steadiness check reads the search's replays again
            return runs[n].holds
        note(f"whole trace: replaying the answer on {replicas_text(n)} ...")
        t0 = time.perf_counter()

        def replay(status: str) -> RobustEvaluator:
            # An evaluator a replay: its feed counts from 0 within the replay shown.
            on_n = judge.at_replicas(n)
            if progress is not None:
                on_n.progress = progress.replay(f"whole trace on {replicas_text(n)}: {status}",
                                                plan.simulated_s)
            return on_n

        if window_s is None:
            run = WholeRun(n, replay("replaying").evaluate(config), 0.0)
        else:
            run = _judged(replay, config, window_s)
        runs[n] = dataclasses.replace(run, wall_s=time.perf_counter() - t0)
        note(f"whole trace on {replicas_text(n)}: {'holds' if run.holds else 'misses'}")
        return run.holds

    top = max(replicas, max_replicas)
    found = fewest_holding(replicas, top, holds)
    # The windows' count, where it holds, had its next count run on the windows; a count
    # the replays' own bisection found has had none.
    steady = SteadyCount(found) if found == replicas else \
        steady_count(found, holds, runs.keys, top, top)
    return WholeCheck(tuple(runs.values()), max_replicas, evaluator.slo, window_s or 0.0,
                      steady.replicas, steady.lucky, steady.gave_up)


def _judged(replay: Callable[[str], RobustEvaluator], config: Mapping[str, Any],
            window_s: float) -> WholeRun:
    """The replay judged over its windows (the grid's, and the sweep's worst off it),
    those of a handful of requests set aside, and over the whole file; ``replay(status)``
    is the evaluator for each replay on this count."""
    judge = replay("replaying")
    run = judge.replay(config, Sliding(window_s, window_s / HOPS,
                                       tbt_margin=judge.margin))
    cfg = dict(config)
    whole_result = score(run.summary, judge.slo, config=cfg)
    whole = dataclasses.replace(
        robust_verdict(config, [WindowResult("whole trace", "the whole trace", whole_result)],
                       judge.margin), windows=())
    result, thin = _verdict(config, run.windows, whole_result, judge)
    replays = 1
    # A window more can only raise the worst: where the grid's already miss, the verdict
    # is "misses" without it, and the search would pay a second replay on every count
    # below the answer.
    extra = _off_grid(run, window_s) if result.feasible else ()
    if extra:
        again = replay(f"the worst {window_s:,.0f} s window off the grid")
        more = again.replay(config, Sliding(window_s, None, at=extra)).windows
        result, thin = _verdict(config, [*run.windows, *more], whole_result, judge)
        replays = 2
    return WholeRun(judge.replicas or 1, result, 0.0, whole, thin, replays)


def _verdict(config: Mapping[str, Any], figures: Sequence[WindowFigures],
             whole_result: TrialResult, judge: RobustEvaluator
             ) -> tuple[TrialResult, tuple[ThinWindow, ...]]:
    """The windows' verdict beside the whole file's, those of a handful set aside (the
    worst of them first)."""
    cfg = dict(config)
    kept: list[WindowResult] = []
    thin: list[tuple[float, ThinWindow]] = []
    for w in sorted(figures, key=lambda w: (w.start_s, w.end_s)):
        span = f"{w.start_s:,.0f}-{w.end_s:,.0f} s"
        result = score(w.summary, judge.slo, config=cfg)
        aside = _thin(result, judge, w.end_s - w.start_s, span)
        if aside is None:
            kept.append(WindowResult("window", span, result))
        else:
            thin.append((max(result.constraints), aside))
    kept.append(WindowResult("whole trace", "the whole trace", whole_result))
    thin.sort(key=lambda t: t[0], reverse=True)
    return robust_verdict(config, kept, judge.margin), tuple(t for _, t in thin)


def _off_grid(run: SimRun, window_s: float) -> tuple[float, ...]:
    """The starts, off the grid, of windows that the sweeps (``window_sweep``) find worse
    than the grid's, each measured in full by a second replay: a class's TTFT P99 above
    every grid window's, or its TBT P99 over its limit with the headroom
    (``GapWindow.misses``: where any window is past the limit, the one found is; one
    that holds is not replayed, its full measurement reads the same P99). Only windows
    of at least ``DEFAULT_CLASS_REQUESTS`` of the class: one of fewer that missed would be set aside
    (``_thin``), and a replay spent on it."""
    stats = run.stats
    if not isinstance(stats, SlidingStats):
        return ()
    grid = [w.start_s for w in run.windows]
    out = []
    for worst in worst_starts(stats.first_tokens, window_s, stats.start_time,
                              stats.end_time, floor=DEFAULT_CLASS_REQUESTS):
        if worst.requests < DEFAULT_CLASS_REQUESTS:
            continue
        on_grid = ttft_p99s(stats.first_tokens, worst.priority, grid, window_s,
                            stats.end_time)
        if all(g.ttft_p99_ms < worst.ttft_p99_ms for g in on_grid):
            out.append(worst.start_s)
    out += [w.start_s for w in worst_gap_starts(
        stats.token_gaps, window_s, stats.start_time, stats.end_time,
        floor=DEFAULT_CLASS_REQUESTS) if w.misses]
    return tuple(sorted(set(out) - set(grid)))


def _thin(result: TrialResult, judge: RobustEvaluator, length_s: float, span: str
          ) -> ThinWindow | None:
    """The window, where it misses (headroom counted) only on terms of classes it holds
    fewer than ``DEFAULT_CLASS_REQUESTS`` of, none of them starved (clients waiting while
    few are served: that is no handful's luck, ``sample_floor.starved``)."""
    missed = [i for i, c in enumerate(result.constraints) if c > -judge.margin]
    summary = result.summary
    if not missed or summary is None:
        return None
    counts = judged_counts(summary, judge.slo)
    hungry = starved(summary, judge.slo, DEFAULT_CLASS_REQUESTS)
    classes = set()
    for i in missed:
        label = result.constraint_names[i].split(".")[0]
        if label not in counts or counts[label] >= DEFAULT_CLASS_REQUESTS or label in hungry:
            return None
        classes.add(label)
    short = shortfall(summary, judge.slo, DEFAULT_CLASS_REQUESTS, length_s, classes)
    i = max(missed, key=lambda k: result.constraints[k])
    term = result.constraint_names[i]
    limit = term_limit(judge.slo, term)
    return ThinWindow(span, f"{term_label(term)[0]} {_ms((result.constraints[i] + 1) * limit)}",
                      short.describe() if short is not None else "")
