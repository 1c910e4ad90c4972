"""Alert and recording rules: rendering, promtool, and one real Prometheus end to end."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.alert_table import Figure
from slopilot.tuner.prometheus.rules import (
    RuleError,
    RuleOptions,
    example_path,
    render_example,
    render_prometheus_rule,
    render_rule_groups,
    render_rules_yaml,
    render_selector,
)
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.prometheus import (
    PrometheusBinaries,
    PrometheusServer,
    ScrapeTarget,
    promtool,
    serve_metrics,
)
from tests.support.waits import wait_for

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "prometheus"


def _alerts(groups: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in groups["groups"] for r in g["rules"] if "alert" in r]


def test_checked_in_rules_equal_the_rendering() -> None:
    assert example_path() == MANIFESTS / "slopilot-rules.yaml"
    assert example_path().read_text() == render_example(), (
        "manifests/prometheus/slopilot-rules.yaml is stale: "
        "run python -m slopilot.tuner.prometheus.rules")


def test_every_alert_carries_the_labels_the_controller_reads() -> None:
    spec = SLOSpec.from_dict({"profile": "strict", "prefix_hit_min": 0.9})
    alerts = _alerts(render_rule_groups(spec, "chat", namespace="team-a"))
    names = {a["alert"] for a in alerts}
    assert names == {"SlopilotTBTP99High", "SlopilotTBTP99Sustained", "SlopilotTTFTP99High",
                     "SlopilotTTFTP99Sustained",
                     "SlopilotPreemptionStorm", "SlopilotBatchingUnderused",
                     "SlopilotPrefixCacheHitLow", "SlopilotEngineStalled",
                     "SlopilotTargetsDown"}
    for a in alerts:
        assert set(a["labels"]) == {"severity", "action", "priority_class",
                                    "slopilot_namespace", "slopilot_deployment"}
        assert a["labels"]["slopilot_deployment"] == "chat"
        assert a["labels"]["slopilot_namespace"] == "team-a"
        assert a["annotations"]["summary"].startswith("team-a/chat: ")
        assert {"summary", "description"} <= set(a["annotations"])
    actions = {(a["alert"], a["labels"]["severity"]): a["labels"]["action"] for a in alerts}
    assert actions == {("SlopilotTBTP99High", "critical"): "scale",
                       ("SlopilotTTFTP99High", "warning"): "inform",
                       ("SlopilotTTFTP99High", "critical"): "retune",
                       ("SlopilotTTFTP99Sustained", "warning"): "retune",
                       ("SlopilotTBTP99Sustained", "warning"): "retune",
                       ("SlopilotPreemptionStorm", "warning"): "retune",
                       ("SlopilotBatchingUnderused", "warning"): "retune",
                       ("SlopilotPrefixCacheHitLow", "info"): "inform",
                       ("SlopilotEngineStalled", "critical"): "hold",
                       ("SlopilotTargetsDown", "critical"): "hold"}


def test_thresholds_follow_the_slo() -> None:
    # strict: P1 TBT 50 ms -> scale above 2 x = 0.1 s; P0 TTFT 100 ms warns above 0.1 s.
    alerts = _alerts(render_rule_groups(SLOSpec.from_profile("strict"), "d"))
    tbt = {a["labels"]["priority_class"]: a["expr"] for a in alerts
           if a["alert"] == "SlopilotTBTP99High"}
    assert set(tbt) == {"p0", "p1"}, "P2 is best effort: no TBT rule"
    assert tbt["p1"].endswith("> 0.1") and tbt["p0"].endswith("> 0.04")
    ttft = {(a["labels"]["priority_class"], a["labels"]["severity"]): a["expr"]
            for a in alerts if a["alert"] == "SlopilotTTFTP99High"}
    assert ttft[("p0", "warning")].endswith("> 0.1")
    assert ttft[("p0", "critical")].endswith("> 0.2")
    assert ttft[("p1", "critical")].endswith("> 1"), "the seeds' 1 s for the 500 ms SLO"
    # No prefix expectation in the plain profile: no prefix alert at all.
    assert "SlopilotPrefixCacheHitLow" not in {a["alert"] for a in alerts}


def test_thresholds_are_configurable_and_rendered_exactly() -> None:
    opts = RuleOptions(tbt_factor=3, ttft_warning_factor=1.5, ttft_retune_factor=4,
                       busy_ratio_min=0.5, waiting_min=7)
    spec = SLOSpec.from_dict({"classes": {"p1": {"tbt_p99_ms": 1000 / 30}}})
    exprs = {(a["alert"], a["labels"]["priority_class"], a["labels"]["severity"]): a["expr"]
             for a in _alerts(render_rule_groups(spec, "d", options=opts))}
    tbt = exprs[("SlopilotTBTP99High", "p1", "critical")]
    # 3 x 33.33 ms: every digit, so PromQL compares with the float Python compares with.
    assert float(tbt.rsplit("> ", 1)[1]) == 3 * (1000 / 30) / 1000
    assert exprs[("SlopilotTTFTP99High", "p1", "warning")].endswith("> 0.75")
    assert exprs[("SlopilotTTFTP99High", "p1", "critical")].endswith("> 2")
    batching = exprs[("SlopilotBatchingUnderused", "all", "warning")]
    assert "slopilot:utilization:ratio" in batching and "< 0.5" in batching
    assert batching.endswith("> 7")


def test_timing_options_reach_for_and_windows() -> None:
    opts = RuleOptions(interval_s=10, rate_window_s=120, alert_for_s=45, tbt_periods=3)
    group = render_rule_groups(SLOSpec.from_profile("standard"), "d", options=opts)["groups"][0]
    assert group["interval"] == "10s"
    fors = {(r["alert"], r["labels"]["severity"]): r["for"] for r in group["rules"]
            if "alert" in r}
    # 3 evaluations over the threshold span 2 intervals: for 20s fires at the 3rd.
    assert fors[("SlopilotTBTP99High", "critical")] == "20s"
    assert fors[("SlopilotTTFTP99High", "warning")] == "45s"
    long = {Figure.TTFT_P99_LONG.value, Figure.TBT_P99_LONG.value}
    assert all("[2m]" in r["expr"] for r in group["rules"] if "rate(" in r["expr"]
               and r.get("record") not in long)
    # The sustained-breach rows' P99s: the same buckets over breach_window_s (5m).
    assert all("[5m]" in r["expr"] for r in group["rules"] if r.get("record") in long)
    assert fors[("SlopilotTBTP99Sustained", "warning")] == "5m"  # held as long as read
    one = RuleOptions(tbt_periods=1)
    assert one.tbt_for_s == 0 and RuleOptions().tbt_for_s == 60


def test_selector_is_a_parameter() -> None:
    groups = render_rule_groups(SLOSpec.from_profile("standard"), "chat",
                                selector={"namespace": "llm", "job": "chat-engine"})
    exprs = [r["expr"] for r in groups["groups"][0]["rules"] if "record" in r
             and ("vllm:" in r["expr"] or "slopilot_busy_ratio" in r["expr"])]
    assert exprs and all('namespace="llm",job="chat-engine"' in e for e in exprs)
    assert render_selector({"a": 'x"y'}) == '{a="x\\"y"}'


def test_two_namespaces_are_two_deployments() -> None:
    spec = SLOSpec.from_profile("standard")
    a, b = (render_rule_groups(spec, "chat", namespace=ns)["groups"][0]
            for ns in ("team-a", "team-b"))
    assert a["name"] == "slopilot/team-a/chat" != b["name"]
    for rule in a["rules"]:
        assert rule["labels"]["slopilot_namespace"] == "team-a"
        assert 'slopilot_namespace="team-b"' not in rule["expr"]
        if "vllm:" in rule["expr"]:
            assert 'slopilot_namespace="team-a",slopilot_deployment="chat"' in rule["expr"]
    with pytest.raises(RuleError, match="namespace is empty"):
        render_rule_groups(spec, "chat", namespace="")


def test_the_enforced_namespace_label_is_on_every_selector_series_and_alert() -> None:
    # What a prometheus-operator with enforcedNamespaceLabel stamps on a PrometheusRule,
    # rendered in as well: the rules then work, and the controller's reads that match
    # the label find them, with or without the enforcement.
    spec = SLOSpec.from_profile("standard")
    rules = render_rule_groups(spec, "chat", namespace="team-b",
                               namespace_label="namespace")["groups"][0]["rules"]
    for rule in rules:
        assert rule["labels"]["namespace"] == "team-b", rule.get("record", rule.get("alert"))
        if "vllm:" in rule["expr"] or "slopilot:" in rule["expr"]:
            assert 'namespace="team-b"' in rule["expr"].replace("slopilot_namespace", "")
    alerts = [r for r in rules if "alert" in r]
    assert alerts and all("and on (slopilot_namespace, namespace, slopilot_deployment)"
                          in r["expr"] for r in alerts if " and on " in r["expr"])
    cr = render_prometheus_rule(spec, "chat", "team-b", namespace_label="namespace")
    assert cr["spec"]["groups"][0]["rules"] == rules
    plain = render_rule_groups(spec, "chat", namespace="team-b")["groups"][0]["rules"]
    assert all("namespace" not in r["labels"] for r in plain)
    with pytest.raises(RuleError, match="already use"):
        render_rule_groups(spec, "chat", namespace="team-b", namespace_label="pod")


@pytest.mark.prometheus
def test_promtool_checks_the_rules_with_the_namespace_label(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "rules.yaml"
    path.write_text(render_rules_yaml(SLOSpec.from_profile("strict"), "chat",
                                      namespace="team-b", namespace_label="namespace"))
    result = promtool(prometheus_binaries, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"deployment": ""}, "deployment name is empty"),
    ({"selector": {}}, "selector is empty"),
    ({"selector": {"bad-name": "x"}}, "not a Prometheus label name"),
])
def test_bad_render_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"deployment": "d", **kwargs}
    with pytest.raises(RuleError, match=message):
        render_rule_groups(SLOSpec.from_profile("standard"), args.pop("deployment"), **args)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"interval_s": 0}, "interval_s=0"),
    ({"alert_for_s": -1}, "alert_for_s=-1"),
    ({"busy_ratio_min": 1.5}, "busy_ratio_min=1.5"),
    ({"busy_ratio_min": "0.6"}, "busy_ratio_min=.0.6.: expected a ratio"),
    ({"tbt_periods": 1.5}, "tbt_periods=1.5"),
    ({"tbt_factor": 0.5}, "tbt_factor=0.5: expected a multiple of the SLO >= 1"),
    ({"ttft_warning_factor": 3.0}, "exceeds ttft_retune_factor=2.0"),
    ({"waiting_min": -1}, "waiting_min=-1"),
])
def test_bad_rule_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RuleError, match=message):
        RuleOptions(**kwargs)


def test_prometheus_rule_resource() -> None:
    cr = render_prometheus_rule(SLOSpec.from_profile("standard"), "chat", "llm")
    assert cr["apiVersion"] == "monitoring.coreos.com/v1"
    assert cr["kind"] == "PrometheusRule"
    assert cr["metadata"]["namespace"] == "llm"
    assert cr["spec"] == render_rule_groups(SLOSpec.from_profile("standard"), "chat",
                                            namespace="llm")
    with pytest.raises(RuleError, match="namespace is empty"):
        render_prometheus_rule(SLOSpec.from_profile("standard"), "chat", "")


@pytest.mark.prometheus
@pytest.mark.parametrize("profile", ["strict", "standard", "relaxed"])
def test_promtool_check_rules(prometheus_binaries: PrometheusBinaries,  # noqa: F811
                              tmp_path: Path, profile: str) -> None:
    path = tmp_path / "rules.yaml"
    spec = SLOSpec.from_dict({"profile": profile, "prefix_hit_min": 0.9})
    path.write_text(render_rules_yaml(spec, "d", selector={"namespace": "n", "job": "j"}))
    result = promtool(prometheus_binaries, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_unit_tests_pass(prometheus_binaries: PrometheusBinaries) -> None:  # noqa: F811
    result = promtool(prometheus_binaries, "test", "rules", "slopilot-rules.test.yaml",
                      cwd=MANIFESTS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_unit_tests_catch_a_wrong_threshold(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # The relaxed profile scales only above 2 x 200 ms: the unit tests' 0.4 s P99 no
    # longer fires, so the same tests must fail against it.
    shutil.copy(MANIFESTS / "slopilot-rules.test.yaml", tmp_path)
    relaxed = SLOSpec.from_dict({"profile": "relaxed", "prefix_hit_min": 0.95})
    (tmp_path / "slopilot-rules.yaml").write_text(render_rules_yaml(relaxed, "example"))
    result = promtool(prometheus_binaries, "test", "rules", "slopilot-rules.test.yaml",
                      cwd=tmp_path)
    assert result.returncode != 0
    assert "SlopilotTBTP99High" in result.stdout + result.stderr


@pytest.fixture
def metrics_endpoint() -> Iterator[tuple[EngineMetrics, str]]:
    """EngineMetrics served at http://127.0.0.1:PORT/metrics by a plain thread."""
    metrics = EngineMetrics("tiny-random")
    with serve_metrics(metrics.render) as address:
        yield metrics, address


@pytest.mark.prometheus
@pytest.mark.slow
def test_tbt_alert_fires_and_resolves_in_real_prometheus(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        metrics_endpoint: tuple[EngineMetrics, str], tmp_path: Path) -> None:
    metrics, address = metrics_endpoint
    rules = tmp_path / "rules.yaml"
    # The sustained-breach window as short as the rest: the slow gaps driven first would
    # otherwise keep its 5-minute P99 over the SLO (as they should) after the fast ones.
    opts = RuleOptions(interval_s=1, rate_window_s=5, alert_for_s=1, tbt_periods=1,
                       breach_window_s=5)
    rules.write_text(render_rules_yaml(SLOSpec.from_profile("standard"), "itest", options=opts))
    prom = prometheus_factory(
        targets=[ScrapeTarget("engine", [address], {"slopilot_deployment": "itest"})],
        rule_files=[rules])

    def firing_tbt() -> list[dict[str, Any]]:
        return [a for a in prom.alerts()
                if a["labels"]["alertname"] == "SlopilotTBTP99High" and a["state"] == "firing"]

    def drive(gap_s: float) -> None:
        # Each poll feeds more P1 token gaps, so every scrape sees the counters grow.
        for _ in range(50):
            metrics.on_token_gap(Priority.P1, gap_s, now=0.0)

    def slow_and_firing() -> list[dict[str, Any]]:
        drive(0.35)  # > 2 x the 100 ms P1 SLO
        return firing_tbt()

    fired = wait_for(slow_and_firing, what="SlopilotTBTP99High firing",
                     interval_s=0.2)
    assert fired[0]["labels"]["action"] == "scale"
    assert fired[0]["labels"]["priority_class"] == "p1"
    assert fired[0]["labels"]["slopilot_deployment"] == "itest"

    def fast_and_resolved() -> bool:
        drive(0.01)
        return not firing_tbt()

    wait_for(fast_and_resolved, what="SlopilotTBTP99High resolved",
             interval_s=0.2)
    answer = prom.query('slopilot:tbt_seconds:p99{priority_class="p1"}')
    assert answer["status"] == "success"
    assert float(answer["data"]["result"][0]["value"][1]) <= 0.2
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] != "SlopilotTBTP99High"
                and a["state"] == "firing"], "only the driven alert may fire"
    assert yaml.safe_load(rules.read_text())["groups"][0]["interval"] == "1s"


def _assert_p0_goodput(binaries: PrometheusBinaries, tmp_path: Path, test: dict[str, Any],
                       tokens_per_s: float, eval_time: str = "5m",
                       record: str = "slopilot:goodput_tokens:per_second") -> None:
    """Run ``test`` (a promtool unit test of rules.yaml in ``tmp_path``, its input series
    set) and demand P0's recorded goodput (or ``record``) of deployment n/d be
    ``tokens_per_s`` at ``eval_time``, compared in thousandths (promtool's float
    formatting rounds)."""
    test["tests"][0]["promql_expr_test"] = [{
        "expr": f'round({record}{{priority_class="p0"}} * 1000)',
        "eval_time": eval_time,
        "exp_samples": [{"labels": '{priority_class="p0",slopilot_deployment="d",'
                                   'slopilot_namespace="n"}',
                         "value": round(tokens_per_s * 1000)}]}]
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _vllm_goodput_test(rules: str, ttft_tbt: dict[str, dict[str, int]]) -> dict[str, Any]:
    """A promtool unit test: one minute of vLLM-shaped histograms (vLLM's own bucket
    edges) for class p0 of deployment d, and the goodput the rules should record."""
    series = []
    labels = 'namespace="n",slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
    for metric, buckets in ttft_tbt.items():
        total = buckets["+Inf"]
        for le, count in buckets.items():
            series.append({"series": f'{metric}_bucket{{{labels},le="{le}"}}',
                           "values": f"0+{count}x10"})
        series.append({"series": f"{metric}_count{{{labels}}}", "values": f"0+{total}x10"})
    series.append({"series": f"vllm:request_generation_tokens_sum{{{labels}}}",
                   "values": "0+600x10"})  # 10 tokens/s over the 1 m rate window
    return {"rule_files": [rules], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series}]}


@pytest.mark.prometheus
def test_goodput_reads_a_vllm_histogram_whose_edges_miss_the_slo(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # vLLM's inter-token buckets are 0.01, 0.025, 0.05, ...: the standard P0 TBT SLO of
    # 20 ms lies between two of them. The rules selected le="0.02", which vLLM never
    # exports, so P0's goodput (and the deployment's sloAttainment) read nothing while
    # clients were served well. (P0's TTFT SLO, 100 ms, is one of vLLM's TTFT edges.)
    from slopilot.tuner.prometheus.rules import VLLM_LATENCY

    spec = SLOSpec.from_profile("standard")
    slo = spec.classes()[Priority.P0]
    assert slo.tbt_p99_ms == 20 and slo.ttft_p99_ms == 100
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules_yaml(spec, "d", namespace="n",
                                       latency=VLLM_LATENCY))
    # Per minute: 100 gaps, 60 within 10 ms and 90 within 25 ms: the 30 in (10, 25] ms
    # may each be within 20 ms or not, and are counted within (``fraction_within``: a
    # share read uniform inside the bucket put 80 within, a third of a bucket of 12 ms
    # gaps over the SLO); 10 first tokens, 8 within 100 ms.
    tbt = {"0.01": 60, "0.025": 90, "0.05": 100, "+Inf": 100}
    ttft = {"0.1": 8, "0.25": 10, "+Inf": 10}
    test = _vllm_goodput_test("rules.yaml", {"vllm:inter_token_latency_seconds": tbt,
                                             "vllm:time_to_first_token_seconds": ttft})
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, 10 * (90 / 100) * (8 / 10))


@pytest.mark.prometheus
@pytest.mark.parametrize(("verdicts_under", "expected"), [
    ("current", 5.0),     # the engine's per-request verdicts, under the SLO judged now
    ("edited", 9.9),      # verdicts under objectives since edited: not this SLO's
    (None, 9.9),          # no verdicts (vLLM, an engine not told the SLO): the histograms
], ids=["verdicts", "stale-verdicts", "histograms-only"])
def test_goodput_counts_the_engines_per_request_verdicts_where_it_exports_them(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        verdicts_under: str | None, expected: float) -> None:
    """Half the tokens came from requests that broke P0's SLO (a few slow gaps each,
    over 1 % of their own), while 99 % of all gaps and every first token were fast: the
    histograms' product read 99 % good. The engine judges each request as the simulator
    does; its verdicts are the goodput where it exports them under this SLO."""
    from slopilot.engine.verdicts import SLO_TOKENS

    spec = SLOSpec.from_profile("standard")
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules_yaml(spec, "d", namespace="n"))
    test = _vllm_goodput_test("rules.yaml", {
        "vllm:inter_token_latency_seconds": {"0.02": 99, "+Inf": 100},
        "vllm:time_to_first_token_seconds": {"0.1": 10, "+Inf": 10}})
    labels = 'namespace="n",slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
    if verdicts_under is not None:
        judged = spec.p0.label if verdicts_under == "current" else \
            SLOSpec.from_profile("strict").p0.label.replace("100.0", "80.0")
        assert judged != spec.p0.label or verdicts_under == "current"
        for met in ("true", "false"):  # 300 tokens a minute each: 5 tokens/s good
            test["tests"][0]["input_series"].append({
                "series": f'{SLO_TOKENS}{{{labels},slo="{judged}",met="{met}"}}',
                "values": "0+300x10"})
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, expected)


@pytest.mark.prometheus
def test_goodput_counts_each_replica_by_its_verdicts_or_else_its_histograms(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """A fleet where one replica judges requests under this SLO and another does not
    yet (a rollout onto an image that judges, the seconds after an SLO edit before the
    operator's sync): the verdicts counted the first replica alone, and the second's
    tokens vanished from goodput. Each replica counts by its verdicts where it exports
    them, else by its own histograms' product."""
    from slopilot.engine.verdicts import SLO_TOKENS

    spec = SLOSpec.from_profile("standard")
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(spec, "d", namespace="n"))
    series = []
    for instance, judged in (("a:8000", True), ("b:8000", False)):
        labels = (f'namespace="n",slopilot_namespace="n",slopilot_deployment="d",'
                  f'priority_class="p0",instance="{instance}"')
        for metric, buckets in (("vllm:inter_token_latency_seconds", {"0.02": 99, "+Inf": 100}),
                                ("vllm:time_to_first_token_seconds", {"0.1": 10, "+Inf": 10})):
            for le, count in buckets.items():
                series.append({"series": f'{metric}_bucket{{{labels},le="{le}"}}',
                               "values": f"0+{count}x10"})
            series.append({"series": f"{metric}_count{{{labels}}}",
                           "values": f"0+{buckets['+Inf']}x10"})
        series.append({"series": f"vllm:request_generation_tokens_sum{{{labels}}}",
                       "values": "0+600x10"})  # 10 tokens/s each
        if judged:  # 5 tokens/s from requests within their SLO
            for met in ("true", "false"):
                series.append({"series": f'{SLO_TOKENS}{{{labels},slo="{spec.p0.label}",'
                                         f'met="{met}"}}', "values": "0+300x10"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series}]}
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, 5.0 + 10 * 0.99)


@pytest.mark.prometheus
def test_goodput_counts_a_replicas_tokens_where_a_histogram_has_no_observation(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """vLLM (no verdicts) serving a class whose requests each ask one token (a
    classifier's max_tokens=1): every first token within the SLO, and no gap to judge.
    The share of gaps within target was 0/0, filtered out, and took the replica's
    tokens with it: goodput (and sloAttainment) read 0, where the direct scrape, which
    judges only what it observed, reads every token good. A share with no observation
    leaves the tokens as they are."""
    spec = SLOSpec.from_profile("standard")
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(spec, "d", namespace="n"))
    test = _vllm_goodput_test("rules.yaml", {
        "vllm:inter_token_latency_seconds": {"0.02": 0, "+Inf": 0},
        "vllm:time_to_first_token_seconds": {"0.1": 10, "+Inf": 10}})
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, 10.0)


@pytest.mark.prometheus
def test_goodput_of_a_replica_told_its_slo_inside_the_window_is_its_share_of_the_tokens(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """A replica told this SLO half a minute into the one-minute window (an edited
    spec.slo, a restarted pod) exports its verdicts from then on: it judged half the
    window's requests. Its met tokens read 2 tokens/s where it served 10 tokens/s, 80 %
    of them to requests within their SLO; goodput and sloAttainment read a quarter of
    the truth for a whole window after every edit of the SLO. What it judged is its
    share of good tokens; its tokens are all the window's."""
    from slopilot.engine.verdicts import SLO_TOKENS

    spec = SLOSpec.from_profile("standard")
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(spec, "d", namespace="n"))
    labels = 'namespace="n",slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
    series = [{"series": f"vllm:request_generation_tokens_sum{{{labels}}}",
               "values": "0+100x30"}]  # 10 tokens/s, sampled every 10 s
    for metric in ("vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds"):
        for le in ("0.02", "0.1", "+Inf"):
            series.append({"series": f'{metric}_bucket{{{labels},le="{le}"}}',
                           "values": "0+10x30"})
        series.append({"series": f"{metric}_count{{{labels}}}", "values": "0+10x30"})
    for met, per_10s in (("true", 40), ("false", 10)):  # from t=270 s, at 0 when told
        series.append({"series": f'{SLO_TOKENS}{{{labels},slo="{spec.p0.label}",'
                                 f'met="{met}"}}', "values": f"_x27 0+{per_10s}x3"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "10s",
            "tests": [{"interval": "10s", "input_series": series}]}
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, 8.0, eval_time="300s")


@pytest.mark.prometheus
@pytest.mark.parametrize(("record", "refused_per_min", "expected_s"), [
    ("slopilot:ttft_seconds:p99", None, 0.099),     # no such series (vLLM): as before
    ("slopilot:ttft_seconds:p99", 0, 0.099),
    # 5 of 105 turned away: the P99 falls among them, in the +Inf bucket, which
    # histogram_quantile reads as the highest finite edge (the simulator's REFUSED_TTFT_S).
    ("slopilot:ttft_seconds:p99", 5, 300.0),
    ("slopilot:ttft_seconds:p99_long", 5, 300.0),
    ("slopilot:ttft_seconds:p50", 20, 0.06),        # the median moves up too
])
def test_a_request_turned_away_for_load_is_a_first_token_never_given(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        record: str, refused_per_min: int | None, expected_s: float) -> None:
    """A full waiting queue answers 429: the client was never served. Its TTFT is a
    first token never given, so the TTFT percentiles the alerts, the trials and status
    read count it in the +Inf bucket; left out, they read the served requests alone, and
    a deployment turning away 5 % of its clients held its SLO (no alert fired)."""
    from slopilot.engine.metric_names import REFUSED
    from slopilot.engine.sim.stats import REFUSED_TTFT_S

    assert expected_s != 300.0 or REFUSED_TTFT_S == 300.0
    spec = SLOSpec.from_profile("standard")
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(spec, "d", namespace="n"))
    labels = 'namespace="n",slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
    series = [{"series": f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}}',
               "values": "0+100x10"} for le in ("0.1", "300.0", "+Inf")]
    series.append({"series": f"vllm:time_to_first_token_seconds_count{{{labels}}}",
                   "values": "0+100x10"})
    if refused_per_min is not None:
        series.append({"series": f'{REFUSED}{{{labels},model_name="m"}}',
                       "values": f"0+{refused_per_min}x10"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series}]}
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, expected_s, eval_time="6m",
                       record=record)


@pytest.mark.prometheus
@pytest.mark.parametrize(("refused_per_min", "abandoned_per_min", "expected_s"), [
    (0, 0, 0.099),
    (0, 1, 0.09999),  # 1 of 101: the P99 (rank 99.99) is still a served one
    (0, 5, 300.0),   # 5 of 105 whose clients left before a first token
    (3, 3, 300.0),   # neither counter alone, but 6 of 106 together
])
def test_a_client_gone_before_its_first_token_is_a_first_token_never_given(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        refused_per_min: int, abandoned_per_min: int, expected_s: float) -> None:
    """A request queued behind a stall until its client gave up is never observed in the
    TTFT histogram: counted beside the refusals in +Inf, or a stall in which no client
    gets a first token reads a NaN P99 and every TTFT alert clears."""
    from slopilot.engine.metric_names import ABANDONED, REFUSED

    spec = SLOSpec.from_profile("standard")
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(spec, "d", namespace="n"))
    labels = 'namespace="n",slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
    series = [{"series": f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}}',
               "values": "0+100x10"} for le in ("0.1", "300.0", "+Inf")]
    for counter, per_min in ((REFUSED, refused_per_min), (ABANDONED, abandoned_per_min)):
        series.append({"series": f'{counter}{{{labels},model_name="m"}}',
                       "values": f"0+{per_min}x10"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series}]}
    _assert_p0_goodput(prometheus_binaries, tmp_path, test, expected_s, eval_time="6m",
                       record="slopilot:ttft_seconds:p99")


@pytest.mark.prometheus
def test_every_classs_ttft_p99_counts_those_turned_away_too(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The windows' P99 of every class together (status.ttftP99Ms) reads the buckets
    summed by ``le`` alone: the refused counter joins them there as well."""
    from slopilot.engine.metric_names import REFUSED
    from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, TTFT, bucket_rates

    (tmp_path / "rules.yaml").write_text(render_rules_yaml(SLOSpec.from_profile("standard"),
                                                           "d", namespace="n"))
    sel = '{slopilot_deployment="d"}'
    series = []
    for cls, refused in (("p0", 5), ("p1", 0)):
        labels = f'slopilot_deployment="d",priority_class="{cls}"'
        series += [{"series": f'{TTFT}_bucket{{{labels},le="{le}"}}', "values": "0+100x10"}
                   for le in ("0.1", "300.0", "+Inf")]
        series.append({"series": f"{REFUSED}{{{labels}}}", "values": f"0+{refused}x10"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            # 5 of 205 never served: the P99 (rank 202.95) falls among them.
            "expr": "histogram_quantile(0.99, "
                    f"{bucket_rates(BUILTIN_LATENCY.ttft.engine, sel, '1m', by='le')})",
            "eval_time": "6m", "exp_samples": [{"labels": "{}", "value": 300}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
