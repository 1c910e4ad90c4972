"""Trials whose windows never measured anything are no evidence about configs or capacity.

A Prometheus that answers but reads no series for a while (a broken scrape, a relabel, a
restarted Prometheus without its TSDB) rejects every trial window; after
``max_window_repeats`` such windows a trial is told failed. Those failures say nothing of
the config: an episode that ran ``max_trials`` of them used to end in COMMIT's
``no_feasible_config`` and buy a replica, saying no config held when none was measured.
"""

from __future__ import annotations

from slopilot.tuner.loop.state import Action, ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import START, FakeAlerts, FakePlanner, Rig, alert


def test_an_episode_whose_windows_all_read_no_data_buys_no_replica() -> None:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), offline=None,
              planner=FakePlanner(needed=1),
              settings={"max_trials": 2, "max_window_repeats": 2})
    ctl = rig.build()
    assert rig.ev is not None
    rig.ev.reject = 1000  # every window: no data
    decisions = [ctl.tick(float(t)) for t in range(0, 60, 5)]
    reasons = [d.reason for d in decisions if d.action is not Action.NONE]
    assert rig.study.asked == 2, reasons  # both trials ran and were never measured
    assert rig.dep.scaled == [], reasons
    assert rig.dep.config == START
    end = next(d for d in decisions if d.state is ControllerState.COOLDOWN)
    assert end.action is Action.HOLD and "no window measured" in end.reason, end.reason
