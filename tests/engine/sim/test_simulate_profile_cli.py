"""`slopilot simulate --profile FILE`: the twin runs on it and says so; bad profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main
from tests.support.profiles import profile_file


def test_simulate_says_which_twin_it_ran(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = profile_file(tmp_path)
    base = ["simulate", "--scenario", "tiny-cpu", "--duration", "8", "--json"]
    assert main(base) == 0
    datasheet = json.loads(capsys.readouterr().out)
    assert main([*base, "--profile", str(path)]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert datasheet["twin"] == "uncalibrated datasheet roofline (A100-80GB, tp=1)"
    assert calibrated["twin"] == f"calibrated profile {path}" and calibrated["calibrated"]
    assert calibrated["iterations"] != datasheet["iterations"]  # another cost model
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "8",
                 "--profile", str(path)]) == 0
    assert f"twin: calibrated profile {path}" in capsys.readouterr().out


def test_a_profile_for_another_model_exits_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = profile_file(tmp_path, model="smollm2-135m")
    assert main(["simulate", "--scenario", "tiny-cpu", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "calibrated for model 'SmolLM2-135M', not 'llama-3-8b'" in err and str(path) in err


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("schema: nope\n", "not a slopilot cost profile"),
    ("][\n", "not valid YAML"),
])
def test_missing_or_malformed_profiles_exit_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              content: str | None, message: str) -> None:
    path = tmp_path / "p.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["simulate", "--scenario", "tiny-cpu", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err


def test_a_stale_profile_warns_and_still_runs(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = profile_file(tmp_path, form_digest="0000000000000000")
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "5", "--json",
                 "--profile", str(path)]) == 0
    captured = capsys.readouterr()
    assert "slopilot simulate: warning:" in captured.err and "re-run" in captured.err
    assert json.loads(captured.out)["calibrated"] is True
