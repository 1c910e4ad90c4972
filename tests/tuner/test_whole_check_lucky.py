"""The whole-trace check's replica search where holding is not monotone in the count:
a count that held while the next missed is not what tune recommends.

The replays are a table here (``RobustEvaluator`` swapped for one): which counts hold is
the point, not the simulator that decides it (``test_whole_check_windows.py`` replays)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune import whole_check as whole_check_module
from slopilot.tuner.tune.whole_check import WholeCheck, whole_check

SCENARIO = load_scenario("tiny-cpu")


def judged(holding: set[int], calls: list[int]) -> type:
    """A whole replay's judge reading P1 TTFT p99 at 80 % of its limit on ``holding``
    counts and 95 % (short of the headroom) on the others."""
    class TableJudge:
        def __init__(self, scenario: Any, plan: Any, replicas: int | None = None,
                     margin: float = HEADROOM, slo: Any = None) -> None:
            self.scenario, self.plan, self.replicas = scenario, plan, replicas
            self.margin, self.slo, self.progress = margin, slo, None

        def at_replicas(self, n: int) -> TableJudge:
            return TableJudge(self.scenario, self.plan, n, self.margin, self.slo)

        def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
            assert self.replicas is not None
            calls.append(self.replicas)
            c = (0.80 if self.replicas in holding else 0.95) - 1.0
            return TrialResult(dict(config), 1.0, (c,), c <= -self.margin,
                               constraint_names=("p1.ttft_p99",), margin=self.margin)
    return TableJudge


def check(monkeypatch: pytest.MonkeyPatch, holding: set[int], first: int, top: int,
          calls: list[int]) -> WholeCheck:
    monkeypatch.setattr(whole_check_module, "RobustEvaluator", judged(holding, calls))
    evaluator = SimpleNamespace(scenario=SCENARIO, margin=HEADROOM, slo=SCENARIO.slo)
    plan = SimpleNamespace(kind="whole", simulated_s=600.0)
    return whole_check(evaluator, plan, {}, first, top)  # type: ignore[arg-type]


def test_the_whole_trace_is_not_recommended_on_a_count_that_held_by_luck(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The windows' 1 misses over the whole trace; 6 holds, 7 misses, 8 and up hold. The
    # gallop (2, 4, 8) and bisection (6, 5) landed on 6.
    calls: list[int] = []
    whole = check(monkeypatch, {6, *range(8, 17)}, 1, 16, calls)
    assert whole.replicas == 8 and whole.lucky == (6,)
    assert calls == [1, 2, 4, 8, 6, 5, 7, 9]
    clause = whole.clause(1)
    assert "the whole trace holds on 8 replicas" in clause, clause
    assert "6 replicas held but 7 missed" in clause, clause


def test_where_holding_is_monotone_one_replay_more_checks_the_count_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    whole = check(monkeypatch, set(range(6, 17)), 1, 16, calls)
    assert whole.replicas == 6 and whole.lucky == () and calls == [1, 2, 4, 8, 6, 5, 7]
    assert "held but" not in whole.clause(1)
    # None where the windows' count holds over the whole trace: the windows' capacity
    # answer checked its next count already (or it is the count tune was asked about).
    calls.clear()
    whole = check(monkeypatch, set(range(3, 17)), 3, 16, calls)
    assert whole.replicas == 3 and calls == [3]
    # None at the maximum: no count above it to miss.
    calls.clear()
    whole = check(monkeypatch, {16}, 1, 16, calls)
    assert whole.replicas == 16 and calls == [1, 2, 4, 8, 16, 12, 14, 15]


def test_a_lucky_count_with_none_holding_above_it_recommends_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    whole = check(monkeypatch, {4}, 1, 8, calls)
    assert whole.replicas is None and whole.lucky == (4,) and not whole.holds
    clause = whole.clause(1)
    assert "nothing is recommended" in clause and "4 replicas held but 5 missed" in clause, \
        clause


def test_a_replay_search_that_gives_up_names_its_count_and_the_unchecked_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 6, 8 and 10 hold with their next count missing; 12 holds above 11, the largest
    # count replayed that missed. The maximum, 32, the costliest replay, is never run.
    calls: list[int] = []
    whole = check(monkeypatch, {6, 8, 10, 12, 14, *range(15, 33)}, 1, 32, calls)
    assert whole.replicas == 12 and whole.lucky == (6, 8, 10) and whole.gave_up
    assert 32 not in calls and 13 not in calls, calls
    clause = whole.clause(1)
    assert "the whole trace holds on 12 replicas" in clause, clause
    assert "so the answer is 12, the smallest count that holds above 11, the largest " \
        "count replayed that missed; 13 was not checked" in clause, clause
    assert "--max-replicas, was judged" not in clause, clause
