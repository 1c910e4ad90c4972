"""``slopilot tune``'s start config is the scenario's knobs with the ``--set`` values,
fitted where the user left a knob alone: into its ``--bound`` range, the chunk to the
token budget (and the budget to a fixed chunk); two ``--set`` values that conflict are
refused naming both flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main


def _tune(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["tune", *args, "--json", "--quiet"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_fixed_budget_below_the_start_chunk_fits_the_chunk_to_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-cpu's chunk is 2048: "chunk_size=2048 exceeds the token budget 256", exit 2,
    # though the user never set the chunk and the study tunes it.
    out = _tune(capsys, "--scenario", "tiny-cpu", "--set", "token_budget=256", "--trials", "1",
                "--duration", "6", "--seeds", "1")
    start = out["start"]["config"]
    assert (start["token_budget"], start["chunk_size"]) == (256, 256)
    assert out["start_fitted"] == {"chunk_size": {"scenario": 2048, "start": 256}}
    assert all(t["config"]["chunk_size"] <= 256 for t in out["top"])


def test_a_stated_chunk_bound_fits_the_start_chunk_into_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _tune(capsys, "--scenario", "tiny-cpu", "--set", "token_budget=256",
                "--bound", "chunk_size=64:128", "--bound", "max_num_seqs=16:128",
                "--trials", "2", "--duration", "6", "--seeds", "1")
    start = out["start"]["config"]
    assert (start["token_budget"], start["chunk_size"], start["max_num_seqs"]) == (256, 128, 128)
    assert out["start_fitted"] == {"chunk_size": {"scenario": 2048, "start": 128},
                                   "max_num_seqs": {"scenario": 256, "start": 128}}


def test_a_fixed_chunk_above_the_start_budget_raises_the_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _tune(capsys, "--scenario", "tiny-cpu", "--set", "chunk_size=4096", "--trials", "1",
                "--duration", "6", "--seeds", "1")
    start = out["start"]["config"]
    assert (start["token_budget"], start["chunk_size"]) == (4096, 4096)
    assert out["start_fitted"] == {"token_budget": {"scenario": 2048, "start": 4096}}


def test_a_fixed_budget_below_a_trace_scenarios_chunk_is_tuned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The trace's checks (that its requests fit, how long they live) built the scenario's
    # engine with the --set values alone, and refused the study before it started.
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n"
                     + "".join(f"{t * 0.5:.1f},300,20\n" for t in range(40)))
    out = _tune(capsys, "--trace", str(trace), "--set", "token_budget=256", "--trials", "1")
    assert out["start"]["config"]["token_budget"] == 256
    assert out["start"]["config"]["chunk_size"] <= 256


def test_a_fixed_chunk_above_a_fixed_budget_names_both_flags(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", "--scenario", "tiny-cpu", "--set", "token_budget=256",
                 "--set", "chunk_size=512"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--set chunk_size=512 exceeds the token budget 256 of --set token_budget=256" \
        in err, err
    assert "give --set chunk_size=256 or less, or --set token_budget=512 or more" in err, err


@pytest.mark.parametrize("bound", ["token_budget=128:256", "token_budget=256:1024"])
def test_a_knob_both_set_and_bound_is_refused_naming_both_flags(
        bound: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound was dropped without a word ({**stated, **fixed}): the study ran at 512,
    # outside 128:256, exit 0. Inside the bound it is as dead: --set fixes the knob.
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", "--scenario", "tiny-cpu", "--set", "token_budget=512",
                 "--bound", bound]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--set token_budget=512 and --bound {bound}" in err, err
    assert f"give --set token_budget=512 to fix it, or --bound {bound} to tune it" in err, err
