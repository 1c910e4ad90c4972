"""The robust verdict: worst window per term, the loop's headroom, the worst window's
goodput share as the objective, violations in user units, and storage round trips."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.window_summary import RequestAccounting, WindowSummary
from slopilot.tuner.study.objective import HEADROOM, WindowResult, holds, score
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import (
    goodput_share,
    infeasible_sentence,
    robust_verdict,
    violations,
)
from tests.support.summaries import figures, window

SLO = load_scenario("tiny-cpu").slo  # P0 300/60 ms, P1 1000/150 ms, 10 preemptions/min


def offered(s: WindowSummary, offered_tok_s: float) -> WindowSummary:
    acc = RequestAccounting(10, 0, 0, 0, offered_tok_s, s.overall.goodput_tok_s)
    return dataclasses.replace(s, overall=dataclasses.replace(s.overall, accounting=acc))


def at(p1_ttft: float, p1_tbt: float = 50.0, goodput: float = 100.0,
       asked: float = 100.0) -> WindowSummary:
    return offered(window({"p0": figures(100.0, 20.0, 0.0),
                           "p1": figures(p1_ttft, p1_tbt, goodput)}), asked)


def judged(*summaries: WindowSummary, margin: float = HEADROOM) -> object:
    results = [WindowResult(f"w{i}", f"w{i}: {i}-{i + 1} s", score(s, SLO, {"k": 1}))
               for i, s in enumerate(summaries)]
    return robust_verdict({"k": 1}, results, margin)


def test_each_term_is_its_worst_window() -> None:
    v = judged(at(300.0, 140.0), at(800.0, 20.0))
    assert v.constraint_names == ("p0.ttft_p99", "p0.tbt_p99", "p1.ttft_p99", "p1.tbt_p99",
                                  "preemptions_per_min")
    assert v.constraints[2] == pytest.approx(800 / 1000 - 1)   # TTFT from the second
    assert v.constraints[3] == pytest.approx(140 / 150 - 1)   # TBT from the first
    assert len(v.windows) == 2


def test_feasible_only_with_the_headroom_in_every_window() -> None:
    assert judged(at(850.0), at(880.0)).feasible          # 85 % and 88 % of the limit
    edge = judged(at(850.0), at(950.0))                   # 95 %: within the SLO, not 10 %
    assert not edge.feasible and holds(edge, 0.0)
    assert edge.violation == pytest.approx(0.95 - 0.9)    # what Optuna sees, shifted
    assert edge.optuna_constraints[2] == pytest.approx(0.95 - 1 + HEADROOM)
    assert not judged(at(100.0), at(1200.0)).feasible     # one bad window is enough


def test_the_objective_is_the_worst_windows_goodput_share() -> None:
    v = judged(at(300.0, goodput=90.0, asked=100.0), at(300.0, goodput=400.0, asked=800.0))
    assert v.objective == pytest.approx(0.5) and v.value == pytest.approx(0.5)
    assert v.goodput_tok_s == pytest.approx((90.0 + 400.0) / 2)
    better = judged(at(300.0, goodput=90.0), at(300.0, goodput=700.0, asked=800.0))
    assert rank(better) > rank(v)
    assert goodput_share(window({})) is None  # a live window cannot tell


def test_violations_in_user_units_with_the_window_they_come_from() -> None:
    v = judged(at(400.0), at(13_400.0), at(970.0, 20.0))
    (miss,) = [x for x in violations(v, SLO) if x.term == "p1.ttft_p99"]
    assert miss.text() == "P1 TTFT p99 13.4 s against 1.0 s (in w1: 1-2 s)"
    near = violations(judged(at(950.0)), SLO)
    assert [x.text() for x in near] == [
        "P1 TTFT p99 950 ms against 1.0 s (within it, but not with the 10% headroom: "
        "needs 900 ms) (in w0: 0-1 s)"]
    sentence = infeasible_sentence(v, SLO, replicas=1)
    assert sentence.startswith("No configuration tried holds the SLO on 1 replica with "
                               "10% headroom: the closest misses P1 TTFT p99 13.4 s")
    assert sentence.count(".") >= 1 and "\n" not in sentence


def test_a_verdict_needs_windows_scored_alike() -> None:
    with pytest.raises(ValueError, match="windows is empty"):
        robust_verdict({}, [], HEADROOM)
    with pytest.raises(ValueError, match="margin"):
        robust_verdict({}, [WindowResult("a", "a", score(at(1.0), SLO))], 1.5)


def test_optuna_and_storage_see_the_same_verdict(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace.from_bounds({"token_budget": [256, 1024]})
    tuner = Tuner(open_study(url, "robust"), space)
    edge = judged(at(850.0), at(950.0))  # holds the SLO, not the headroom
    good = judged(at(500.0), at(600.0))
    for result in (edge, good):
        number, config = tuner.ask()
        tuner.tell(number, dataclasses.replace(result, config=config))
    trials = tuner.study.trials
    optuna_p1 = [v for k, v in trials[0].system_attrs.items() if k.endswith(":p1.ttft_p99")]
    assert optuna_p1 == [pytest.approx(0.95 - 1 + HEADROOM)]  # > 0: infeasible to Optuna
    assert tuner.study.best_trial.number == 1  # Optuna: only the one with headroom counts
    again = Tuner(open_study(url, "robust"), space).results()
    (_, stored_edge), (_, stored_good) = again
    assert not stored_edge.feasible and stored_good.feasible
    assert stored_edge.margin == HEADROOM and stored_edge.constraints == edge.constraints
    assert [w.name for w in stored_edge.windows] == ["w0", "w1"]
    assert stored_edge.windows[1].result.summary == edge.windows[1].result.summary
    assert stored_good.objective == good.objective
