"""A trial is judged only on enough requests of each judged class.

At 0.15-0.3 req/s a trial's window held 6-12 requests of the alert's class, so its P99
was about their maximum: a config truly 1.25 x over the SLO committed 34-46 % of the
time, one truly at the limit 87-95 %. A window short of ``min_class_requests`` is now
extended (measured again over all of the trial since it settled), up to
``max_trial_s``; a trial that reaches it short ends without a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import (
    SLO,
    START,
    FakeAlerts,
    FakeEvaluator,
    Rig,
    alert,
)


@dataclass
class Trickle(FakeEvaluator):
    """P0 and P1 arriving at ``per_s`` each: a range's count grows with its length."""

    per_s: float = 1.0

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        self.calls.append((start, end, canary))
        n = round(self.per_s * (end - start))
        return window({"p0": figures(250.0, 20.0, 50.0, finished=n),
                       "p1": figures(400.0, 40.0, 60.0, finished=n)})


def _rig(per_s: float, **settings: Any) -> Rig:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              settings={"min_class_requests": 100, **settings})
    rig.ev = Trickle(rig.dep, lambda c: window(), per_s=per_s)
    return rig


def test_a_window_short_of_the_floor_runs_on_and_is_judged_on_all_of_it() -> None:
    rig = _rig(4.0)  # 9 s measured hold 36 of each class
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    d = ctl.tick(10.0)
    assert (d.state, d.action) == (ControllerState.TUNING, Action.NONE)
    assert "trial 0 extended: P0 36 of 100 requests in 9 s" in d.reason
    assert rig.study.told == {}
    assert ctl.tick(20.0).action is Action.NONE  # 76
    d = ctl.tick(30.0)  # 116: judged, and it holds
    assert d.action is Action.COMMIT
    assert d.summary is not None and d.summary.overall.requests_finished == 2 * 116
    assert rig.ev is not None
    assert {start for start, end, _ in rig.ev.calls if end >= 10.0} == {1.0}  # since settled


def test_a_trial_that_reaches_its_cap_short_of_the_floor_ends_without_a_verdict() -> None:
    rig = _rig(0.5, max_trial_s=60)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    for t in (10.0, 20.0, 30.0, 40.0, 50.0):
        assert ctl.tick(t).action is Action.NONE
    d = ctl.tick(60.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.HOLD)
    assert "too little traffic to judge: P0 30 of 100 requests in 59 s" in d.reason
    assert "no replica" not in d.reason and rig.dep.scaled == []
    assert rig.study.told == {} and 0 in rig.study.failed
    assert rig.dep.config == START  # rolled back


@pytest.mark.parametrize("settings, named", [
    ({"min_class_requests": 0}, "min_class_requests=0: expected a whole number"),
    ({"min_class_requests": 2.5}, "min_class_requests=2.5"),
    ({"max_trial_s": 60.0}, "max_trial_s=60.0: expected seconds >= window_s=120"),
])
def test_the_floor_and_the_cap_are_checked(settings: Mapping[str, Any], named: str) -> None:
    with pytest.raises(ControllerError, match=named.replace(".", r"\.")):
        ControllerSettings(deployment="d", slo=SLO, **settings)


def test_the_default_floor_is_a_hundred_requests() -> None:
    assert ControllerSettings(deployment="d", slo=SLO).min_class_requests == 100
