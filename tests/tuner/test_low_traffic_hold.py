"""An alert class too thin for any trial to reach ``min_class_requests`` in
``max_trial_s``: the episode holds rather than tunes.

Each trial of such an episode ran its ``max_trial_s`` on a config nobody judged and ended
``too_little_traffic``, ending the episode; the alert, still firing, began the next after
the cooldown, so the loop spent most of its time on unjudged configs. Driven on the
production Controller with an injected clock (tick every 15 s, windows of 120 s, P0 the
alert's class), the probe measuring the same load the windows count.
"""

from __future__ import annotations

import dataclasses

from slopilot.engine.request import Priority
from slopilot.engine.sim.arrivals import Poisson
from slopilot.engine.sim.workload import ClassMix
from slopilot.engine.sim.workload_spec import OpenLoopSpec
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from tests.support.summaries import window
from tests.tuner.controller_fakes import START, FakeAlerts, FakeProbe, Rig, alert
from tests.tuner.test_low_traffic_verdicts import Ranged, traffic


def _probe_at(p0_per_s: float, p1_per_s: float) -> FakeProbe:
    """A probe that measures P0 and P1 arriving at these rates."""
    probe = FakeProbe()
    workload = probe.scenario.workload
    assert isinstance(workload, OpenLoopSpec)
    phase = dataclasses.replace(
        workload.phases[-1], start_s=0.0, arrivals=Poisson(rate=p0_per_s + p1_per_s),
        classes=ClassMix.of({Priority.P0: p0_per_s, Priority.P1: p1_per_s}))
    probe.scenario = dataclasses.replace(probe.scenario, workload=OpenLoopSpec((phase,)))
    return probe


def _controller(p0_per_s: float, p1_per_s: float, fired: Alert | None = None
                ) -> tuple[Rig, Controller]:
    rig = Rig(alerts=FakeAlerts([fired or alert(AlertAction.RETUNE)]),
              settings={"min_class_requests": 100, "window_s": 120, "max_trial_s": 1200,
                        "cooldown_s": 300},
              probe=_probe_at(p0_per_s, p1_per_s))
    rig.ev = Ranged(rig.dep, lambda c: window(), ranged=traffic(p0_per_s, p1_per_s))
    return rig, rig.build()


def _ticks(ctl: Controller, minutes: float) -> list[Decision]:
    return [ctl.tick(15.0 * i) for i in range(int(minutes * 4))]


def test_an_alert_class_too_thin_to_reach_the_floor_holds_rather_than_tunes() -> None:
    # P0 at 0.02/s brings 24 requests in max_trial_s; P1 at 5/s has plenty.
    rig, ctl = _controller(0.02, 5.0)
    decisions = _ticks(ctl, 90)
    assert [d for d in decisions if d.action is Action.TRIAL] == []
    assert rig.study.asked == 0 and rig.dep.canary_config is None
    assert rig.dep.applied == [] and rig.dep.committed == START
    assert rig.dep.scaled == []
    holds = [d for d in decisions if d.action is Action.HOLD]
    assert holds and all(d.state is ControllerState.COOLDOWN for d in holds)
    assert "too little traffic to tune: P0 0.02 req/s reaches 24 of 100 requests in " \
        "max_trial_s 20 min" in holds[0].reason
    # Said once an episode: the cooldown (300 s) spaces them, the tick (15 s) does not.
    assert len(holds) <= 90 * 60 / 300


def test_an_alert_class_that_can_reach_the_floor_is_tuned() -> None:
    # P0 at 0.1/s reaches 120 requests in max_trial_s: the trial goes live as before.
    rig, ctl = _controller(0.1, 5.0)
    assert ctl.tick(0.0).action is Action.TRIAL
    assert rig.study.asked == 1


def test_an_alert_of_no_class_holds_on_the_thin_classes_the_floor_binds() -> None:
    """A preemption storm names no class (``all``): the floor then binds every judged
    class, and a thin P0 ended each trial unjudged after 20 minutes, one after another,
    while the same load alerting on P0 held."""
    storm = Alert(name="SlopilotPreemptionStorm", action=AlertAction.RETUNE,
                  severity="warning", priority_class="all", since=0.0)
    rig, ctl = _controller(0.02, 5.0, storm)
    decisions = _ticks(ctl, 90)
    assert [d for d in decisions if d.action is Action.TRIAL] == []
    assert rig.dep.applied == []
    holds = [d for d in decisions if d.action is Action.HOLD]
    assert holds and "too little traffic to tune: P0 0.02 req/s" in holds[0].reason
