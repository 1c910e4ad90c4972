"""RobustEvaluator: every config simulated on the plan's windows and judged on the worst."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.trace_scenario import TraceOptions, with_trace
from slopilot.engine.sim.windows import WindowChoice
from slopilot.engine.sim.workload import ClassMix
from slopilot.tuner.sim.robust import RobustEvaluator, WindowPlan, plan_windows
from slopilot.tuner.study.objective import HEADROOM, holds

AZURE = load_scenario("azure-conv-2023")
TINY = load_scenario("tiny-cpu")


def test_a_trace_plan_is_its_busiest_windows_a_typical_one_and_its_heaviest_prompts() -> None:
    plan = plan_windows(AZURE)
    assert plan.kind == "trace"
    # The shipped hour's heaviest prompts: a minute whose P99-rank prompt (the 10th of
    # its 888) has 6,280 tokens, where the others' has ~4,130 (the windows' own P99
    # TTFT on 2-4 replicas is highest there).
    assert [w.name for w in plan.windows] == ["busiest arrivals", "busiest tokens", "typical",
                                              "heaviest prompts"]
    assert all(w.length_s == 60.0 and w.warmup_s == 30.0 for w in plan.windows)
    assert plan.simulated_s == 4 * (30 + 60 + 20)
    assert plan == plan_windows(AZURE)  # chosen once, the same every time
    text = plan.describe()
    assert "busiest windows, a typical one and its heaviest prompts', 60 s each (+30 s " \
        "warm-up" in text
    assert "busiest arrivals: 725-785 s" in text
    assert "heaviest prompts: 1,054-1,114 s" in text and "6,280+ tokens at its P99" in text


def test_a_generated_plan_is_several_seeds_and_whole_is_one_window() -> None:
    plan = plan_windows(TINY, duration_s=20.0, seeds=2)
    assert plan.kind == "seeds" and [w.seed for w in plan.windows] == [0, 1]
    whole = plan_windows(AZURE, whole=True)
    assert whole.kind == "whole" and whole.windows[0].length_s > 1400
    # One window is not "each": "judged on the whole trace, 1,401 s (+0 s warm-up, ...".
    assert whole.describe().startswith("judged on the whole trace, 1,401 s (+0 s warm-up")


def test_each_window_is_simulated_and_the_worst_decides() -> None:
    plan = plan_windows(TINY, duration_s=6.0, seeds=2, drain_s=2.0)
    seen: list[float] = []
    evaluator = RobustEvaluator(TINY, plan, progress=seen.append)
    result = evaluator.evaluate({"token_budget": 512, "chunk_size": 256})
    assert [w.name for w in result.windows] == ["seed 0", "seed 1"]
    assert result.margin == HEADROOM and result.feasible == holds(result, HEADROOM)
    for i in range(len(result.constraints)):
        assert result.constraints[i] == max(w.result.constraints[i] for w in result.windows)
    # The same as simulating that seed's window by hand (until its requests are judged).
    by_hand = simulate(TINY, {"token_budget": 512, "chunk_size": 256}, seed=1,
                       measure=Measure(0.0, 6.0, 8.0), until_judged=True).summary
    assert result.windows[1].result.summary == by_hand
    # The progress feed counts each window whole, as the plan's total does; what was
    # simulated may be less (a window ends once its requests are judged).
    assert seen[-1] == plan.simulated_s and evaluator.simulated_s <= plan.simulated_s
    assert seen == sorted(seen)


def test_a_trace_window_counts_only_its_own_arrivals_after_a_warm_up() -> None:
    plan = plan_windows(AZURE, duration_s=10.0, warmup_s=5.0, drain_s=2.0)
    result = RobustEvaluator(AZURE, plan).evaluate({})
    busy = plan.windows[0]
    summary = result.windows[0].result.summary
    assert summary is not None and summary.overall.accounting is not None
    assert summary.duration_s == 10.0
    arrived = summary.overall.accounting.requests_arrived
    assert busy.arrival_rate is not None
    assert arrived == pytest.approx(busy.arrival_rate * 10.0)


def test_more_replicas_on_the_same_windows() -> None:
    plan = plan_windows(TINY, duration_s=5.0, seeds=1, drain_s=1.0)
    two = RobustEvaluator(TINY, plan).at_replicas(2).evaluate({})
    summary = two.windows[0].result.summary
    assert summary is not None and summary.replicas == 2


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="duration_s=0"):
        plan_windows(TINY, duration_s=0.0)
    with pytest.raises(ValueError, match="warmup_s=-1"):
        plan_windows(AZURE, warmup_s=-1.0)
    with pytest.raises(ValueError, match="replicas=0"):
        RobustEvaluator(TINY, WindowPlan((), "seeds"), replicas=0)


def bursty(tmp_path: Path) -> Scenario:
    """Bursts of 20 requests every 10 minutes, silence between (its median minute is
    empty)."""
    rows = [f"{600 * b + i * 0.5:.1f},200,20" for b in range(5) for i in range(20)]
    path = tmp_path / "bursty.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return with_trace(TINY, TraceOptions(path=str(path)))


def test_a_bursty_trace_is_judged_on_windows_with_traffic(tmp_path: Path) -> None:
    scenario = bursty(tmp_path)
    plan = plan_windows(scenario)
    assert "typical" in [w.name for w in plan.windows]
    result = RobustEvaluator(scenario, plan).evaluate({})
    assert len(result.windows) == len(plan.windows)


def test_an_empty_window_names_the_way_out(tmp_path: Path) -> None:
    scenario = bursty(tmp_path)
    empty = WindowPlan((WindowChoice("typical", 120.0, 180.0, 30.0, 20.0),), "trace")
    with pytest.raises(ValueError, match=r"no request arrives in it.*--windows whole"):
        RobustEvaluator(scenario, empty).evaluate({})


def test_a_trace_plan_of_fewer_windows_says_which_it_has() -> None:
    # A sparse trace whose busiest window is also its only one with arrivals: it read
    # "its busiest windows and a typical one" over one window.
    from slopilot.engine.sim.windows import WindowChoice
    from slopilot.tuner.sim.robust import WindowPlan

    one = WindowChoice("busiest arrivals", 30.0, 90.0, 30.0, 20.0, arrival_rate=0.1,
                       token_rate=10.0)
    text = WindowPlan((one,), "trace").describe()
    assert text.startswith("judged on the trace's busiest window by arrivals (its only "
                           "one), 60 s (+30 s warm-up"), text


def classed(tmp_path: Path) -> Scenario:
    """A classless trace with a busy stretch mid-way (its busiest windows start well
    after its first request), given classes half and half by --classes."""
    times = [i * 0.5 for i in range(600)] + [150 + i * 0.05 for i in range(400)]
    rows = [f"{t:.2f},{40 + i % 50},{1 + i % 4}" for i, t in enumerate(sorted(times))]
    path = tmp_path / "classed.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return with_trace(TINY, TraceOptions(path=str(path),
                                         classes=ClassMix((0.5, 0.5, 0.0))))


def test_a_window_replays_the_whole_replays_requests_class_and_prompt_included(
        tmp_path: Path) -> None:
    # A request's drawn class and prompt were drawn afresh from the window's first
    # request: only about half of a window's requests kept the class the check command's
    # whole replay gives them, and a window's misses were not the whole replay's there.
    scenario = classed(tmp_path)
    plan = plan_windows(scenario, duration_s=20.0, warmup_s=10.0, drain_s=5.0)
    assert any(w.start_s - w.warmup_s > 0 for w in plan.windows)
    whole = list(scenario.build_workload().initial())
    evaluator = RobustEvaluator(scenario, plan)
    for w in plan.windows:
        t0, t1 = w.start_s - w.warmup_s, w.end_s + w.drain_s
        same = [s for s in whole if t0 <= s.arrival_time < t1]
        sliced = list(evaluator._trace_slice(w).initial())
        assert [s.arrival_time for s in sliced] == pytest.approx(
            [s.arrival_time - t0 for s in same])
        assert [(s.priority, s.max_tokens, list(s.prompt_token_ids)) for s in sliced] == [
            (s.priority, s.max_tokens, list(s.prompt_token_ids)) for s in same], w.name


def test_a_windows_class_counts_are_the_whole_replays_in_that_interval(
        tmp_path: Path) -> None:
    scenario = classed(tmp_path)
    plan = plan_windows(scenario, duration_s=20.0, warmup_s=10.0, drain_s=5.0)
    whole = list(scenario.build_workload().initial())
    result = RobustEvaluator(scenario, plan).evaluate({})
    for w, judged in zip(plan.windows, result.windows, strict=True):
        summary = judged.result.summary
        assert summary is not None
        for p in (Priority.P0, Priority.P1):
            accounting = summary.classes[p].accounting
            assert accounting is not None
            assert accounting.requests_arrived == sum(
                w.start_s <= s.arrival_time < w.end_s and s.priority == p for s in whole)


def test_an_evaluation_counts_its_windows_session_pace_afresh(tmp_path: Path) -> None:
    # Sessions 100 s apart, each sending its turns a millisecond apart: no answer ends
    # before the next turn. Each window is a replay of its own; tune says their sum.
    rows = [f"{100 * s + k * 0.001:.3f},{100 + 50 * k},20,{s}" for s in range(4)
            for k in range(3)]
    path = tmp_path / "chat.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens,session_id\n"
                    + "\n".join(rows) + "\n")
    scenario = with_trace(TINY, TraceOptions(path=str(path)))
    plan = WindowPlan((WindowChoice("a", 0.0, 50.0, 0.0, 20.0),
                       WindowChoice("b", 200.0, 250.0, 0.0, 20.0)), "trace")
    evaluator = RobustEvaluator(scenario, plan)
    assert (evaluator.pace.follow_ups, evaluator.pace.early) == (0, 0)
    for _ in range(2):  # the second evaluation's counts are its own, not added on
        evaluator.evaluate({})
        assert (evaluator.pace.follow_ups, evaluator.pace.early) == (4, 4)
