"""``SlidingStats``: each sliding window of one run measured as that window alone is."""

from __future__ import annotations

import pytest

from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.window_stats import Sliding, SlidingStats
from slopilot.engine.slo import SLOSpec


def test_starts_tile_every_hop_and_end_on_the_span() -> None:
    assert Sliding(10.0, 5.0).starts(0.0, 32.0) == [0.0, 5.0, 10.0, 15.0, 20.0, 22.0]
    assert Sliding(10.0, 5.0).starts(0.0, 30.0) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert Sliding(10.0, 5.0).starts(0.0, 8.0) == [0.0]


@pytest.mark.parametrize("field", ["length_s", "hop_s"])
def test_a_window_of_no_seconds_is_refused_by_name(field: str) -> None:
    kwargs = {"length_s": 10.0, "hop_s": 5.0, field: 0.0}
    with pytest.raises(ValueError, match=field):
        Sliding(**kwargs)


def test_each_window_reads_what_a_run_measuring_only_it_reads() -> None:
    scenario = load_scenario("mixed-priority")
    whole = Measure(0.0, 30.0, 40.0)
    run = simulate(scenario, replicas=1, measure=whole, sliding=Sliding(12.0, 6.0))
    assert [(w.start_s, w.end_s) for w in run.windows] == [
        (0.0, 12.0), (6.0, 18.0), (12.0, 24.0), (18.0, 30.0)]
    for w in run.windows:
        alone = simulate(scenario, replicas=1, measure=Measure(w.start_s, w.end_s, 40.0))
        assert w.summary.to_dict()["requests_arrived"] > 0
        assert w.summary.to_dict() == alone.summary.to_dict()
    plain = simulate(scenario, replicas=1, measure=whole)
    assert run.summary.to_dict() == plain.summary.to_dict()


def test_starts_at_given_points_beside_or_instead_of_the_grid() -> None:
    assert Sliding(10.0, 5.0, at=(7.0, 40.0)).starts(0.0, 30.0) == [
        0.0, 5.0, 7.0, 10.0, 15.0, 20.0]
    assert Sliding(10.0, None, at=(7.0, 3.0)).starts(0.0, 30.0) == [3.0, 7.0]
    with pytest.raises(ValueError, match="hop_s"):
        Sliding(10.0, None)


def _arrival(stats: SlidingStats, rid: str, t: float) -> None:
    stats.on_arrival(Request(rid, [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=t))


def test_windows_are_made_where_the_run_has_requests_not_over_its_span() -> None:
    # Two requests 2e6 s apart (a stray time's span): the dense grid was 199,998
    # SimStats, ~466 MB before any request; the windows that hold an arrival are 6.
    slo = SLOSpec.from_profile("standard")
    stats = SlidingStats(slo, 2e6, Sliding(30.0, 10.0))
    assert stats.made == 0
    _arrival(stats, "a", 5.0)
    _arrival(stats, "b", 1_000_005.0)
    assert stats.made == 1 + 3  # [0, 30), and the three windows that hold 1,000,005
    assert [w.start_s for w in stats.windows()] == [0.0, 999_980.0, 999_990.0, 1_000_000.0]
    assert [w.summary.to_dict()["requests_arrived"] for w in stats.windows()] == [1] * 4


def test_a_quiet_stretch_makes_no_window_and_the_busy_ones_read_as_before() -> None:
    # The grid's windows with an arrival or a step, each as the dense grid measured it
    # (each window as a run of it alone reads, above); the quiet ones are not made.
    scenario = load_scenario("mixed-priority")
    whole = Measure(0.0, 30.0, 40.0)
    run = simulate(scenario, replicas=1, measure=whole, sliding=Sliding(6.0, 2.0))
    grid = Sliding(6.0, 2.0).starts(0.0, 30.0)
    made = [w.start_s for w in run.windows]
    assert made == grid  # a busy run: every window of the grid is made
    for w in run.windows[::5]:
        alone = simulate(scenario, replicas=1, measure=Measure(w.start_s, w.end_s, 40.0))
        assert w.summary.to_dict() == alone.summary.to_dict()
