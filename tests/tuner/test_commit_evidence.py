"""A trial confirmed on a second window commits on the worse of the two: the COMMIT's
evidence (the decision's summary, the demo's COMMIT line and its episode record) is the
figures it was judged on, not the last window's alone."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.local.demo_story import describe
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.loop.trial_window import both_windows
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import SLO, FakeAlerts, FakeEvaluator, Rig, alert


@dataclass
class ByTime(FakeEvaluator):
    """The first window's figures for a range that ends by ``first_until``."""

    first_until: float = 0.0
    first: WindowSummary | None = None

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        self.calls.append((start, end, canary))
        assert self.first is not None
        return self.first if end <= self.first_until else self.figures({})


def test_a_confirmed_commit_shows_the_worse_p99_and_both_windows_requests() -> None:
    first = window({"p0": figures(285.0, 20.0, 50.0, finished=110),  # within 10 % of
                    "p1": figures(400.0, 40.0, 60.0, finished=130)})  # 300 ms: confirm
    second = window({"p0": figures(240.0, 30.0, 40.0, finished=120),
                     "p1": figures(500.0, 35.0, 70.0, finished=140)})
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    rig.ev = ByTime(rig.dep, lambda c: second, first_until=10.0, first=first)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    assert ctl.tick(10.0).action is Action.REPEAT  # confirming
    d = ctl.tick(20.0)
    assert d.action is Action.COMMIT and d.summary is not None
    p0, p1 = d.summary.classes[Priority.P0], d.summary.classes[Priority.P1]
    assert (p0.ttft_p99_ms, p0.tbt_p99_ms, p0.requests_finished) == (285.0, 30.0, 230)
    assert (p1.ttft_p99_ms, p1.tbt_p99_ms, p1.requests_finished) == (500.0, 40.0, 270)
    assert d.summary.overall.requests_finished == 500
    line = describe(d, ctl)
    assert "P0 TTFT/TBT P99 285/30 ms" in line and "500 requests finished" in line


def test_both_windows_count_the_ttft_samples_of_both() -> None:
    """The sample floor counts the observations a TTFT P99 ranks (on vLLM the meter's
    streams, fewer than the requests finished): joined, they are both windows' too, not
    dropped for the finished requests."""
    first = window({"p0": dataclasses.replace(figures(285.0, 20.0, 50.0, finished=110),
                                              ttft_samples=30.0)})
    second = window({"p0": dataclasses.replace(figures(240.0, 30.0, 40.0, finished=120),
                                               ttft_samples=45.0)})
    joined = both_windows(first, second).classes[Priority.P0]
    assert joined.ttft_samples == 75.0 and joined.requests_finished == 230
    unknown = window({"p0": figures(240.0, 30.0, 40.0, finished=120)})
    assert both_windows(first, unknown).classes[Priority.P0].ttft_samples is None


FIRST_NEAR = window({"p0": figures(285.0, 20.0, 50.0, finished=110),  # 95 % of 300 ms
                     "p1": figures(400.0, 40.0, 60.0, finished=130)})
SECOND_CLEAR = window({"p0": figures(240.0, 30.0, 40.0, finished=120),
                       "p1": figures(500.0, 35.0, 70.0, finished=140)})


def _confirming(rig: Rig) -> LoopState:
    """A trial on its confirming window, as ``status.controller`` keeps it."""
    rig.ev = ByTime(rig.dep, lambda c: SECOND_CLEAR, first_until=10.0, first=FIRST_NEAR)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL
    assert ctl.tick(10.0).action is Action.REPEAT
    return LoopState.from_dict(ctl.loop.to_dict())


def test_an_slo_tightened_while_a_trial_confirms_judges_both_windows_by_it() -> None:
    """The first window's verdict was kept as terms of the SLO it was judged on and
    joined with the second's under the edited one: P0 TTFT tightened from 300 to 250 ms
    committed a trial whose own first window read 285 ms, as the new SLO's config. Both
    windows are now judged by the SLO in force (the first measured again)."""
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    state = _confirming(rig)
    tight = dataclasses.replace(SLO, p0=dataclasses.replace(SLO.p0, ttft_p99_ms=250))
    rig.settings = {"slo": tight}
    d = rig.build(state).tick(20.0)
    assert d.action is not Action.COMMIT, d.reason
    assert "P0 TTFT" in d.reason or "p0" in d.reason.lower(), d.reason


def test_an_slo_term_added_while_a_trial_confirms_is_judged_not_an_error() -> None:
    """A P2 target added mid-confirmation made the kept terms one fewer than the new
    SLO's: ``zip`` raised and the tick rolled back with its message as the reason."""
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    state = _confirming(rig)
    more = dataclasses.replace(SLO, p2=dataclasses.replace(SLO.p2, ttft_p99_ms=5000))
    rig.settings = {"slo": more}
    d = rig.build(state).tick(20.0)
    assert "zip" not in d.reason and "error" not in d.reason, d.reason
    assert d.action is Action.COMMIT, d.reason  # both windows hold it: p2 sent nothing


def test_a_first_window_no_longer_measurable_starts_the_confirmation_again() -> None:
    """Where the first window cannot be measured again (Prometheus lost it), the SLO it
    was judged by is unknown: the window just measured is a first window of its own."""
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    state = _confirming(rig)
    rig.ev = ByTime(rig.dep, lambda c: FIRST_NEAR, first_until=10.0, first=FIRST_NEAR)
    lost = rig.ev

    def refuse(start: float, end: float, *, canary: bool) -> WindowSummary:
        if end <= 10.0:
            raise PrometheusUnavailable("Prometheus at http://prom answered 503")
        return FIRST_NEAR
    lost.measure = refuse  # type: ignore[method-assign]
    d = rig.build(state).tick(20.0)
    assert d.action is Action.REPEAT and "confirming" in d.reason, d.reason
