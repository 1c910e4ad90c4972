"""status.ttftP99Ms / tbtP99Ms / sloAttainment: each counted window's figures, and only its."""

from __future__ import annotations

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import ClassFigures, WindowSummary
from slopilot.operator.slo_status import FIGURES, WindowFigures, figures_of


def summary(ttft: float | None, tbt: float | None, throughput: float) -> WindowSummary:
    figures = ClassFigures(10.0, throughput, throughput / 2, ttft, tbt)
    return WindowSummary(60.0, 0.0, figures, dict.fromkeys(Priority, figures))


class Evaluator:
    def __init__(self, summaries: list[WindowSummary]) -> None:
        self.summaries = summaries

    def measure(self, start: float, end: float, *, canary: bool = False) -> WindowSummary:
        return self.summaries.pop(0)


def test_a_window_without_a_figure_clears_the_last_windows_one() -> None:
    # A window of prompts that finished in one token has a TTFT and no TBT: the status
    # must not show the TBT of an earlier window under this window's measuredAt.
    figures = WindowFigures(Evaluator([summary(300.0, 50.0, 160.0),
                                       summary(250.0, None, 0.0)]), 60.0, 0.0)
    first = figures.due(60.0)
    assert first["ttftP99Ms"] == 300.0 and first["tbtP99Ms"] == 50.0
    assert first["sloAttainment"] == 0.5
    second = figures.due(120.0)
    assert second["ttftP99Ms"] == 250.0 and second["measuredAt"] == "1970-01-01T00:02:00Z"
    # Null in a merge patch: the field goes.
    assert second["tbtP99Ms"] is None and second["sloAttainment"] is None
    assert set(second) == {*FIGURES, "measuredAt"}


def test_a_window_with_no_figure_at_all_leaves_the_last_ones_and_their_time() -> None:
    figures = WindowFigures(Evaluator([summary(None, None, 0.0)]), 60.0, 0.0)
    assert figures.due(60.0) == {}


def test_requests_turned_away_for_load_lower_the_attainment() -> None:
    """A deployment that turned away 30 of every 40 requests (429) with each of the 10 it
    served within its SLO showed sloAttainment 1.0: the share of the tokens it made, none
    of them for the clients it refused. Each refused request counts at the window's mean
    output length of the served ones, never given."""
    served = ClassFigures(10.0, 100.0, 100.0, 50.0, 10.0, requests_refused=30.0)
    s = WindowSummary(60.0, 0.0, served, dict.fromkeys(Priority, served))
    assert figures_of(s)["sloAttainment"] == 0.25
    nobody = ClassFigures(0.0, 0.0, 0.0, None, None, requests_refused=5.0)
    s = WindowSummary(60.0, 0.0, nobody, dict.fromkeys(Priority, nobody))
    assert figures_of(s)["sloAttainment"] == 0.0  # every client turned away
    tokens_only = ClassFigures(0.0, 10.0, 5.0, None, None)  # tokens of requests still running
    s = WindowSummary(60.0, 0.0, tokens_only, dict.fromkeys(Priority, tokens_only))
    assert figures_of(s)["sloAttainment"] == 0.5


def test_a_clock_stepped_back_measures_one_window_after_the_step() -> None:
    """The window is ``[last end, now]`` on the operator's clock: stepped back a day, no
    figure was written for a day (``now - since`` was negative all that time)."""
    figures = WindowFigures(Evaluator([summary(300.0, 50.0, 160.0)]), 60.0, 1_000_000.0)
    back = 1_000_000.0 - 86_400.0
    assert figures.due(back) == {}  # the window starts again at the step
    assert figures.due(back + 60.0)["ttftP99Ms"] == 300.0
