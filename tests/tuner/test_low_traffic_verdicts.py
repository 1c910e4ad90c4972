"""Which classes an extended trial waits for, and what ends it before the floor.

The floor (``min_class_requests``) binds the classes the verdict needs: a class the
alerts are about always, another only where its figures would decide a commit. A class
that has reached the floor and misses is a verdict at once; a sparse class over its SLO
is a miss as it was before the floor, one within it holds nothing back; and the early
look's breach rule runs on every tick of an extended trial. Each case drives the
production Controller on an injected clock (tick every 15 s, windows of 120 s, P0 the
alert's class, tiny-cpu's SLO: P0 300/60 ms, P1 1000/150 ms).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import FakeAlerts, FakeEvaluator, Rig, alert

Figures = Callable[[float, float], WindowSummary]


@dataclass
class Ranged(FakeEvaluator):
    """Figures as a function of the measured range (its requests grow with its length)."""

    ranged: Figures | None = None

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        self.calls.append((start, end, canary))
        assert self.ranged is not None
        return self.ranged(start, end)


def traffic(p0_per_s: float, p1_per_s: float, *, p0_ttft: Callable[[float], float]
            = lambda end: 100.0, p1_tbt: Callable[[float], float] = lambda end: 40.0
            ) -> Figures:
    def at(start: float, end: float) -> WindowSummary:
        n0 = round(p0_per_s * (end - start))
        n1 = max(1, round(p1_per_s * (end - start))) if p1_per_s else 0
        classes = {"p0": figures(p0_ttft(end), 20.0, 50.0, finished=n0)}
        if n1:
            classes["p1"] = figures(200.0, p1_tbt(end), 60.0, finished=n1)
        return window(classes, duration_s=end - start)
    return at


def _controller(ranged: Figures, **settings: Any) -> tuple[Rig, Controller]:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              settings={"min_class_requests": 100, "window_s": 120, "max_trial_s": 1200,
                        "cooldown_s": 300, **settings})
    rig.ev = Ranged(rig.dep, lambda c: window(), ranged=ranged)
    return rig, rig.build()


def _until_acted(ctl: Controller, start: float = 0.0, end: float = 1500.0
                 ) -> list[tuple[float, Decision]]:
    """Every tick's decision that acted, from ``start`` up to the first cooldown."""
    out, t = [], start
    while t < end:
        d = ctl.tick(t)
        if d.action is not Action.NONE:
            out.append((t, d))
        if d.state is ControllerState.COOLDOWN:
            break
        t += 15.0
    return out


def _until(ctl: Controller, end: float) -> None:
    """Ticks every 15 s from 15 s to ``end``, each doing nothing but wait."""
    t = 15.0
    while t <= end:
        d = ctl.tick(t)
        assert d.action is Action.NONE, (t, d.reason)
        t += 15.0


def test_a_class_at_the_floor_that_misses_is_judged_without_waiting_for_the_others(
        ) -> None:
    # P1 holds 600 requests a window at 1.5 x its TBT SLO; P0 (the alert's) needs ~500 s.
    rig, ctl = _controller(traffic(0.2, 5.0, p1_tbt=lambda end: 225.0))
    assert ctl.tick(0.0).action is Action.TRIAL
    _until(ctl, 105.0)
    d = ctl.tick(120.0)
    assert "trial 0 infeasible: p1.tbt_p99 +50% over" in d.reason
    assert not rig.study.told[0].feasible and rig.study.failed == {}


def test_a_sparse_class_within_its_slo_does_not_hold_the_trial_back() -> None:
    # One stray P1 request in an otherwise clean window of 300 P0 requests.
    rig, ctl = _controller(traffic(3.0, 0.001))
    acted = _until_acted(ctl)
    assert [(t, d.action) for t, d in acted] == [(0.0, Action.TRIAL), (120.0, Action.COMMIT)]
    assert rig.study.told[0].feasible


def test_a_sparse_class_over_its_slo_is_a_miss() -> None:
    # P1 at 0.02/s reading 1.5 x its TBT SLO (under the early look's 2 x): too few to
    # hold the trial back, not too few to count against it (as before the floor).
    rig, ctl = _controller(traffic(3.0, 0.02, p1_tbt=lambda end: 225.0))
    assert ctl.tick(0.0).action is Action.TRIAL
    _until(ctl, 105.0)
    assert "trial 0 infeasible: p1.tbt_p99 +50% over" in ctl.tick(120.0).reason
    assert not rig.study.told[0].feasible


def test_the_breach_rule_cuts_an_extended_trial() -> None:
    # P0, the alert's class, fine through the first window, then 2.5 x its SLO: the
    # early look has passed, and the class is short of the floor.
    rig, ctl = _controller(traffic(0.2, 0.0, p0_ttft=lambda end: 100.0 if end < 120
                                   else 750.0))
    acted = _until_acted(ctl, end=400.0)
    t, d = acted[1]
    assert (t, d.action) == (120.0, Action.REVERT)
    assert "slo_breach trial 0 cut short: p0 ttft_p99_ms=750 > 2 x 300" in d.reason
    assert not rig.study.told[0].feasible


def test_a_confirming_window_gets_max_trial_s_from_its_own_start() -> None:
    # P0 at 0.15/s reading 95 % of its SLO: the first window needs ~680 s for the floor,
    # and its confirming one as long again, past 1200 s from the trial's start.
    rig, ctl = _controller(traffic(0.15, 0.0, p0_ttft=lambda end: 285.0))
    acted = _until_acted(ctl, end=2400.0)
    assert [d.action for _, d in acted] == [Action.TRIAL, Action.REPEAT, Action.COMMIT]
    confirm, committed = acted[1][0], acted[2][0]
    assert "confirming trial 0" in acted[1][1].reason
    assert 1200.0 < committed < confirm + 1200.0
    assert rig.study.told[0].feasible and rig.study.failed == {}


@pytest.mark.parametrize(("max_trial_s", "gap_s"), [(1200.0, 2400.0), (86400.0, 5000.0)])
def test_a_trial_looked_at_late_is_measured_over_its_last_max_trial_s(
        max_trial_s: float, gap_s: float) -> None:
    """An operator back after a gap measured a trial's last window alone: at 0.12 P0/s,
    14 of 100 requests in 2 min, unjudged, where the config had served ~330 P0 requests
    since. And a range past a day (maxTrial's most, a tick late) is more than the rules
    read (``RuleOptions``: a day at most): the trial ended in an error."""
    rig, ctl = _controller(traffic(0.12, 5.0, p0_ttft=lambda end: 290.0),
                           max_trial_s=max_trial_s)
    assert ctl.tick(0.0).action is Action.TRIAL
    now = max_trial_s + 120.0 + gap_s
    ctl.tick(now)
    start, end, _ = rig.ev.calls[-1]
    assert end == now and end - start == max_trial_s
