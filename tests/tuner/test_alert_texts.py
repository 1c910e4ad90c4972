"""What the alerts' texts say to the on-call, read through promtool as Alertmanager gets
them: a TTFT P99 of no first token is not a wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.alert_table import AlertName, RuleOptions, alert_table
from slopilot.tuner.prometheus.rules import VLLM_LATENCY, render_rules_yaml
from tests.support.fixtures import prometheus_binaries  # noqa: F401
from tests.support.prometheus import PrometheusBinaries, promtool

NS, NAME = "team-a", "chat"
IDENT = f'slopilot_namespace="{NS}",slopilot_deployment="{NAME}"'
NO_TOKEN = ("P0 time to first token P99 is at the histogram's last edge, {over} of 100 ms: "
            "at least 1 % of requests got no first token (refused for load or at the "
            "connection cap, abandoned or still waiting). A stall, an outage or an "
            "overload, not a chunk size: SlopilotEngineStalled or SlopilotTargetsDown "
            "says which where it fires, and "
            "the controller holds while it does (docs/operations.md, Alerts).")


def _bucket(metric: str, le: str, values: str) -> dict[str, str]:
    return {"series": f'{metric}_bucket{{{IDENT},instance="a",priority_class="p0",'
                      f'le="{le}"}}', "values": values}


def _ttft_high(descriptions: dict[str, str]) -> list[dict[str, Any]]:
    labels = {"priority_class": "p0", "slopilot_namespace": NS, "slopilot_deployment": NAME}
    return [{"exp_labels": {**labels, "severity": severity, "action": action},
             "exp_annotations": {"summary": f"{NS}/{NAME}: P0 TTFT P99 {over}",
                                 "description": descriptions[severity]}}
            for severity, action, over in (("warning", "inform", "over its SLO"),
                                           ("critical", "retune", "over 2 x its SLO"))]


def _run(binaries: PrometheusBinaries, tmp_path: Path, rules: str,
         series: list[dict[str, str]], expected: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(rules)
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "30s",
            "tests": [{"interval": "15s", "input_series": series,
                       "alert_rule_test": [{"eval_time": "14m",
                                            "alertname": "SlopilotTTFTP99High",
                                            "exp_alerts": expected}]}]}
    (tmp_path / "t.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "t.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


STALL = "0+10x20 200x40"  # served fast for 5 min, then no first token at all


@pytest.mark.prometheus
def test_a_stall_reads_as_no_first_token_not_a_five_minute_wait(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    metric = "vllm:time_to_first_token_seconds"
    series = [_bucket(metric, le, STALL) for le in ("0.05", "300.0", "+Inf")]
    series.append({"series": f'slopilot_requests_awaiting_first_token{{{IDENT},instance="a",'
                             'priority_class="p0",within_ttft_target="false"}',
                   "values": "0x20 5x40"})
    expected = _ttft_high({"warning": NO_TOKEN.format(over="over its SLO"),
                           "critical": NO_TOKEN.format(over="over 2 x its SLO")})
    _run(prometheus_binaries, tmp_path, render_rules_yaml(SLOSpec.from_profile("standard"),
                                                          NAME, namespace=NS),
         series, expected)


@pytest.mark.prometheus
def test_on_vllm_its_own_last_edge_is_no_first_token_and_a_wait_past_300_s_is_one(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    rules = render_rules_yaml(SLOSpec.from_profile("standard"), NAME, namespace=NS,
                              latency=VLLM_LATENCY)
    metric = "vllm:time_to_first_token_seconds"
    stall = [_bucket(metric, le, STALL) for le in ("0.1", "2560.0", "+Inf")]
    stall.append({"series": f'slopilot_client_requests_awaiting_first_token{{{IDENT},'
                            'instance="a",priority_class="p0",within_ttft_target="false"}',
                  "values": "0x20 5x40"})
    _run(prometheus_binaries, tmp_path, rules, stall,
         _ttft_high({"warning": NO_TOKEN.format(over="over its SLO"),
                     "critical": NO_TOKEN.format(over="over 2 x its SLO")}))
    # Every request served in (160, 640] s: a wait past the meter's 300 s last edge that
    # vLLM's own buckets measured, read as one.
    slow = [_bucket(metric, "160.0", "0x60"), *(_bucket(metric, le, "0+10x60")
                                                 for le in ("640.0", "2560.0", "+Inf"))]
    wait = "P0 time to first token P99 is 10m 35s, {over} of 100 ms: {then}."
    _run(prometheus_binaries, tmp_path, rules, slow, _ttft_high({
        "warning": wait.format(over="over its SLO", then="the controller retunes above "
                               "2 x, or when it holds across 5 min"),
        "critical": wait.format(over="over 2 x its SLO",
                                then="retune the token budget and chunk size")}))


def test_equal_ttft_factors_render_the_critical_row_alone() -> None:
    # Both rows would fire on the same condition with the same hold, and the warning
    # cited a sustained row that is not rendered at equal factors.
    rows = alert_table(SLOSpec.from_profile("standard"),
                       RuleOptions(ttft_warning_factor=2, ttft_retune_factor=2))
    ttft = [r for r in rows if r.name in (AlertName.TTFT_P99_HIGH, AlertName.TTFT_P99_SUSTAINED)]
    assert ttft and all(r.name == AlertName.TTFT_P99_HIGH and r.severity == "critical"
                        for r in ttft)
    assert len({r.priority_class for r in ttft}) == len(ttft)
    assert not any("across" in r.description for r in ttft)
