"""The worst window of a given length anywhere in a run, by each class's TTFT P99.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.window_stats import FirstToken


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
