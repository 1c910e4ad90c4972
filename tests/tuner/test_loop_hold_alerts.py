"""An alert whose action is ``hold`` (a stalled engine, targets down) stops the loop acting.

A stall fires the TTFT alerts too (a request whose client left before its first token is
one never given), whose action is ``retune``: a retune's trials on a stuck executor, or a
scale, answer nothing, and the replicas given back for "headroom" while nothing is served
or seen are capacity lost. While a hold alert fires the loop does neither; it says so
once (a Warning event), and acts again once it clears.
"""

from __future__ import annotations

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction, parse_alert_series
from tests.tuner.controller_fakes import START, FakeAlerts, FakeDeployment, FakePlanner, Rig, alert

STALLED = Alert("SlopilotEngineStalled", AlertAction.HOLD, "critical", "all", 0.0)
DOWN = Alert("SlopilotTargetsDown", AlertAction.HOLD, "critical", "all", 0.0)
TTFT = Alert("SlopilotTTFTP99High", AlertAction.RETUNE, "critical", "p0", 0.0)


def test_a_stall_holds_the_retune_its_ttft_alert_asks_for_until_it_clears() -> None:
    rig = Rig(alerts=FakeAlerts([TTFT, STALLED]), offline=None)
    ctl = rig.build()
    d = ctl.tick(0.0)
    assert (d.state, d.action) == (ControllerState.STEADY, Action.HOLD), d.line()
    assert "SlopilotEngineStalled[all,critical]" in d.reason, d.reason
    quiet = ctl.tick(15.0)  # said once, then held quietly
    assert (quiet.state, quiet.action) == (ControllerState.STEADY, Action.NONE)
    assert "SlopilotEngineStalled" in quiet.reason
    assert rig.study.asked == 0 and rig.dep.applied == [] and rig.dep.config == START
    rig.alerts.alerts = [TTFT, STALLED, DOWN]  # another hold joins: said again
    assert ctl.tick(30.0).action is Action.HOLD
    rig.alerts.alerts = [TTFT]  # served again, still breached: now the retune acts
    d = ctl.tick(45.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()


def test_targets_down_give_no_replica_back_and_scale_none_up() -> None:
    rig = Rig(dep=FakeDeployment(n=3), alerts=FakeAlerts([DOWN]), planner=FakePlanner(needed=1))
    ctl = rig.build()
    for t in (0.0, 30.0, 60.0, 120.0):
        assert ctl.tick(t).state is ControllerState.STEADY
    assert rig.dep.scaled == [] and ctl.loop.headroom_since is None
    rig.alerts.alerts = [DOWN, alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    assert ctl.tick(150.0).action is Action.NONE and rig.dep.scaled == []


def test_the_hold_action_is_read_back_from_prometheus() -> None:
    labels = {"alertname": "SlopilotEngineStalled", "action": "hold", "severity": "critical",
              "priority_class": "all", "slopilot_deployment": "chat",
              "slopilot_namespace": "team"}
    got = parse_alert_series([{"metric": {"__name__": "ALERTS", "alertstate": "firing",
                                          **labels}, "value": [0, "1"]}], "chat", "team")
    assert [(a.name, a.action) for a in got] == [("SlopilotEngineStalled", AlertAction.HOLD)]


def test_a_stall_during_an_episode_ends_it_with_its_config_restored_and_no_replica() -> None:
    """A stall that begins while trials run: each trial's window judged a stuck executor,
    none held, and the episode ended in "no config holds", which bought a replica for an
    engine that served nothing. Now the hold ends the episode as a scale alert would,
    its open trial told failed and its rollback config back on every replica, without
    the replica; STEADY then holds until it clears."""
    rig = Rig(dep=FakeDeployment(n=2), alerts=FakeAlerts([TTFT]), offline=None)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL and rig.dep.canary_config is not None
    rig.alerts.alerts = [TTFT, STALLED]
    d = ctl.tick(5.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.HOLD), d.line()
    assert "SlopilotEngineStalled[all,critical]" in d.reason, d.reason
    assert list(rig.study.failed) == [0] and ctl.loop.trial is None
    assert rig.dep.config == START and rig.dep.canary_config is None
    assert rig.dep.scaled == []
