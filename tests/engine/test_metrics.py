"""EngineMetrics: the rendered text as Prometheus parses it."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.histogram_quantiles import histogram_quantile, latency_quantile
from slopilot.engine.latency_buckets import LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS
from slopilot.engine.metric_names import HISTOGRAMS, SLOPILOT_METRICS, VLLM_METRICS
from slopilot.engine.metric_window import HistogramRecorder, SlidingMax, SlidingSum
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _step(m: EngineMetrics, now: float, **kw: Any) -> None:
    args: dict[str, Any] = {
        "now": now, "elapsed_s": 0.0, "num_running": 0, "num_waiting": 0, "num_swapped": 0,
        "kv_usage": 0.0, "iteration_tokens": 0, "num_preempted_recompute": 0,
        "num_preempted_swap": 0, "swap_s": 0.0, "prefix_queries": 0, "prefix_hits": 0}
    args.update(kw)
    m.on_step(**args)


def samples(m: EngineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the rendered text, keyed by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(m: EngineMetrics) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(m.render().decode())}


def value(m: EngineMetrics, name: str, **labels: str) -> float:
    labels = {"model_name": "tiny", **labels}
    return samples(m)[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def m(clock: Clock) -> EngineMetrics:
    metrics = EngineMetrics("tiny", clock=clock)
    metrics.set_config(EngineConfig())
    return metrics


def test_names_keep_the_colon_and_the_vllm_list(m: EngineMetrics) -> None:
    from slopilot.engine.slo import SLOSpec

    m.set_slo(SLOSpec.from_profile("standard"))  # its verdicts are exported with one
    text = m.render().decode()
    assert "vllm:time_to_first_token_seconds_bucket{" in text
    assert "vllm_time_to_first_token" not in text
    kinds = families(m)
    # The parser strips _total from counter names; put it back to compare with the list.
    exported = {name + "_total" if kind == "counter" else name for name, kind in kinds.items()}
    assert exported == set(VLLM_METRICS | SLOPILOT_METRICS)
    assert {n for n, k in kinds.items() if k == "histogram"} == set(HISTOGRAMS)
    assert kinds["vllm:num_requests_running"] == "gauge"


def test_latency_buckets_sit_on_slo_thresholds() -> None:
    for threshold in (0.01, 0.02, 0.04, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60):
        assert threshold in LATENCY_BUCKETS


def test_latency_histograms_count_per_class_and_bucket(m: EngineMetrics) -> None:
    for gap in (0.015, 0.02, 0.021, 0.5, 400.0):
        m.on_token_gap(Priority.P1, gap, now=99.0)
    m.on_first_token(Priority.P0, 0.05)
    name = "vllm:inter_token_latency_seconds_bucket"
    # le is inclusive: 0.02 falls in the 0.02 bucket, 0.021 does not.
    assert value(m, name, priority_class="p1", le="0.015") == 1
    assert value(m, name, priority_class="p1", le="0.02") == 2
    assert value(m, name, priority_class="p1", le="0.03") == 3
    assert value(m, name, priority_class="p1", le="300.0") == 4
    assert value(m, name, priority_class="p1", le="+Inf") == 5
    assert value(m, name, priority_class="p0", le="+Inf") == 0
    assert value(m, "vllm:inter_token_latency_seconds_count", priority_class="p1") == 5
    assert value(m, "vllm:inter_token_latency_seconds_sum", priority_class="p1") == \
        pytest.approx(400.556)
    assert value(m, "vllm:time_to_first_token_seconds_bucket",
                 priority_class="p0", le="0.05") == 1
    # First tokens and gaps are generated tokens.
    assert value(m, "vllm:generation_tokens_total") == 6


def test_finished_requests(m: EngineMetrics) -> None:
    m.on_finished(Priority.P2, e2e_s=3.0, queue_s=0.2, prompt_tokens=100,
                  generation_tokens=20, finish_reason="stop")
    m.on_finished(Priority.P2, e2e_s=1.0, queue_s=0.1, prompt_tokens=28,
                  generation_tokens=1, finish_reason="length")
    m.on_finished(Priority.P1, e2e_s=1.0, queue_s=0.1, prompt_tokens=5,
                  generation_tokens=0, finish_reason="stop")
    assert value(m, "vllm:request_success_total", finished_reason="stop") == 2
    assert value(m, "vllm:request_success_total", finished_reason="length") == 1
    # Counted where each prefill is done (``on_first_token``), as vLLM counts them.
    assert value(m, "vllm:prompt_tokens_total") == 0
    assert value(m, "vllm:e2e_request_latency_seconds_bucket",
                 priority_class="p2", le="2.0") == 1
    assert value(m, "vllm:request_queue_time_seconds_count", priority_class="p2") == 2
    assert value(m, "vllm:request_prompt_tokens_bucket", priority_class="p2",
                 le="128.0") == 2
    assert value(m, "vllm:request_generation_tokens_sum", priority_class="p2") == 21


def test_step_gauges_and_counters(m: EngineMetrics, clock: Clock) -> None:
    _step(m, 99.0, num_running=7, num_waiting=3, num_swapped=2, kv_usage=0.75,
          iteration_tokens=300, num_preempted_recompute=2, num_preempted_swap=1,
          swap_s=0.004, prefix_queries=64, prefix_hits=48)
    _step(m, 99.5, num_running=5, iteration_tokens=0, num_preempted_swap=1, swap_s=0.006,
          prefix_queries=16, prefix_hits=16)
    assert value(m, "vllm:num_requests_running") == 5
    assert value(m, "vllm:num_requests_waiting") == 0
    assert value(m, "slopilot_num_requests_swapped") == 0
    # vLLM's counts each when its request next makes a token (the observer's call).
    assert value(m, "vllm:num_preemptions_total") == 0
    m.count_preemptions(3)
    assert value(m, "vllm:num_preemptions_total") == 3
    assert value(m, "slopilot_preemptions_total", mode="recompute") == 2
    assert value(m, "slopilot_preemptions_total", mode="swap") == 2
    assert value(m, "slopilot_swap_seconds_total") == pytest.approx(0.01)
    assert value(m, "vllm:prefix_cache_queries_total") == 80
    assert value(m, "vllm:prefix_cache_hits_total") == 64
    # A step that made no token is not observed (vLLM's engine core sends no output).
    assert value(m, "vllm:iteration_tokens_total_count") == 1
    assert value(m, "vllm:iteration_tokens_total_bucket", le="256.0") == 0
    assert value(m, "vllm:iteration_tokens_total_bucket", le="512.0") == 1


def test_busy_ratio_is_windowed_and_decays_when_idle(clock: Clock) -> None:
    m = EngineMetrics("tiny", clock=clock, busy_window_s=10)
    # 10 s of steps, each busy 40 ms of every 50 ms: 80% busy.
    t = 50.0
    for _ in range(200):
        t += 0.05
        _step(m, t, elapsed_s=0.04)
    clock.t = t
    assert value(m, "slopilot_busy_ratio") == pytest.approx(0.8, abs=0.05)
    clock.t = t + 5  # idle for half the window
    assert value(m, "slopilot_busy_ratio") == pytest.approx(0.4, abs=0.05)
    clock.t = t + 11
    assert value(m, "slopilot_busy_ratio") == 0


def test_decode_stall_is_the_max_over_the_last_minute(m: EngineMetrics, clock: Clock) -> None:
    m.on_token_gap(Priority.P1, 2.5, now=10.0)
    m.on_token_gap(Priority.P1, 0.3, now=50.0)
    m.on_token_gap(Priority.P0, 0.01, now=60.0)
    clock.t = 65.0
    assert value(m, "slopilot_decode_stall_max_seconds", priority_class="p1") == 2.5
    assert value(m, "slopilot_decode_stall_max_seconds", priority_class="p0") == 0.01
    clock.t = 75.0  # the 2.5 s gap is now older than 60 s
    assert value(m, "slopilot_decode_stall_max_seconds", priority_class="p1") == 0.3
    assert value(m, "slopilot_decode_stall_max_seconds", priority_class="p2") == 0


def test_config_info_carries_the_live_knobs(m: EngineMetrics) -> None:
    m.set_config(EngineConfig(token_budget=512, chunk_size=256,
                              preemption_mode=PreemptionMode.SWAP))
    info = [k for k in samples(m) if k[0] == "slopilot_config_info"]
    assert len(info) == 1, "one series: the old knob set is gone"
    labels = dict(info[0][1])
    assert labels["token_budget"] == "512"
    assert labels["chunk_size"] == "256"
    assert labels["preemption_mode"] == "swap"
    assert labels["enable_prefix_caching"] == "true"
    assert labels["model_name"] == "tiny"
    assert value(m, "slopilot_config_knob", knob="token_budget") == 512
    assert value(m, "slopilot_config_knob", knob="effective_budget") == 512
    assert value(m, "slopilot_engine_info", version=__import__("slopilot").__version__) == 1


def test_no_config_no_config_series(clock: Clock) -> None:
    m = EngineMetrics("tiny", clock=clock, info={"executor": "simulated"})
    names = {k[0] for k in samples(m)}
    assert "slopilot_config_info" not in names
    assert dict(next(k[1] for k in samples(m) if k[0] == "slopilot_engine_info"))[
        "executor"] == "simulated"


def test_two_engines_in_one_registry_do_not_clash(clock: Clock) -> None:
    registry = CollectorRegistry()
    EngineMetrics("a", registry=registry, clock=clock)
    with pytest.raises(ValueError, match="Duplicated"):
        EngineMetrics("b", registry=registry, clock=clock)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model_name": ""}, "model_name is empty"),
    ({"model_name": "m", "busy_window_s": 0}, "window_s=0"),
    ({"model_name": "m", "stall_window_s": 600}, "window_s=600"),
    ({"model_name": "m", "info": {"model_name": "x"}}, "info label 'model_name'"),
    ({"model_name": "m", "info": {"bad-label": "x"}}, "info label 'bad-label'"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineMetrics(**kwargs)


def test_recorders_directly() -> None:
    h = HistogramRecorder((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    assert h.cumulative() == [("1.0", 2.0), ("2.0", 3.0), ("+Inf", 4.0)]
    assert h.count == 4 and h.total == 6.0
    s = SlidingMax(5)
    s.add(1.0, now=0.5)
    assert s.value(now=5.4) == 1.0 and s.value(now=6.1) == 0.0
    w = SlidingSum(5)
    assert w.ratio(now=1.0) == 0.0


@pytest.mark.parametrize(("threshold", "share"), [
    # Between 0.01 and 0.025: the bucket that holds it counted within (which of its
    # observations are over 20 ms no one can tell; read uniform it was 0.8, a third of a
    # bucket of 12 ms gaps counted as missed), as the rules read it.
    (0.02, 0.9),
    (0.025, 0.9),    # on an edge: that bucket's count
    (0.005, 0.6),    # below the first edge: the first bucket's count
    (0.5, 1.0),      # past the last finite edge: its count
])
def test_the_share_within_an_slo_is_read_as_the_recording_rules_read_it(
        threshold: float, share: float) -> None:
    # The demo's direct scrape and the Prometheus rules must give one goodput: the same
    # vLLM-shaped histogram as tests/tuner/test_rules.py's promtool test (0.9 at 20 ms).
    from slopilot.engine.histogram_quantiles import histogram_share_within

    buckets = {0.01: 60.0, 0.025: 90.0, 0.05: 100.0, math.inf: 100.0}
    assert histogram_share_within(threshold, buckets) == pytest.approx(share)
    assert math.isnan(histogram_share_within(0.02, {math.inf: 0.0}))


def _verdicts(m: EngineMetrics) -> dict[tuple[str, str, str, str], float]:
    """(series, class, slo, met) -> value, of the per-request verdict counters."""
    out = {}
    for (name, labels), v in samples(m).items():
        if name in ("slopilot_slo_requests_total", "slopilot_slo_generation_tokens_total"):
            d = dict(labels)
            out[(name, d["priority_class"], d["slo"], d["met"])] = v
    return out


def test_verdicts_are_counted_under_the_objectives_they_were_judged_by(
        m: EngineMetrics) -> None:
    from slopilot.engine.slo import SLOSpec

    assert _verdicts(m) == {}  # no SLO: nothing judged, no series to read as "none met"
    slo = SLOSpec.from_profile("standard")
    m.set_slo(slo)
    p0 = slo.p0.label
    # Every class's series exist at 0 from the start: a window with verdicts but none
    # met reads 0, never absent (which the rules read as "no verdicts here").
    assert _verdicts(m)[("slopilot_slo_requests_total", "p0", p0, "true")] == 0
    assert _verdicts(m)[("slopilot_slo_generation_tokens_total", "p2", "best_effort",
                         "false")] == 0
    m.observe_verdict(Priority.P0, slo.p0, met=True, tokens=30)
    m.observe_verdict(Priority.P0, slo.p0, met=False, tokens=200)
    m.observe_verdict(Priority.P0, slo.p0, met=True, tokens=10)
    v = _verdicts(m)
    assert v[("slopilot_slo_requests_total", "p0", p0, "true")] == 2
    assert v[("slopilot_slo_requests_total", "p0", p0, "false")] == 1
    assert v[("slopilot_slo_generation_tokens_total", "p0", p0, "true")] == 40
    assert v[("slopilot_slo_generation_tokens_total", "p0", p0, "false")] == 200
    m.observe_verdict(Priority.P1, slo.p1, met=True, tokens=5)
    # An edited SLO (P0's only): new verdicts go under its label, and the old label's
    # series leave (no rule reads them); P1's objectives did not change, nor its counts.
    strict = SLOSpec.from_dict({"classes": {"p0": {"ttftP99Ms": 50}}})
    m.set_slo(strict)
    m.observe_verdict(Priority.P0, strict.p0, met=True, tokens=7)
    v = _verdicts(m)
    assert v[("slopilot_slo_generation_tokens_total", "p0", strict.p0.label, "true")] == 7
    assert ("slopilot_slo_generation_tokens_total", "p0", p0, "true") not in v
    assert v[("slopilot_slo_generation_tokens_total", "p1", slo.p1.label, "true")] == 5
    assert m.slo == strict
    m.set_slo(None)
    assert m.slo is None
    assert "slopilot_slo_requests_total" in SLOPILOT_METRICS


def test_a_tenant_editing_its_slo_in_a_loop_cannot_grow_the_series_without_bound(
        m: EngineMetrics) -> None:
    """Each SLO gets its own ``slo`` label: kept for every SLO ever set, a CR edited in a
    loop grew its pods' series, and the Prometheus every team shares, without bound. A
    verdict under objectives no longer judged is read by no rule: only the current
    SLO's series are exported (a counter that comes back later restarts from 0, which
    rate() reads as a reset)."""
    from slopilot.engine.slo import SLOSpec

    for ms in range(1, 1001):
        slo = SLOSpec.from_dict({"classes": {"p0": {"ttftP99Ms": ms}}})
        m.set_slo(slo)
        m.observe_verdict(Priority.P0, slo.p0, met=True, tokens=1)
    series = [k for k in _verdicts(m) if k[0] == "slopilot_slo_requests_total"]
    assert len(series) == 6  # 3 classes x met true/false, all under the last SLO
    assert {k[2] for k in series if k[1] == "p0"} == {slo.p0.label}
    assert _verdicts(m)[("slopilot_slo_generation_tokens_total", "p0", slo.p0.label,
                         "true")] == 1


def test_a_quantile_whose_rank_is_a_bucket_count_lies_in_that_bucket() -> None:
    """As Prometheus reads it: the first bucket whose count reaches the rank, so an empty
    bucket after it does not move the answer up (0.1, not 0.2)."""
    buckets = {0.1: 50.0, 0.2: 50.0, 0.3: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.25)


def test_the_bucketed_ttft_quantile_reads_first_tokens_never_given_in_inf() -> None:
    # As the rules read it: 2 of 100 never served put the P99 in +Inf (the last finite
    # edge); none, and it is the served requests' own.
    served = [0.05] * 98
    # inside (0.046, 0.05]
    assert latency_quantile(0.99, served) == pytest.approx(0.046 + 0.004 * 0.99)
    assert latency_quantile(0.99, served, never=2) == TOKEN_LATENCY_BUCKETS[-1]


@pytest.mark.parametrize(("thresholds", "p99"), [
    ((), 0.02485),           # read as it is: 10 + 15 x 0.99 ms, over a 20 ms SLO
    ((0.02, 0.04), 0.0199),  # 20 ms inside (10, 25]: spread over (10, 20] ms instead
    ((0.01, 0.025), 0.02485),  # on edges: as it is
    ((0.005,), 0.02485),     # in another bucket than the P99's
])
def test_a_p99_is_read_as_the_recording_rules_judge_it(
        thresholds: tuple[float, ...], p99: float) -> None:
    # Every gap 12 ms, in vLLM's (10, 25] ms: the rules' judged P99 (rules.judged_buckets)
    # claims no breach of 20 ms that the buckets cannot prove; the direct scrape reads
    # the same.
    from slopilot.engine.histogram_quantiles import judged_quantile

    buckets = {0.01: 0.0, 0.025: 100.0, 0.05: 100.0, math.inf: 100.0}
    assert judged_quantile(0.99, buckets, thresholds) == pytest.approx(p99)
    # 10 % past 25 ms, in (25, 50]: over 20 ms for sure, over 40 ms not (25 + 15 x 0.9
    # ms, not 25 + 25 x 0.9).
    slow = {0.01: 0.0, 0.025: 90.0, 0.05: 100.0, math.inf: 100.0}
    assert judged_quantile(0.99, slow, (0.02, 0.04)) == pytest.approx(0.0385)
    assert judged_quantile(0.99, slow, ()) == pytest.approx(0.0475)
