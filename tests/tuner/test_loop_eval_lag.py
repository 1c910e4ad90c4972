"""An alert is judged on its rule's last evaluation, not on the loop's clock.

Prometheus evaluates the rules every ``interval_s`` (30 s) on scrapes every 15 s: the
alerts read at a tick are the verdict of the last evaluation, up to one interval old,
over a window that ends there. The loop used to count a sustained-breach alert (a
``breach_window_s`` P99) as judging the config once ``breach_window_s`` had passed on its
own clock since the action; the first read after a 300 s cooldown, 305 s after it, had
the verdict of the evaluation 25 s before, whose window still held 20 s of requests
served before the action (promtool on the rendered rules: P0's P99 over 5 min 2.14 s at
A+305 s, 0.33 s from the next evaluation on), and an episode began on a config that held.
And the bound counted from the commit's tick: a rollout longer than the cooldown left the
alert's whole window on the old pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from tests.tuner.controller_fakes import GOOD, FakeAlerts, FakeEvaluator, Rig, summary
from tests.tuner.test_rollout_wait import RollingDeployment, run_rolling

COMMIT_AT, COOLDOWN_S, BREACH_S = 10.0, 300.0, 300.0


def sustained(evaluated_ago_s: float) -> Alert:
    """P0's TTFT P99 over ``breach_window_s``, active since before the episode, as read
    ``evaluated_ago_s`` after the rule's last evaluation."""
    return Alert("SlopilotTTFTP99Sustained", AlertAction.RETUNE, "warning", "p0",
                 since=0.0, value=2.14, evaluated_ago_s=evaluated_ago_s)


def heavy(config: Mapping[str, Any]) -> WindowSummary:
    """Only GOOD holds P0's TTFT SLO (tiny-cpu: 300 ms)."""
    return summary(goodput=150.0) if dict(config) == GOOD else summary(p0_ttft=350.0)


def committed() -> tuple[Rig, Controller]:
    """An episode on the sustained alert commits GOOD at ``COMMIT_AT`` (a live apply:
    in effect at once); the cooldown runs to ``COMMIT_AT + COOLDOWN_S``."""
    rig = Rig(alerts=FakeAlerts([sustained(0.0)]),
              settings={"cooldown_s": COOLDOWN_S, "breach_window_s": BREACH_S})
    rig.ev = FakeEvaluator(rig.dep, heavy)
    ctl = rig.build()
    ctl.tick(0.0)
    d = ctl.tick(COMMIT_AT)
    assert (d.action, rig.dep.config) == (Action.COMMIT, GOOD), d.line()
    assert ctl.tick(COMMIT_AT + COOLDOWN_S).reason == "cooldown over"
    return rig, ctl


def test_the_first_read_after_the_cooldown_of_an_evaluation_before_it_starts_no_episode(
        ) -> None:
    """The reviewer's figure: at A + 305 s the last evaluation was at A + 280 s, over
    (A - 20 s, A + 280 s]: the alert is not the committed config's."""
    rig, ctl = committed()
    rig.alerts.alerts = [sustained(25.0)]
    asked = rig.study.asked
    d = ctl.tick(COMMIT_AT + 305.0)
    assert (d.state, d.action) == (ControllerState.STEADY, Action.NONE), d.line()
    assert rig.study.asked == asked and rig.dep.config == GOOD


@pytest.mark.parametrize("evaluated_ago_s", [0.0, 5.0])
def test_a_breach_an_evaluation_past_the_window_still_reads_starts_the_episode(
        evaluated_ago_s: float) -> None:
    """The same alert read from an evaluation whose whole window is after the commit
    (A + 305 s or A + 300 s): the committed config breaches, and it acts at once."""
    rig, ctl = committed()
    rig.alerts.alerts = [sustained(evaluated_ago_s)]
    d = ctl.tick(COMMIT_AT + 305.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()


def test_a_breach_that_persists_is_acted_on_at_the_next_evaluation() -> None:
    rig, ctl = committed()
    rig.alerts.alerts = [sustained(25.0)]
    assert ctl.tick(COMMIT_AT + 305.0).action is Action.NONE
    rig.alerts.alerts = [sustained(0.0)]  # evaluated at A + 310 s: still over the SLO
    d = ctl.tick(COMMIT_AT + 310.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()


@pytest.mark.parametrize("roll_s", [400.0, 120.0])
def test_after_a_commits_rollout_the_alert_waits_for_a_window_on_the_new_pods(
        roll_s: float) -> None:
    """The sustained alert fires on throughout (Prometheus evaluating as the loop reads,
    ``evaluated_ago_s=0``): once the commit has rolled out, it is the new config's only
    when its window starts after the rollout's end, and then it is acted on. The new pods
    serve ``roll_s`` after the apply: longer than the cooldown (its end used to start an
    episode on a window all of old pods), or within it (unseen until the cooldown's time
    was over, the window still held ``roll_s`` of them)."""
    dep = RollingDeployment(roll_s=roll_s, deadline_s=3600.0)
    rig = Rig(dep=dep, alerts=FakeAlerts([sustained(0.0)]),
              settings={"window_s": 120, "canary": False, "cooldown_s": COOLDOWN_S,
                        "breach_window_s": BREACH_S})
    ticks = run_rolling(rig, 3000.0, step=10.0)
    commit_at = next(t for t, d in ticks if d.action is Action.COMMIT)
    rolled = commit_at + roll_s  # every new pod serves from then (ticks 10 s apart)
    again = next((t, d) for t, d in ticks if t > commit_at and d.action is Action.TRIAL)
    assert again[0] >= rolled + BREACH_S, [(t, d.line()) for t, d in ticks
                                           if commit_at <= t <= again[0]]
    # Not held for ever: the first evaluation whose window is all on the new pods acts.
    assert again[0] <= rolled + BREACH_S + 10.0, again[1].line()
