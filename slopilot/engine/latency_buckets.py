"""The bucket edges of every latency histogram slopilot exports itself.

Apart from ``metrics``, whose imports (the simulator's iteration shapes) the meter beside
a vLLM engine may not take: the engine's histograms and the meter's client-side ones
share these edges, so the recording rules read an SLO on both the same way.
"""

from __future__ import annotations

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
