"""The worst window of a given length anywhere in a run, by each class's TTFT P99 and
by its TBT P99 against its limit.

Sliding windows every ``hop`` seconds judge a burst whole only where one of them holds
it: a burst longer than ``length - hop`` may be split between two, each reading it
half-diluted, while the window from its first arrival reads it whole (a 39.5 s burst of
45 s windows every 15 s: 416 ms in every window, 488 ms in its own). Counting every
window start in full costs a ``SimStats`` per start per token; the TTFT P99 of each
window from each arrival costs one record per request (``SlidingStats.first_tokens``)
and a percentile per arrival. The window that sweep finds worst is then measured in full
like the others (``Sliding.at``), so the verdict reads the same figures on it.

Starts at the arrivals alone: a window's requests change only where its start passes
an arrival (or its end does: dropping the last arrivals from a window of 100 or more
could move its P99 a rank, which the grid's windows and the next arrival's bound).

The TBT P99 is over a window's token gaps, millions where its TTFT P99 is over hundreds
of first tokens: a percentile per start is a sort of them each. But the verdict asks
only whether it is above a limit (the largest gap whose term holds the class's target
with the headroom, ``window_stats.tbt_limit_s``: the verdict's own test, to the ulp),
and that is read from how many gaps are above it: sorted, they are the top ``over`` of
``gaps``, and numpy's P99 reads rank ``r = 0.99 (gaps - 1)`` (linear between
``floor(r)`` and the one above). With ``floor(r)`` among them the P99 is above the
limit; with ``floor(r) + 1`` not, it is not; in between (one rank: ``depth`` -1) it
rests on two gaps' values: the window's largest at or under the limit and its smallest
over it. So each request's gaps and gaps over its class's limit are counted as they
come, beside those two gaps of its own (``window_stats.TokenGaps``, 32 bytes a request),
a window's counts are two prefix sums over its arrivals (a gap counts in the windows
holding its request's arrival, as ``SimStats`` counts it: the figures are the window's
own), and the start whose P99 rank lies deepest among the gaps over the limit is the one
a miss would show in: where any window's P99 rank is among them, that one's is. Where
none is, the windows of the band read their P99 as numpy does, between the largest and
the smallest of their requests' two gaps (``RangeMax``), and the highest is the one: it
misses exactly where any window does (``GapWindow.misses``). Starts at the arrivals and
at each arrival less the length: a window's requests change where its start passes an
arrival or its end does, and a share can rise as its end drops one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.window_stats import FirstToken, TokenGaps

P99 = 99 / 100
"""The quantile ``np.percentile(x, 99)`` reads (it divides by 100): the ranks and the
band's P99s are computed from it as numpy computes them, to the bit."""


@dataclass(frozen=True, slots=True)
class WorstStart:
    """The window from ``start_s`` whose ``priority`` TTFT P99 is the highest found."""

    priority: Priority
    start_s: float
    ttft_p99_ms: float
    requests: int
    """First tokens of the class the window's P99 ranks."""


def worst_starts(first_tokens: Sequence[FirstToken], length_s: float, start_s: float,
                 end_s: float, *, floor: int = 0) -> list[WorstStart]:
    """Per class, the window of ``length_s`` from an arrival within ``[start_s, end_s -
    length_s]`` (or from ``start_s`` where the span is shorter) with the highest TTFT
    P99; with ``floor``, the highest among windows of at least ``floor`` of the class's
    first tokens, and beside it the highest of fewer where that is higher still (a
    verdict that sets windows of a handful aside needs the worst it keeps)."""
    if not length_s > 0:
        raise ValueError(f"length_s={length_s!r}: expected seconds > 0")
    last = max(start_s, end_s - length_s)
    out: list[WorstStart] = []
    for p in Priority:
        arrivals, _ = _series(first_tokens, p)
        if not len(arrivals):
            continue
        starts = np.unique(np.concatenate(
            ([start_s], arrivals[(arrivals >= start_s) & (arrivals <= last)])))
        best: WorstStart | None = None
        thin: WorstStart | None = None
        for found in ttft_p99s(first_tokens, p, starts.tolist(), length_s, end_s):
            if found.requests >= floor:
                if best is None or found.ttft_p99_ms > best.ttft_p99_ms:
                    best = found
            elif thin is None or found.ttft_p99_ms > thin.ttft_p99_ms:
                thin = found
        if best is not None:
            out.append(best)
        if thin is not None and (best is None or thin.ttft_p99_ms > best.ttft_p99_ms):
            out.append(thin)
    return out


def ttft_p99s(first_tokens: Sequence[FirstToken], priority: Priority,
              starts: Sequence[float], length_s: float, end_s: float) -> list[WorstStart]:
    """The class's TTFT P99 over the arrivals in each window ``[start, min(start +
    length_s, end_s))`` of ``starts``, where it has any."""
    arrivals, ttft = _series(first_tokens, priority)
    at = np.asarray(starts, dtype=np.float64)
    lo = np.searchsorted(arrivals, at, side="left")
    hi = np.searchsorted(arrivals, np.minimum(at + length_s, end_s), side="left")
    return [WorstStart(priority, s, float(np.percentile(ttft[i:j], 99)) * 1000.0, j - i)
            for s, i, j in zip(at.tolist(), lo.tolist(), hi.tolist(), strict=True) if j > i]


def _series(first_tokens: Sequence[FirstToken], priority: Priority
            ) -> tuple[np.ndarray, np.ndarray]:
    """The class's arrivals (sorted) and their TTFTs."""
    rows = sorted((f.arrival_s, f.ttft_s) for f in first_tokens if f.priority is priority)
    return (np.array([a for a, _ in rows], dtype=np.float64),
            np.array([t for _, t in rows], dtype=np.float64))


@dataclass(frozen=True, slots=True)
class GapWindow:
    """The window from ``start_s``: its ``priority`` requests' token gaps, and how many
    are above the class's limit (``TokenGaps.over_s``)."""

    priority: Priority
    start_s: float
    requests: int
    """Requests of the class with a first token in it."""
    gaps: int
    over: int
    limit_s: float = math.inf
    """The class's limit the gaps are counted over (``TokenGaps.over_s``)."""
    p99_s: float | None = None
    """numpy's P99 of the window's gaps where ``depth`` is -1 (read from the two gaps it
    lies between); None elsewhere, where the depth alone says."""

    @property
    def depth(self) -> int:
        """How far the P99's rank lies among the gaps over the limit: 0 or more, its P99
        is above the limit; -1, it may be (it reads between a gap over and one not:
        ``p99_s``); less, it is not."""
        return self.over - (self.gaps - math.floor((self.gaps - 1) * P99))

    @property
    def could_miss(self) -> bool:
        return self.gaps > 0 and self.depth >= -1

    @property
    def misses(self) -> bool:
        """Whether the window's TBT P99 is over the limit: its depth, and in the one-rank
        band its ``p99_s`` (without one, a window built by hand: it may)."""
        depth = self.depth
        if self.gaps <= 0 or depth < -1:
            return False
        if depth >= 0:
            return True
        if self.gaps == 1:  # its one gap is its P99, and at or under the limit
            return False
        return self.p99_s is None or self.p99_s > self.limit_s

    @property
    def share(self) -> float:
        return self.over / self.gaps if self.gaps else 0.0


def worst_gap_starts(token_gaps: TokenGaps, length_s: float, start_s: float, end_s: float,
                     *, floor: int = 0) -> list[GapWindow]:
    """Per class with a TBT limit, the window of ``length_s`` from within ``[start_s,
    end_s - length_s]`` (or from ``start_s`` where the span is shorter) of at least
    ``floor`` requests of the class whose P99 rank lies deepest among the gaps over the
    limit (``GapWindow.depth``; the highest share of them among equals). Arrays, not an
    object a start: two starts a request, ~170 bytes a request while it runs (1M
    requests: 0.7 s, 169 MB at its peak, on the shared 2-core build machine)."""
    if not length_s > 0:
        raise ValueError(f"length_s={length_s!r}: expected seconds > 0")
    last = max(start_s, end_s - length_s)
    out: list[GapWindow] = []
    for p in token_gaps.over_s:
        series = token_gaps.series(p)
        arrivals = series[0]
        if not len(arrivals):
            continue
        edges = np.concatenate((arrivals, arrivals - length_s))
        starts = np.unique(np.concatenate(
            ([start_s, last], edges[(edges >= start_s) & (edges <= last)])))
        lo, hi, requests, gaps, over = _counts(series, starts, length_s, end_s)
        keep = (requests >= floor) & (gaps > 0)
        if not keep.any():
            continue
        starts, lo, hi = starts[keep], lo[keep], hi[keep]
        requests, gaps, over = requests[keep], gaps[keep], over[keep]
        depth = over - (gaps - _rank(gaps))
        # None past the limit by rank: the band's P99s decide, the highest first.
        p99 = _band_p99s(token_gaps, p, lo, hi, gaps, depth) if depth.max() == -1 else None
        if p99 is not None and p99.max() > -np.inf:
            best = int(np.argmax(p99))
        else:
            p99, best = None, int(np.lexsort((over / gaps, depth))[-1])
        out.append(GapWindow(p, float(starts[best]), int(requests[best]), int(gaps[best]),
                             int(over[best]), token_gaps.over_s[p],
                             None if p99 is None else float(p99[best])))
    return out


def gap_windows(token_gaps: TokenGaps, priority: Priority, starts: Sequence[float],
                length_s: float, end_s: float) -> list[GapWindow]:
    """The class's gaps and gaps over its limit in each window ``[start, min(start +
    length_s, end_s))`` of ``starts``, counted by their requests' arrivals."""
    at = np.asarray(starts, dtype=np.float64)
    lo, hi, requests, gaps, over = _counts(token_gaps.series(priority), at, length_s, end_s)
    p99 = _band_p99s(token_gaps, priority, lo, hi, gaps, over - (gaps - _rank(gaps)))
    limit = token_gaps.over_s.get(priority, math.inf)
    return [GapWindow(priority, s, r, g, o, limit, None if math.isinf(q) else q)
            for s, r, g, o, q in zip(at.tolist(), requests.tolist(), gaps.tolist(),
                                     over.tolist(), p99.tolist(), strict=True)]


def _rank(gaps: np.ndarray) -> np.ndarray:
    """The rank numpy's P99 of ``gaps`` gaps reads from (``np.percentile``, linear:
    ``floor((n - 1) * 0.99)``), computed as numpy computes it, to the bit: the band's
    P99 is interpolated from it (``_band_p99s``)."""
    return np.floor((gaps - 1) * P99).astype(np.int64)


def _band_p99s(token_gaps: TokenGaps, priority: Priority, lo: np.ndarray, hi: np.ndarray,
               gaps: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """numpy's P99 of each window's gaps (requests ``lo`` to ``hi`` by arrival) whose depth
    is -1; -inf for the others. Its rank ``f`` is the window's largest gap at or under
    the limit and ``f + 1`` its smallest over it (the window holds ``over = gaps - f - 1``
    over it), the largest and the smallest of its requests' own (``TokenGaps.nearest``);
    interpolated as ``np.percentile`` interpolates (its ``_lerp``), so the window misses
    exactly where this is over the limit. ``CHUNK`` windows at a time: every window of
    1M requests in the band held 330 MB of temporaries at once."""
    out = np.full(len(lo), -np.inf)
    band = np.flatnonzero((depth == -1) & (gaps > 1))  # one gap: it, under the limit
    if not len(band):
        return out
    below, above = token_gaps.nearest(priority)
    largest, smallest = RangeMax(below), RangeMax(-above)
    for at in (band[i:i + CHUNK] for i in range(0, len(band), CHUNK)):
        a = largest.over(lo[at], hi[at])
        b = -smallest.over(lo[at], hi[at])
        index = (gaps[at] - 1) * P99
        t = index - np.floor(index)
        diff = b - a
        out[at] = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return out


CHUNK = 1 << 16
"""Windows of the band read at a time: a few MB of temporaries."""
BLOCK = 64
"""Requests a block of ``RangeMax``'s: a window within one is read request by request."""


class RangeMax:
    """``max(values[i:j])`` for any ``i < j``: each block's running maxima from its start
    and to its end, and a sparse table over the blocks' maxima, so a window costs a few
    lookups however many requests it holds, and the structure 3 copies of the values and
    a 64th of them a level (a reduce a window cost its length; a sparse table over the
    values themselves, 20 copies of them for 1M requests)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        nb = -(-len(values) // BLOCK)
        padded = np.full(nb * BLOCK, -np.inf)
        padded[:len(values)] = values
        blocks = padded.reshape(nb, BLOCK)
        self.from_start = np.maximum.accumulate(blocks, axis=1).ravel()
        self.to_end = np.maximum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
        self.table = [blocks.max(axis=1)]
        while 1 << len(self.table) <= nb:
            step = 1 << (len(self.table) - 1)
            self.table.append(np.maximum(self.table[-1][:-step], self.table[-1][step:]))

    def over(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The maximum of each ``values[lo:hi]``, each ``hi > lo``."""
        first, last = lo.astype(np.int64), hi.astype(np.int64) - 1
        out = np.maximum(self.to_end[first], self.from_start[last])
        fb, lb = first // BLOCK, last // BLOCK
        same = fb == lb
        if same.any():  # both ends in one block: the running maxima reach past them
            f, end = first[same], last[same]
            got = self.values[f]
            for k in range(1, BLOCK):
                got = np.maximum(got, self.values[np.minimum(f + k, end)])
            out[same] = got
        between = lb - fb >= 2
        if between.any():  # whole blocks between the ends: two of the table's spans
            a, b = fb[between] + 1, lb[between] - 1
            level = np.frexp((b - a + 1).astype(np.float64))[1] - 1
            got = np.empty(len(a))
            for k in np.unique(level).tolist():
                at = level == k
                got[at] = np.maximum(self.table[k][a[at]],
                                     self.table[k][b[at] - (1 << k) + 1])
            out[between] = np.maximum(out[between], got)
        return out


def _counts(series: tuple[np.ndarray, np.ndarray, np.ndarray], at: np.ndarray,
            length_s: float, end_s: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each window from ``at``'s first and past-last request by arrival, and its requests,
    gaps and gaps over the limit: prefix sums over the requests by arrival, each window's
    ends found as ``SimStats`` bounds it."""
    arrivals, gaps, over = series
    lo = np.searchsorted(arrivals, at, side="left")
    hi = np.searchsorted(arrivals, np.minimum(at + length_s, end_s), side="left")
    all_gaps = np.concatenate(([0], np.cumsum(gaps)))
    all_over = np.concatenate(([0], np.cumsum(over)))
    return lo, hi, hi - lo, all_gaps[hi] - all_gaps[lo], all_over[hi] - all_over[lo]
