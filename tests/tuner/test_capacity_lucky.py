"""The live loop's capacity search where holding is not monotone in the replica count:
a count that held while the count above it missed is not the answer the loop acts on
(``loop/steady_count.py``, the rule tune's capacity answer applies too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.tuner.loop.capacity import CapacityAnswer, CapacityPlanner
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.objective import TrialResult
from tests.tuner.controller_fakes import TERMS, FakeAlerts, FakeDeployment, FakeProbe, Rig, alert

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


# Counts 1-5 miss; 6-14 flip (even ones hold at 75 % of the limit, odd ones miss at
# 110 %); 15 and up hold at 70 %. The gallop and bisection land on 6; 6, 8 and 10 hold
# with their next count missing, and the climb gives up after the third.
FLIPPY = {n: (1.3 if n < 6 else (0.75 if n % 2 == 0 else 1.1) if n < 15 else 0.7)
          for n in range(1, 65)}


def test_a_search_that_gives_up_answers_the_smallest_count_holding_above_its_last_miss(
) -> None:
    # Not the maximum: 64 replicas bought where 12 hold above every count run that missed
    # (11, the largest) is spend the noise near the line does not call for.
    for margin in (0.1, 0.2):  # the scale-up's headroom and the scale-down's
        calls: list[int] = []
        answer = by_share(FLIPPY, calls).search(SCENARIO, {}, 1, 64, margin=margin)
        assert answer.replicas == 12 and answer.lucky == (6, 8, 10) and answer.gave_up
        # 12's next count is not run (the noise was judged too flippy to chase), nor the
        # maximum, the most expensive run of all.
        assert calls == [1, 2, 4, 8, 6, 5, 7, 9, 10, 11, 12], calls
        assert all(FLIPPY[n] <= 1 for n in answer.results if n >= 12)


def test_a_search_that_gives_up_answers_none_where_no_count_above_its_last_miss_holds(
) -> None:
    # A later candidate's search (tune's) below 10, the best count so far, checking next
    # counts up to 16: 10 held and 11 missed, and no count up to 10 lies above 11.
    calls: list[int] = []
    answer = by_share(FLIPPY, calls).search(SCENARIO, {}, 1, 10, margin=0.1, check_to=16)
    assert answer.replicas is None and answer.gave_up and answer.lucky == (6, 8, 10)
    assert calls == [1, 2, 4, 8, 6, 5, 7, 9, 10, 11], calls


def test_an_answer_given_up_on_is_no_evidence_for_fewer_replicas() -> None:
    # Its next count was not checked: the noise near it says nothing of fewer.
    assert not CapacityAnswer(replicas=12, gave_up=True).fewer_hold(64)
    assert CapacityAnswer(replicas=12).fewer_hold(64)


def test_an_alert_scales_up_to_the_count_given_up_on_not_the_maximum() -> None:
    calls: list[int] = []
    rig = Rig(dep=FakeDeployment(n=4), planner=by_share(FLIPPY, calls),  # type: ignore[arg-type]
              alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTTFTP99High")]),
              offline=None, probe=FakeProbe(), settings={"max_replicas": 64})
    decision = rig.build().tick(0.0)
    assert rig.dep.scaled == [12], decision.line()
    assert "scale_up 4->12" in decision.reason, decision.line()
    assert 64 not in calls, calls


def test_a_quiet_fleet_is_scaled_down_above_an_answer_given_up_on_not_to_it() -> None:
    # The scale-down's search from 64 gives up at 12, whose next count misses: noise
    # near the line, no evidence that 12 would serve. Above it the twin holds 14 with
    # its next count (15), and no live breach at this load says otherwise: the fleet
    # goes to 14 (``loop/given_up.py``), not to 12. (Before, it kept all 64.)
    calls: list[int] = []
    rig = Rig(dep=FakeDeployment(n=64), planner=by_share(FLIPPY, calls),  # type: ignore[arg-type]
              alerts=FakeAlerts([]), offline=None, probe=FakeProbe(),
              settings={"max_replicas": 64})
    ctl = rig.build()
    decisions = [ctl.tick(float(t)) for t in range(0, 120, 15)]
    assert 12 in calls, calls  # the search did run and gave up at 12
    assert rig.dep.scaled == [14], [d.line() for d in decisions]
    down = [d.reason for d in decisions if d.reason.startswith("scale_down")]
    assert "gave up at 12" in down[0] and "holds 14 with its next count" in down[0], down
