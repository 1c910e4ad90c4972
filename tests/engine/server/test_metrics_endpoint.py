"""/metrics: the classic text format with vLLM's names, whatever the scraper asks for."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.metric_names import VLLM_METRICS
from tests.support.live_server import start_server
from tests.support.waits import HANG_GUARD_S

OPENMETRICS_ACCEPT = ("application/openmetrics-text;version=1.0.0,"
                      "application/openmetrics-text;version=0.0.1;q=0.75,"
                      "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_metrics_after_traffic() -> None:
    with start_server() as srv:
        url = srv.url + "/v1/completions"
        for priority in ("p0", "p1", "p1"):
            res = httpx.post(url, json={"prompt": "one two three", "max_tokens": 4,
                                        "priority": priority}, timeout=HANG_GUARD_S)
            assert res.status_code == 200
        # The gauges settle when the engine goes idle (and checks its integrity).
        srv.call(lambda e: None)
        res = httpx.get(srv.url + "/metrics", headers={"Accept": OPENMETRICS_ACCEPT})
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(res.text)}
    # The parser strips _total from counters; compare base names.
    bases = {n.removesuffix("_total") for n in families}
    assert {n.removesuffix("_total") for n in VLLM_METRICS} <= bases
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    model = srv.backend.served_model_name

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"model_name": model, **labels}.items())))]

    assert value("vllm:time_to_first_token_seconds_count", priority_class="p0") == 1
    assert value("vllm:time_to_first_token_seconds_count", priority_class="p1") == 2
    assert value("vllm:inter_token_latency_seconds_count", priority_class="p1") == 2 * 3
    assert value("vllm:request_success_total", finished_reason="length") == 3
    assert value("vllm:prompt_tokens_total") == 3 * 3
    assert value("vllm:generation_tokens_total") == 3 * 4
    assert value("vllm:num_requests_running") == 0
    assert value("vllm:kv_cache_usage_perc") == 0
    assert value("slopilot_busy_ratio") > 0
