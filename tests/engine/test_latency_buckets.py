"""The latency histograms' bucket edges: on every SLO threshold, dense where read."""

from __future__ import annotations

from itertools import pairwise

import pytest
from prometheus_client.utils import floatToGoString

from slopilot.engine.latency_buckets import (
    DENSE_FROM_S,
    DENSE_TO_S,
    LATENCY_BUCKETS,
    QUANTILE_STEP,
    TOKEN_LATENCY_BUCKETS,
)
from slopilot.engine.slo import PROFILES


@pytest.mark.parametrize("edges", [LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS],
                         ids=["latency", "token_latency"])
def test_every_profiles_thresholds_and_twice_them_are_edges(edges: tuple[float, ...]) -> None:
    """A verdict "P99 within the SLO" reads one bucket's count, so it is exact only on an
    edge; the TBT alerts scale at twice the target."""
    for name, classes in PROFILES.items():
        for p, slo in classes.items():
            for ms in (slo.ttft_p99_ms, slo.tbt_p99_ms):
                if ms is not None:
                    assert {ms / 1000, 2 * ms / 1000} <= set(edges), (name, p, ms)


def test_token_latency_edges_are_the_latency_edges_and_more() -> None:
    assert set(LATENCY_BUCKETS) <= set(TOKEN_LATENCY_BUCKETS)
    assert list(TOKEN_LATENCY_BUCKETS) == sorted(set(TOKEN_LATENCY_BUCKETS))
    assert TOKEN_LATENCY_BUCKETS[-1] == LATENCY_BUCKETS[-1]


def test_a_quantile_from_1ms_to_10s_is_known_within_the_step() -> None:
    """histogram_quantile's answer lies in the bucket of the exact quantile, so a bucket
    at most QUANTILE_STEP wider than its lower edge bounds the error by it."""
    assert QUANTILE_STEP <= 0.10
    inside = [e for e in TOKEN_LATENCY_BUCKETS if DENSE_FROM_S <= e <= DENSE_TO_S]
    assert inside[0] == DENSE_FROM_S and inside[-1] == DENSE_TO_S
    widths = [(hi - lo) / lo for lo, hi in pairwise(inside)]
    assert max(widths) <= QUANTILE_STEP + 1e-9


def test_edges_are_written_as_short_decimals() -> None:
    """A le label a user types (le="0.011"), not a float's long tail."""
    for edge in TOKEN_LATENCY_BUCKETS:
        text = floatToGoString(edge)
        assert float(text) == edge and len(text) <= 6, text
