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
only whether it is above a limit (the class's target less the headroom), and that is
read from how many gaps are above it: sorted, they are the top ``over`` of ``gaps``, and
numpy's P99 reads rank ``r = 0.99 (gaps - 1)`` (linear between ``floor(r)`` and the one
above). With ``floor(r)`` among them the P99 is above the limit; with ``floor(r) + 1``
not, it is not; in between (one rank: ``depth`` -1) it rests on two gaps' values. So
each request's gaps and gaps over its class's limit are counted as they come
(``window_stats.TokenGaps``, 16 bytes a request), a window's counts are two prefix sums
over its arrivals (a gap counts in the windows holding its request's arrival, as
``SimStats`` counts it: the figures are the window's own), and the start whose P99 rank
lies deepest among the gaps over the limit is the one a miss would show in: where any
window's P99 rank is among them, that one's is. Starts at the arrivals and at each
arrival less the length: a window's requests change where its start passes an arrival or
its end does, and a share can rise as its end drops one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.window_stats import FirstToken, TokenGaps


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

    @property
    def depth(self) -> int:
        """How far the P99's rank lies among the gaps over the limit: 0 or more, its P99
        is above the limit; -1, it may be (it reads between a gap over and one not);
        less, it is not."""
        rank = math.floor(0.99 * (self.gaps - 1) + 1e-9)
        return self.over - (self.gaps - rank)

    @property
    def could_miss(self) -> bool:
        return self.gaps > 0 and self.depth >= -1

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
        requests, gaps, over = _counts(series, starts, length_s, end_s)
        keep = (requests >= floor) & (gaps > 0)
        if not keep.any():
            continue
        starts, requests, gaps, over = starts[keep], requests[keep], gaps[keep], over[keep]
        depth = over - (gaps - np.floor(0.99 * (gaps - 1) + 1e-9).astype(np.int64))
        best = int(np.lexsort((over / gaps, depth))[-1])
        out.append(GapWindow(p, float(starts[best]), int(requests[best]), int(gaps[best]),
                             int(over[best])))
    return out


def gap_windows(token_gaps: TokenGaps, priority: Priority, starts: Sequence[float],
                length_s: float, end_s: float) -> list[GapWindow]:
    """The class's gaps and gaps over its limit in each window ``[start, min(start +
    length_s, end_s))`` of ``starts``, counted by their requests' arrivals."""
    at = np.asarray(starts, dtype=np.float64)
    requests, gaps, over = _counts(token_gaps.series(priority), at, length_s, end_s)
    return [GapWindow(priority, s, r, g, o) for s, r, g, o in
            zip(at.tolist(), requests.tolist(), gaps.tolist(), over.tolist(), strict=True)]


def _counts(series: tuple[np.ndarray, np.ndarray, np.ndarray], at: np.ndarray,
            length_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests, gaps and gaps over the limit in each window from ``at``: prefix sums
    over the requests by arrival, each window's ends found as ``SimStats`` bounds it."""
    arrivals, gaps, over = series
    lo = np.searchsorted(arrivals, at, side="left")
    hi = np.searchsorted(arrivals, np.minimum(at + length_s, end_s), side="left")
    all_gaps = np.concatenate(([0], np.cumsum(gaps)))
    all_over = np.concatenate(([0], np.cumsum(over)))
    return hi - lo, all_gaps[hi] - all_gaps[lo], all_over[hi] - all_over[lo]
