"""An alert that has held since before the last commit or scale may outlive the load it
measured: after the cooldown it starts no episode unless a window measured entirely
after that action breaches the SLO.

Alerts are ``for:``-held rules over rate windows, evaluated every ``interval_s`` behind
the clock: a P99 over the last minutes still counts the requests served before a commit
(and at the load before it) after the cooldown is over. The loop used to start one more
episode on it, which retuned for whatever load ran then: a lighter one after the peak
(config churn). The repro: a retune alert at a heavy load, an episode commits the config
that holds it, the load drops, and the alert is still firing (active since before the
commit) when the cooldown ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import GOOD, FakeAlerts, FakeEvaluator, Rig, alert, summary

COMMIT_AT, COOLDOWN_S = 10.0, 30.0


class Load:
    """The plant: at a heavy load only GOOD holds the SLO; at a light one every config does."""

    def __init__(self) -> None:
        self.heavy = True

    def figures(self, config: Mapping[str, Any]) -> WindowSummary:
        if not self.heavy or dict(config) == GOOD:
            return summary(goodput=150.0)
        return summary(p0_ttft=350.0)  # over tiny-cpu's 300 ms P0 TTFT SLO


def committed(fired: Alert, load: Load) -> tuple[Rig, Controller]:
    """An episode on ``fired`` (active since 0 s) commits GOOD at 10 s; cooldown to 40 s."""
    rig = Rig(alerts=FakeAlerts([fired]), settings={"cooldown_s": COOLDOWN_S})
    rig.ev = FakeEvaluator(rig.dep, load.figures)
    ctl = rig.build()
    ctl.tick(0.0)
    d = ctl.tick(COMMIT_AT)
    assert (d.action, rig.dep.config) == (Action.COMMIT, GOOD), d.line()
    return rig, ctl


def test_an_alert_from_before_the_commit_that_the_load_outlived_starts_no_episode() -> None:
    load = Load()
    fired = alert(AlertAction.RETUNE)
    rig, ctl = committed(fired, load)
    load.heavy = False  # the peak is over; the alert's window still holds some of it
    assert ctl.tick(41.0).reason == "cooldown over"
    asked = rig.study.asked
    for t in (45.0, 60.0, 90.0):
        d = ctl.tick(t)
        assert (d.state, d.action) == (ControllerState.STEADY, Action.NONE), (t, d.line())
        assert "since before the last commit or scale" in d.reason, d.reason
    assert rig.study.asked == asked and rig.dep.config == GOOD  # no churn
    assert rig.ev is not None
    start, end, canary = rig.ev.calls[-1]
    # Measured on the whole deployment, entirely after the commit (past its settle time).
    assert start >= COMMIT_AT + ctl.settings.settle_s and end == 90.0 and not canary


def test_an_alert_from_before_the_commit_acts_when_a_window_after_it_breaches() -> None:
    load = Load()
    rig, ctl = committed(alert(AlertAction.RETUNE), load)
    rig.ev = ctl.evaluator = FakeEvaluator(rig.dep, lambda c: summary(p0_ttft=350.0))
    ctl.tick(41.0)
    d = ctl.tick(45.0)  # the committed config no longer holds: a new episode is right
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()


def test_an_alert_active_since_after_the_commit_acts_without_a_look() -> None:
    load = Load()
    rig, ctl = committed(alert(AlertAction.RETUNE), load)
    load.heavy = False
    rig.alerts.alerts = [Alert("SlopilotTTFTP99High", AlertAction.RETUNE, "critical", "p0",
                               since=COMMIT_AT + 1)]
    ctl.tick(41.0)
    assert rig.ev is not None
    calls = len(rig.ev.calls)
    d = ctl.tick(45.0)  # held entirely on windows after the commit: as before
    assert d.action is Action.TRIAL, d.line()
    assert len(rig.ev.calls) == calls  # no look at a window: nothing to re-confirm


def test_a_window_that_says_nothing_leaves_the_alert_its_word() -> None:
    load = Load()
    rig, ctl = committed(alert(AlertAction.RETUNE), load)
    load.heavy = False
    assert rig.ev is not None
    ctl.tick(41.0)
    rig.ev.reject = 1  # too few requests since the commit: no evidence either way
    assert ctl.tick(45.0).action is Action.TRIAL


def test_a_scale_alert_from_before_the_commit_buys_no_replica_the_load_outlived() -> None:
    load = Load()
    rig, ctl = committed(alert(AlertAction.RETUNE), load)
    load.heavy = False
    rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    ctl.tick(41.0)
    d = ctl.tick(45.0)
    assert (d.state, d.action) == (ControllerState.STEADY, Action.NONE), d.line()
    assert rig.dep.scaled == [] and rig.dep.n == 1


def test_a_window_without_the_alerts_own_figure_leaves_it_its_word() -> None:
    """A TTFT alert re-confirmed on a window with the class's gaps but none of its first
    tokens (streams started before it run on; the requests after it all still queued)
    read the missing P99 as held (``NO_SAMPLES``), and the alert was left out: a window
    that said nothing of the alert's figure said the SLO held."""
    load = Load()
    rig, ctl = committed(alert(AlertAction.RETUNE), load)
    no_first_tokens = window({"p0": figures(None, 20.0, 75.0), "p1": figures(200.0, 40.0, 75.0),
                              "p2": figures(200.0, 40.0)})
    rig.ev = ctl.evaluator = FakeEvaluator(rig.dep, lambda c: no_first_tokens)
    ctl.tick(41.0)
    d = ctl.tick(45.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()


def test_the_re_check_ends_once_the_alerts_window_holds_nothing_from_before_the_action(
        ) -> None:
    """An alert's rule reads at most ``breach_window_s``: past that since the action, an
    alert still firing judges requests served after it alone, and its word stands, as
    for an alert that became active after the action. Before, the loop measured a window
    on every tick for as long as such an alert fired and the two read the SLO apart, and
    never acted on it."""
    load = Load()
    fired = alert(AlertAction.RETUNE)
    rig, ctl = committed(fired, load)
    load.heavy = False
    assert rig.ev is not None
    ctl.tick(41.0)
    t = 45.0
    while t < COMMIT_AT + ctl.settings.breach_window_s:
        assert ctl.tick(t).action is Action.NONE
        t += 15.0
    calls = len(rig.ev.calls)
    d = ctl.tick(COMMIT_AT + ctl.settings.breach_window_s)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL), d.line()
    assert len(rig.ev.calls) == calls  # no window measured to re-confirm it
