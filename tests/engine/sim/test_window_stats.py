"""``SlidingStats``: each sliding window of one run measured as that window alone is."""

from __future__ import annotations

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.window_stats import Sliding


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
