"""meter_truth's P99 arithmetic on made-up streams: the client's exact, the meter's and
the made ones bucketed as the rules read them, each against the client's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from slopilot.engine.meter.client_latency import CLIENT_TBT, CLIENT_TTFT

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import meter_truth as mt


def test_the_p99s_are_the_clients_exact_and_the_others_bucketed() -> None:
    # 100 requests: first tokens at 0.25 s (one at 0.45), then two chunks 0.0625 s apart.
    records = [mt.Record(0.0, [t, t + 0.0625, t + 0.125], [1, 1, 1], True)
               for t in [0.25] * 99 + [0.45]]
    labels = (("le", "{le}"), ("model_name", "m"), ("priority_class", "p0"))

    def meter_buckets(name: str, cumulative: dict[str, float]) -> mt.Samples:
        return {(f"{name}_bucket", tuple((k, v.format(le=le)) for k, v in labels)): n
                for le, n in cumulative.items()}

    # The meter counted what the client saw, on the engine's edges.
    m = meter_buckets(CLIENT_TTFT, {"0.2": 0, "0.25": 99, "0.5": 100, "+Inf": 100}) | \
        meter_buckets(CLIENT_TBT, {"0.06": 0, "0.075": 200, "+Inf": 200})
    # The engine made each token 10 ms before its client got it.
    made = {"ttft": [r.arrivals[0] - r.sent - 0.01 for r in records],
            "gaps": [0.0625] * 200}
    got = mt.p99s(records, m, made)
    assert got["client_ttft_p99_ms"] == pytest.approx(250 + 0.01 * 200)  # numpy's rank
    # Rank 99 of 100 on the engine's edges: the top of the (0.2, 0.25] bucket, where
    # 99 first tokens came at 0.25 s (the exact P99, 252 ms, interpolates toward 0.45).
    assert got["client_bucketed_ttft_p99_ms"] == pytest.approx(250.0)
    assert got["meter_ttft_p99_ms"] == pytest.approx(250.0)
    assert got["meter_ttft_p99_err"] == pytest.approx(250 / 252 - 1)
    # vLLM's TTFT edges 0.25 and 0.5: 99 made at 0.24 s, one at 0.44.
    assert got["made_ttft_p99_ms"] == pytest.approx(250.0)
    assert got["made_exact_ttft_p99_ms"] == pytest.approx(got["client_ttft_p99_ms"] - 10)
    assert got["client_tbt_p99_ms"] == pytest.approx(62.5)
    assert got["meter_tbt_p99_ms"] == pytest.approx(60 + 15 * 0.99)
    assert got["made_tbt_p99_err"] == pytest.approx(
        (got["made_tbt_p99_ms"] - 62.5) / 62.5)
    assert math.isclose(mt._bucketed([0.1, 0.2, 0.3], (0.15, 0.3))[0.3], 3.0)
