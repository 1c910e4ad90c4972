"""The Alertmanager inhibit rules, against the labels the rendered alerts carry: in the
rules' own model, and by a real Alertmanager (amtool's check, and a running server
judging alerts posted with those labels)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.inhibitions import (
    Matcher,
    MatchType,
    alertmanager_yaml,
    inhibitions,
    manifest_path,
    render_manifest,
)
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    RuleError,
    render_rule_groups,
)
from tests.support.alertmanager import (
    AlertmanagerBinaries,
    AlertmanagerServer,
    amtool,
    null_route_config,
)
from tests.support.fixtures import alertmanager_binaries, alertmanager_factory  # noqa: F401
from tests.support.waits import wait_for

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
    # The very block the real Alertmanager is run with below.
    assert _docs_snippet() == alertmanager_yaml(), "docs/operations.md: paste alertmanager_yaml()"


def test_the_manifest_holds_the_rules_alertmanager_checks() -> None:
    """The AlertmanagerConfig's matchers, written as Alertmanager's own, are the docs'
    rules: what the real Alertmanager judges below is what the manifest asks for."""
    spec = yaml.safe_load(manifest_path().read_text())["spec"]

    def text(matchers: list[dict[str, str]]) -> list[str]:
        return [Matcher(m["name"], MatchType(m["matchType"]), m["value"]).text()
                for m in matchers]

    assert [{"source_matchers": text(r["sourceMatch"]), "target_matchers": text(r["targetMatch"]),
             "equal": r["equal"]} for r in spec["inhibitRules"]] == _docs_rules()


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


def test_an_alert_forged_in_another_namespace_silences_nothing() -> None:
    """A tenant allowed rules in its own namespace writes a stall naming team-b's chat in
    the ``slopilot_*`` labels; the Prometheus's enforced label stamps it with the
    tenant's own namespace, which the rules compare too, so team-b pages on."""
    victim = _labels(BUILTIN_LATENCY, namespace="team-b")
    for fault in ("SlopilotEngineStalled", "SlopilotTTFTP99High"):
        forged = [dict(a, namespace="team-evil") for a in victim
                  if a["alertname"] == fault and a["severity"] == "critical"]
        assert forged
        assert not any(_inhibited(f, a) for f in forged for a in victim), fault


def test_without_an_enforced_label_a_stall_still_silences_its_latency_pages() -> None:
    """A Prometheus without an enforced namespace label: no alert carries ``namespace``,
    and a label absent from both sides is equal."""
    spec = SLOSpec.from_dict({"profile": "standard"})
    rules = render_rule_groups(spec, "chat", namespace="team-a",
                               latency=BUILTIN_LATENCY)["groups"][0]["rules"]
    alerts = [{"alertname": r["alert"], **r["labels"]} for r in rules if "alert" in r]
    assert not any("namespace" in a for a in alerts)
    stall = next(a for a in alerts if a["alertname"] == "SlopilotEngineStalled")
    assert all(_inhibited(stall, a) for a in alerts if a["alertname"] in LATENCY)


def test_the_enforced_label_is_the_one_the_cluster_names() -> None:
    rules = inhibitions(namespace_label="tenant")
    assert all("tenant" in r.equal and "namespace" not in r.equal for r in rules)
    assert all("namespace" in r.equal for r in inhibitions())
    with pytest.raises(RuleError, match="namespace label"):
        inhibitions(namespace_label='bad"label')


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


def _docs_snippet() -> str:
    """The plain ``alertmanager.yml`` block docs/operations.md shows, as written there."""
    docs = (ROOT / "docs" / "operations.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S)
              if b.startswith("inhibit_rules:")]
    assert len(blocks) == 1, (
        f"docs/operations.md: {len(blocks)} ```yaml blocks start with inhibit_rules:, "
        "expected the one snippet (paste alertmanager_yaml() there once)")
    return blocks[0]


def _docs_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(_docs_snippet())["inhibit_rules"]
    return rules


def test_amtool_accepts_the_docs_snippet(alertmanager_binaries: AlertmanagerBinaries,  # noqa: F811
                                         tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(null_route_config(_docs_rules()), sort_keys=False))
    checked = amtool(alertmanager_binaries, "check-config", config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every rule parsed, none dropped on the way.
    assert f" - {len(inhibitions())} inhibit rules" in checked.stdout, checked.stdout
    # The check can fail: a matcher Alertmanager cannot parse is refused.
    broken = _docs_rules()
    broken[0]["source_matchers"] = ['alertname=~"(SlopilotEngineStalled"']
    config.write_text(yaml.safe_dump(null_route_config(broken), sort_keys=False))
    refused = amtool(alertmanager_binaries, "check-config", config)
    assert refused.returncode != 0 and "error parsing regexp" in refused.stdout, (
        refused.stdout + refused.stderr)


# A barrier, not a rule under test: no slopilot alert carries ``canary``. Alertmanager's
# inhibitor reads posted alerts into its source cache in order, on its own goroutine, and
# a read (GET /api/v2/alerts) judges each alert against that cache. So once the canary
# target reads as inhibited, the canary source, posted last, is in the cache, and so is
# every alert before it: the verdicts read then are final, whether or not they agree with
# the docs, and a disagreement fails at once rather than at the hang guard.
CANARY_RULE = {"source_matchers": ['canary="source"'], "target_matchers": ['canary="target"'],
               "equal": []}
CANARY_TARGET = {"alertname": "Canary", "canary": "target"}
CANARY_SOURCE = {"alertname": "Canary", "canary": "source"}


Verdicts = dict[frozenset[tuple[str, str]], dict[str, Any]]
"""Alertmanager's alerts by label set: ``fingerprint``, ``labels``, ``status``."""


def _judged(am: AlertmanagerServer, alerts: Sequence[dict[str, str]]) -> Verdicts:
    """Post ``alerts`` (then the canary source) and read Alertmanager's verdicts once its
    inhibitor has taken them all in."""
    am.post_alerts([CANARY_TARGET, *alerts, CANARY_SOURCE])

    def settled() -> Verdicts | None:
        got = {frozenset(a["labels"].items()): a for a in am.alerts()}
        canary = got.get(frozenset(CANARY_TARGET.items()))
        return got if canary and canary["status"]["inhibitedBy"] else None

    verdicts: Verdicts = wait_for(settled, "Alertmanager's inhibitor to take in the canary",
                                  diagnose=lambda: f"its log:\n{am.log[-2000:]}")
    for labels in alerts:
        assert frozenset(labels.items()) in verdicts, f"posted, not listed: {labels}"
    return verdicts


def _inhibitors(verdicts: Verdicts, labels: dict[str, str]) -> list[dict[str, str]]:
    """The label sets of the alerts Alertmanager says inhibit ``labels``' alert."""
    by_fp = {a["fingerprint"]: a["labels"] for a in verdicts.values()}
    status = verdicts[frozenset(labels.items())]["status"]
    assert (status["state"] == "suppressed") == bool(status["inhibitedBy"]), status
    return [by_fp[fp] for fp in status["inhibitedBy"]]


def _agrees_with_the_model(verdicts: Verdicts, alerts: Sequence[dict[str, str]]) -> None:
    """Every alert inhibited by Alertmanager exactly where ``inhibitions()`` says, and only
    by an alert the model says may inhibit it."""
    for target in alerts:
        by = _inhibitors(verdicts, target)
        assert bool(by) == any(_inhibited(s, target) for s in alerts), (target, by)
        assert all(_inhibited(s, target) for s in by), (target, by)


@pytest.mark.parametrize("fault", ["SlopilotEngineStalled", "SlopilotTargetsDown"])
def test_a_real_alertmanager_lets_a_stall_or_an_outage_page_once(
        alertmanager_factory: Callable[[dict[str, Any]], AlertmanagerServer],  # noqa: F811
        fault: str) -> None:
    am = alertmanager_factory(null_route_config([*_docs_rules(), CANARY_RULE]))
    chat = _labels(BUILTIN_LATENCY)
    paged = next(a for a in chat if a["alertname"] == fault)
    latency = [a for a in chat if a["alertname"] in LATENCY]
    neighbours = [a for namespace, name in (("team-b", "chat"), ("team-a", "other"))
                  for a in _labels(BUILTIN_LATENCY, namespace, name)
                  if a["alertname"] in LATENCY]
    posted = [paged, *latency, *neighbours]
    verdicts = _judged(am, posted)

    assert _inhibitors(verdicts, paged) == []
    assert {a["alertname"] for a in latency} == set(LATENCY)
    for alert in latency:
        by = _inhibitors(verdicts, alert)
        assert by, f"{fault} does not silence {alert}"
        # A TTFT warning may name its critical instead: Alertmanager names one inhibitor.
        assert all(s == paged or (s["alertname"] == alert["alertname"]
                                  and s["priority_class"] == alert["priority_class"]
                                  and s["severity"] == "critical") for s in by), (alert, by)
        if alert["severity"] == "critical" or alert["alertname"] != "SlopilotTTFTP99High":
            assert by == [paged], (alert, by)
    # Another namespace's chat and another deployment in team-a page on; only their own
    # TTFT warnings go quiet, under their own criticals.
    for alert in neighbours:
        by = _inhibitors(verdicts, alert)
        assert paged not in by, (alert, by)
        if alert["severity"] == "critical" or alert["alertname"] != "SlopilotTTFTP99High":
            assert by == [], (alert, by)
    _agrees_with_the_model(verdicts, posted)


def test_a_real_alertmanager_lets_a_critical_silence_its_warning_only(
        alertmanager_factory: Callable[[dict[str, Any]], AlertmanagerServer],  # noqa: F811
) -> None:
    am = alertmanager_factory(null_route_config([*_docs_rules(), CANARY_RULE]))
    rows = {(a["alertname"], a["priority_class"], a["severity"]): a
            for a in _labels(BUILTIN_LATENCY)}
    critical = rows["SlopilotTTFTP99High", "p0", "critical"]
    warning = rows["SlopilotTTFTP99High", "p0", "warning"]
    # p1's warning fires alone (its critical does not), as does p0's sustained warning.
    other_class = rows["SlopilotTTFTP99High", "p1", "warning"]
    other_alert = rows["SlopilotTTFTP99Sustained", "p0", "warning"]
    posted = [critical, warning, other_class, other_alert]
    verdicts = _judged(am, posted)

    assert _inhibitors(verdicts, warning) == [critical]
    for alone in (critical, other_class, other_alert):
        assert _inhibitors(verdicts, alone) == [], alone
        assert verdicts[frozenset(alone.items())]["status"]["state"] == "active", alone
    _agrees_with_the_model(verdicts, posted)


def test_a_real_alertmanager_lets_no_forged_alert_silence_another_namespace(
        alertmanager_factory: Callable[[dict[str, Any]], AlertmanagerServer],  # noqa: F811
) -> None:
    """The docs' rules on a real Alertmanager: team-evil's stall and criticals, naming
    team-b's chat in the ``slopilot_*`` labels, stamped ``namespace=team-evil`` by the
    Prometheus; team-b's own stall still silences its latency pages."""
    am = alertmanager_factory(null_route_config([*_docs_rules(), CANARY_RULE]))
    victim = [a for a in _labels(BUILTIN_LATENCY, namespace="team-b")
              if a["alertname"] in LATENCY]
    stall = next(a for a in _labels(BUILTIN_LATENCY, namespace="team-b")
                 if a["alertname"] == "SlopilotEngineStalled")
    forged = [dict(stall, namespace="team-evil"),
              *(dict(a, namespace="team-evil") for a in victim if a["severity"] == "critical")]
    verdicts = _judged(am, [*victim, *forged])
    for alert in victim:
        by = _inhibitors(verdicts, alert)
        assert not any(s.get("namespace") == "team-evil" for s in by), (alert, by)
        if alert["severity"] == "critical" or alert["alertname"] != "SlopilotTTFTP99High":
            assert by == [], (alert, by)
    _agrees_with_the_model(verdicts, [*victim, *forged])
    am2 = alertmanager_factory(null_route_config([*_docs_rules(), CANARY_RULE]))
    own = _judged(am2, [stall, *victim])
    assert all(_inhibitors(own, a) for a in victim)
