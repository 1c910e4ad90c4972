"""A histogram read as Prometheus reads it: ``histogram_quantile`` and a share within a threshold.

The benchmarks, the twin's check and the direct scrape hold what they measure against
what the recording rules would read from the engine's histograms: the same
interpolation, uniform inside a bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS


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


def histogram_share_within(threshold: float, buckets: Mapping[float, float]) -> float:
    """The share of observations at or under ``threshold`` from cumulative
    ``{le: count}`` (with ``+Inf``), read as ``histogram_quantile`` reads a bucket, uniform
    inside it; the recording rules compute the same (``rules.fraction_within``). NaN when
    empty."""
    total = buckets.get(math.inf, 0.0)
    if total <= 0:
        return math.nan
    edges = sorted(e for e in buckets if not math.isinf(e))
    lower = [e for e in edges if e <= threshold + 1e-12]
    upper = [e for e in edges if e > threshold + 1e-12]
    if lower and (abs(lower[-1] - threshold) <= 1e-12 or not upper):
        return buckets[lower[-1]] / total
    hi = upper[0]
    if not lower:
        return buckets[hi] * (threshold / hi) / total
    lo = lower[-1]
    return (buckets[lo] + (buckets[hi] - buckets[lo]) * (threshold - lo) / (hi - lo)) / total


def latency_quantile(q: float, seconds: Sequence[float], never: int = 0) -> float:
    """``q`` of these TTFTs or token gaps as Prometheus reads it from the engine's
    histogram (``TOKEN_LATENCY_BUCKETS``, then ``histogram_quantile``), with ``never``
    more in +Inf (the first tokens of requests turned away for load): NaN without
    samples."""
    ordered = sorted(seconds)
    cumulative = {e: float(bisect.bisect_right(ordered, e)) for e in TOKEN_LATENCY_BUCKETS}
    return histogram_quantile(q, {**cumulative, math.inf: float(len(ordered) + never)})
