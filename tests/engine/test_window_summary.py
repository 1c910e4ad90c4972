"""WindowSummary: one typed summary, its JSON form, and the dicts earlier versions stored."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.stats import SimStats
from slopilot.engine.window_summary import ClassFigures, SummaryError, Window, WindowSummary
from tests.support.summaries import OLD_CLUSTER, OLD_PROMETHEUS


def test_a_simulated_run_reads_back_equal_through_json() -> None:
    summary = simulate(load_scenario("tiny-cpu"), duration_s=8, seed=1).summary
    text = json.dumps(summary.to_dict(), allow_nan=False)
    assert WindowSummary.from_dict(json.loads(text)) == summary
    assert summary.run is not None and summary.run.scenario == "tiny-cpu"
    assert summary.engine is not None and summary.engine.iterations > 0


def test_an_idle_class_has_no_percentiles_and_the_json_says_null() -> None:
    summary = SimStats(load_scenario("tiny-cpu").slo, end_time=10.0).summary(10.0)
    idle = summary.classes[Priority.P0]
    assert idle.requests_finished == 0 and idle.ttft_p99_ms is None and idle.tbt_p99_ms is None
    assert idle.samples is not None and idle.samples.ttft_mean_ms is None
    assert summary.overall.ttft_p99_ms is None
    figures = json.loads(json.dumps(summary.to_dict(), allow_nan=False))["classes"]["p0"]
    assert figures["ttft_p99_ms"] is None and figures["slo_attainment"] is None
    assert figures["max_stall_ms"] == 0.0


def test_old_prometheus_summaries_load_with_nan_as_none() -> None:
    s = WindowSummary.from_dict(OLD_PROMETHEUS)
    idle = s.classes[Priority.P2]
    assert idle.ttft_p99_ms is None and idle.tbt_p99_ms is None
    assert s.request_rate is None
    assert s.window == Window(90.0, 100.0, canary=False)
    assert s.classes[Priority.P1].requests_finished == 7.5
    assert s.classes[Priority.P0].slo_attainment is None  # Prometheus never had one
    assert s.engine is None and s.run is None
    json.dumps(s.to_dict(), allow_nan=False)  # what this version writes back is JSON


def test_old_cluster_summaries_load_without_overall_percentiles() -> None:
    s = WindowSummary.from_dict(OLD_CLUSTER)
    assert s.overall.ttft_p99_ms is None and s.overall.requests_finished == 7
    assert s.classes[Priority.P1].slo_attainment == pytest.approx(5 / 6)
    assert s.replicas == 1 and s.busy_ratio == 0.70 and s.window is None
    assert "slo_met" not in s.to_dict()["classes"]["p1"]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda s: s.pop("classes"), r"lacks 'classes'"),
    (lambda s: s["classes"].pop("p1"), r"\['classes'\] lacks 'p1'"),
    (lambda s: s["classes"]["p0"].pop("goodput_tok_s"), r"\['p0'\] lacks 'goodput_tok_s'"),
    (lambda s: s.pop("duration_s"), r"lacks 'duration_s'"),
    (lambda s: s.__setitem__("preemptions_per_min", "many"), r"expected a number"),
    (lambda s: s["classes"]["p0"].__setitem__("ttft_p99_ms", "slow"), r"expected a number"),
    (lambda s: s["classes"]["p0"].__setitem__("throughput_tok_s", math.inf),
     r"throughput_tok_s=inf: expected a finite number"),
    (lambda s: s.update(start=1.0, end="later"), r"Window.end='later'"),
])
def test_a_malformed_dict_names_the_figure(mutate: Any, message: str) -> None:
    data = json.loads(json.dumps(OLD_CLUSTER))
    mutate(data)
    with pytest.raises(SummaryError, match=message):
        WindowSummary.from_dict(data)


def test_nan_is_refused_where_a_summary_is_built() -> None:
    with pytest.raises(SummaryError, match="ttft_p99_ms=nan: expected a finite number or None"):
        ClassFigures(requests_finished=1, throughput_tok_s=1.0, goodput_tok_s=1.0,
                     ttft_p99_ms=math.nan, tbt_p99_ms=None)
    empty = ClassFigures(0, 0.0, 0.0, None, None)
    with pytest.raises(SummaryError, match="each of p0, p1, p2"):
        WindowSummary(duration_s=1.0, preemptions_per_min=0.0, overall=empty,
                      classes={Priority.P0: empty})


def test_the_requests_turned_away_read_back_and_default_to_none_turned_away() -> None:
    figures = ClassFigures(10.0, 5.0, 4.0, 100.0, 20.0, requests_refused=3.0)
    s = WindowSummary(60.0, 0.0, figures, dict.fromkeys(Priority, figures))
    back = WindowSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.overall.requests_refused == 3.0
    assert back.classes[Priority.P1].requests_refused == 3.0
    old = s.to_dict()  # stored before the field existed
    del old["requests_refused"]
    for c in old["classes"].values():
        del c["requests_refused"]
    assert WindowSummary.from_dict(old).overall.requests_refused == 0.0
    with pytest.raises(SummaryError, match="requests_refused"):
        ClassFigures(1.0, 1.0, 1.0, None, None, requests_refused=-1.0)


def test_a_simulated_summary_stored_before_ttft_measured_pct_keeps_its_samples() -> None:
    summary = simulate(load_scenario("tiny-cpu"), duration_s=4, seed=1).summary
    assert summary.overall.samples is not None
    assert summary.overall.samples.ttft_measured_pct == 100.0  # none refused
    old = summary.to_dict()
    del old["ttft_measured_pct"]
    for c in old["classes"].values():
        del c["ttft_measured_pct"]
    back = WindowSummary.from_dict(old)
    assert back.overall.samples is not None
    assert back.overall.samples.ttft_mean_ms == summary.overall.samples.ttft_mean_ms
    assert back.overall.samples.ttft_measured_pct is None


def test_the_ttft_samples_read_back_and_older_dicts_read_none() -> None:
    figures = ClassFigures(100.0, 5.0, 4.0, 100.0, 20.0, ttft_samples=3.0)
    s = WindowSummary(60.0, 0.0, figures, dict.fromkeys(Priority, figures))
    back = WindowSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.classes[Priority.P0].ttft_samples == 3.0
    old = s.to_dict()  # stored before the field existed
    del old["ttft_samples"]
    for c in old["classes"].values():
        del c["ttft_samples"]
    assert WindowSummary.from_dict(old).classes[Priority.P0].ttft_samples is None
    with pytest.raises(SummaryError, match="ttft_samples"):
        ClassFigures(1.0, 1.0, 1.0, None, None, ttft_samples=-1.0)


def test_a_simulated_class_counts_the_ttfts_its_p99_ranks() -> None:
    summary = simulate(load_scenario("tiny-cpu"), duration_s=8, seed=1).summary
    for c in summary.classes.values():
        # Every finished request had a first token; censored waits and refusals rank too.
        assert c.ttft_samples is not None and c.ttft_samples >= c.requests_finished
    assert summary.overall.ttft_samples == sum(
        c.ttft_samples or 0.0 for c in summary.classes.values())


def test_a_count_read_back_stays_the_count_it_was() -> None:
    """tune's JSON read "ttft_samples": 264.0 where simulate's read 264: its summaries
    come back through ``from_dict``, which made every statistic a float."""
    from tests.support.summaries import window

    figures = ClassFigures(requests_finished=264, throughput_tok_s=1.0, goodput_tok_s=1.0,
                           ttft_p99_ms=100.0, tbt_p99_ms=10.0, ttft_samples=264,
                           requests_awaiting=0)
    s = window({"p1": figures})
    back = WindowSummary.from_dict(s.to_dict())
    p1 = back.to_dict()["classes"]["p1"]
    assert p1["ttft_samples"] == 264 and isinstance(p1["ttft_samples"], int), p1
    assert isinstance(p1["requests_awaiting"], int), p1
