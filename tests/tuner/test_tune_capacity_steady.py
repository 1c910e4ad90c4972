"""tune's capacity answer where holding is not monotonic in the replica count: a count
that held while the count above it missed is named, and is not the answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.steady_count import RECHECKS, steady_count
from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune.capacity import capacity_answer


class NoisyEvaluator:
    """P1 TTFT p99 as a share of its limit per count, from ``shares`` (counts it does not
    list read ``rest``): deterministic, and not monotonic where the table says so."""

    def __init__(self, shares: Mapping[int, float], rest: float, n: int = 1,
                 calls: list[int] | None = None) -> None:
        self.shares, self.rest, self.n = shares, rest, n
        self.calls = [] if calls is None else calls
        self.scenario = load_scenario("tiny-cpu")
        self.slo, self.plan = self.scenario.slo, None  # no seeds: no idle floor priced
        self.margin = HEADROOM

    def at_replicas(self, n: int) -> NoisyEvaluator:
        return NoisyEvaluator(self.shares, self.rest, n, self.calls)

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        self.calls.append(self.n)
        c = self.shares.get(self.n, self.rest) - 1.0
        return TrialResult(dict(config), 1.0, (c,), c <= -HEADROOM,
                           constraint_names=("p1.ttft_p99",), margin=HEADROOM)


def answer(ev: NoisyEvaluator, lo: int, hi: int) -> Any:
    return capacity_answer(ev, [("trial 4", {"name": "a"})], lo, hi)  # type: ignore[arg-type]


def test_a_count_that_holds_while_the_next_misses_is_not_the_answer() -> None:
    # 6 holds at 85 %, 7 misses the headroom at 95 %, 8 and up hold at 80 %: the
    # bisection (2, 4, 8, then 6 and 5) answered 6, which held by luck.
    ev = NoisyEvaluator({2: 3.0, 4: 1.5, 5: 1.05, 6: 0.85, 7: 0.95}, rest=0.80)
    out = answer(ev, 2, 16)
    assert out.replicas == 8 and out.lucky == (6,)
    # Every count above the answer that was run holds; the one below it misses.
    assert all(r.feasible for n, r in out.tried.items() if n >= 8)
    assert not out.tried[7].feasible
    sentence = out.sentence()
    assert sentence.startswith("8 replicas hold the SLO in every window with 10% headroom")
    assert "Holding is not monotonic over the counts tried: 6 replicas held but 7 missed" \
        in sentence
    assert "so the answer is 8, the smallest count tried that holds with every count " \
        "tried above it holding too" in sentence
    assert out.to_dict()["monotonic"] is False and out.to_dict()["lucky"] == [6]
    # Two runs more than the bisection's five: 7 (6's next count) and 9 (8's).
    assert ev.calls == [2, 4, 8, 6, 5, 7, 9]


def test_where_holding_is_monotone_one_run_more_checks_the_next_count() -> None:
    ev = NoisyEvaluator({2: 3.0, 4: 1.5, 5: 1.05}, rest=0.80)
    out = answer(ev, 2, 16)
    assert out.replicas == 6 and out.lucky == () and out.to_dict()["monotonic"] is True
    assert ev.calls == [2, 4, 8, 6, 5, 7]
    assert "not monotonic" not in out.sentence()
    # None where the maximum itself is the answer: no larger count to miss.
    ev = NoisyEvaluator({2: 3.0, 3: 3.0}, rest=0.80)
    assert answer(ev, 2, 4).replicas == 4 and ev.calls == [2, 4, 3]


def test_a_lucky_count_with_no_holding_count_above_it_is_said_plainly() -> None:
    # 8 held (the gallop's top; 6 and 7 miss), 9 to 12 miss: no answer, and the
    # sentence says a count held rather than only "not even 12 hold".
    ev = NoisyEvaluator({8: 0.85}, rest=1.2)
    out = answer(ev, 2, 12)
    assert out.replicas is None and out.lucky == (8,)
    sentence = out.sentence()
    assert sentence.startswith("Not even 12 replicas hold the SLO")
    assert "8 replicas held but 9 missed" in sentence
    assert "no count up to 12 holds with the count above it holding too" in sentence


def test_the_climb_stops_after_rechecks_at_the_smallest_count_holding_above_the_last_miss(
) -> None:
    holding = {5, 7, 9, 11, 16}
    calls: list[int] = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n in holding
    tried: set[int] = set()

    def cached(n: int) -> bool:
        tried.add(n)
        return ok(n)
    out = steady_count(5, cached, lambda: tried, 16, 16)
    assert out.lucky == (5, 7, 9)[:RECHECKS + 1] and out.gave_up
    # 11, the smallest count holding above 10 (the largest that missed), its next count
    # unchecked: not 16, the maximum, the costliest run, which is never run.
    assert out.replicas == 11
    assert calls == [6, 7, 8, 9, 10, 11]


def test_tune_names_the_count_given_up_on_and_that_its_next_was_not_checked() -> None:
    # 2-5 miss; 6-14 flip (even ones hold at 85 %, odd ones miss the headroom at 95 %);
    # 15 and up hold at 80 %. 6, 8 and 10 held with their next count missing.
    flips = {n: 1.2 if n < 6 else 0.85 if n % 2 == 0 else 0.95 for n in range(2, 15)}
    ev = NoisyEvaluator(flips, rest=0.80)
    out = answer(ev, 2, 32)
    assert out.replicas == 12 and out.lucky == (6, 8, 10) and out.gave_up
    assert 32 not in ev.calls and 13 not in ev.calls, ev.calls
    sentence = out.sentence()
    assert sentence.startswith("12 replicas hold the SLO in every window"), sentence
    assert "so the answer is 12, the smallest count that holds above 11, the largest " \
        "count tried that missed; 13 was not checked" in sentence, sentence
    assert "only 32" not in sentence, sentence
    assert out.to_dict()["gave_up"] is True
