"""A trial that only ties the start config on goodput replaces it only where its closest
term is ``TIE_MARGIN`` further from its limit, and the verdict says it was a tie: a
reviewer's tune of the conversation trace recommended nine knob changes for a tie on
goodput and its closest term at 56 % of its limit against the start config's 59 %,
another term worse, and was never told it was a tie."""

from __future__ import annotations

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.objective import HEADROOM, TrialResult, WindowResult, score
from slopilot.tuner.study.verdict import robust_verdict
from slopilot.tuner.tune.outcome import TIE_MARGIN, candidates, kept_clause, tie_clause
from tests.support.summaries import figures, window

SLO = load_scenario("tiny-cpu").slo  # P1 TTFT 1000 ms, TBT 150 ms


def judged(p1_ttft: float, goodput: float = 100.0, finished: float = 200,
           knob: int = 1) -> TrialResult:
    s = window({"p1": figures(p1_ttft, 20.0, goodput, finished=finished)})
    w = WindowResult("busiest arrivals", "busiest arrivals: 0-30 s",
                     score(s, SLO, {"k": knob}))
    return robust_verdict({"k": knob}, [w], HEADROOM)


def test_the_margin_is_five_points() -> None:
    assert TIE_MARGIN == 0.05


def test_a_tie_won_by_less_than_the_margin_keeps_the_start_config() -> None:
    start, trial = judged(590.0), judged(560.0, knob=2)
    assert trial.value == start.value and max(trial.constraints) < max(start.constraints)
    ranked = candidates(start, [(0, trial)])
    assert ranked[0].is_start, [c.label for c in ranked]
    said = kept_clause(start, (0, trial))
    assert "trial 0, ties it on goodput, mean goodput over the windows 100.0 tok/s" \
        in said, said
    assert "its closest term, at 56% of its limit against its 59%, is 3 pp further from " \
        "it, less than the 5 pp a tie must win by" in said, said


def test_a_tie_won_by_the_margin_names_the_tie() -> None:
    start, trial = judged(590.0), judged(500.0, knob=2)
    ranked = candidates(start, [(0, trial)])
    assert ranked[0].trial == 0
    said = tie_clause(trial, start)
    assert said is not None and "It ties the start config on goodput" in said, said
    assert "its closest term is 9 pp further from its limit (50% against 59%;" in said, said
    assert "few requests" not in said


def test_a_tie_decided_on_few_requests_says_so() -> None:
    start, trial = judged(590.0, finished=8), judged(500.0, finished=8, knob=2)
    said = tie_clause(trial, start)
    assert said is not None and "that term, P1 TTFT p99, is judged on few requests: " \
        "P1's 8, fewer than the 100 the live loop judges a class on" in said, said


def test_more_goodput_wins_whatever_the_headroom_and_is_no_tie() -> None:
    start, better = judged(590.0), judged(600.0, goodput=110.0, knob=2)
    assert better.value > start.value  # no tokens asked said: the mean goodput
    assert candidates(start, [(0, better)])[0].trial == 0
    assert tie_clause(better, start) is None
