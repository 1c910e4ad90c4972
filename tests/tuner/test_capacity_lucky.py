"""The live loop's capacity search where holding is not monotone in the replica count:
a count that held while the count above it missed is not the answer the loop acts on
(``loop/steady_count.py``, the rule tune's capacity answer applies too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.study.objective import TrialResult
from tests.tuner.controller_fakes import TERMS, FakeAlerts, FakeDeployment, FakeProbe, Rig

SCENARIO = load_scenario("tiny-cpu")


def by_share(shares: Mapping[int, float], calls: list[int]) -> CapacityPlanner:
    """P0 TTFT p99 as a share of its limit per count (other terms well inside theirs):
    deterministic, and not monotone where the table says so."""
    def score_fn(scenario: Scenario, config: Mapping[str, Any], n: int) -> TrialResult:
        calls.append(n)
        share = shares[n]
        return TrialResult(dict(config), 100.0, (share - 1, -0.5, -0.5, -0.5, -0.9),
                           share <= 1, constraint_names=TERMS)
    return CapacityPlanner(score_fn=score_fn)


# With 20 % headroom (the scale-down's): 1, 2, 4 and 5 miss, 6 holds, 7 misses, 8 holds.
# The gallop (1, 2, 4, 8) and bisection (6, 5) land on 6, which held by luck.
LUCKY_SIX = {1: 3.0, 2: 2.0, 4: 1.2, 5: 0.9, 6: 0.75, 7: 0.85, 8: 0.7}


def test_the_search_does_not_answer_with_a_count_whose_next_count_misses() -> None:
    calls: list[int] = []
    answer = by_share(LUCKY_SIX, calls).search(SCENARIO, {}, 1, 8, margin=0.2)
    assert answer.replicas == 8 and answer.lucky == (6,) and not answer.gave_up
    assert calls == [1, 2, 4, 8, 6, 5, 7]  # one run more than the bisection: 6's next


def test_where_holding_is_monotone_the_check_costs_one_run_at_most() -> None:
    calls: list[int] = []
    shares = {1: 3.0, 2: 2.0, 4: 1.2, 5: 0.9, 6: 0.75, 7: 0.72, 8: 0.7}
    answer = by_share(shares, calls).search(SCENARIO, {}, 1, 8, margin=0.2)
    assert answer.replicas == 6 and answer.lucky == () and answer.checked
    assert calls == [1, 2, 4, 8, 6, 5, 7]
    # None where the answer's next count was run by the search already (the gallop's top).
    calls.clear()
    answer = by_share({1: 3.0, 2: 0.7, 3: 0.7}, calls).search(SCENARIO, {}, 1, 4,
                                                                margin=0.2)
    assert answer.replicas == 2 and calls == [1, 2, 3] and answer.checked
    calls.clear()
    answer = by_share({1: 3.0, 2: 2.0, 3: 0.7, 4: 0.7}, calls).search(SCENARIO, {}, 1, 4,
                                                                        margin=0.2)
    assert answer.replicas == 3 and calls == [1, 2, 4, 3] and not answer.checked


def test_a_quiet_fleet_is_not_scaled_down_to_a_count_that_held_by_luck() -> None:
    # The bisection's 6 held, 7 missed: scaled 8 -> 6, the next window at 6 would breach
    # and buy the replicas back. 8 is the smallest count whose next count (none: the
    # current count is the search's top) does not contradict it: the fleet stays.
    calls: list[int] = []
    rig = Rig(dep=FakeDeployment(n=8), planner=by_share(LUCKY_SIX, calls),  # type: ignore[arg-type]
              alerts=FakeAlerts([]), offline=None, probe=FakeProbe(),
              settings={"max_replicas": 8})
    ctl = rig.build()
    decisions = [ctl.tick(float(t)) for t in range(0, 120, 15)]
    assert rig.dep.scaled == [], [d.line() for d in decisions]
    assert 7 in calls, calls  # the search did look, and checked 6's next count
