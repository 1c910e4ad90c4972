"""A dashboard written for vLLM reads the built-in engine unchanged.

The engine names its series as vLLM does so that what its users already run on vLLM
(dashboards, recording rules) works here. vLLM's own example dashboard
(vllm-project/vllm, examples/observability/prometheus_grafana/grafana.json, the one its
docs point to) reads the series below; each must be exported, and the request phases
must split as vLLM splits them (vllm/v1/metrics/stats.py, ``update_from_finished_request``:
prefill = first token - first scheduled, decode = last token - first token, inference =
last token - first scheduled).
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.metric_names import exported_series
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from tests.engine.helpers import make_request
from tests.engine.test_iteration_metrics import Clock, TickingExecutor

# Every expression of vLLM's example dashboard (its panels' targets), as it ships them.
VLLM_EXAMPLE_DASHBOARD = (
    'histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket'
    '{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:e2e_request_latency_seconds_sum{model_name="$model_name"}[$__rate_interval])'
    '/rate(vllm:e2e_request_latency_seconds_count{model_name="$model_name"}'
    '[$__rate_interval])',
    'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket'
    '{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:inter_token_latency_seconds_sum{model_name="$model_name"}[$__rate_interval])'
    '/rate(vllm:inter_token_latency_seconds_count{model_name="$model_name"}'
    '[$__rate_interval])',
    'vllm:num_requests_running{model_name="$model_name"}',
    'vllm:num_requests_waiting{model_name="$model_name"}',
    'histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket'
    '{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:time_to_first_token_seconds_sum{model_name="$model_name"}[$__rate_interval])'
    '/rate(vllm:time_to_first_token_seconds_count{model_name="$model_name"}'
    '[$__rate_interval])',
    'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    'sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$model_name"}'
    '[$__rate_interval]))',
    'sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name="$model_name"}'
    '[$__rate_interval]))',
    'sum by(finished_reason) (increase(vllm:request_success_total'
    '{model_name="$model_name"}[$__rate_interval]))',
    'rate(vllm:request_queue_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_prefill_time_seconds_sum{model_name="$model_name"}'
    '[$__rate_interval])',
    'rate(vllm:request_decode_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_max_num_generation_tokens_sum{model_name="$model_name"}'
    '[$__rate_interval])',
)
_SELECTED = re.compile(r"(vllm:[a-zA-Z0-9_:]+)\{")


def test_every_series_vllms_example_dashboard_reads_is_exported() -> None:
    read = {name for expr in VLLM_EXAMPLE_DASHBOARD for name in _SELECTED.findall(expr)}
    # The pattern finds a series in every expression: the check cannot pass vacuously.
    assert all(_SELECTED.search(expr) for expr in VLLM_EXAMPLE_DASHBOARD)
    assert read - exported_series() == set()


def _sums(metrics: EngineMetrics, family: str) -> tuple[float, float]:
    """(sum, count) of ``family`` over its classes, as the rendered text says."""
    total = count = 0.0
    for fam in text_string_to_metric_families(metrics.render().decode()):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name.endswith("_sum"):
                total += s.value
            elif s.name.endswith("_count"):
                count += s.value
    return total, count


def test_the_request_phases_split_as_vllms_do() -> None:
    clock = Clock()
    metrics = EngineMetrics("tiny", clock=clock)
    engine = LLMEngine(EngineConfig(budget_align=1), TickingExecutor(clock, 0.010), 100,
                       clock=WallClock(clock), observers=[MetricsObserver(metrics)])
    engine.add_request(make_request("a", 8, max_tokens=4))
    while engine.has_work():
        engine.step()
    # Four iterations of 10 ms: the prefill's gives the first token, three decode steps
    # the other three.
    prefill, n = _sums(metrics, "vllm:request_prefill_time_seconds")
    decode, n_decode = _sums(metrics, "vllm:request_decode_time_seconds")
    inference, n_inference = _sums(metrics, "vllm:request_inference_time_seconds")
    assert n == n_decode == n_inference == 1
    assert abs(prefill - 0.010) < 1e-9
    assert abs(decode - 0.030) < 1e-9
    assert abs(inference - (prefill + decode)) < 1e-9
    tokens, requests = _sums(metrics, "vllm:request_max_num_generation_tokens")
    assert (tokens, requests) == (4, 1)


def test_every_finish_reason_is_exported_at_zero_from_the_start() -> None:
    """As vLLM does (it creates ``vllm:request_success_total`` for every finish reason at
    start): rate() and increase() read a counter's change between two samples, so a
    series born at 1 never shows its first request. Created on first use, a replica
    whose only abort was its first read no abort at all on "Finish Reason"."""
    metrics = EngineMetrics("tiny", clock=Clock())
    reasons = {s.labels["finished_reason"]: s.value
               for fam in text_string_to_metric_families(metrics.render().decode())
               if fam.name == "vllm:request_success" for s in fam.samples
               if s.name == "vllm:request_success_total"}
    # vLLM's five (FinishReason), the two the engine never ends with too.
    assert reasons == {r: 0.0 for r in ("stop", "length", "abort", "error", "repetition")}
