"""Trials whose windows never measured anything are no evidence about configs or capacity.

A Prometheus that answers but reads no series for a while (a broken scrape, a relabel, a
restarted Prometheus without its TSDB) rejects every trial window; after
``max_window_repeats`` such windows a trial is told failed. Those failures say nothing of
the config: an episode that ran ``max_trials`` of them used to end in COMMIT's
``no_feasible_config`` and buy a replica, saying no config held when none was measured.
"""

from __future__ import annotations

from typing import Any

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState, LoopState
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


def _before_the_count(loop: LoopState) -> dict[str, Any]:
    """``loop``'s status as a slopilot that did not count measured trials wrote it."""
    saved = loop.to_dict()
    del saved["episode_measured"]
    return saved


def test_an_episode_an_older_version_left_open_still_scales_when_nothing_held() -> None:
    # Two trials measured and missed under the older version (it kept no count of
    # measured ones); this one resumes in COMMIT with nothing feasible. The older version
    # would have bought a replica on that evidence: an unknown count is not "none".
    loop = LoopState(state=ControllerState.COMMIT, since=20.0, baseline_config=dict(START),
                     episode_trials=2, trial_starts=[0.0, 10.0],
                     episode_alerts=["SlopilotTTFTP99High[p0,warning]"])
    saved = _before_the_count(loop)
    resumed = LoopState.from_dict(saved)
    assert resumed.episode_measured is None  # not known, not 0
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), offline=None,
              planner=FakePlanner(needed=1), settings={"max_trials": 2})
    d = rig.build(resumed).tick(21.0)
    assert (d.action, d.replicas) == (Action.SCALE, 2), d.line()
    assert "no_feasible_config after 2 trials" in d.reason and rig.dep.scaled == [2]


def test_an_unknown_count_round_trips_and_a_measured_trial_makes_it_known() -> None:
    loop = LoopState(state=ControllerState.TUNING, baseline_config=dict(START),
                     episode_trials=1, trial_starts=[0.0],
                     episode_alerts=["SlopilotTTFTP99High[p0,warning]"])
    resumed = LoopState.from_dict(_before_the_count(loop))
    assert LoopState.from_dict(resumed.to_dict()) == resumed  # still unknown after a save
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), offline=None,
              settings={"max_trials": 3})
    ctl = rig.build(resumed)
    assert ctl.tick(20.0).action is Action.TRIAL
    ctl.tick(30.0)  # its window measured (a near miss): one measured trial at least
    assert ctl.loop.episode_measured == 1
    assert LoopState().episode_measured == 0  # a new state's count is known: none yet
