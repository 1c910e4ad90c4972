"""The Alertmanager inhibit rules, against the labels the rendered alerts carry."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.inhibitions import (
    alertmanager_yaml,
    inhibitions,
    manifest_path,
    render_manifest,
)
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    render_rule_groups,
)

ROOT = Path(__file__).resolve().parents[2]
LATENCY = ("SlopilotTTFTP99High", "SlopilotTTFTP99Sustained", "SlopilotTBTP99High",
           "SlopilotTBTP99Sustained")


def _labels(latency: LatencySources, namespace: str = "team-a", name: str = "chat"
            ) -> list[dict[str, str]]:
    spec = SLOSpec.from_dict({"profile": "standard", "prefix_hit_min": 0.95})
    rules = render_rule_groups(spec, name, namespace=namespace, latency=latency,
                               namespace_label="namespace")["groups"][0]["rules"]
    return [{"alertname": r["alert"], **r["labels"]} for r in rules if "alert" in r]


def _inhibited(source: dict[str, str], target: dict[str, str]) -> bool:
    return source != target and any(rule.inhibits(source, target) for rule in inhibitions())


def test_the_manifest_is_the_rendering() -> None:
    assert manifest_path() == ROOT / "manifests" / "prometheus" / "slopilot-inhibit-rules.yaml"
    assert manifest_path().exists() and manifest_path().read_text() == render_manifest(), (
        "run python -m slopilot.tuner.prometheus.inhibitions")
    config = yaml.safe_load(manifest_path().read_text())
    assert config["kind"] == "AlertmanagerConfig"
    for rule in config["spec"]["inhibitRules"]:
        for m in rule["sourceMatch"] + rule["targetMatch"]:
            assert m["matchType"] in ("=", "=~") and m["name"] and m["value"]


def test_the_docs_show_the_alertmanager_snippet() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    assert alertmanager_yaml() in docs, "docs/operations.md: paste alertmanager_yaml()"


@pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY], ids=["builtin", "vllm"])
def test_a_stall_or_an_outage_pages_once_per_deployment(latency: LatencySources) -> None:
    alerts = _labels(latency)
    other = _labels(latency, namespace="team-b")
    latencies = [a for a in alerts if a["alertname"] in LATENCY]
    assert {a["alertname"] for a in latencies} == set(LATENCY)
    for source in ("SlopilotEngineStalled", "SlopilotTargetsDown"):
        fault = next(a for a in alerts if a["alertname"] == source)
        assert all(_inhibited(fault, a) for a in latencies)
        # Another namespace's deployment of the same name pages on.
        assert not any(_inhibited(fault, a) for a in other if a["alertname"] in LATENCY)
        # What the on-call acts on stays: the fault itself and the non-latency rows.
        assert not any(_inhibited(a, fault) for a in alerts)
        assert not any(_inhibited(fault, a) for a in alerts if a["alertname"] not in LATENCY)


def test_a_critical_silences_the_warning_of_its_alert_and_class_only() -> None:
    alerts = _labels(BUILTIN_LATENCY)
    ttft = {(a["priority_class"], a["severity"]): a for a in alerts
            if a["alertname"] == "SlopilotTTFTP99High"}
    classes = {cls for cls, severity in ttft if severity == "critical"}
    assert classes
    for cls in classes:
        assert _inhibited(ttft[cls, "critical"], ttft[cls, "warning"])
        assert not _inhibited(ttft[cls, "warning"], ttft[cls, "critical"])
    assert not _inhibited(ttft["p0", "critical"], ttft["p1", "warning"])
    sustained = [a for a in alerts if a["alertname"] == "SlopilotTTFTP99Sustained"]
    assert sustained and not any(_inhibited(ttft["p0", "critical"], a) for a in sustained)
