"""A tenant's own monitors and rules cannot draw on another namespace's dashboard.

A tenant allowed ServiceMonitors, PodMonitors or PrometheusRules in team-evil can write
series with ``slopilot_namespace="team-b"``; the Prometheus's enforced namespace label
(``namespace``, prometheus-operator's ``enforcedNamespaceLabel``) then says team-evil, and
no tenant can write it. The dashboard's own queries, evaluated by promtool with the
variables set to team-b's ``chat``: the forged series draws nothing, team-b's stamped
series and an unstamped one (a Prometheus without the enforcement) draw, and the
operator's series count only from the operator's namespace."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.dashboards import OPERATOR_NAMESPACE, WHOSE, build_dashboard
from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, VLLM_LATENCY, LatencySources
from tests.support.fixtures import prometheus_binaries  # noqa: F401
from tests.support.prometheus import PrometheusBinaries, promtool

_VARIABLES = {"$__rate_interval": "1m", "$namespace": "team-b", "$deployment": "chat",
              "$operator_namespace": OPERATOR_NAMESPACE}
IDENT = 'slopilot_namespace="team-b",slopilot_deployment="chat"'
FORGED = ',namespace="team-evil"'
"""What enforcement stamps on a tenant's series from team-evil."""


def _expr(dashboard: dict[str, Any], title: str, legend: str) -> str:
    if title == "annotation":
        expr = next(a["expr"] for a in dashboard["annotations"]["list"]
                    if a["name"] == legend)
    else:
        panel = next(p for p in dashboard["panels"] if p.get("title") == title)
        # Each line is named for its deployment too (several may be chosen).
        expr = next(t["expr"] for t in panel["targets"]
                    if t["legendFormat"] in (legend, f"{legend} {WHOSE}"))
    # The variables a Grafana user sets, longest first ($operator_namespace holds none).
    for var, value in sorted(_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def _case(d: dict[str, Any], own: str, operator: str) -> dict[str, Any]:
    """One promtool test: team-b's series labelled ``own`` and the operator's labelled
    ``operator`` (each "" where unstamped), beside forged ones that must not draw."""
    series = [
        # Recorded by team-b's rules; forged by a rule of team-evil's.
        (f'slopilot:ttft_seconds:p99{{{IDENT},priority_class="p0"{own}}}', "0.2x40"),
        (f'slopilot:ttft_seconds:p99{{{IDENT},priority_class="p0"{FORGED}}}', "9x40"),
        # Scraped from team-b's engines; forged by team-evil's own PodMonitor.
        (f'vllm:num_requests_running{{{IDENT},instance="a"{own}}}', "3x40"),
        (f'vllm:num_requests_running{{{IDENT},instance="x"{FORGED}}}', "50x40"),
        # team-b's alert, and one a rule of team-evil's fires in team-b's name.
        (f'ALERTS{{alertname="SlopilotTTFTP99High",alertstate="firing",{IDENT}{own}}}',
         "1x40"),
        (f'ALERTS{{alertname="SlopilotEngineStalled",alertstate="firing",{IDENT}{FORGED}}}',
         "1x40"),
        # The operator's, scraped from its pod; forged from team-evil and from team-b
        # itself (a tenant's monitor is never the operator's).
        (f"slopilot_replicas{{{IDENT}{operator}}}", "3x40"),
        (f"slopilot_replicas{{{IDENT}{FORGED}}}", "40x40"),
        (f'slopilot_replicas{{{IDENT},namespace="team-b"}}', "50x40"),
        (f"slopilot_twin_trusted{{{IDENT}{operator}}}", "1x40"),
        (f"slopilot_twin_trusted{{{IDENT}{FORGED}}}", "0x40"),
        (f'slopilot_tuner_actions_total{{{IDENT},action="scale",reason="alert"{operator}}}',
         "0x19 1x20"),  # one step, at the evaluation: changes() sees it either way
        (f'slopilot_tuner_actions_total{{{IDENT},action="revert",reason="x"{FORGED}}}',
         "0x19 1x20"),
    ]
    ident = f"{{{IDENT}}}"
    checks = [
        (_expr(d, "TTFT P0", "P99 {{slopilot_namespace}}/{{slopilot_deployment}}"),
         [(ident, 0.2)]),
        (_expr(d, "Requests", "running"), [(ident, 3)]),
        (_expr(d, "annotation", "Alerts"),
         [(f'ALERTS{{alertname="SlopilotTTFTP99High",alertstate="firing",{IDENT}{own}}}',
           1)]),
        (_expr(d, "Replicas", "desired"), [(ident, 3)]),
        (_expr(d, "Twin error and trust", "trusted (100% = yes)"), [(ident, 1)]),
        (_expr(d, "annotation", "Tuner actions"),
         [(f'{{{IDENT},action="scale",reason="alert"{operator}}}', 1)]),
    ]
    return {"interval": "30s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [
                {"expr": expr, "eval_time": "10m",
                 "exp_samples": [{"labels": labels, "value": value}
                                 for labels, value in want]}
                for expr, want in checks]}


@pytest.mark.prometheus
@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_a_tenants_forged_series_draw_nothing_on_another_namespaces_dashboard(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        latency: LatencySources) -> None:
    d = build_dashboard(latency=latency)
    test = {"rule_files": [], "evaluation_interval": "30s", "tests": [
        # Under enforcement: team-b's own stamped team-b, the operator's its namespace.
        _case(d, ',namespace="team-b"', f',namespace="{OPERATOR_NAMESPACE}"'),
        # A Prometheus that stamps nothing (the demo, a plain scrape config).
        _case(d, "", "")]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
OPERATOR_SERIES = ("slopilot_tuner_", "slopilot_replicas", "slopilot_twin_")


@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_every_selector_of_a_deployment_also_matches_the_enforced_label(
        latency: LatencySources) -> None:
    """Every query and variable that selects a deployment's series, not only those
    evaluated above: the operator's from its namespace, the rest from the chosen one."""
    d = build_dashboard(latency=latency)
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in d["annotations"]["list"] if a.get("expr")]
    exprs += [v["query"] for v in d["templating"]["list"] if v["name"] == "deployment"]
    seen = 0
    for expr in exprs:
        for name, matchers in _SELECTOR.findall(expr):
            if "slopilot_namespace" not in matchers:
                continue
            seen += 1
            want = ('namespace=~"$operator_namespace|"' if name.startswith(OPERATOR_SERIES)
                    else 'namespace=~"$namespace|"')
            assert want in matchers.split(","), (name, expr)
    assert seen > 40


def test_the_enforced_label_is_the_one_the_dashboard_is_generated_for() -> None:
    """A Prometheus enforcing another label name: every guard names it instead."""
    text = json.dumps(build_dashboard(namespace_label="tenant"))
    assert text.count('tenant=~\\"$namespace|\\"') > 40
    assert text.count('tenant=~\\"$operator_namespace|\\"') >= 8
    assert 'namespace=~\\"$namespace|\\"' not in text
    # kube-state-metrics' own namespace label is no guard: it stays.
    assert 'kube_deployment_status_replicas{namespace=~\\"$namespace\\"' in text
    with pytest.raises(ValueError, match="namespace_label"):
        build_dashboard(namespace_label="slopilot_namespace")


@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_all_namespaces_is_the_namespaces_listed_not_every_one(latency: LatencySources) -> None:
    """Grafana opens a multi-value variable on All; an All of ".*" made the guard
    ``namespace=~"$namespace|"`` match every namespace, one with no deployment too."""
    variables = build_dashboard(latency=latency)["templating"]["list"]
    namespace = next(v for v in variables if v["name"] == "namespace")
    assert namespace.get("includeAll") is True and "allValue" not in namespace
