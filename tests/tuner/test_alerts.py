"""Alert parsing and routing by the action label; a dead Prometheus says so."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from slopilot.tuner.prometheus.alerts import (
    AlertAction,
    AlertSource,
    PrometheusUnavailable,
    parse_alerts,
)
from tests.support.prometheus import free_port


def row(name: str, action: str, state: str = "firing", dep: str = "demo",
        **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "action": action, "severity": "warning",
                       "priority_class": "p0", "slopilot_deployment": dep, **labels},
            "state": state, "activeAt": "2026-01-02T03:04:05.123456789Z", "value": "0.42"}


def answer(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"alerts": list(rows)}}


def test_firing_alerts_of_the_deployment_are_routed_by_action() -> None:
    alerts = parse_alerts(answer(
        row("SlopilotTTFTP99High", "retune"), row("SlopilotTBTP99High", "scale"),
        row("SlopilotPrefixCacheHitLow", "inform"), row("Pending", "retune", state="pending"),
        row("Other", "retune", dep="other")), "demo")
    assert [(a.name, a.action) for a in alerts] == [
        ("SlopilotPrefixCacheHitLow", AlertAction.INFORM),
        ("SlopilotTBTP99High", AlertAction.SCALE),
        ("SlopilotTTFTP99High", AlertAction.RETUNE)]
    assert alerts[0].since == pytest.approx(1767323045.123456)
    assert alerts[0].value == pytest.approx(0.42) and alerts[0].priority_class == "p0"


def test_an_unknown_action_is_read_as_inform_never_acted_on() -> None:
    (a,) = parse_alerts(answer(row("New", "reboot")), "demo")
    assert a.action is AlertAction.INFORM


@pytest.mark.parametrize("bad", [{"status": "error", "error": "boom"}, {"status": "success"},
                                 "not json"])
def test_a_bad_answer_is_prometheus_unavailable(bad: Any) -> None:
    with pytest.raises(PrometheusUnavailable):
        parse_alerts(bad, "demo")


def test_a_dead_prometheus_raises_a_clear_error() -> None:
    port = free_port()  # nothing listens there
    source = AlertSource(f"http://127.0.0.1:{port}", "demo", timeout_s=2)
    with pytest.raises(PrometheusUnavailable, match=f"127.0.0.1:{port} is unreachable"):
        source.firing()
    source.close()


def test_reads_through_http() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/alerts"
        return httpx.Response(200, json=answer(row("SlopilotTTFTP99High", "retune")))

    source = AlertSource("http://prom:9090/", "demo",
                         client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert [a.action for a in source.firing()] == [AlertAction.RETUNE]


@pytest.mark.parametrize("url, dep, fix", [("prom:9090", "d", "expected http"),
                                           ("http://p:9090", "", "deployment is empty")])
def test_bad_arguments_are_refused(url: str, dep: str, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        AlertSource(url, dep)
