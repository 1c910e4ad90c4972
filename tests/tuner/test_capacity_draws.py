"""A replica count's capacity verdict near the margin's line is the median of several
seeded draws, not one (a first draw far from it decides alone).

In the closed loop (docs/closed_loop.md, seed 3) the post-shift load on 3 replicas held
with 10 % headroom in 9 of 10 simulated draws; the loop's plan took one draw, the tenth,
and bought 4 replicas where 3 do. A count holds when most of its draws hold; a count
that truly misses in most draws is still passed over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityError, CapacityPlanner
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.objective import TrialResult
from tests.tuner.controller_fakes import TERMS, FakeAlerts, FakeProbe, Rig, alert

Table = Mapping[int, Mapping[int, float]]
"""P0 TBT p99 as a share of its limit, per replica count, per draw seed."""

# Seed 0's draw on 3 replicas is the unlucky one (92 % of the limit: inside it, not with
# the 10 % a scale-up asks); seeds 1 and 2 hold 3 with room, as do most draws.
EDGE: Table = {1: {0: 2.5, 1: 2.4, 2: 2.6}, 2: {0: 1.15, 1: 1.12, 2: 0.98},
               3: {0: 0.92, 1: 0.80, 2: 0.81}, 4: {0: 0.60, 1: 0.61, 2: 0.60}}
# Here 3 replicas miss in two draws of three: the load needs 4.
SHORT: Table = {**EDGE, 3: {0: 0.92, 1: 0.95, 2: 0.81}}


def by_draw(table: Table, calls: list[tuple[int, int | None]]
            ) -> Any:
    def draw(scenario: Scenario, config: Mapping[str, Any], n: int,
             seed: int | None) -> TrialResult:
        assert seed is not None
        calls.append((n, seed))
        share = table[n][seed]
        return TrialResult(dict(config), 100.0, (-0.5, share - 1, -0.5, -0.5, -0.9),
                           share <= 1, constraint_names=TERMS)
    return draw


def scaled_to(table: Table) -> tuple[list[int], str]:
    calls: list[tuple[int, int | None]] = []
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]),
              planner=CapacityPlanner(seed=0, draw_fn=by_draw(table, calls)),  # type: ignore[arg-type]
              offline=None, probe=FakeProbe())
    d = rig.build().tick(0.0)
    assert d.action is Action.SCALE, d.line()
    return rig.dep.scaled, d.reason


def test_one_unlucky_draw_does_not_buy_a_replica() -> None:
    scaled, reason = scaled_to(EDGE)
    assert scaled == [3], reason


def test_a_count_that_misses_in_most_draws_still_scales_past_it() -> None:
    scaled, reason = scaled_to(SHORT)
    assert scaled == [4], reason


def test_each_count_keeps_its_median_draw() -> None:
    calls: list[tuple[int, int | None]] = []
    answer = CapacityPlanner(seed=0, draw_fn=by_draw(EDGE, calls)).search(
        FakeProbe().scenario, {}, 1, 4, margin=0.1)
    assert answer.replicas == 3
    # A first draw a tenth of the limit or more from the margin's line decides alone (1,
    # 2 and 4 replicas); 3's, at 92 % against the 90 % a 10 % margin asks, is drawn again.
    assert calls == [(1, 0), (2, 0), (4, 0), (3, 0), (3, 1), (3, 2)], calls
    # Its terms are what the replica plateau and the scale-down read: the median's, not
    # the first draw's nor the luckiest.
    assert answer.results[3].constraints[1] == pytest.approx(0.81 - 1)
    assert answer.results[2].constraints[1] == pytest.approx(1.15 - 1)
    assert answer.results[1].constraints[1] == pytest.approx(2.5 - 1)


def test_one_draw_is_todays_single_window() -> None:
    calls: list[tuple[int, int | None]] = []
    answer = CapacityPlanner(seed=0, draws=1, draw_fn=by_draw(EDGE, calls)).search(
        FakeProbe().scenario, {}, 1, 4, margin=0.1)
    assert answer.replicas == 4 and {s for _, s in calls} == {0}


@pytest.mark.parametrize("draws", [0, 2, -1, True])
def test_draws_must_be_an_odd_count(draws: int) -> None:
    with pytest.raises(CapacityError, match=f"draws={draws!r}: expected an odd count"):
        CapacityPlanner(draws=draws)


def closed_loop_after_shift() -> Scenario:
    """The closed-loop benchmark's load after its shift (``benchmarks/closed_loop.py``):
    tiny-cpu's shape at 1.5 req/s, 40 % P0 with prompts of mean 1536, P0 TTFT SLO 400 ms."""
    import copy
    from pathlib import Path

    import yaml

    import slopilot
    from slopilot.engine.sim.scenario import parse_scenario

    path = Path(slopilot.__file__).parent / "data" / "scenarios" / "tiny-cpu.yaml"
    data = copy.deepcopy(yaml.safe_load(path.read_text()))
    data["name"], data["duration_s"] = "closed-loop", 1200
    data["workload"]["arrivals"]["rate"] = 1.5
    data["workload"]["shift"]["at_s"] = 1.0
    data["workload"]["shift"]["prompt_tokens"].update({"mean": 1536, "max": 3072})
    data["slo"]["classes"]["p0"]["ttft_p99_ms"] = 400
    return parse_scenario(data, source="closed-loop after the shift")


def test_the_simulator_sizes_the_closed_loop_load_on_the_median_draw() -> None:
    # On the real simulator: seed 3's one draw read 2 replicas with a term at 98.5 % of
    # its limit, short of the 10 % a scale-up asks, and bought 3; its draws 4 and 5 hold
    # 2 with that margin (the median of three says 2 for seeds 0-7 alike).
    scenario = closed_loop_after_shift()
    answer = CapacityPlanner(duration_s=60, seed=3).search(
        scenario, dict(scenario.engine), 1, 4, margin=0.1)
    assert answer.replicas == 2, {n: max(r.constraints) for n, r in answer.results.items()}
