"""Scale-down waits for quiet: no alert that acts, and none that says an SLO is breached.

The P0 TTFT warning (TTFT P99 over its SLO, action inform) used to leave the headroom
clock running: the loop removed a replica "quiet for 60 s" while the SLO was breached the
whole time (the review's r5).
"""

from __future__ import annotations

import pytest

from slopilot.tuner.prometheus.alert_table import (
    SLO_BREACH_ALERTS,
    AlertName,
    RuleOptions,
    alert_table,
)
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import SLO, FakeDeployment, FakePlanner, Rig, alert


def quiet_minute(name: str) -> tuple[Rig, list[str]]:
    """Three replicas, the simulator holding the SLO with two, and ``name`` (action
    inform) firing for the whole of ``scale_down_after_s`` (60 s) and a tick more."""
    rig = Rig(dep=FakeDeployment(n=3), planner=FakePlanner(needed=2))
    ctl = rig.build()
    rig.alerts.alerts = [alert(AlertAction.INFORM, name)]
    return rig, [ctl.tick(float(t)).reason for t in range(0, 76, 15)]


def test_an_slo_breach_warning_blocks_the_scale_down() -> None:
    rig, reasons = quiet_minute(AlertName.TTFT_P99_HIGH)
    assert rig.dep.scaled == [], reasons
    assert rig.ctl is not None and rig.ctl.loop.headroom_since is None
    assert reasons[-1] == "alert SlopilotTTFTP99High[p0,warning]"


def test_an_inform_that_is_no_slo_breach_lets_the_scale_down_go_on() -> None:
    rig, reasons = quiet_minute(AlertName.PREFIX_CACHE_HIT_LOW)
    assert rig.dep.scaled == [2], reasons
    assert reasons[4].startswith("scale_down 3->2: no alert that acts or says an SLO is "
                                 "breached for 60 s"), reasons


def test_the_breach_alerts_are_the_rows_over_an_slo_term() -> None:
    # The controller reads alerts by name; the table's rows under those names must all be
    # "an SLO term above its SLO", and no other row may be.
    slo_terms = {"slopilot:ttft_seconds:p99", "slopilot:tbt_seconds:p99",
                 "slopilot:ttft_seconds:p99_long", "slopilot:tbt_seconds:p99_long",
                 "slopilot:preemptions:per_minute"}
    for row in alert_table(SLO, RuleOptions()):
        over_slo = all(c.figure.value in slo_terms and c.op.value == ">"
                       for c in row.conditions)
        assert (row.name in SLO_BREACH_ALERTS) is over_slo, row.name


@pytest.mark.parametrize("name", sorted(SLO_BREACH_ALERTS))
def test_no_breach_alert_leaves_the_headroom_clock_running(name: str) -> None:
    rig, _ = quiet_minute(name)
    assert rig.dep.scaled == []


def test_metrics_gone_blind_scale_nothing_down() -> None:
    """No alert fires when the deployment's series stop reaching Prometheus, so a quiet
    period runs out as if the deployment were idle; the probe then says it sees no
    engines (PrometheusUnavailable), and the loop holds instead of planning fewer
    replicas for the designed load."""
    from slopilot.tuner.study.evaluator import PrometheusUnavailable

    rig = Rig(dep=FakeDeployment(n=3), planner=FakePlanner(needed=1))
    ctl = rig.build()

    def blind(now: float) -> object:
        raise PrometheusUnavailable("no series of the deployment's engines in the last 1m")

    ctl.probe.measure = blind  # type: ignore[method-assign, assignment]
    decisions = [ctl.tick(float(t)) for t in range(0, 76, 15)]
    assert rig.dep.scaled == [], [d.line() for d in decisions]
    assert decisions[-2].reason.startswith("prometheus_unavailable: holding the current "
                                           "config (no series of the deployment's engines")


def test_quiet_at_min_replicas_runs_no_capacity_search() -> None:
    """Nothing can be given back at ``min_replicas``: no headroom clock, and no simulator
    run (seconds of CPU on the operator's host) every quiet period to find that out."""
    rig = Rig(dep=FakeDeployment(n=1))
    ctl = rig.build()
    reasons = [ctl.tick(float(t)).reason for t in range(0, 301, 15)]
    assert rig.planner.calls == [], reasons
    assert ctl.loop.headroom_since is None and rig.dep.scaled == []
