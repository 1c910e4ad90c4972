"""The bucket edges of every latency histogram slopilot exports itself.

Apart from ``metrics``, whose imports (the simulator's iteration shapes) the meter beside
a vLLM engine may not take: the engine's histograms and the meter's client-side ones
share these edges, so the recording rules read an SLO on both the same way.
"""

from __future__ import annotations

# Edges sit on every SLO threshold of the profiles (and on twice each), so that
# "fraction under the SLO" is one bucket and a P99 above a threshold is exact.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
