"""A replay sends a session's turns at the trace's times, scaled with every other gap by
``--time-scale``/``--target-rate``, think time included: a follow-up turn can then
arrive before the previous turn's answer has ended, which no chat client does.
``simulate`` counts such turns in its run and says so, with the factor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.sim.workload import RequestSpec


def _session(gap_s: float) -> list[TraceRecord]:
    return [TraceRecord(0.0, 50, 100, session_id=0, index=0),
            TraceRecord(0.5, 40, 10, index=1),
            TraceRecord(gap_s, 80, 10, session_id=0, index=2),
            TraceRecord(gap_s * 2, 120, 10, session_id=0, index=3)]


def _finish(workload: TraceWorkload, spec: RequestSpec, now: float) -> None:
    assert workload.on_finish(spec, list(spec.prompt_token_ids), now) == []


def test_a_turn_arriving_before_the_previous_answer_ended_is_counted() -> None:
    workload = TraceWorkload(_session(5.0))
    first, lone, second, third = workload.initial()
    assert (first.turn, second.turn, third.turn, lone.turn) == (0, 1, 2, 0)
    _finish(workload, lone, 1.0)  # no session: nothing to count
    _finish(workload, first, 6.0)  # the second turn came at 5 s, before this answer
    _finish(workload, second, 9.0)  # the third comes at 10 s: after it
    _finish(workload, third, 12.0)  # the last turn: none follows
    assert (workload.pace.follow_ups, workload.pace.early) == (2, 1)


def test_a_refused_turn_is_no_answer_a_follow_up_waited_for() -> None:
    workload = TraceWorkload(_session(5.0))
    first, _, second, _ = workload.initial()
    assert workload.on_rejected(first, 0.0) == []
    _finish(workload, second, 11.0)
    assert (workload.pace.follow_ups, workload.pace.early) == (1, 1)


def test_a_replay_started_over_counts_afresh() -> None:
    workload = TraceWorkload(_session(5.0))
    first, *_ = workload.initial()
    _finish(workload, first, 6.0)
    list(workload.initial())
    assert (workload.pace.follow_ups, workload.pace.early) == (0, 0)


def _trace(tmp_path: Path) -> Path:
    """Sessions whose turns come 20 s apart, each answer of 200 tokens well within it."""
    rows = [{"arrival_time": s * 3.0 + k * 20.0, "prompt_tokens": 200 + 300 * k,
             "output_tokens": 200, "session_id": s} for s in range(8) for k in range(3)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_simulate_says_how_many_turns_a_time_scale_sent_before_their_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_trace(tmp_path))
    assert main(["simulate", "--trace", trace, "--json", "--quiet"]) == 0
    assert "follow-up turn" not in capsys.readouterr().err
    assert main(["simulate", "--trace", trace, "--time-scale", "0.001", "--json",
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert ("16 of 16 follow-up turns of a session arrived before the previous turn's "
            "answer had ended") in err
    assert "--time-scale 0.001 scales every gap by 0.001" in err


def test_simulate_names_the_factor_a_target_rate_picked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 24 arrivals over 61 s: 23/61 req/s; at 4 req/s every gap is 0.0943 of the trace's.
    assert main(["simulate", "--trace", str(_trace(tmp_path)), "--target-rate", "4",
                 "--json", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "--target-rate 4 scales every gap by 0.0943" in err
    assert "think time between a session's turns too" in err


def test_tune_says_of_its_replay_what_simulate_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tune replayed the same trace at the same scale and said nothing of the turns sent
    # before their answer: its verdict was judged on traffic no chat client makes, unsaid.
    trace = str(_trace(tmp_path))
    args = ["--trace", trace, "--time-scale", "0.001"]
    assert main(["simulate", *args, "--json", "--quiet"]) == 0
    said = capsys.readouterr().err
    assert main(["tune", *args, "--trials", "1", "--max-replicas", "1", "--json",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    counted = ("--time-scale 0.001 scales every gap by 0.001, the think time between a "
               "session's turns too: 16 of 16 follow-up turns of a session arrived before "
               "the previous turn's answer had ended in ")
    assert f"slopilot simulate: warning: {counted}this run" in said
    assert f"slopilot tune: warning: {counted}the start config's replay" in captured.err
    warnings = json.loads(captured.out)["warnings"]
    assert [w for w in warnings if counted in w] == [
        f"{counted}the start config's replay, as no chat client sends one; a rate nearer "
        "the trace's keeps more of it"]


def test_tune_says_nothing_of_a_replay_that_kept_the_pace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--trace", str(_trace(tmp_path)), "--trials", "1",
                 "--max-replicas", "1", "--json", "--quiet"]) == 0
    assert "follow-up turn" not in capsys.readouterr().err
