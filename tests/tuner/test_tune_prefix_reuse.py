"""A trace whose prompts share prefixes is judged on the minutes its engine works hardest,
not the minutes with the most prompt tokens (``engine/sim/windows.fresh_tokens``).

Found replaying a Mooncake-form trace (hash_ids) that tune was not built around: its
busiest minutes by arrivals and by tokens were follow-up turns whose prompts the prefix
cache mostly held, and a later minute of fresh documents, fewer tokens but every one
prefilled, was judged by no window. ``tune`` said a config held the SLO with room to
spare; the whole replay of that config missed it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.sim.summary_view import simulate_json
from tests.support.mooncake_shift import DOCUMENTS, mooncake_shift
from tests.support.tune_replay import tune_and_replay


def test_a_mooncake_trace_is_judged_as_its_whole_replay_judges_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # What check_command runs: the whole trace, followed past its end, with the answer.
    run = tune_and_replay(mooncake_shift(tmp_path / "shift.jsonl"), capsys)
    out, scenario, whole = run.out, run.scenario, run.whole
    held = simulate_json(whole.summary, scenario.slo)["p99_within_slo"]
    assert held is False, "the case needs a trace whose whole replay misses the SLO"
    assert out["feasible"] is held, out["verdict"]
    # The minute that misses is the documents', and a window judged it.
    assert any(w["start_s"] < DOCUMENTS[1] and w["end_s"] > DOCUMENTS[0]
               for w in out["windows"]), out["judged_on"]
