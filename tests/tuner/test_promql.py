"""The Prometheus-to-summary reduction every live reader shares."""

from __future__ import annotations

import math

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import Window
from slopilot.tuner.prometheus.query import query_at, window_summary


def test_best_effort_class_counts_all_its_tokens_and_missing_series_are_neutral() -> None:
    s = window_summary(
        requests={"p0": 10.0, "p1": 20.0, "p2": 5.0},
        throughput={"p0": 100.0, "p1": 300.0, "p2": 50.0},
        ttft_p99_s={"p0": 0.08, "p1": 0.4}, tbt_p99_s={"p0": 0.015, "p1": 0.05},
        goodput={"p0": 90.0, "p1": math.nan}, preemptions_per_min=math.nan,
        overall_ttft_p99_s=0.35, overall_tbt_p99_s=math.nan, duration_s=60,
        window=Window(40.0, 100.0), request_rate=math.nan)
    assert s.classes[Priority.P2].goodput_tok_s == 50.0  # no SLO: every token is good
    assert s.classes[Priority.P1].goodput_tok_s == 0.0  # an SLO but no answer: none
    assert s.overall.goodput_tok_s == 140.0 and s.overall.throughput_tok_s == 450.0
    assert s.preemptions_per_min == 0.0
    assert s.overall.ttft_p99_ms == pytest.approx(350.0)  # every class together
    # No samples: None, never NaN (the summary crosses JSON).
    assert s.classes[Priority.P2].ttft_p99_ms is None and s.overall.tbt_p99_ms is None
    assert s.request_rate is None
    assert s.overall.requests_finished == 35.0 and s.duration_s == 60.0
    assert s.window == Window(40.0, 100.0, canary=False, bucketed=True)


def test_query_at_refuses_a_url_without_a_scheme() -> None:
    with pytest.raises(ValueError, match=r"expected an http\(s\) URL"):
        query_at("prometheus:9090")
