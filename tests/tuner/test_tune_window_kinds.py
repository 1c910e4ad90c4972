"""``tune --help``, ``--windows``' help and the ``--seeds`` refusal name the windows a
trace is judged on from one list (``engine/sim/window_kinds``): they said "its busiest
and a typical one" where a run judged four windows, the heaviest prompts' among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.window_kinds import KINDS, kinds_text
from slopilot.tuner.sim.robust import said_window


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_help_names_every_kind_of_window(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = _flat(capsys.readouterr().out)
    assert _flat(kinds_text()) in out, out
    for kind in KINDS:
        assert kind.short in out, (kind, out)
    assert "busiest and a typical one" not in out
    assert "busiest windows (by arrivals, by tokens) and a typical one," not in out


def test_the_seeds_refusal_names_every_kind(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,5,5\n1,5,5\n")
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", "--trace", str(trace), "--seeds", "2"]) == 2
    err = _flat(capsys.readouterr().err)
    assert kinds_text() in err and "heaviest prompts'" in err, err


def test_the_plan_says_each_window_by_the_same_list() -> None:
    for kind in KINDS:
        assert said_window(kind.name) == kind.said
