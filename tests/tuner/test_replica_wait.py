"""After a scale-up the loop waits for the replicas it bought (scale_wait.py).

Before, COOLDOWN ended on ``cooldown_s`` alone: with a namespace quota that refused the
new pods, STEADY judged the next windows as if the asked replicas served, and the alert
still firing started an episode at the asked count (blaming the config), or, on live
evidence alone, bought one more replica after every cooldown up to max, none of them
serving.
"""

from __future__ import annotations

import pytest

from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import SLO, FakeAlerts, FakeDeployment, FakePlanner, Rig, alert

QUOTA = ("ReplicaSet/demo-5d8f FailedCreate: pods \"demo-5d8f-x\" is forbidden: exceeded "
         "quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: "
         "requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2")
READY_S = 120.0


def quota_rig(planner: FakePlanner) -> Rig:
    """Two replicas serve of six allowed, the quota fits no third; a scale alert fires
    for good; 30 s cooldown, ``replica_ready_s`` 120 s, no offline study."""
    dep = FakeDeployment(n=2, ready_cap=2, why_not_ready=QUOTA)
    return Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]),
               planner=planner, offline=None,
               settings={"max_replicas": 6, "cooldown_s": 30, "replica_ready_s": READY_S})


def run(ctl: Controller, start: float, end: float, step: float = 10.0) -> list[Decision]:
    out, t = [], start
    while t < end:
        out.append(ctl.tick(t))
        t += step
    return out


@pytest.mark.parametrize("planner", [FakePlanner(needed=4),
                                     FakePlanner(error=TimeoutError("sim past its limit"))],
                         ids=["planned", "live_evidence"])
def test_replicas_a_quota_refuses_are_waited_for_then_said_and_not_bought_again(
        planner: FakePlanner) -> None:
    rig = quota_rig(planner)
    ctl = rig.build()
    first = ctl.tick(0.0)
    assert (first.state, first.action) == (ControllerState.COOLDOWN, Action.SCALE)
    bought = list(rig.dep.scaled)
    assert len(bought) == 1 and bought[0] > 2
    waiting = run(ctl, 10.0, READY_S)
    # Past the cooldown it still waits, saying what keeps the pods.
    assert all(d.state is ControllerState.COOLDOWN for d in waiting)
    assert any("exceeded quota: gpu-quota" in d.reason for d in waiting
               if d.reason != "cooling down")
    said = run(ctl, READY_S, READY_S + 20.0)
    informs = [d for d in said if d.action is Action.INFORM]
    assert len(informs) == 1, [d.line() for d in said]
    assert "exceeded quota: gpu-quota" in informs[0].reason
    assert "2 of " in informs[0].reason and "ready" in informs[0].reason
    later = run(ctl, READY_S + 20.0, 2000.0)
    # No replica bought again while the quota holds, no episode started on the count
    # asked, and the scale alert held with the quota named.
    assert rig.dep.scaled == bought, rig.dep.scaled
    assert rig.study.asked == 0
    assert not [d for d in later if d.action in (Action.SCALE, Action.RETUNE, Action.TRIAL)]
    assert any("exceeded quota" in d.reason and "SlopilotTBTP99High" in d.reason
               for d in later), [d.line() for d in later[-3:]]


def test_replicas_ready_late_end_the_wait_and_the_loop_judges_on_all_of_them() -> None:
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    ctl.tick(0.0)
    assert rig.dep.scaled == [4]
    run(ctl, 10.0, 60.0)
    assert ctl.state is ControllerState.COOLDOWN  # past cooldown_s, two of four ready
    rig.dep.ready_cap = None  # the pods start: all four serve
    ready_at = 60.0
    d = ctl.tick(ready_at)
    assert d.state is ControllerState.COOLDOWN and d.action is Action.NONE
    # The cooldown counts from when they serve: the windows before judged two replicas.
    assert ctl.loop.cooldown_until == ready_at + 30.0
    assert ctl.loop.replica_wait is None
    after = run(ctl, 70.0, 200.0)
    assert not [x for x in after if x.action is Action.INFORM]
    # Judged on all four: at four of the four needed, the capacity suffices, and the
    # alert still firing starts an episode there (no replica bought for nothing).
    assert rig.dep.scaled == [4]
    assert any(x.action is Action.TRIAL for x in after)
    assert any("capacity_suffices at 4 replica(s)" in x.reason for x in after)


def test_replicas_ready_at_once_change_nothing() -> None:
    rig = quota_rig(FakePlanner(needed=4))
    rig.dep.ready_cap = None
    ctl = rig.build()
    ctl.tick(0.0)
    assert ctl.loop.replica_wait is None and ctl.loop.cooldown_until == 30.0
    d = ctl.tick(30.0)
    assert d.state is not ControllerState.COOLDOWN, d.line()


def test_the_wait_survives_a_restart() -> None:
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    ctl.tick(0.0)
    saved = LoopState.from_dict(ctl.to_dict())
    assert saved.replica_wait is not None and saved.replica_wait.asked == 4
    again = rig.build(state=saved)
    d = again.tick(READY_S + 10.0)
    assert d.action is Action.INFORM and "exceeded quota" in d.reason


def test_tuning_turned_off_forgets_the_wait() -> None:
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    ctl.tick(0.0)
    ctl.stop(10.0, "tuning turned off")
    assert ctl.loop.replica_wait is None and ctl.state is ControllerState.STEADY


@pytest.mark.parametrize("value", [0, -5.0, float("inf"), float("nan"), True, "10m"])
def test_a_bad_replica_ready_s_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ControllerError, match=r"replica_ready_s=.*seconds"):
        ControllerSettings(deployment="demo", slo=SLO,
                           replica_ready_s=value)  # type: ignore[arg-type]
