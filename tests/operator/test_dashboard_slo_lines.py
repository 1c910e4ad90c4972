"""The dashboards' SLO lines are the chosen deployment's own objectives.

One dashboard serves every LLMDeployment, chosen by its namespace and deployment
variables: a line drawn from the standard profile's numbers would tell a strict CR its
P1 TBT SLO is 100 ms. Each line is a query of the series the CR's own rules record
(``tuner/prometheus/objectives``), drawn dashed; a class or objective the CR does not
have records no series, so no line; and no title names a number.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.dashboards import build_dashboard
from slopilot.operator.reconcile import desired_objects
from slopilot.operator.spec import parse_spec
from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, VLLM_LATENCY, LatencySources
from tests.operator.test_crd import sample
from tests.operator.test_dashboards import substitute
from tests.support.fixtures import prometheus_binaries  # noqa: F401
from tests.support.prometheus import PrometheusBinaries, promtool

BACKENDS = [BUILTIN_LATENCY, VLLM_LATENCY]
LATENCY_TITLES = [f"{short} {cls}" for short in ("TTFT", "TBT") for cls in ("P0", "P1", "P2")]
LINED = [*LATENCY_TITLES, "Preemptions per minute", "Prefix cache hit rate",
         "the batching alert's input"]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def panel(dashboard: dict[str, Any], part: str) -> dict[str, Any]:
    found = [p for p in panels(dashboard) if part in p["title"]]
    assert len(found) == 1, (part, [p["title"] for p in found])
    return found[0]


def slo_lines(p: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets the panel draws as dashed lines (its SLO), by their overrides."""
    dashed = {o["matcher"]["options"] for o in p["fieldConfig"].get("overrides", [])
              if o["matcher"]["id"] == "byFrameRefID"
              and any(prop["id"] == "custom.lineStyle" and prop["value"]["fill"] == "dash"
                      for prop in o["properties"])}
    return [t for t in p["targets"] if t["refId"] in dashed]


@pytest.mark.parametrize("latency", BACKENDS, ids=["builtin", "vllm"])
def test_every_objective_panel_draws_the_chosen_deployments_line(
        latency: LatencySources) -> None:
    d = build_dashboard(latency=latency)
    for part in LINED:
        p = panel(d, part)
        lines = slo_lines(p)
        assert len(lines) == 1, (p["title"], lines)
        expr = lines[0]["expr"]
        assert 'slopilot_namespace=~"$namespace"' in expr, expr
        assert 'slopilot_deployment=~"$deployment"' in expr, expr
        # A line per deployment chosen, named for it (the variables are multi-valued).
        assert "{{slopilot_namespace}}/{{slopilot_deployment}}" in lines[0]["legendFormat"]
        override = next(o for o in p["fieldConfig"]["overrides"]
                        if o["matcher"]["options"] == lines[0]["refId"])
        props = {prop["id"]: prop["value"] for prop in override["properties"]}
        assert props["color"] == {"mode": "fixed", "fixedColor": "red"}
        assert props["custom.fillOpacity"] == 0


@pytest.mark.parametrize("latency", BACKENDS, ids=["builtin", "vllm"])
def test_no_panel_claims_a_threshold_of_its_own(latency: LatencySources) -> None:
    """Neither in its title ("SLO P99 < 100 ms", "best effort") nor as a fixed
    threshold step: the deployment's rules say what the line is, the JSON does not."""
    claim = re.compile(r"[<>]|best effort|SLO P\d|\d\s*m?s\b")
    for p in panels(build_dashboard(latency=latency)):
        assert not claim.search(p["title"]), p["title"]
        steps = p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {})
        assert [s for s in steps.get("steps", []) if s.get("value") is not None] == [], \
            p["title"]
    titles = {p["title"] for p in panels(build_dashboard(latency=latency))}
    assert set(LATENCY_TITLES) <= titles


def crs() -> dict[str, tuple[dict[str, Any], LatencySources]]:
    """Three CRs named chat in three namespaces, each with an SLO of its own."""
    builtin, vllm = sample("llmdeployment-builtin.yaml"), sample("llmdeployment-vllm.yaml")

    def cr(base: dict[str, Any], ns: str, slo: dict[str, Any],
           alerts: dict[str, Any] | None = None) -> dict[str, Any]:
        body = copy.deepcopy(base)
        body["metadata"] = {"name": "chat", "namespace": ns, "uid": f"{ns}-uid"}
        body["spec"]["slo"] = slo
        if alerts is not None:
            body["spec"]["alerts"] = alerts
        return body

    return {
        "team-a": (cr(builtin, "team-a", {"profile": "standard", "prefixHitMin": 0.9,
                                          "classes": {"p2": {"ttftP99Ms": 2000}}},
                      {"utilizationMin": 0.4}), BUILTIN_LATENCY),
        "team-b": (cr(builtin, "team-b", {"profile": "strict",
                                          "classes": {"p0": {"ttftP99Ms": 50}}}),
                   BUILTIN_LATENCY),
        "team-c": (cr(vllm, "team-c", {"profile": "relaxed", "vllmClass": "p0"}),
                   VLLM_LATENCY),
    }


# What each CR's line reads on each panel (seconds, per minute, ratio); None: no line.
EXPECTED: dict[str, dict[str, float | None]] = {
    "team-a": {"TTFT P0": 0.1, "TTFT P1": 0.5, "TTFT P2": 2.0,
               "TBT P0": 0.02, "TBT P1": 0.1, "TBT P2": None,
               "Preemptions per minute": 10, "Prefix cache hit rate": 0.9,
               "the batching alert's input": 0.4},
    "team-b": {"TTFT P0": 0.05, "TTFT P1": 0.5, "TTFT P2": None,
               "TBT P0": 0.02, "TBT P1": 0.05, "TBT P2": None,
               "Preemptions per minute": 10, "Prefix cache hit rate": None,
               "the batching alert's input": 0.6},
    "team-c": {"TTFT P0": 0.1, "TTFT P1": 0.5, "TTFT P2": None,
               "TBT P0": 0.02, "TBT P1": 0.2, "TBT P2": None,
               "Preemptions per minute": 10, "Prefix cache hit rate": None,
               "the batching alert's input": 0.6},
}


@pytest.mark.prometheus
def test_each_crs_rules_give_its_own_lines_on_the_dashboard(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The operator's rules for three CRs (all named chat) loaded in one Prometheus
    (promtool): the dashboard's SLO-line queries, with the variables set to one CR,
    read that CR's targets and nothing of the others'."""
    files, checks = [], []
    for ns, (body, latency) in crs().items():
        objects = desired_objects(body, parse_spec(body), replicas=1, monitoring=True,
                                  operator_namespace="slopilot", namespace_label="namespace",
                                  dcgm_namespace="gpu-operator")
        rule = next(o for o in objects if o["kind"] == "PrometheusRule")
        (tmp_path / f"{ns}.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
        files.append(f"{ns}.yaml")
        d = build_dashboard(latency=latency)
        for part, value in EXPECTED[ns].items():
            (line,) = slo_lines(panel(d, part))
            expr = substitute(line["expr"].replace("$namespace", ns)
                              .replace("$deployment", "chat"))
            want = [] if value is None else [
                {"labels": f'{{slopilot_namespace="{ns}",slopilot_deployment="chat"}}',
                 "value": value}]
            checks.append({"expr": expr, "eval_time": "1m", "exp_samples": want})
    test = {"rule_files": files, "evaluation_interval": "30s",
            "tests": [{"interval": "30s", "input_series": [], "promql_expr_test": checks}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
