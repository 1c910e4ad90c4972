"""The rules an LLMDeployment gets: thresholds from its spec, keyed by namespace and name.

Two CRs named ``chat`` in ``team-a`` and ``team-b`` are two deployments to every rule,
relabeling, ServiceMonitor selector, recorded series, alert and alert match. The CRD has
a field for every threshold the rules read (a real API server prunes unknown fields, so a
threshold without one could never reach the rules).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.crd import openapi_schema
from slopilot.operator.reconcile import RULES_FILE, desired_objects
from slopilot.operator.render import render_all
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.prometheus.rules import RuleOptions
from tests.support.crd_schema import apply_defaults, schema_errors
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool


def body(namespace: str = "team-a", name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}"},
            "spec": {"model": {"name": "smollm2-135m"}, **spec}}


def admitted(b: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores: the schema's defaults filled, the schema checked."""
    schema = openapi_schema()
    stored = apply_defaults(schema, b)
    assert schema_errors(schema, stored) == []
    return stored


def schema_at(path: str) -> dict[str, Any]:
    node = openapi_schema()
    for part in path.split("."):
        node = node["properties"][part]
    return node


def rule_of(b: dict[str, Any], *, monitoring: bool = True) -> dict[str, Any]:
    objects = desired_objects(b, parse_spec(b), replicas=1, monitoring=monitoring,
                              operator_namespace="slopilot-system")
    if monitoring:
        return next(o for o in objects if o["kind"] == "PrometheusRule")["spec"]
    cm = next(o for o in objects if o["metadata"]["name"].endswith("-rules"))
    return dict(yaml.safe_load(cm["data"][RULES_FILE]))


def alerts_of(groups: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["alert"], r["labels"]["priority_class"], r["labels"]["severity"]): r
            for g in groups["groups"] for r in g["rules"] if "alert" in r}


def test_the_prefix_hit_threshold_has_a_crd_field_and_reaches_the_rules() -> None:
    field = schema_at("spec.slo.prefixHitMin")
    assert field["type"] == "number" and field["maximum"] == 1
    b = admitted(body(slo={"prefixHitMin": 0.9}))
    assert parse_spec(b).slo.prefix_hit_min == 0.9
    for monitoring in (True, False):
        prefix = alerts_of(rule_of(b, monitoring=monitoring))[
            ("SlopilotPrefixCacheHitLow", "all", "info")]
        assert prefix["expr"].endswith("< 0.9") and prefix["labels"]["action"] == "inform"
    # Where prefix caching is not expected, there is no such alert.
    names = {name for name, _, _ in alerts_of(rule_of(admitted(body())))}
    assert "SlopilotPrefixCacheHitLow" not in names


def test_alert_thresholds_are_configurable_per_deployment() -> None:
    b = admitted(body(alerts={"tbtScaleFactor": 3, "tbtPeriods": 2, "ttftWarningFactor": 1.5,
                              "ttftRetuneFactor": 3, "holdFor": "90s", "utilizationMin": 0.5,
                              "waitingMin": 50, "sustainedBreachWindow": "10m"}))
    assert parse_spec(b).alerts == RuleOptions(
        tbt_factor=3, tbt_periods=2, ttft_warning_factor=1.5, ttft_retune_factor=3,
        alert_for_s=90, busy_ratio_min=0.5, waiting_min=50, breach_window_s=600)
    alerts = alerts_of(rule_of(b))
    tbt = alerts[("SlopilotTBTP99High", "p1", "critical")]
    assert tbt["expr"].endswith("> 0.3") and tbt["for"] == "30s"  # 2 periods of 30 s
    assert alerts[("SlopilotTTFTP99High", "p1", "warning")]["expr"].endswith("> 0.75")
    assert alerts[("SlopilotTTFTP99High", "p1", "critical")]["expr"].endswith("> 1.5")
    sustained = alerts[("SlopilotTTFTP99Sustained", "p1", "warning")]
    assert sustained["expr"].startswith("slopilot:ttft_seconds:p99_long{")
    assert sustained["expr"].endswith("> 0.75") and sustained["for"] == "10m"
    assert sustained["labels"]["action"] == "retune"
    long = {r["record"]: r["expr"] for g in rule_of(b)["groups"] for r in g["rules"]
            if "record" in r}["slopilot:tbt_seconds:p99_long"]
    assert "[10m]" in long
    batching = alerts[("SlopilotBatchingUnderused", "all", "warning")]
    assert "< 0.5" in batching["expr"] and batching["expr"].endswith("> 50")
    assert batching["for"] == "90s"


def test_the_defaults_are_the_seeds_and_say_where_they_differ() -> None:
    b = admitted(body())
    assert parse_spec(b).alerts == RuleOptions()
    fields = schema_at("spec.alerts")["properties"]
    assert {k: fields[k].get("default") for k in fields} == {
        "tbtScaleFactor": 2, "tbtPeriods": 3, "ttftWarningFactor": 1, "ttftRetuneFactor": 2,
        "holdFor": "2m", "utilizationMin": 0.6, "waitingMin": 100,
        "sustainedBreachWindow": None, "scrapeInterval": "15s"}
    # The breach window's default depends on scrapeInterval: the operator's, said here.
    assert "Left out: 5m" in fields["sustainedBreachWindow"]["description"]
    assert "on purpose" in fields["holdFor"]["description"]


@pytest.mark.parametrize(("alerts", "needle"), [
    ({"tbtPeriods": 0}, "alerts.tbtPeriods: 0 is less than the minimum of 1"),
    ({"utilizationMin": 1.5}, "alerts.utilizationMin: 1.5 is greater than the maximum of 1"),
    ({"ttftRetuneFactor": 0.5}, "alerts.ttftRetuneFactor: 0.5 is less than the minimum of 1"),
    ({"holdFor": "soon"}, "alerts.holdFor: 'soon' does not match"),
    ({"sustainedBreachWindow": "later"},
     "alerts.sustainedBreachWindow: 'later' does not match"),
    ({"waitingMin": -1}, "alerts.waitingMin: -1 is less than the minimum of 0"),
])
def test_the_schema_refuses_bad_thresholds_by_name(alerts: dict[str, Any], needle: str) -> None:
    schema = openapi_schema()
    problems = schema_errors(schema, apply_defaults(schema, body(alerts=alerts)))
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize(("spec", "needle"), [
    ({"alerts": {"ttftWarningFactor": 3, "ttftRetuneFactor": 2}},
     "spec.alerts.ttftWarningFactor=3 exceeds spec.alerts.ttftRetuneFactor=2"),
    ({"alerts": {"holdFor": "1.5s"}}, "spec.alerts.holdFor='1.5s': use whole seconds"),
    ({"alerts": {"sustainedBreachWindow": "30s"}},
     "spec.alerts.sustainedBreachWindow=30: expected whole seconds >= 60 s (the rules' "
     "rate window"),
    ({"slo": {"prefixHitMin": 0.9}, "engine": {"enablePrefixCaching": False}},
     "spec.slo.prefixHitMin=0.9 expects prefix hits, but spec.engine.enablePrefixCaching"),
    ({"slo": {"prefixHitMin": 0}}, "spec.slo.prefixHitMin=0: expected a ratio in (0, 1]"),
    # A duration Prometheus cannot hold stops the Prometheus that loads every tenant's
    # rules from starting: refused here, by the field's name.
    ({"alerts": {"holdFor": "999999999h"}}, "spec.alerts.holdFor=3599999996400: expected"),
    ({"alerts": {"sustainedBreachWindow": "2600000h"}},
     "spec.alerts.sustainedBreachWindow=9360000000: expected whole seconds"),
    ({"alerts": {"tbtPeriods": 10**9}}, "spec.alerts.tbtPeriods=1000000000: expected"),
    ({"alerts": {"waitingMin": 10**30}}, "spec.alerts.waitingMin=" + str(10**30)),
])
def test_parse_spec_refuses_what_the_schema_cannot_judge(spec: dict[str, Any],
                                                         needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(body(**spec))
    assert any(needle in p for p in info.value.problems), info.value.problems


def test_two_chats_in_two_namespaces_are_two_deployments() -> None:
    a, b = body("team-a"), body("team-b")
    for cr, ns in ((a, "team-a"), (b, "team-b")):
        monitor = render_all(cr, parse_spec(cr)).service_monitor["spec"]
        assert monitor["namespaceSelector"] == {"matchNames": [ns]}
        relabel = {r["targetLabel"]: r["replacement"] for r in monitor["endpoints"][0][
            "relabelings"] if r["action"] == "replace" and "sourceLabels" not in r}
        assert relabel == {"slopilot_namespace": ns, "slopilot_deployment": "chat"}
        for monitoring in (True, False):
            groups = rule_of(cr, monitoring=monitoring)
            for rule in groups["groups"][0]["rules"]:
                assert rule["labels"]["slopilot_namespace"] == ns
                if "vllm:" in rule["expr"]:
                    assert f'slopilot_namespace="{ns}",slopilot_deployment="chat"' in rule["expr"]


@pytest.mark.prometheus
def test_a_slow_team_a_fires_its_own_alert_beside_a_fast_team_b(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Both deployments' rules in one Prometheus: team-a's P1 gaps are slow, team-b's fast.
    # Selected by name only, the fast one hid the slow one (the sum of both was fast).
    files = []
    for ns in ("team-a", "team-b"):
        (tmp_path / f"{ns}.yaml").write_text(yaml.safe_dump(rule_of(body(ns))))
        files.append(f"{ns}.yaml")

    def gaps(ns: str, slow: bool) -> list[dict[str, str]]:
        labels = f'slopilot_namespace="{ns}",slopilot_deployment="chat",priority_class="p1"'
        edge = "0.4" if slow else "0.05"
        return [{"series": f'vllm:inter_token_latency_seconds_bucket{{{labels},le="{edge}"}}',
                 "values": "0+10x40"},
                {"series": f'vllm:inter_token_latency_seconds_bucket{{{labels},le="+Inf"}}',
                 "values": "0+10x40"}]

    slow_a = {"exp_labels": {"severity": "critical", "action": "scale", "priority_class": "p1",
                             "slopilot_namespace": "team-a", "slopilot_deployment": "chat"},
              "exp_annotations": {
                  "summary": "team-a/chat: P1 TBT P99 over 2 x its SLO",
                  "description": "P1 time between tokens P99 is 396ms, over 2 x the 100 ms "
                                 "SLO for 3 evaluations: add replicas."}}
    test = {"rule_files": files, "evaluation_interval": "30s", "tests": [{
        "interval": "15s",
        "input_series": gaps("team-a", slow=True) + gaps("team-b", slow=False)
        + [{"series": 'vllm:inter_token_latency_seconds_bucket{slopilot_deployment="chat",'
                      'priority_class="p1",le="0.4"}', "values": "0+1000x40"}],
        "alert_rule_test": [{"eval_time": "5m", "alertname": "SlopilotTBTP99High",
                             "exp_alerts": [slow_a]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr



def test_the_longest_holds_a_tenant_may_write_load_in_prometheus(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    from slopilot.tuner.prometheus.alert_table import MAX_DURATION_S, MAX_WAITING

    day = f"{MAX_DURATION_S}s"
    spec = parse_spec(body(alerts={"holdFor": day, "sustainedBreachWindow": day,
                                   "waitingMin": MAX_WAITING}))
    rule = rule_of(body(alerts={"holdFor": day, "sustainedBreachWindow": day,
                                "waitingMin": MAX_WAITING}))
    assert spec.alerts.alert_for_s == MAX_DURATION_S
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule))
    result = promtool(prometheus_binaries, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
