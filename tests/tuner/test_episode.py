"""How an episode judges its live trials: what a window must show before it is a verdict,
which breaches cut a trial short, and what ends an episode. Driven through the in-memory
fakes (tests/tuner/controller_fakes.py) on a virtual clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import (
    BAD,
    GOOD,
    START,
    FakeAlerts,
    FakeDeployment,
    FakeEvaluator,
    FakeOffline,
    FakePlanner,
    FakeStudy,
    Rig,
    alert,
    summary,
)

TRIAL = {"token_budget": 4096, "chunk_size": 4096}


def test_a_window_without_the_alerts_class_is_no_verdict() -> None:
    """A P0 alert starts the episode; the canary (a third of the traffic) serves 30 P1
    requests and no P0 in its window. P0's P99s are None: read as met, the trial 'held'
    and went to every replica with nothing measured for the class the alert was about."""
    rig = Rig(dep=FakeDeployment(n=3), offline=None,
              alerts=FakeAlerts([alert(AlertAction.RETUNE)]),  # P0 TTFT P99 high
              study=FakeStudy(queue=[dict(TRIAL)]), settings={"max_window_repeats": 2})
    rig.ev = FakeEvaluator(rig.dep, lambda c: window(
        {"p1": figures(400.0, 50.0, 40.0, finished=30)}))
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    d = ctl.tick(10.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.REPEAT), d.reason
    assert "p0" in d.reason and rig.study.told == {}
    d = ctl.tick(20.0)  # still no P0: the trial fails, as a window rejected too often
    assert d.action is Action.REVERT and 0 in rig.study.failed
    assert rig.dep.config != TRIAL and rig.dep.canary_config != TRIAL


def test_a_class_the_alert_is_not_about_may_be_absent() -> None:
    """P2 served nothing in the window (a workload without P2 traffic): the P0 alert's
    class was measured, so the window is a verdict and the trial commits."""
    rig = Rig(offline=None, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              study=FakeStudy(queue=[dict(TRIAL)]))
    rig.ev = FakeEvaluator(rig.dep, lambda c: window(
        {"p0": figures(100.0, 20.0, 10.0), "p1": figures(400.0, 50.0, 40.0)}))
    ctl = rig.build()
    ctl.tick(0.0)
    assert ctl.tick(10.0).action is Action.COMMIT


def test_a_window_in_which_no_class_with_an_slo_was_measured_is_no_verdict() -> None:
    """An alert on every class (preemptions) names no class; a window that measured no
    class with an SLO still says nothing, and is never feasible by absence."""
    storm = dataclasses.replace(alert(AlertAction.RETUNE, "SlopilotPreemptionStorm"),
                                priority_class="all")
    rig = Rig(offline=None, alerts=FakeAlerts([storm]), study=FakeStudy(queue=[dict(TRIAL)]))
    rig.ev = FakeEvaluator(rig.dep, lambda c: window({}))
    ctl = rig.build()
    ctl.tick(0.0)
    d = ctl.tick(10.0)
    assert d.action is Action.REPEAT and rig.study.told == {}


def test_a_scale_alert_during_an_episode_ends_it_and_scales() -> None:
    """A surge 60 s into an episode: the scale alert (P0 TBT P99 over 2 x SLO) used to wait
    for the whole episode, 20 infeasible trials judged at a load the episode was not
    started for, and the replica came 44 minutes after the alert."""
    rig = Rig(dep=FakeDeployment(n=2), alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              planner=FakePlanner(needed=3))
    rig.ev = FakeEvaluator(rig.dep, lambda c: summary(p0_tbt=96.0))  # every config misses
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL and rig.dep.canary_config is not None
    rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    d = ctl.tick(5.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.SCALE), d.reason
    assert rig.dep.scaled == [3] and "SlopilotTBTP99High" in d.reason
    assert list(rig.study.failed) == [0] and ctl.loop.trial is None
    # The episode's rollback config (its starting one) on every replica, the canary too.
    assert rig.dep.config == START and rig.dep.canary_config is None


def test_the_scale_alert_an_episode_started_under_does_not_end_it() -> None:
    """A scale alert whose offline study finds a config that holds starts an episode
    (retune_suffices); the alert still fires while its trials run, and is theirs."""
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]))
    ctl = rig.build()
    d = ctl.tick(0.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.TRIAL)
    assert ctl.tick(5.0).action is Action.NONE and rig.dep.scaled == []
    assert ctl.tick(10.0).action is Action.COMMIT


def test_a_trial_that_breaks_any_class_badly_is_cut_short() -> None:
    """The early look read P0 only: a trial with P1 TTFT at 10 x its SLO ran its whole
    window, and on a workload without P0 (the azure-conv-2023 trace) none was ever cut.
    tiny-cpu's SLO: P1 TTFT 1000 ms, TBT 150 ms; the revert margin 1.0 (2 x)."""
    awful = {"token_budget": 128, "chunk_size": 64}

    def p1_only(c: Mapping[str, Any]) -> WindowSummary:
        ttft = 10_000.0 if dict(c) == awful else 1_200.0
        return window({"p1": figures(ttft, 100.0, 50.0, finished=40)})

    rig = Rig(offline=None, study=FakeStudy(queue=[dict(awful)]),
              alerts=FakeAlerts([dataclasses.replace(alert(AlertAction.RETUNE),
                                                     priority_class="p1")]))
    rig.ev = FakeEvaluator(rig.dep, p1_only)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    assert ctl.tick(2.0).action is Action.NONE  # before the early look (a quarter window)
    d = ctl.tick(3.0)
    assert d.action is Action.REVERT and "p1 ttft_p99_ms=10000" in d.reason, d.reason
    assert rig.dep.config == START and not rig.study.told[0].feasible


def test_a_breach_under_the_revert_margin_runs_its_window() -> None:
    """P1 TTFT at 1.2 x its SLO: under 2 x, the window runs whole and is then judged."""
    rig = Rig(offline=None,
              alerts=FakeAlerts([dataclasses.replace(alert(AlertAction.RETUNE),
                                                     priority_class="p1")]))
    rig.ev = FakeEvaluator(rig.dep, lambda c: window(
        {"p1": figures(1_200.0, 100.0, 50.0, finished=40)}))
    ctl = rig.build()
    ctl.tick(0.0)
    assert [ctl.tick(float(t)).action for t in range(3, 10, 2)] == [Action.NONE] * 4
    assert "infeasible: p1.ttft_p99" in ctl.tick(10.0).reason


EDGE = {"token_budget": 1024, "chunk_size": 768}


def _edge_rig(*p0_ttft: float) -> Rig:
    """A trial whose P0 TTFT P99 is each of ``p0_ttft`` in turn, window by window (the
    SLO's limit is 300 ms)."""
    rig = Rig(dep=FakeDeployment(n=3), alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              offline=None, study=FakeStudy(queue=[dict(EDGE)]))
    left = list(p0_ttft)
    rig.ev = FakeEvaluator(rig.dep, lambda c: summary(p0_ttft=left.pop(0)))
    return rig


def test_a_window_within_the_margin_is_confirmed_by_a_second() -> None:
    """One window at 99.7 % of the limit committed the config to every replica: the
    simulator must show 10 % to spare before the loop trusts a config, a live trial
    needed none, on ~35 P0 requests a window. Within the margin, one more window."""
    rig = _edge_rig(299.0, 290.0, 299.0)  # the first window measured again at the commit
    ctl = rig.build()
    ctl.tick(0.0)
    d = ctl.tick(10.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.REPEAT), d.reason
    assert "p0.ttft_p99" in d.reason and rig.study.told == {}
    assert (rig.dep.config, rig.dep.canary_config) == (START, EDGE)  # still on the canary
    assert ctl.loop.episode_trials == 0
    d = ctl.tick(20.0)
    assert d.action is Action.COMMIT and rig.dep.config == EDGE
    assert rig.ev is not None and (10.0, 20.0) in [c[:2] for c in rig.ev.calls]  # whole
    told = rig.study.told[0]
    assert told.feasible and told.constraints[0] == pytest.approx(299.0 / 300.0 - 1.0)


def test_an_edge_config_that_misses_on_its_second_window_is_not_committed() -> None:
    rig = _edge_rig(299.0, 310.0, 299.0)  # the first window measured again, judged again
    ctl = rig.build()
    ctl.tick(0.0)
    assert ctl.tick(10.0).action is Action.REPEAT
    d = ctl.tick(20.0)
    assert d.action is Action.NONE and "infeasible: p0.ttft_p99" in d.reason
    assert (EDGE, False) not in rig.dep.applied and not rig.study.told[0].feasible
    assert rig.study.told[0].constraints[0] == pytest.approx(310.0 / 300.0 - 1.0)


def test_a_config_with_the_margin_to_spare_commits_on_one_window() -> None:
    rig = _edge_rig(260.0)  # 87 % of the limit
    ctl = rig.build()
    ctl.tick(0.0)
    assert ctl.tick(10.0).action is Action.COMMIT


def test_the_hours_budget_running_out_with_warm_starts_untried_buys_no_replica() -> None:
    """29 of the hour's 30 trials used by an earlier episode; the offline study ranks
    three configs that hold; one trial runs and misses, and the budget is spent. COMMIT
    read that as live evidence that nothing holds: 'no_feasible_config after 1 trials',
    a replica bought with two warm starts the twin said hold never tried."""
    near = {"token_budget": 1536, "chunk_size": 1024}  # misses by a little (by_config)
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), planner=FakePlanner(needed=1),
              offline=FakeOffline([(dict(near), True), (dict(GOOD), True),
                                   (dict(BAD), True)]))
    ctl = rig.build(LoopState(trial_starts=[float(-3000 + i) for i in range(29)]))
    assert ctl.tick(0.0).action is Action.TRIAL
    d = ctl.tick(10.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.HOLD), d.reason
    assert "trial_rate_limit" in d.reason and "2 warm start(s) untried" in d.reason
    assert rig.dep.scaled == [] and rig.dep.config == START


def test_at_max_replicas_a_scale_alert_leaves_the_episode_running() -> None:
    """No replica can answer the alert there: the episode is the only remedy left."""
    rig = Rig(dep=FakeDeployment(n=4), alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              offline=None)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    d = ctl.tick(5.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.NONE), d.reason
    assert rig.study.failed == {} and rig.dep.scaled == []


def test_a_trial_looked_at_long_after_its_window_is_judged_on_its_last_max_trial_s() -> None:
    """An operator down for a week (or a tick that came late) found the trial running and
    measured it from its start: one window of a week, over loads and a config the pods
    may have lost in between, and a range query over all of it. Past its longest
    (``max_trial_s``, and a window), what is measured is its last ``max_trial_s``."""
    rig = _edge_rig(260.0)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    week = 7 * 86400.0
    assert ctl.tick(week).action is Action.COMMIT
    assert rig.ev is not None
    start, end, _ = rig.ev.calls[-1]
    assert (start, end) == (week - ctl.settings.max_trial_s, week)
    # On time, the window is the trial's own, from its start past the settling.
    rig = _edge_rig(260.0)
    ctl = rig.build()
    ctl.tick(0.0)
    ctl.tick(15.0)
    assert rig.ev is not None
    assert rig.ev.calls[-1][:2] == (ctl.settings.settle_s, 15.0)
