"""A time the loop kept that lies after ``now``: the clock stepped back, or it is not ours.

The loop's times (a trial's start, the cooldown's end, the rate limit's trial starts, the
quiet period's start, a backoff's end) are seconds of the clock that ticks it, and they
are persisted in ``status.controller``. The controller's clock stepped back (an NTP step
on its node, a restarted operator on a node whose clock is behind the one that wrote the
status, a peer replica's clock ahead) or a hand-edited status put them in the future:
each wait then lasted the step's length on top of its own. A trial served its config
for a day on a clock stepped back a day, and ``cooldown_until: 1e15`` cooled for ever.
Each wait now lasts at most its own length from the tick that finds it in the future.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from slopilot.tuner.loop.backoff import Backoff
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import (
    ControllerState,
    LoopState,
    PendingRestore,
    RunningTrial,
)
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import GOOD, FakeDeployment, FakePlanner, Rig, alert

T = 1_000_000.0
DAY_S = 86_400.0


def test_a_trial_is_judged_one_window_after_the_clock_stepped_back() -> None:
    rig = Rig(settings={"window_s": 10})
    ctl = rig.build()
    rig.alerts.alerts = [alert(AlertAction.RETUNE)]
    assert ctl.tick(T).action is Action.TRIAL
    rig.alerts.alerts = []
    back = T - DAY_S  # the node's clock is stepped back a day mid-trial
    assert ctl.tick(back).action is Action.NONE
    assert ctl.loop.trial is not None and ctl.loop.trial.started_at == back
    d = ctl.tick(back + 10)
    assert d.action is not Action.NONE and 0 in rig.study.told  # judged, not held a day
    assert rig.ev is not None and all(end <= back + 10 for _, end, _ in rig.ev.calls)


def test_a_starved_trial_ends_at_its_own_limit_after_the_clock_stepped_back() -> None:
    """``began_at`` (when the trial was applied, which ``max_trial_s`` and the backlog's
    wait count from) was left an hour ahead after a step back of an hour: a trial whose
    windows starved ran 3,720 s where its limit is 120 s."""
    rig = Rig(settings={"window_s": 10, "max_trial_s": 120})
    ctl = rig.build()
    rig.alerts.alerts = [alert(AlertAction.RETUNE)]
    assert ctl.tick(T).action is Action.TRIAL
    # Every window from here on starves: too few requests to judge.
    ctl.settings = dataclasses.replace(ctl.settings, min_class_requests=1000)
    now = T - 3600.0  # the clock steps back an hour mid-trial
    for _ in range(40):
        now += 10.0
        ctl.tick(now)
        t = ctl.loop.trial
        assert t is None or t.began_at is None or t.began_at <= now
        if t is None or t.number != 0:
            break
    assert now - (T - 3600.0) <= 120.0 + 2 * 10.0, now - (T - 3600.0)


def test_a_restarted_operator_whose_clock_is_behind_resumes_the_trial_in_a_window() -> None:
    trial = RunningTrial(number=4, config=dict(GOOD), started_at=T + 3600.0, canary=False)
    saved = LoopState(state=ControllerState.TUNING, since=T + 3600.0, trial=trial,
                      trial_starts=[T + 3600.0], baseline_config={"token_budget": 2048})
    rig = Rig(settings={"window_s": 10})
    ctl = rig.build(LoopState.from_dict(saved.to_dict()))
    assert ctl.tick(T).action is Action.NONE
    assert 4 not in rig.study.told
    assert "trial 4" in ctl.tick(T + 10).reason and 4 in rig.study.told  # judged
    assert ctl.loop.since <= T + 10


@pytest.mark.parametrize("until", [T + DAY_S, 1e15])
def test_a_cooldown_that_ends_in_the_far_future_lasts_one_cooldown(until: float) -> None:
    rig = Rig(settings={"cooldown_s": 30})
    ctl = rig.build(LoopState(state=ControllerState.COOLDOWN, since=T,
                              cooldown_until=until))
    assert ctl.tick(T).action is Action.NONE and ctl.state is ControllerState.COOLDOWN
    assert ctl.tick(T + 29).state is ControllerState.COOLDOWN
    assert ctl.tick(T + 30).state is ControllerState.STEADY


def test_trial_starts_in_the_future_rate_limit_one_hour_at_most() -> None:
    rig = Rig(settings={"max_trials_per_hour": 1})
    ctl = rig.build(LoopState(trial_starts=[T + DAY_S]))
    rig.alerts.alerts = [alert(AlertAction.RETUNE)]
    assert ctl.tick(T).action is not Action.TRIAL  # one this hour (as far as we know)
    ctl.loop.state = ControllerState.STEADY  # whatever the limit did, start over
    ctl.loop.cooldown_until = None
    assert ctl.tick(T + 3600.0).action is Action.TRIAL


def test_a_quiet_period_that_began_in_the_future_ends_one_period_from_now() -> None:
    rig = Rig(dep=FakeDeployment(n=3), planner=FakePlanner(needed=1),
              settings={"scale_down_after_s": 60})
    ctl = rig.build(LoopState(headroom_since=T + DAY_S))
    assert ctl.tick(T).action is Action.NONE
    d = ctl.tick(T + 60)
    assert (d.action, d.replicas) == (Action.SCALE, 1)


def test_a_backoff_that_ends_in_the_far_future_lasts_its_cap_at_most() -> None:
    kept = Backoff({"replicas": 4}, until=1e15, wait_s=1e15).to_dict()
    rig = Rig(settings={"cooldown_s": 30, "max_backoff_s": 120})
    ctl = rig.build(LoopState(backoff=kept))
    ctl.tick(T)
    restored = Backoff.from_dict(ctl.loop.backoff or {})
    assert restored is not None
    assert restored.until <= T + 120 and restored.wait_s <= 120


def test_the_step_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(settings={"cooldown_s": 30})
    ctl = rig.build(LoopState(state=ControllerState.COOLDOWN, since=T, cooldown_until=1e15))
    with caplog.at_level(logging.WARNING, logger="slopilot.tuner.loop"):
        ctl.tick(T)
        ctl.tick(T + 1)
    lines = [r.getMessage() for r in caplog.records if "in the future" in r.getMessage()]
    assert len(lines) == 1 and "cooldown_until" in lines[0]


def test_an_owed_restore_due_in_the_far_future_is_tried_within_its_wait() -> None:
    # Two failures: the next try waits 5 s. Kept a day ahead, the trial's config stayed.
    owed = PendingRestore(since=T + DAY_S, attempts=2, retry_at=T + DAY_S + 5.0,
                          error="RuntimeError: replica unreachable", trial=0)
    rig = Rig()
    ctl = rig.build(LoopState(state=ControllerState.COOLDOWN, since=T, cooldown_until=T,
                              baseline_config={"token_budget": 2048, "chunk_size": 2048},
                              pending_restore=owed))
    rig.dep.config = dict(GOOD)
    assert "restore" not in ctl.tick(T).reason  # its wait restarts from now
    assert ctl.loop.pending_restore is not None
    assert ctl.loop.pending_restore.since == T and ctl.loop.pending_restore.retry_at == T + 5
    d = ctl.tick(T + 5)
    assert d.reason.startswith("restored:") and rig.dep.config["token_budget"] == 2048
