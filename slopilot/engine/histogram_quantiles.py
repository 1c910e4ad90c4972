"""A histogram read as Prometheus reads it: ``histogram_quantile`` and a share within a threshold.

The benchmarks, the twin's check and the direct scrape hold what they measure against
what the recording rules would read from the engine's histograms: the same
interpolation, uniform inside a bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence

from slopilot.engine.latency_buckets import EDGE_TOLERANCE, TOKEN_LATENCY_BUCKETS

__all__ = ["EDGE_TOLERANCE", "histogram_quantile", "histogram_share_within",
           "inside", "judged_copies", "judged_quantile", "latency_quantile", "straddled"]


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """Prometheus' ``histogram_quantile`` over cumulative ``{le: count}``: NaN when empty."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return math.nan
    rank = q * buckets[edges[-1]]
    counts = [buckets[e] for e in edges]
    i = bisect.bisect_left(counts, rank)
    if i >= len(edges) - 1 and math.isinf(edges[-1]):
        return edges[-2] if len(edges) > 1 else math.nan
    lo_edge, lo_count = (0.0, 0.0) if i == 0 else (edges[i - 1], counts[i - 1])
    width = counts[i] - lo_count
    return lo_edge + (edges[i] - lo_edge) * ((rank - lo_count) / width if width else 1.0)


def straddled(edges: Iterable[float], thresholds: Iterable[float]
              ) -> tuple[tuple[float, float], ...]:
    """``(upper edge, threshold)`` for each bucket of ``edges`` that holds a threshold
    strictly inside (the lowest, where it holds several), in order. A threshold on an
    edge is in none; one past the last finite edge neither (``histogram_quantile`` reads
    that edge there, under it)."""
    finite = sorted(e for e in edges if math.isfinite(e))
    out: dict[float, float] = {}
    for t in sorted(thresholds):
        if any(abs(e - t) <= EDGE_TOLERANCE for e in finite):
            continue
        hi = next((e for e in finite if e > t), None)
        if hi is not None:
            out.setdefault(hi, t)
    return tuple(sorted(out.items()))


def inside(edges: Iterable[float], thresholds: Iterable[float]
           ) -> tuple[tuple[float, float], ...]:
    """``(upper edge, threshold)`` for every threshold strictly inside a bucket of
    ``edges``, several per bucket where it holds several, in order of threshold. A
    replica's copies go on each, not on the lowest alone: beside a replica that exports
    every one of them (started with the SLO), a sum at the higher one without the copy
    stood below the sum at the lower one."""
    finite = sorted(e for e in edges if math.isfinite(e))
    out = []
    for t in sorted(set(thresholds)):
        if any(abs(e - t) <= EDGE_TOLERANCE for e in finite):
            continue
        hi = next((e for e in finite if e > t), None)
        if hi is not None:
            out.append((hi, t))
    return tuple(out)


def judged_quantile(q: float, buckets: Mapping[float, float],
                    thresholds: Iterable[float] = ()) -> float:
    """``histogram_quantile`` read so that it claims none of ``thresholds`` breached
    where the buckets cannot prove it, as the recording rules read a P99
    (``rules.judged_buckets``): each bucket that holds a threshold strictly inside is
    read as if its observations lay at or under the lowest such one; every other bucket
    as it is. So it reads above a threshold exactly where more than ``1 - q`` of the
    observations are above the first edge at or above it."""
    return histogram_quantile(q, {**buckets, **judged_copies(buckets, thresholds)})


def judged_copies(buckets: Mapping[float, float], thresholds: Iterable[float]
                  ) -> dict[float, float]:
    """``{T: count}`` for each threshold ``T`` strictly inside a bucket of cumulative
    ``buckets``: that bucket's count, as if none of it lay above ``T`` (``inside``).
    Added to one process' buckets before they are summed with another's that has an edge
    at ``T`` (its process started with that SLO), each is read as its own edges allow, as
    the rules read them (``rules.judged_rates``)."""
    return {t: buckets[hi] for hi, t in inside(buckets, thresholds)}


def histogram_share_within(threshold: float, buckets: Mapping[float, float]) -> float:
    """The share of observations at or under ``threshold`` from cumulative
    ``{le: count}`` (with ``+Inf``): off the edges, the share at or under the first edge
    above it, the bucket that holds it counted within (none can tell which of its
    observations are over, and a P99 read there claims no breach either,
    ``judged_quantile``); past the last finite edge, that edge's. The recording rules
    compute the same (``rules.fraction_within``). NaN when empty."""
    total = buckets.get(math.inf, 0.0)
    if total <= 0:
        return math.nan
    edges = sorted(e for e in buckets if not math.isinf(e))
    if not edges:
        return 1.0
    edge = next((e for e in edges if e >= threshold - EDGE_TOLERANCE), edges[-1])
    return buckets[edge] / total


def latency_quantile(q: float, seconds: Sequence[float], never: int = 0,
                     edges: Sequence[float] = TOKEN_LATENCY_BUCKETS) -> float:
    """``q`` of these TTFTs or token gaps as Prometheus reads it from the engine's
    histogram (``edges``: ``TOKEN_LATENCY_BUCKETS``, with the SLO's where the engine
    started with one, ``latency_buckets.token_latency_buckets``; then
    ``histogram_quantile``), with ``never`` more in +Inf (the first tokens of requests
    turned away for load): NaN without samples."""
    ordered = sorted(seconds)
    cumulative = {e: float(bisect.bisect_right(ordered, e)) for e in edges}
    return histogram_quantile(q, {**cumulative, math.inf: float(len(ordered) + never)})
