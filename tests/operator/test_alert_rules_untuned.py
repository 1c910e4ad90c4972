"""With spec.tuning.enabled false nobody acts on an alert: the rendered rows say so."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.tuner.prometheus.alert_table import TUNING_OFF
from tests.operator.test_alert_rules import admitted, body, rule_of


def _alerts(group: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in group["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("monitoring", [True, False], ids=["PrometheusRule", "ConfigMap"])
@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_tuning_off_renders_inform_rows_that_say_nobody_acts(monitoring: bool,
                                                             backend: str) -> None:
    off = _alerts(rule_of(admitted(body(backend=backend, tuning={"enabled": False})),
                          monitoring=monitoring))
    on = _alerts(rule_of(admitted(body(backend=backend)), monitoring=monitoring))
    # The same rows, conditions, holds and severities: only who acts differs.
    assert [(a["alert"], a["expr"], a["for"], a["labels"]["severity"]) for a in off] == \
        [(a["alert"], a["expr"], a["for"], a["labels"]["severity"]) for a in on]
    assert {a["labels"]["action"] for a in off} == {"inform"}
    assert {"retune", "scale", "hold"} <= {a["labels"]["action"] for a in on}
    for alert in off:
        text = alert["annotations"]["description"]
        assert "controller" not in text and "add replicas" not in text, text
        assert "retune the" not in text and "raise the token budget" not in text, text
        # The prefix row tells of the traffic, no action of anyone's.
        assert alert["alert"] == "SlopilotPrefixCacheHitLow" or \
            TUNING_OFF.split(":")[0].lower() in text.lower(), text
    for alert in on:
        assert "tuning is off" not in alert["annotations"]["description"].lower()


def test_turning_tuning_on_renders_the_acting_rows_again() -> None:
    # A spec edit reconciles (kopf's update handler on spec), which renders from the spec
    # alone: the rule follows spec.tuning.enabled both ways.
    off = rule_of(admitted(body(tuning={"enabled": False})))
    on = rule_of(admitted(body(tuning={"enabled": True})))
    assert off != on and on == rule_of(admitted(body()))
