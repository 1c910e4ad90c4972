"""After a scale-up the loop waits for the replicas it bought (scale_wait.py).

Before, COOLDOWN ended on ``cooldown_s`` alone: with a namespace quota that refused the
new pods, STEADY judged the next windows as if the asked replicas served, and the alert
still firing started an episode at the asked count (blaming the config), or, on live
evidence alone, bought one more replica after every cooldown up to max, none of them
serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.ports import Pending, Rollout, Stuck
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import (
    SLO,
    FakeAlerts,
    FakeDeployment,
    FakePlanner,
    Rig,
    alert,
)
from tests.tuner.test_rollout_wait import RollingDeployment

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
    # The replicas that never came are given back in the same decision: the Deployment
    # asks what serves (kept asking, its pods Pending kept every rollout from completing).
    assert "given back" in informs[0].reason and "2 serve" in informs[0].reason
    assert rig.dep.scaled == [*bought, 2] and rig.dep.n == 2
    later = run(ctl, READY_S + 20.0, 2000.0)
    # No replica bought again while the refusal is remembered (max_backoff_s), no episode
    # started on the count asked, and the scale alert held with the quota named.
    assert rig.dep.scaled == [*bought, 2], rig.dep.scaled
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


@pytest.mark.parametrize("planner", [FakePlanner(needed=4),
                                     FakePlanner(error=TimeoutError("sim past its limit"))],
                         ids=["planned", "live_evidence"])
def test_the_refusal_holds_scale_ups_for_max_backoff_s_then_one_is_tried_again(
        planner: FakePlanner) -> None:
    """Remembered for good, a quota raised later was never used; forgotten at once, every
    alert bought, waited ``replica_ready_s`` and gave back."""
    rig = quota_rig(planner)
    rig.settings["max_backoff_s"] = 600.0
    ctl = rig.build()
    run(ctl, 0.0, READY_S + 10.0)  # bought at 0, given back at READY_S
    bought = rig.dep.scaled[0]
    assert rig.dep.scaled == [bought, 2]
    short = ctl.loop.replicas_short
    assert short is not None and short.until == READY_S + 600.0
    held = run(ctl, READY_S + 10.0, READY_S + 600.0)
    assert rig.dep.scaled == [bought, 2], rig.dep.scaled
    assert "exceeded quota" in held[-1].reason and "SlopilotTBTP99High" in held[-1].reason
    again = run(ctl, READY_S + 600.0, READY_S + 700.0)
    assert rig.dep.scaled == [bought, 2, bought], [d.line() for d in again]
    assert any(d.action is Action.SCALE for d in again)


def test_replicas_ready_late_forget_the_refusal() -> None:
    """The quota raised and the deployment scaled by hand: more serve than when the wait
    gave up, so nothing refuses them any more."""
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    run(ctl, 0.0, READY_S + 10.0)
    assert rig.dep.n == 2 and ctl.loop.replicas_short is not None
    rig.dep.ready_cap, rig.dep.n = None, 3  # a user's scale, the quota raised
    seen = run(ctl, READY_S + 10.0, READY_S + 30.0)  # the cooldown's end, then STEADY
    assert ctl.loop.replicas_short is None, [d.line() for d in seen]
    assert not [d for d in seen if "no scale_up" in d.reason]


def test_a_refusal_kept_by_an_older_version_loads_and_expires_after_max_backoff_s() -> None:
    """Written before ``until``, with the deployment still asking the refused count: the
    replicas that never served are given back at STEADY's first look, and the hold lasts
    ``max_backoff_s`` from when the wait ended, not for ever."""
    saved = LoopState.from_dict({"state": "steady", "replicas_short": {
        "asked": 4, "ready": 2, "since": 100.0, "why": QUOTA}})
    assert saved.replicas_short is not None and saved.replicas_short.until is None
    rig = quota_rig(FakePlanner(needed=5))
    rig.dep.n = 4
    rig.settings["max_backoff_s"] = 600.0
    ctl = rig.build(state=saved)
    d = ctl.tick(200.0)
    assert d.action is Action.INFORM and "given back (scaled 4->2)" in d.reason, d.line()
    assert rig.dep.scaled == [2]
    d = ctl.tick(210.0)
    assert "no scale_up" in d.reason and "exceeded quota" in d.reason, d.line()
    d = ctl.tick(700.0)
    assert rig.dep.scaled == [2, 5], d.line()


def test_the_refusal_survives_a_restart_and_a_clock_stepped_back() -> None:
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    run(ctl, 0.0, READY_S + 10.0)
    saved = LoopState.from_dict(ctl.to_dict())
    assert saved.replicas_short == ctl.loop.replicas_short
    # Written on a clock a day ahead: the hold lasts max_backoff_s from now at most.
    assert saved.replicas_short is not None and saved.replicas_short.until is not None
    saved.replicas_short.until += 86400.0
    saved.replicas_short.since += 86400.0
    again = rig.build(state=saved)
    again.tick(READY_S + 20.0)
    kept = again.loop.replicas_short
    assert kept is not None and kept.until == READY_S + 20.0 + 3600.0


@dataclass
class ShortRolling(RollingDeployment):
    """vLLM's Deployment under a quota: a rollout completes only once every asked replica
    is of the new template and available, so with pods the quota refuses it never does."""

    def settled(self, now: float) -> Rollout:
        if self.n > self.running():
            if self.rolling is not None and now >= self.rolling[1] + self.deadline_s:
                return Stuck("ProgressDeadlineExceeded: ReplicaSet chat-9 has timed out "
                             "progressing")
            return Pending(f"{self.running()} of {self.n} replicas updated")
        return super().settled(now)


def test_after_the_refusal_a_vllm_trial_rolls_out_and_is_judged() -> None:
    """Kept asking the refused count, every full rollout read Pending and then
    ProgressDeadlineExceeded: each trial waited 15 minutes, ended rollout_stuck and its
    config was held from trials as stuck, a good one included."""
    dep = ShortRolling(n=2, ready_cap=2, why_not_ready=QUOTA)
    rig = Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]),
              planner=FakePlanner(needed=4), offline=None,
              settings={"max_replicas": 6, "cooldown_s": 30, "replica_ready_s": READY_S,
                        "window_s": 120, "canary": False})
    ctl = rig.build()
    out, t = [], 0.0
    while t < 3000.0:
        if t >= READY_S + 30.0:
            rig.alerts.alerts[:] = [alert(AlertAction.RETUNE)]
        dep.now = t
        out.append(ctl.tick(t))
        t += 30.0
    assert dep.n == 2
    assert not [d for d in out if "rollout_stuck" in d.reason], \
        [d.line() for d in out if "rollout_stuck" in d.reason][:2]
    assert ctl.loop.stuck_configs == []
    assert any(d.action is Action.TRIAL for d in out)
    # Each trial rolls out and is judged on a window of its own.
    assert sum("rolled out: its window starts" in d.reason for d in out) >= 2


def test_a_scale_up_to_what_served_is_made_and_keeps_the_refusal() -> None:
    """Scaled down by hand below what served: buying back up to it is no replica the
    quota refused, and the refusal of more still holds."""
    rig = quota_rig(FakePlanner(needed=4))
    ctl = rig.build()
    run(ctl, 0.0, READY_S + 10.0)
    assert rig.dep.scaled == [4, 2]
    rig.dep.n = 1  # a user's scale
    rig.planner.needed = 2
    run(ctl, READY_S + 10.0, READY_S + 60.0)
    assert rig.dep.scaled == [4, 2, 2]
    assert ctl.loop.replicas_short is not None
    rig.planner.needed = 4
    later = run(ctl, READY_S + 60.0, READY_S + 300.0)
    assert rig.dep.scaled == [4, 2, 2], [d.line() for d in later]
