"""``SlidingStats``: one replay's figures over each sliding window of it, beside its own.

A whole-trace replay judged as one P99 lets a long quiet tail dilute the burst that the
live alerts, which judge a sliding window, would fire on. Replaying each window apart
costs one run per window; a ``SimStats`` per window, fed by the one run, gives the same
figures (each window's requests followed to their end on the engine the whole trace drove
them to) for the cost of counting each token once per window that holds its request.
"""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slopilot.engine.request import Priority, Request
from slopilot.engine.sim.stats import SimStats, to_ms
from slopilot.engine.slo import slo_term, term_holds
from slopilot.engine.window_summary import RunInfo, WindowSummary

if TYPE_CHECKING:
    from slopilot.engine.engine import LLMEngine
    from slopilot.engine.outputs import SchedulerOutput
    from slopilot.engine.slo import SLOSpec


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``length_s`` every ``hop_s`` over a run's measured span, and one from
    each of ``at`` (the starts a sweep of the run found worst: ``window_sweep.py``);
    ``hop_s`` None: those alone."""

    length_s: float
    hop_s: float | None
    at: tuple[float, ...] = ()
    tbt_margin: float = 0.0
    """The verdict's headroom (``RobustEvaluator.margin``): ``SlidingStats.token_gaps``
    counts a request's gaps over the largest gap whose TBT term holds with it
    (``tbt_limit_s``), so that a window's TBT P99 over that is a miss exactly where the
    verdict reads one (``window_sweep.worst_gap_starts``)."""

    def __post_init__(self) -> None:
        for name, v in (("length_s", self.length_s), ("hop_s", self.hop_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"Sliding.{name}={v!r}: expected seconds > 0")
        if not 0.0 <= self.tbt_margin < 1.0:
            raise ValueError(f"Sliding.tbt_margin={self.tbt_margin!r}: expected the "
                             "verdict's headroom, a fraction in [0, 1), e.g. 0.1")
        if self.hop_s is None and not self.at:
            raise ValueError("Sliding(hop_s=None, at=()): no window; give hop_s (seconds "
                             "between starts) or at (the starts)")

    def starts(self, start_s: float, end_s: float) -> list[float]:
        """The windows' starts over ``[start_s, end_s)``: every ``hop_s`` while a whole
        window fits, and one more ending at ``end_s`` so that the last arrivals are in a
        window of full length; one window (the span) where it is shorter than one; and
        each of ``at`` within the span (a window from it ends early at ``end_s``)."""
        grid = self.grid(start_s, end_s)
        out = [] if grid is None else [grid.start(k) for k in range(grid.count)]
        out += self.off_grid(start_s, end_s)
        return sorted(set(out))

    def grid(self, start_s: float, end_s: float) -> Grid | None:
        """The grid of ``starts`` (None without ``hop_s``), as a rule, not a list: over a
        long span it is millions of starts, and only those near a request are wanted."""
        if self.hop_s is None:
            return None
        last = end_s - self.length_s
        if last <= start_s:
            return Grid(start_s, self.hop_s, 1)
        n = math.floor((last - start_s) / self.hop_s + 1e-9)
        return Grid(start_s, self.hop_s, n + 1)

    def off_grid(self, start_s: float, end_s: float) -> list[float]:
        """The starts of ``starts`` the grid's rule does not give: the window ending at
        ``end_s`` where the grid stops short of it, and each of ``at`` within the span."""
        out = [s for s in self.at if start_s <= s < end_s]
        grid = self.grid(start_s, end_s)
        last = end_s - self.length_s
        if grid is not None and last > start_s and last - grid.start(grid.count - 1) > 1e-9:
            out.append(last)
        return sorted(set(out))


def tbt_limit_s(target_ms: float, margin: float) -> float:
    """The largest gap in seconds that, read as a window's TBT P99, the verdict counts as
    holding ``target_ms`` with ``margin`` headroom: the full measurement's own test of
    its P99 (``stats.to_ms``, ``slo.slo_term``, ``slo.term_holds``, as ``percentile_ms``
    and ``objective.score`` apply them). Found, not computed as ``target_ms * (1 -
    margin) / 1000``: that lay an ulp off the verdict's edge for about a tenth of
    targets and margins (10 ms at 10 %: 0.009 s counted at or under it, where a 9.0 ms
    P99 reads -0.09999999999999998, a miss). The term never falls as the gap rises (each
    float operation rounds monotonically), so the gaps that hold are those up to one
    float, bisected over the bit patterns of floats >= 0, which order as their values."""

    def holds(gap_s: float) -> bool:
        return term_holds(slo_term(to_ms(gap_s), target_ms), margin)

    if not holds(0.0):
        raise ValueError(f"margin={margin!r}: no TBT P99 holds {target_ms!r} ms with it; "
                         "expected a headroom in [0, 1), e.g. 0.1")
    lo, hi = 0, _bits(math.inf)  # lo holds, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(_float(mid)):
            lo = mid
        else:
            hi = mid
    return _float(lo)


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


@dataclass(frozen=True, slots=True)
class Grid:
    """Starts ``origin + k * hop`` for ``k`` in ``[0, count)``."""

    origin: float
    hop: float
    count: int

    def start(self, k: int) -> float:
        return self.origin + k * self.hop

    def between(self, lo: float, hi: float) -> list[float]:
        """Its starts in ``[lo, hi]``, computed as ``start`` computes them (the same
        floats the list of them held)."""
        first = max(0, math.floor((lo - self.origin) / self.hop) - 1)
        last = min(self.count - 1, math.floor((hi - self.origin) / self.hop) + 1)
        return [s for s in map(self.start, range(first, last + 1)) if lo <= s <= hi]


@dataclass(frozen=True, slots=True)
class FirstToken:
    """One request's arrival, class and time to first token."""

    arrival_s: float
    priority: Priority
    ttft_s: float


class TokenGaps:
    """Per class with a TBT target, each measured request's arrival, token gaps and gaps
    above ``over_s`` (its class's limit): what a window's TBT P99 against that limit
    needs of a request, since a gap counts in the windows holding its request's arrival
    (``SimStats.on_token_gap``); and its largest gap at or under the limit and smallest
    over it, the two a window's P99 reads between where its rank lies just under the gaps
    over the limit (``window_sweep.GapWindow.misses``). 32 bytes a request (an 8-byte
    arrival, two 4-byte counts, two 8-byte gaps) and nothing a token: 1M requests, 32 MB,
    where a float32 a gap would be 4 bytes a token (1M requests of 300 tokens, 1.2 GB).
    A request still streaming holds a dict entry too, until it finishes."""

    def __init__(self, over_s: dict[Priority, float]) -> None:
        self.over_s = over_s
        self._arrival = {p: array("d") for p in over_s}
        self._gaps = {p: array("i") for p in over_s}
        self._over = {p: array("i") for p in over_s}
        # float64, as the gaps: the P99 interpolated between two is numpy's to the bit.
        self._below = {p: array("d") for p in over_s}
        self._above = {p: array("d") for p in over_s}
        self._row: dict[str, int] = {}

    def first_token(self, req: Request) -> None:
        """A measured request's first token: its row, before any gap."""
        arrival = self._arrival.get(req.priority)
        if arrival is None:  # no TBT target: nothing to judge its gaps by
            return
        self._row[req.request_id] = len(arrival)
        arrival.append(req.arrival_time)
        self._gaps[req.priority].append(0)
        self._over[req.priority].append(0)
        self._below[req.priority].append(-math.inf)
        self._above[req.priority].append(math.inf)

    def gap(self, req: Request, gap_s: float) -> None:
        row = self._row.get(req.request_id)
        if row is None:
            return
        p = req.priority
        self._gaps[p][row] += 1
        if gap_s > self.over_s[p]:
            self._over[p][row] += 1
            if gap_s < (above := self._above[p])[row]:
                above[row] = gap_s
        elif gap_s > (below := self._below[p])[row]:
            below[row] = gap_s

    def finished(self, req: Request) -> None:
        self._row.pop(req.request_id, None)

    def close(self) -> None:
        self._row.clear()

    def series(self, priority: Priority) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The class's arrivals (sorted), and each one's gaps and gaps over the limit."""
        if priority not in self._arrival:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros(0, dtype=np.float64), empty, empty
        arrival = np.frombuffer(self._arrival[priority], dtype=np.float64)
        order = np.argsort(arrival, kind="stable")
        return (arrival[order],
                np.frombuffer(self._gaps[priority], dtype=np.int32)[order].astype(np.int64),
                np.frombuffer(self._over[priority], dtype=np.int32)[order].astype(np.int64))

    def nearest(self, priority: Priority) -> tuple[np.ndarray, np.ndarray]:
        """The class's requests by arrival, as ``series`` orders them: each one's largest
        gap at or under the limit (-inf: none) and smallest over it (inf: none)."""
        if priority not in self._arrival:
            empty = np.zeros(0, dtype=np.float64)
            return empty, empty
        order = np.argsort(np.frombuffer(self._arrival[priority], dtype=np.float64),
                           kind="stable")
        return (np.frombuffer(self._below[priority], dtype=np.float64)[order],
                np.frombuffer(self._above[priority], dtype=np.float64)[order])

    def __len__(self) -> int:
        return sum(len(a) for a in self._arrival.values())


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One sliding window's figures."""

    start_s: float
    end_s: float
    summary: WindowSummary


class SlidingStats(SimStats):
    """``SimStats`` over the whole measured span, and a ``SimStats`` per sliding window."""

    def __init__(self, slo: SLOSpec, end_time: float, sliding: Sliding, *,
                 start_time: float = 0.0, horizon: float | None = None) -> None:
        super().__init__(slo, end_time, start_time=start_time, horizon=horizon)
        self.sliding = sliding
        # A window's SimStats (~2.4 KB) is made when an arrival or a step first falls in
        # it, not for every start up front: a trace's span, quiet time included, made
        # one per hop (a stray time's 54 years, millions), where its requests make a
        # few per request at most. A window nothing falls in reads nothing and is not
        # listed.
        self._grid = sliding.grid(start_time, end_time)
        self._off_grid = sliding.off_grid(start_time, end_time)
        self._parts: dict[float, SimStats] = {}
        self._of: dict[str, list[SimStats]] = {}
        self.first_tokens: list[FirstToken] = []
        """Every measured request's first token, for a sweep over every window start
        (``window_sweep.py``): one record a request, not a window's count a start."""
        self.token_gaps = TokenGaps({
            p: tbt_limit_s(c.tbt_p99_ms, sliding.tbt_margin)
            for p in Priority if (c := slo.class_slo(p)).tbt_p99_ms is not None})
        """Every measured request's token gaps, counted against its class's TBT limit,
        for the TBT sweep (``window_sweep.worst_gap_starts``)."""

    @property
    def made(self) -> int:
        """How many windows an arrival or a step has fallen in (each one's SimStats)."""
        return len(self._parts)

    @property
    def parts(self) -> list[SimStats]:
        """The windows made, by start."""
        return [self._parts[s] for s in sorted(self._parts)]

    def _starts_near(self, t: float) -> list[float]:
        # Called per step and per arrival: only the windows that can hold t, from the
        # grid's rule and the few starts off it.
        lo, hi = t - self.sliding.length_s - 1e-9, t
        starts = [] if self._grid is None else self._grid.between(lo, hi)
        at = self._off_grid
        starts += at[bisect_left(at, lo):bisect_right(at, hi)]
        return sorted(set(starts))

    def _near(self, t: float) -> list[SimStats]:
        return [self._part(s) for s in self._starts_near(t)]

    def _holding(self, t: float) -> list[SimStats]:
        return [self._part(s) for s in self._starts_near(t)
                if s <= t < min(s + self.sliding.length_s, self.end_time)]

    def _part(self, start: float) -> SimStats:
        part = self._parts.get(start)
        if part is None:
            part = self._parts[start] = SimStats(
                self.slo, min(start + self.sliding.length_s, self.end_time),
                start_time=start, horizon=self.horizon)
        return part

    def on_arrival(self, req: Request) -> None:
        super().on_arrival(req)
        parts = self._holding(req.arrival_time)
        if parts:
            self._of[req.request_id] = parts
        for p in parts:
            p.on_arrival(req)

    def on_rejected(self, arrival_time: float, priority: Priority, max_tokens: int, *,
                    for_load: bool = False) -> None:
        super().on_rejected(arrival_time, priority, max_tokens, for_load=for_load)
        for p in self._holding(arrival_time):
            p.on_rejected(arrival_time, priority, max_tokens, for_load=for_load)

    def on_displaced(self, req: Request) -> None:
        super().on_displaced(req)
        for p in self._of.get(req.request_id, ()):
            p.on_displaced(req)

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        super().on_step(engine, out, elapsed_s, now)
        for p in self._near(now):
            p.on_step(engine, out, elapsed_s, now)

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        super().on_first_token(req, ttft_s, now)
        if self.start_time <= req.arrival_time < self.end_time:
            self.first_tokens.append(FirstToken(req.arrival_time, req.priority, ttft_s))
            self.token_gaps.first_token(req)
        for p in self._of.get(req.request_id, ()):
            p.on_first_token(req, ttft_s, now)

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        super().on_token_gap(req, gap_s, now)
        if self._counted(req, now):  # the gaps the windows' SimStats count, and no other
            self.token_gaps.gap(req, gap_s)
        for p in self._of.get(req.request_id, ()):
            p.on_token_gap(req, gap_s, now)

    def on_finished(self, req: Request, now: float) -> None:
        super().on_finished(req, now)
        self.token_gaps.finished(req)
        for p in self._of.pop(req.request_id, ()):
            p.on_finished(req, now)

    def close(self) -> None:
        super().close()
        self.token_gaps.close()
        for p in self.parts:
            p.close()

    def windows(self, run: RunInfo | None = None, replicas: int | None = None
                ) -> list[WindowFigures]:
        return [WindowFigures(p.start_time, p.end_time,
                              p.summary(p.end_time - p.start_time, run, replicas=replicas))
                for p in self.parts]
