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
from slopilot.tuner.loop.trial_window import both_windows
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import FakeAlerts, FakeEvaluator, Rig, alert


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
