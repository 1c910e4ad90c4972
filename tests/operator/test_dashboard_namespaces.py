"""Several namespaces chosen at once: each panel draws each deployment apart.

A review found "Tokens per second" (``sum``), "Replicas" (``max``), "Knobs over time"
(``max by (knob)``) and others adding up the same-named deployments of every namespace
chosen (``chat`` in team-a and team-b read as one), where the TTFT and TBT panels group
by namespace and deployment. Every aggregation now keeps both labels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.dashboards import build_dashboard
from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, VLLM_LATENCY, LatencySources
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool

_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\)\s*)?\(")
IDENTITY = {"slopilot_namespace", "slopilot_deployment"}
KUBE_IDENTITY = {"namespace", "deployment"}
"""kube-state-metrics' labels for the same: its series carry no slopilot_* ones."""
WHOSE = "{{slopilot_namespace}}/{{slopilot_deployment}}"


def _targets(latency: LatencySources) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in build_dashboard(latency=latency)["panels"]
            if p["type"] not in ("row", "heatmap") for t in p.get("targets", [])]


@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_every_aggregation_keeps_the_deployments_apart(latency: LatencySources) -> None:
    # The heatmap is one histogram of buckets: Grafana draws one series per bucket.
    for title, target in _targets(latency):
        expr = target["expr"]
        for found in _AGGREGATION.finditer(expr):
            by = {label.strip() for label in (found[2] or "").split(",")}
            assert by >= IDENTITY or by >= KUBE_IDENTITY, (title, found[0], expr)
        legend = target["legendFormat"]
        assert WHOSE in legend or "{{namespace}}/{{deployment}}" in legend, (title, legend)


def _two_chats() -> list[dict[str, str]]:
    """``chat`` in team-a and team-b: one pod each, team-b's twice as busy."""
    series = []
    for ns, scale in (("team-a", 1), ("team-b", 2)):
        ident = f'slopilot_namespace="{ns}",slopilot_deployment="chat"'
        pod = f'{ident},instance="{ns}-pod",namespace="{ns}"'
        op = f'{ident},namespace="slopilot-system"'
        series += [
            {"series": f"vllm:generation_tokens_total{{{pod}}}", "values": f"0+{600 * scale}x10"},
            {"series": f"vllm:num_requests_running{{{pod}}}", "values": f"{3 * scale}x10"},
            {"series": f'slopilot_config_knob{{{pod},knob="token_budget"}}',
             "values": f"{1024 * scale}x10"},
            {"series": f"slopilot_replicas{{{op}}}", "values": f"{scale}x10"},
        ]
    return series


@pytest.mark.prometheus
@pytest.mark.parametrize(("title", "legend", "per_namespace"), [
    ("Tokens per second and goodput", "generated", {"team-a": 10, "team-b": 20}),
    ("Requests", "running", {"team-a": 3, "team-b": 6}),
    ("Replicas", "desired", {"team-a": 1, "team-b": 2}),
    ("Knobs over time", "{{knob}}", {"team-a": 1024, "team-b": 2048}),
])
def test_two_namespaces_chosen_draw_two_lines(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        title: str, legend: str, per_namespace: dict[str, float]) -> None:
    target = next(t for t_title, t in _targets(BUILTIN_LATENCY)
                  if t_title == title and t["legendFormat"].startswith(legend))
    expr = target["expr"]
    for var, value in {"$__rate_interval": "2m", "$namespace": "team-a|team-b",
                       "$deployment": "chat", "$operator_namespace": "slopilot-system"
                       }.items():
        expr = expr.replace(var, value)
    extra = ',knob="token_budget"' if "knob" in legend else ""
    expected = [{"labels": f'{{{extra[1:]}{"," if extra else ""}slopilot_deployment="chat",'
                           f'slopilot_namespace="{ns}"}}', "value": value}
                for ns, value in per_namespace.items()]
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _two_chats(), "promql_expr_test": [{
            "expr": expr, "eval_time": "5m", "exp_samples": expected}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
