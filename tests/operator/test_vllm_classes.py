"""vLLM pods in the per-class rules: their series get ``spec.slo.vllmClass``.

vLLM's histograms carry no ``priority_class``. The operator's ServiceMonitor for a vLLM
deployment relabels them into one class; here a real Prometheus, with the same rule as
``metric_relabel_configs``, scrapes a vLLM-shaped exposition and the deployment's
rendered rules record that class and fire its alert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from slopilot.operator.render import render_all
from slopilot.operator.service_monitor import (
    vllm_class_metric_relabel_config,
    vllm_class_relabeling,
    vllm_metric_relabelings,
)
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.prometheus.rules import (
    VLLM_LATENCY,
    VLLM_LATENCY_BUCKETS,
    RuleOptions,
    render_rules_yaml,
)
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.prometheus import PrometheusServer, ScrapeTarget, serve_metrics
from tests.support.waits import wait_for


def body(**slo: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u1"},
            "spec": {"backend": "vllm", "model": {"name": "meta-llama/Meta-Llama-3-8B"},
                     "slo": {"profile": "standard", **slo}}}


def test_a_vllm_monitor_puts_its_series_in_the_chosen_class() -> None:
    for given, cls in (({}, "p0"), ({"vllmClass": "p1"}, "p1")):
        b = body(**given)
        spec = parse_spec(b)
        assert spec.vllm_class == cls
        endpoint = render_all(b, spec).service_monitor["spec"]["endpoints"][0]
        assert endpoint["metricRelabelings"] == vllm_metric_relabelings(cls)
        assert vllm_class_relabeling(cls) in endpoint["metricRelabelings"]


def test_a_builtin_monitor_keeps_the_engines_own_classes() -> None:
    b = body()
    b["spec"]["backend"] = "builtin"
    endpoint = render_all(b, parse_spec(b)).service_monitor["spec"]["endpoints"][0]
    assert "metricRelabelings" not in endpoint


def test_an_unknown_class_is_refused_with_the_choices() -> None:
    with pytest.raises(SpecError, match=r"spec.slo.vllmClass='gold' is not allowed; use one "
                                        r"of: p0, p1, p2"):
        parse_spec(body(vllmClass="gold"))


def test_the_plain_prometheus_form_is_the_same_rule() -> None:
    monitor, plain = vllm_class_relabeling("p2"), vllm_class_metric_relabel_config("p2")
    assert plain == {"action": monitor["action"], "source_labels": monitor["sourceLabels"],
                     "regex": monitor["regex"], "target_label": monitor["targetLabel"],
                     "replacement": monitor["replacement"]}


def test_a_vllm_deployments_goodput_reads_vllms_own_bucket_edges() -> None:
    # The standard P0 TBT SLO is 20 ms; vLLM's inter-token buckets go 0.01, 0.025. The
    # rendered goodput selected le="0.02", which no vLLM pod exports, so P0's goodput and
    # the deployment's sloAttainment read nothing (the review of the loop's numbers).
    from slopilot.operator.reconcile import desired_objects

    def p0_goodput(backend: str) -> str:
        b = body()
        b["spec"]["backend"] = backend
        objects = desired_objects(b, parse_spec(b), replicas=1, monitoring=True,
                                  operator_namespace="slopilot-system")
        [rule] = [o for o in objects if o["kind"] == "PrometheusRule"]
        return next(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]
                    if r.get("record") == "slopilot:goodput_tokens:per_second"
                    and r["labels"]["priority_class"] == "p0")

    gaps = "vllm:inter_token_latency_seconds_bucket"
    vllm = p0_goodput("vllm")
    # The bucket that holds the SLO, (0.01, 0.025], counted as within it (no breach
    # the buckets cannot prove: ``fraction_within``), copied to le="0.02" replica by
    # replica; le="0.02" itself is read only where a replica exports it over the whole
    # window (``rules.judged_rates``), which no vLLM pod does.
    assert 'le="0.01"' not in vllm and gaps in vllm
    assert '"le", "0.02", "le", "0\\\\.025")' in vllm
    assert 'le="0.02"' in p0_goodput("builtin")  # the built-in engine exports that edge


@pytest.fixture
def vllm_endpoint() -> Iterator[tuple[Histogram, str]]:
    """A vLLM-shaped /metrics: its names, labels and bucket edges, no priority_class."""
    registry = CollectorRegistry()
    name = "vllm:inter_token_latency_seconds"
    itl = Histogram(name, "Inter-token latency.", ["model_name", "engine"],
                    buckets=VLLM_LATENCY_BUCKETS[name], registry=registry)

    with serve_metrics(lambda: generate_latest(registry)) as address:
        yield itl, address


@pytest.mark.prometheus
@pytest.mark.slow
def test_vllm_token_gaps_reach_the_class_rules_and_fire_its_alert(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        vllm_endpoint: tuple[Histogram, str], tmp_path: Path) -> None:
    itl, address = vllm_endpoint
    spec = parse_spec(body())
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules_yaml(
        spec.slo, "chat", options=RuleOptions(interval_s=1, rate_window_s=5, alert_for_s=1,
                                              tbt_periods=1),
        latency=VLLM_LATENCY))
    prom = prometheus_factory(
        targets=[ScrapeTarget("vllm", [address], {"slopilot_deployment": "chat"},
                              metric_relabel_configs=[
                                  vllm_class_metric_relabel_config(spec.vllm_class)])],
        rule_files=[rules])
    limit_s = spec.slo.p0.tbt_p99_ms / 1000  # type: ignore[operator]

    def firing() -> list[dict[str, Any]]:
        for _ in range(50):  # each poll adds slow gaps, so every scrape sees growth
            itl.labels(model_name="llama", engine="0").observe(3 * limit_s)
        return [a for a in prom.alerts() if a["state"] == "firing"
                and a["labels"]["alertname"] == "SlopilotTBTP99High"]

    fired = wait_for(firing, what="the P0 TBT alert on vLLM's gaps",
                     interval_s=0.2)
    assert fired[0]["labels"]["priority_class"] == "p0"
    recorded = prom.query('slopilot:tbt_seconds:p99{slopilot_deployment="chat"}')
    assert {s["metric"]["priority_class"] for s in recorded["data"]["result"]} == {"p0"}
