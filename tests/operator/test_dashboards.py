"""The Grafana dashboard: checked-in JSON, PromQL a real Prometheus accepts, known series."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.meter.client_latency import CLIENT_ABANDONED, CLIENT_AWAITING, CLIENT_SERIES
from slopilot.engine.meter.exposition import IN_FLIGHT, METER_REFUSED
from slopilot.engine.metric_names import exported_series
from slopilot.operator.dashboards import (
    EXTERNAL_METRICS,
    build_dashboard,
    dashboard_path,
    render_dashboard,
)
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    example_spec,
    render_rule_groups,
)
from tests.support.fixtures import prometheus_binaries, prometheus_server  # noqa: F401
from tests.support.prometheus import PrometheusBinaries, PrometheusServer, promtool

# Every vector selector the generators write has braces: a name right before '{'.
_SELECTED = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
_TEMPLATE = {"$__rate_interval": "1m", "$__interval": "15s", "$namespace": "team-a",
             "$deployment": "example", "$operator_namespace": "slopilot-system"}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if a.get("expr")]
    return exprs


def rule_exprs(latency: LatencySources = BUILTIN_LATENCY) -> tuple[list[str], set[str]]:
    groups = render_rule_groups(example_spec(), "example", latency=latency)
    rules = [r for g in groups["groups"] for r in g["rules"]]
    return [r["expr"] for r in rules], {r["record"] for r in rules if "record" in r}


def substitute(expr: str) -> str:
    for var, value in _TEMPLATE.items():
        expr = expr.replace(var, value)
    # "$1" is a label_replace back-reference, not a Grafana variable.
    assert not re.search(r"\$(?!\d)", expr), f"unknown template variable in {expr}"
    return expr


def test_checked_in_dashboard_equals_the_generator() -> None:
    assert dashboard_path().read_text() == render_dashboard(), (
        "dashboards/slopilot-overview.json is stale: run python -m slopilot.operator.dashboards")


def test_variables_and_panels_cover_the_brief() -> None:
    d = build_dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["deployment"]["type"] == "query"
    # A deployment is its namespace and its name: every selector carries both.
    assert variables["namespace"]["type"] == "query"
    assert "$namespace" in variables["deployment"]["query"]
    for expr in dashboard_exprs(d):
        if "slopilot_deployment" in expr:
            assert 'slopilot_namespace=~"$namespace"' in expr, expr
    titles = " | ".join(p["title"] for p in _panels(d))
    for needed in ("TTFT P0", "TBT P1", "goodput", "Preemptions per minute by mode",
                   "Requests", "Batch size", "KV cache", "Prefix cache hit rate",
                   "Busy ratio", "Knobs over time", "Live configuration", "Replicas",
                   "Tuner trials"):
        assert needed in titles, needed
    heat = next(p for p in _panels(d) if p["type"] == "heatmap")
    assert "vllm:iteration_tokens_total_bucket" in heat["targets"][0]["expr"]
    assert {a["name"] for a in d["annotations"]["list"]} >= {"Tuner actions", "Tuner trials"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in _panels(d))


def test_the_twin_section_shows_its_check_and_what_the_correction_learned() -> None:
    panels = {p["title"]: p for p in _panels(build_dashboard())}
    error = " ".join(t["expr"] for t in panels["Twin error and trust"]["targets"])
    for series in ("slopilot_twin_error", "slopilot_twin_trusted"):
        assert series in error, series
    learned = panels["What the twin's correction learned"]
    assert "slopilot_twin_correction_factor" in learned["targets"][0]["expr"]
    assert "{{feature}}" in learned["targets"][0]["legendFormat"]


def test_the_controllers_series_the_dashboard_reads_are_the_ones_it_registers() -> None:
    from prometheus_client import generate_latest

    from slopilot.tuner.loop.metrics import TunerMetrics

    # Every family TunerMetrics registers (a labelled one shows its HELP line unset).
    families = {line.split()[2] for line in
                generate_latest(TunerMetrics().registry).decode().splitlines()
                if line.startswith("# TYPE")}
    ours = {n for n in EXTERNAL_METRICS if n.startswith(("slopilot_tuner", "slopilot_twin",
                                                          "slopilot_replicas"))}
    assert ours, "no controller series named: the test would pass vacuously"
    for name in ours:
        assert name in families, name


def test_every_referenced_series_is_exported_or_documented() -> None:
    exprs, recorded = rule_exprs()
    exprs += rule_exprs(VLLM_LATENCY)[0]
    exprs += dashboard_exprs(build_dashboard())
    exprs += dashboard_exprs(build_dashboard(latency=VLLM_LATENCY))
    # The meter's, beside a vLLM engine (engine/meter/client_latency.py).
    meter = {f"{name}_{part}" for name in CLIENT_SERIES for part in ("bucket", "count")}
    meter |= {CLIENT_ABANDONED, CLIENT_AWAITING, IN_FLIGHT, METER_REFUSED}
    known = exported_series() | set(EXTERNAL_METRICS) | recorded | meter
    referenced = {name for e in exprs for name in _SELECTED.findall(e)}
    assert referenced, "the selector pattern found nothing: the test would pass vacuously"
    assert referenced - known == set()
    # And the check is not vacuous the other way: an unknown name is caught.
    assert _SELECTED.findall("rate(vllm:no_such_series{a=\"b\"}[1m])")[0] not in known


@pytest.mark.prometheus
def test_every_query_parses_in_real_prometheus(
        prometheus_server: PrometheusServer) -> None:  # noqa: F811
    exprs = dashboard_exprs(build_dashboard()) + rule_exprs()[0]
    exprs += dashboard_exprs(build_dashboard(latency=VLLM_LATENCY)) + rule_exprs(VLLM_LATENCY)[0]
    for expr in exprs:
        answer = prometheus_server.query(substitute(expr))
        assert answer["status"] == "success", f"{expr}\n-> {answer.get('error')}"
    bad = prometheus_server.query("sum(rate(vllm:x[1m])")
    assert bad["status"] == "error", "the check must be able to fail"


def test_a_vllm_deployments_latency_panels_show_what_the_loop_reads() -> None:
    """vLLM's own histograms leave out its frontend's work: the loop reads the meter's
    client-side P99 where it saw a stream, vLLM's where not, and the vLLM dashboard
    draws that figure, with vLLM's own P99 beside it, labelled."""
    from slopilot.engine.meter.client_latency import CLIENT_TBT, CLIENT_TTFT
    from slopilot.operator.dashboards import vllm_dashboard_path
    from slopilot.tuner.prometheus.rules import VLLM_LATENCY

    vllm = build_dashboard(latency=VLLM_LATENCY)
    assert vllm["uid"] != build_dashboard()["uid"]
    panels = {p["title"]: p for p in _panels(vllm)}
    for title, client, own in (("TTFT P0", CLIENT_TTFT, "vllm:time_to_first_token_seconds"),
                               ("TBT P0", CLIENT_TBT, "vllm:inter_token_latency_seconds")):
        panel = next(p for t, p in panels.items() if t.startswith(title))
        legends = {t["legendFormat"].split(" {{")[0]: t["expr"] for t in panel["targets"]}
        # The figures the rules record, the meter's with vLLM's as its fallback
        # (test_latency_sources), each replica read at the deployment's thresholds.
        short = title.split()[0].lower()
        assert f"slopilot:{short}_seconds:p99{{" in legends["P99"]
        assert f"slopilot:{short}_seconds:p50{{" in legends["P50"]
        assert client not in legends["P99 as vLLM measures it"]
        assert own in legends["P99 as vLLM measures it"]
    assert vllm_dashboard_path().read_text() == render_dashboard(latency=VLLM_LATENCY), (
        "dashboards/slopilot-overview-vllm.json is stale: "
        "run python -m slopilot.operator.dashboards")
    # The built-in engine's dashboard reads no meter.
    assert not any(name in render_dashboard() for name in (CLIENT_TTFT, CLIENT_TBT))


@pytest.mark.prometheus
@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_the_replicas_panel_counts_the_engine_pods_scraped_on_either_backend(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        latency: LatencySources) -> None:
    """Two pods of one deployment scraped: "scraped engines" reads 2, on the built-in
    engine's dashboard and on vLLM's alike. vLLM exports no slopilot_engine_info, and
    labels each data-parallel engine's series with ``engine`` (pod b runs two)."""
    panel = next(p for p in _panels(build_dashboard(latency=latency))
                 if p["title"] == "Replicas")
    expr = next(t["expr"] for t in panel["targets"]
                if t["legendFormat"].startswith("scraped engines"))
    ident = 'slopilot_namespace="team-a",slopilot_deployment="example"'
    if latency == BUILTIN_LATENCY:
        series = [{"series": f'{name}{{{ident},instance="{pod}",model_name="m"}}',
                   "values": "1x10"}
                  for pod in ("a", "b")
                  for name in ("vllm:num_requests_running", "slopilot_engine_info")]
    else:
        series = [{"series": f'vllm:num_requests_running{{{ident},instance="{pod}",'
                             f'model_name="m",engine="{engine}"}}', "values": "1x10"}
                  for pod, engine in (("a", "0"), ("b", "0"), ("b", "1"))]
    # Another deployment's pod, and the same name in another namespace: not counted.
    series += [{"series": f'vllm:num_requests_running{{{other},instance="c"}}',
                "values": "1x10"}
               for other in ('slopilot_namespace="team-a",slopilot_deployment="other"',
                             'slopilot_namespace="team-b",slopilot_deployment="example"')]
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": substitute(expr), "eval_time": "5m",
            "exp_samples": [{"labels": f"{{{ident}}}", "value": 2}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_requests_cut_at_the_send_deadline_are_on_the_finished_panel() -> None:
    """A stalled client's request ends unserved (aborted at ``--send-timeout``): where the
    operator looks for requests that ended, not only in the exporter."""
    from slopilot.engine.metric_names import SEND_TIMEOUTS

    panel = next(p for p in _panels(build_dashboard())
                 if p.get("title") == "Finished requests per second")
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(SEND_TIMEOUTS in e for e in exprs), exprs
