"""Asked replicas are not serving replicas: a canary and the capacity judged on the ready.

The reviewer's quota scenario (a namespace quota fits one pod; the load needs two): the
scaled-to replica never becomes ready, and the loop must neither run "canary" trials on
the one pod that serves nor retune knobs for the capacity that did not arrive.
"""

from __future__ import annotations

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import (
    FakeAlerts,
    FakeDeployment,
    FakeEvaluator,
    Rig,
    alert,
    summary,
)


def test_no_canary_trial_on_the_one_ready_replica_of_two_asked() -> None:
    dep = FakeDeployment(n=2, ready_cap=1)
    rig = Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    ctl = rig.build()
    d = ctl.tick(0.0)
    assert d.action is Action.TRIAL
    # Applied to every replica: with one serving, there is nothing to compare against.
    assert dep.applied and dep.applied[-1][1] is False
    assert "all replicas" in d.reason


def test_a_canary_trial_with_two_ready_replicas() -> None:
    dep = FakeDeployment(n=2)
    rig = Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    rig.ev = FakeEvaluator(dep, lambda c: summary())
    d = rig.build().tick(0.0)
    assert d.action is Action.TRIAL and dep.applied[-1][1] is True
