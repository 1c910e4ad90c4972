"""tune's capacity answer: several candidates, each searched below the best count so far."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune.capacity import capacity_answer


class FakeEvaluator:
    """Config ``name`` holds from ``needs[name]`` replicas on."""

    def __init__(self, needs: Mapping[str, int], n: int = 1,
                 calls: list[tuple[str, int]] | None = None) -> None:
        self.needs, self.n = needs, n
        self.calls = [] if calls is None else calls
        self.scenario = load_scenario("tiny-cpu")
        self.margin = HEADROOM

    def at_replicas(self, n: int) -> FakeEvaluator:
        return FakeEvaluator(self.needs, n, self.calls)

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        self.calls.append((config["name"], self.n))
        ok = self.n >= self.needs[config["name"]]
        return TrialResult(dict(config), 1.0, (-0.5 if ok else 0.5,), ok, margin=HEADROOM)


def test_the_smallest_count_over_the_candidates_wins() -> None:
    ev = FakeEvaluator({"closest": 5, "second": 3, "start": 4})
    out = capacity_answer(ev, [("trial 1", {"name": "closest"}), ("trial 2", {"name": "second"}),
                               ("the start config", {"name": "start"})], 2, 8)  # type: ignore[arg-type]
    assert out.replicas == 3 and out.label == "trial 2" and out.config == {"name": "second"}
    # Later candidates are searched only below the best count so far.
    assert max(n for name, n in ev.calls if name != "closest") <= 4
    assert "3 replicas hold the SLO in every window with headroom, with trial 2's knobs" \
        in out.sentence()
    assert out.to_dict()["candidate"] == "trial 2"


def test_none_holds_up_to_the_maximum() -> None:
    ev = FakeEvaluator({"a": 99, "b": 99})
    out = capacity_answer(ev, [("trial 1", {"name": "a"}), ("trial 2", {"name": "b"})],
                          2, 4)  # type: ignore[arg-type]
    assert out.replicas is None and out.label == "trial 1"
    assert out.sentence().startswith("Not even 4 replicas hold the SLO")


def test_duplicate_candidates_are_searched_once_and_none_is_an_error() -> None:
    ev = FakeEvaluator({"a": 2})
    out = capacity_answer(ev, [("trial 1", {"name": "a"}), ("the start config", {"name": "a"})],
                          2, 4)  # type: ignore[arg-type]
    assert out.replicas == 2 and ev.calls == [("a", 2)]
    with pytest.raises(ValueError, match="candidates is empty"):
        capacity_answer(ev, [], 2, 4)  # type: ignore[arg-type]


class FlatEvaluator(FakeEvaluator):
    """P0 TTFT at 129 % of its limit on any count (each long prompt's prefill alone is
    longer than the limit); P1 TTFT falls as replicas share the load."""

    def at_replicas(self, n: int) -> FlatEvaluator:
        return FlatEvaluator(self.needs, n, self.calls)

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        self.calls.append((config["name"], self.n))
        return TrialResult(dict(config), 1.0, (0.29, 1.0 / self.n - 1.0), False,
                           constraint_names=("p0.ttft_p99", "p1.ttft_p99"), margin=HEADROOM)


def test_a_term_that_replicas_do_not_move_is_named_and_no_more_replicas_are_advised() -> None:
    out = capacity_answer(FlatEvaluator({}), [("trial 1", {"name": "a"})], 2, 16)  # type: ignore[arg-type]
    assert out.replicas is None
    sentence = out.sentence()
    assert "P0 TTFT p99 stays at 129% of its limit from 8 to 16 replicas" in sentence
    assert "raise --max-replicas" not in sentence
    # The report's table names the term beside its share, on every count searched.
    assert out.table_lines()[3:] == ["|---|---|---|---|",
                                     "| 2 | no | P0 TTFT p99 | 129% |",
                                     "| 4 | no | P0 TTFT p99 | 129% |",
                                     "| 8 | no | P0 TTFT p99 | 129% |",
                                     "| 16 | no | P0 TTFT p99 | 129% |"]


class FallingEvaluator(FakeEvaluator):
    """P1 TTFT at 8/n of its limit: more replicas would hold it, past the maximum."""

    def at_replicas(self, n: int) -> FallingEvaluator:
        return FallingEvaluator(self.needs, n, self.calls)

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        return TrialResult(dict(config), 1.0, (8.0 / self.n - 1.0,), False,
                           constraint_names=("p1.ttft_p99",), margin=HEADROOM)


def test_a_term_that_falls_with_replicas_still_advises_more() -> None:
    out = capacity_answer(FallingEvaluator({}), [("trial 1", {"name": "a"})], 2, 4)  # type: ignore[arg-type]
    assert "raise --max-replicas" in out.sentence()
    assert "do not move" not in out.sentence()
    assert out.table_lines()[-1] == "| 4 | no | P1 TTFT p99 | 200% |"
