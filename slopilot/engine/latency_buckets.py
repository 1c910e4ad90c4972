"""The bucket edges of every latency histogram slopilot exports itself.

Apart from ``metrics``, whose imports (the simulator's iteration shapes) the meter beside
a vLLM engine may not take: the engine's histograms and the meter's client-side ones
share these edges, so the recording rules read an SLO on both the same way.
"""

from __future__ import annotations

import math

from slopilot.engine.alert_factors import DEFAULT_FACTORS, MAX_FACTORS, AlertFactors
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec

# Edges sit on every SLO threshold of the profiles (and on twice each), so that
# "fraction under the SLO" is one bucket and a P99 above a threshold is exact; and on
# every edge of vLLM's own TTFT and inter-token histograms up to 300 s
# (``VLLM_LATENCY_BUCKETS``), so that a query a vLLM user wrote on its edges
# (``le="0.25"``) reads the built-in engine's series too. Not vLLM's 640 and 2560 s: the
# highest finite edge is what a refused request's TTFT reads (``sim.stats.REFUSED_TTFT_S``).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.08, 0.1, 0.15,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0, 40.0, 60.0,
    80.0, 120.0, 160.0, 300.0)

EDGE_TOLERANCE = 1e-12
"""A threshold this close to an edge is on it (thresholds are ms / 1000, edges text)."""

QUANTILE_STEP = 0.10
"""The widest a TTFT or token-gap bucket from ``DENSE_FROM_S`` to ``DENSE_TO_S`` is,
relative to its lower edge: the most a quantile read there can be off the exact one."""
DENSE_FROM_S, DENSE_TO_S = 0.001, 10.0

# Two significant digits, each at most 10 % above the one before (the next is the
# previous times 1.1, rounded down; 9.4 to 10 is 6 %): round labels (le="0.011").
_MANTISSAS: tuple[int, ...] = (
    10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 24, 26, 28, 30, 33, 36, 39, 42, 46, 50,
    55, 60, 66, 72, 79, 86, 94)


def _dense(from_s: float, to_s: float) -> set[float]:
    # float("11e-4") is the double nearest 0.0011, whose text is "0.0011" again.
    return {edge for exponent in range(-5, 3) for m in _MANTISSAS
            if from_s <= (edge := float(f"{m}e{exponent}")) <= to_s}


# The histograms whose quantiles are read (the recording rules' P50s and P99s, the
# dashboards, a user's histogram_quantile): histogram_quantile knows a quantile only to
# its bucket and interpolates linearly inside it, and a decode step is steady, so a
# token gap near 10.2 ms (all in (10, 15] ms) read 12.5 ms at the P50, 14.5 at the P90.
# LATENCY_BUCKETS with an edge every 10 % from 1 ms to 10 s, where TTFTs and gaps live:
# every SLO threshold and vLLM edge stays one (verdicts and P99s above a threshold as
# exact as before, a vLLM query's le still there), at about 100 more series per class
# and histogram (docs/benchmarks.md, "Quantiles read from the histograms").
TOKEN_LATENCY_BUCKETS: tuple[float, ...] = tuple(sorted(
    set(LATENCY_BUCKETS) | _dense(DENSE_FROM_S, DENSE_TO_S)))

# vLLM's edges of its request-phase histograms (e2e, queue, prefill, decode, inference:
# v0.11's vllm/v1/metrics/loggers.py request_latency_buckets), every one: LATENCY_BUCKETS holds
# its TTFT and gap edges only, so a vLLM query on le="0.8" or "15.0" found nothing here.
# Up to 7,680 s, unlike TTFT's: no refused request reads these, and a long request's
# e2e past 300 s stays in a finite bucket, as on vLLM.
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = tuple(sorted(
    set(LATENCY_BUCKETS) | set(VLLM_REQUEST_LATENCY_BUCKETS)))


MAX_SLO_EDGES = MAX_FACTORS * len(Priority)
"""The most edges a deployment's SLO and alert factors add to one histogram: one per
class and factor judged (``AlertFactors.factors``: at most 3, a TTFT's target, warning
and retune; a TBT's target and scale, 2), three classes: at most 9 series more per class
and TTFT histogram, 6 per token-gap one, whatever the SLO and ``spec.alerts`` hold."""


def slo_edges(slo: SLOSpec | None, *, ttft: bool,
              factors: AlertFactors = DEFAULT_FACTORS) -> tuple[float, ...]:
    """The thresholds of ``slo`` its TTFT (``ttft``) or token-gap histograms carry as
    edges beside ``TOKEN_LATENCY_BUCKETS``: each class's target times each factor the
    deployment's rules judge it by (``factors``: the target itself and ``spec.alerts``',
    by default the seeds' 1 and 2), computed as the alert table computes them
    (``factor * ms / 1000``), so an edge and its threshold are the same double. Every
    class's on every class's histogram (a sum over classes, the overall P99, then reads
    one set of edges). Those the grid holds already add none; so do those under its
    first edge (1 ms) or at or past its last finite one (300 s, what a first token never
    given reads: ``sim.stats.REFUSED_TTFT_S``), which the rules read judged as before.
    ValueError naming the class and field of a target that is no positive finite number
    (``SLOSpec`` refuses those already; this guards a hand-built one)."""
    if slo is None:
        return ()
    field = "ttft_p99_ms" if ttft else "tbt_p99_ms"
    multiples = factors.factors(ttft=ttft)
    if len(multiples) > MAX_FACTORS:  # AlertFactors has no more; a bound, not a hope
        raise ValueError(f"{len(multiples)} factors {multiples}: at most {MAX_FACTORS}")
    grid = TOKEN_LATENCY_BUCKETS
    out: set[float] = set()
    for p, target in slo.classes().items():
        ms = getattr(target, field)
        if ms is None:
            continue
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) \
                or not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"classes.{p.label}.{field}={ms!r}: expected a positive "
                             "number of milliseconds; fix the SLO")
        for factor in multiples:
            edge = factor * ms / 1000
            if not grid[0] <= edge < grid[-1]:
                continue
            if any(abs(edge - e) <= EDGE_TOLERANCE for e in grid):
                continue
            out.add(edge)
    if len(out) > MAX_SLO_EDGES:  # a factor a class by construction; a bound, not a hope
        raise ValueError(f"{len(out)} SLO edges: at most {MAX_SLO_EDGES}")
    return tuple(sorted(out))


def token_latency_buckets(slo: SLOSpec | None, *, ttft: bool,
                          factors: AlertFactors = DEFAULT_FACTORS) -> tuple[float, ...]:
    """``TOKEN_LATENCY_BUCKETS`` with ``slo``'s thresholds at ``factors`` as edges
    (``slo_edges``): what a TTFT (``ttft``) or token-gap histogram of a process started
    with ``slo`` and ``factors`` exports.
    Fixed for the process' life: a histogram's buckets cannot be split afterwards (the
    observations already in one are not known to either side of a new edge)."""
    extra = slo_edges(slo, ttft=ttft, factors=factors)
    if not extra:
        return TOKEN_LATENCY_BUCKETS
    return tuple(sorted({*TOKEN_LATENCY_BUCKETS, *extra}))
