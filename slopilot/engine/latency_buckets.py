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
