"""Capacity search: the smallest replica count that holds the SLO, on the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityError, CapacityPlanner
from tests.tuner.controller_fakes import summary

SCENARIO = load_scenario("tiny-cpu")


def fake_sim(enough: int, calls: list[int]) -> Any:
    def run(scenario: Scenario, config: Mapping[str, Any], n: int) -> WindowSummary:
        calls.append(n)
        return summary() if n >= enough else summary(p0_ttft=900.0)
    return run


@pytest.mark.parametrize("enough", [1, 2, 3, 5, 8])
def test_the_search_finds_the_smallest_feasible_count(enough: int) -> None:
    calls: list[int] = []
    answer = CapacityPlanner(simulate_fn=fake_sim(enough, calls)).search(SCENARIO, {}, 1, 8)
    assert answer.replicas == enough
    assert len(calls) <= 6 and len(set(calls)) == len(calls)  # 2 log2(8), no repeats


@pytest.mark.parametrize("enough", [1, 2, 3, 7, 20])
def test_the_search_never_simulates_far_more_replicas_than_it_needs(enough: int) -> None:
    # A simulation's time and memory grow with its replica count (512 replicas took 39 s
    # and 1.1 GB): galloping up from lo, the biggest one is under twice the answer, or
    # the answer's next count, run to check it did not hold by luck (steady_count).
    calls: list[int] = []
    answer = CapacityPlanner(simulate_fn=fake_sim(enough, calls)).search(SCENARIO, {}, 1, 64)
    assert answer.replicas == enough
    assert max(calls) < max(2 * enough, enough + 2), calls


def test_none_when_even_the_maximum_is_not_enough() -> None:
    calls: list[int] = []
    answer = CapacityPlanner(simulate_fn=fake_sim(9, calls)).search(SCENARIO, {}, 1, 8)
    assert answer.replicas is None and calls == [1, 2, 4, 8]


def test_margin_asks_for_headroom() -> None:
    def run(scenario: Scenario, config: Mapping[str, Any], n: int) -> WindowSummary:
        return summary(p0_ttft=290.0 if n == 1 else 100.0)  # 1 replica: 97 % of the SLO

    planner = CapacityPlanner(simulate_fn=run)
    assert planner.search(SCENARIO, {}, 1, 4).replicas == 1
    assert planner.search(SCENARIO, {}, 1, 4, margin=0.2).replicas == 2


def test_real_simulator_more_replicas_for_the_shifted_load() -> None:
    answer = CapacityPlanner(duration_s=20, seed=0).search(
        SCENARIO, {"token_budget": 512, "chunk_size": 256}, 1, 2)
    assert set(answer.results) <= {1, 2}
    for n, result in answer.results.items():
        assert result.summary is not None and result.summary.replicas == n


@pytest.mark.parametrize("lo, hi, margin, fix", [(0, 2, 0.0, "1 <= lo <= hi"),
                                                 (3, 2, 0.0, "1 <= lo <= hi"),
                                                 (1, 2, 1.5, "margin=1.5")])
def test_bad_bounds_are_refused(lo: int, hi: int, margin: float, fix: str) -> None:
    with pytest.raises(CapacityError, match=fix):
        CapacityPlanner(simulate_fn=fake_sim(1, [])).search(SCENARIO, {}, lo, hi, margin=margin)


def fake_score(enough: int, calls: list[int]) -> Any:
    from slopilot.tuner.study.objective import score

    def run(scenario: Scenario, config: Mapping[str, Any], n: int) -> Any:
        calls.append(n)
        return score(summary() if n >= enough else summary(p0_ttft=900.0), scenario.slo, config)
    return run


def test_the_climb_stops_at_the_maximum_when_it_is_not_enough() -> None:
    calls: list[int] = []
    answer = CapacityPlanner(score_fn=fake_score(20, calls)).search(SCENARIO, {}, 2, 12)
    assert answer.replicas is None and calls == [2, 4, 8, 12]


def test_simulate_fn_and_score_fn_are_exclusive() -> None:
    with pytest.raises(CapacityError, match="not both"):
        CapacityPlanner(simulate_fn=fake_sim(1, []), score_fn=fake_score(1, []))
