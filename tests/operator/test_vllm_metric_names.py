"""vLLM's series reach Prometheus under the ``vllm:`` names the rules select.

vLLM serves /metrics with prometheus_client's ASGI app (vLLM v0.11.0,
vllm/entrypoints/openai/api_server.py, ``mount_metrics``: ``make_asgi_app``), which
picks the format from the scraper's Accept header. From prometheus_client 0.23 (before
vLLM 0.11.0 was released; vLLM asks only for >= 0.18), an OpenMetrics answer to a
scraper that does not offer ``escaping=allow-utf-8`` (every Prometheus 2, a Prometheus 3
on legacy name validation) writes each sample's name with ``_`` for ``:``
(``vllm_num_requests_running``): Prometheus stores that, and every rule, alert, panel and
trial query that selects ``vllm:...`` reads nothing. The fixture of
test_vllm_classes.py serves the classic text format whatever is asked, so it never saw
this. The ServiceMonitor renames ``vllm_*`` back; a name already ``vllm:`` is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from slopilot.operator.dashboards import render_dashboard
from slopilot.operator.render import render_all
from slopilot.operator.service_monitor import vllm_metric_relabel_configs
from slopilot.operator.spec import parse_spec
from slopilot.tuner.prometheus.rules import (
    VLLM_LATENCY,
    VLLM_LATENCY_BUCKETS,
    render_rules_yaml,
)
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.prometheus import PrometheusServer, ScrapeTarget, serve_negotiated
from tests.support.waits import wait_for

# What Prometheus 2 (2.42, Debian's) sends on every scrape.
PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-"
                       "text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
LABELS = ["model_name", "engine"]  # vLLM v0.11.0, vllm/v1/metrics/loggers.py


def body() -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u1"},
            "spec": {"backend": "vllm", "model": {"name": "meta-llama/Meta-Llama-3-8B"},
                     "slo": {"profile": "standard", "prefixHitMin": 0.5}}}


def vllm_registry() -> CollectorRegistry:
    """The series the rules read, declared as vLLM v0.11.0's loggers.py declares them."""
    r = CollectorRegistry()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        Gauge(name, name, LABELS, registry=r).labels("m", "0").set(1)
    for name in ("vllm:num_preemptions", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:generation_tokens", "vllm:prompt_tokens"):
        Counter(name, name, LABELS, registry=r).labels("m", "0").inc()
    Counter("vllm:request_success", "", [*LABELS, "finished_reason"],
            registry=r).labels("m", "0", "stop").inc()
    for name, edges in (*VLLM_LATENCY_BUCKETS.items(),
                        ("vllm:e2e_request_latency_seconds", (0.3, 0.5, 1.0)),
                        ("vllm:request_generation_tokens", (1, 2, 5, 10)),
                        ("vllm:request_prompt_tokens", (1, 2, 5, 10)),
                        ("vllm:iteration_tokens_total", (1, 8, 16))):
        Histogram(name, name, LABELS, buckets=edges, registry=r).labels("m", "0").observe(0.2)
    return r


def served_names(registry: CollectorRegistry, accept: str) -> set[str]:
    encoder, _ = choose_encoder(accept)
    return {line.split("{")[0].split(" ")[0] for line in encoder(registry).decode().splitlines()
            if line and not line.startswith("#")}


def relabel(name: str, rules: Sequence[Mapping[str, Any]]) -> str:
    """The metric name after Prometheus' replace rules on ``__name__`` (anchored regex,
    ``${1}`` for the group), the only kind these rules use on it."""
    for rule in rules:
        if rule.get("source_labels") != ["__name__"]:
            continue
        assert rule["action"] == "replace" and rule["target_label"] == "__name__"
        if (m := re.fullmatch(rule["regex"], name)) is not None:
            name = m.expand(rule["replacement"].replace("${", "\\g<").replace("}", ">"))
    return name


def selected_vllm_names() -> set[str]:
    """Every vllm:* name the deployment's rules and dashboard select."""
    spec = parse_spec(body())
    text = render_rules_yaml(spec.slo, "chat", namespace="team",
                             latency=VLLM_LATENCY)
    text += render_dashboard(latency=VLLM_LATENCY)
    return set(re.findall(r"vllm:[a-z0-9_:]+", text))  # digits too: vllm:e2e_...


def test_prometheus_2_is_served_vllms_names_with_underscores() -> None:
    # The premise, on the prometheus_client this project runs: were it ever false, the
    # rename below would simply match nothing.
    names = served_names(vllm_registry(), PROMETHEUS_2_ACCEPT)
    assert "vllm_num_requests_running" in names and "vllm:num_requests_running" not in names


@pytest.mark.parametrize("accept", [PROMETHEUS_2_ACCEPT, "text/plain;version=0.0.4"])
def test_the_monitor_stores_every_selected_name_whichever_format_is_served(
        accept: str) -> None:
    b = body()
    endpoint = render_all(b, parse_spec(b)).service_monitor["spec"]["endpoints"][0]
    plain = vllm_metric_relabel_configs(parse_spec(b).vllm_class)
    assert [(r["sourceLabels"], r["regex"], r["targetLabel"], r["replacement"])
            for r in endpoint["metricRelabelings"]] == [
        (r["source_labels"], r["regex"], r["target_label"], r["replacement"]) for r in plain]
    stored = {relabel(n, plain) for n in served_names(vllm_registry(), accept)}
    missing = {n for n in selected_vllm_names()
               if not ({n, f"{n}_bucket", f"{n}_count"} & stored)}
    assert not missing, sorted(missing)


@pytest.fixture
def negotiating_vllm() -> Iterator[str]:
    """A vLLM-shaped /metrics that answers in the format asked, as vLLM's does."""
    registry = vllm_registry()

    def answer(accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    with serve_negotiated(answer) as at:
        yield at


@pytest.mark.prometheus
def test_a_real_prometheus_stores_a_negotiating_vllm_under_the_selected_names(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        negotiating_vllm: str, tmp_path: Path) -> None:
    spec = parse_spec(body())
    prom = prometheus_factory(targets=[ScrapeTarget(
        "vllm", [negotiating_vllm], {"slopilot_deployment": "chat"},
        metric_relabel_configs=vllm_metric_relabel_configs(spec.vllm_class))])

    def scraped() -> bool:
        answer = prom.query("up")
        return bool(answer["data"]["result"]) and \
            answer["data"]["result"][0]["value"][1] == "1"

    wait_for(scraped, what="a scrape of the vLLM-shaped target", interval_s=0.2)
    wait_for(lambda: prom.query('count({__name__=~"vllm.+"})')["data"]["result"],
             what="vLLM's series", interval_s=0.2)
    for name in ("vllm:num_requests_running", "vllm:num_preemptions_total",
                 "vllm:inter_token_latency_seconds_bucket"):
        result = prom.query(f'{name}{{slopilot_deployment="chat"}}')["data"]["result"]
        assert result, f"{name} is not stored under that name"
        assert {s["metric"]["priority_class"] for s in result} == {"p0"}
    assert not prom.query('{__name__=~"vllm_.+"}')["data"]["result"]
