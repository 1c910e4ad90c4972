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


def test_a_run_past_the_calibrated_domain_says_where_the_twin_extrapolates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The profile timed steps of up to 512 tokens, 32 sequences and contexts of 1024;
    # tiny-cpu runs a 2048-token budget and prompts of up to 4096 tokens.
    path = profile_file(tmp_path)
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "8", "--json",
                 "--set", "max_num_seqs=64", "--profile", str(path)]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # the figures stay one JSON object; the warnings go to stderr
    lines = [line for line in captured.err.splitlines() if "calibrated domain" in line]
    assert len(lines) == 2, captured.err
    tokens, context = lines
    assert tokens.startswith("slopilot simulate: warning: iterations of up to ")
    assert "new tokens (token_budget 2048) ran past the profile's calibrated domain " \
           "(fit.token_budget: 512)" in tokens
    assert "the twin extrapolates its fit there" in tokens
    assert "--token-budget 2048" in tokens
    assert "contexts of up to " in context and "(fit.max_context: 1024)" in context
    assert "--max-context" in context
    # 64 sequences allowed, but never more than 32 at once in this run: no warning.
    assert "max_num_seqs" not in captured.err


def test_a_run_inside_the_calibrated_domain_warns_of_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from tests.support.profiles import make_profile

    wide = make_profile()
    assert wide.fit is not None
    fit = dataclasses.replace(wide.fit, token_budget=2048, max_context=8192)
    path = profile_file(tmp_path, fit=fit)
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "8", "--json",
                 "--profile", str(path)]) == 0
    assert "calibrated domain" not in capsys.readouterr().err
