"""``slopilot tune`` end to end on tiny-cpu: the table, the JSON, the report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main


def test_tune_prints_tables_and_writes_the_report(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report"
    code = main(["tune", "--scenario", "tiny-cpu", "--trials", "6", "--duration", "8",
                 "--set", "preemption_mode=recompute", "--bound", "max_num_seqs=16:128",
                 "--report-dir", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    assert "Top trials" in out and "Best config against the scenario's start config" in out
    assert "goodput tok/s" in out
    text = (report / "report.md").read_text()
    assert "## Best configuration" in text and "| p0 | 300 | 60 |" in text  # tiny-cpu's SLO
    for png in ("history.png", "pareto.png", "importance.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_json_resumes_a_stored_study(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["tune", "--scenario", "tiny-cpu", "--trials", "3", "--duration", "8",
            "--storage", url, "--study-name", "cli", "--sampler", "random", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["trials"] == 3 and first["study"] == "cli"
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["trials"] == 6  # the second run continued the same study
    best = second["best"]
    assert best["goodput_tok_s"] >= first["best"]["goodput_tok_s"]
    assert set(best["constraints"]) == {"p0.ttft_p99", "p0.tbt_p99", "p1.ttft_p99",
                                        "p1.tbt_p99", "preemptions_per_min"}
    assert best["config"]["chunk_size"] <= best["config"]["token_budget"]
    assert second["start"]["config"]["token_budget"] == 2048  # tiny-cpu's own knobs
    assert len(second["top"]) == 6


@pytest.mark.parametrize(("extra", "message"), [
    (["--scenario", "no-such"], "unknown scenario 'no-such'"),
    (["--scenario", "tiny-cpu", "--set", "token_budgt=512"], "unknown knob 'token_budgt'"),
    (["--scenario", "tiny-cpu", "--bound", "token_budget=9000:100"], "lo is above hi"),
    (["--scenario", "tiny-cpu", "--bound", "token_budget"], "expected KNOB=LO:HI"),
    (["--scenario", "tiny-cpu", "--storage", "study.db"], "not a database URL"),
    (["--scenario", "tiny-cpu", "--trials", "0"], "--trials 0: expected at least 1"),
])
def test_bad_input_exits_2_with_the_reason(extra: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--duration", "2", *extra]) == 2
    assert message in capsys.readouterr().err


def test_tune_runs_its_trials_on_a_profile(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.profiles import profile_file

    path = profile_file(tmp_path)
    assert main(["tune", "--scenario", "tiny-cpu", "--trials", "2", "--duration", "6",
                 "--sampler", "random", "--json", "--profile", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["twin"] == f"calibrated profile {path}"
    assert main(["tune", "--scenario", "tiny-cpu", "--trials", "1", "--duration", "6",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["twin"].startswith("uncalibrated datasheet")
    wrong = profile_file(tmp_path, "wrong.yaml", model="deepseek-67b")
    assert main(["tune", "--scenario", "tiny-cpu", "--profile", str(wrong)]) == 2
    assert "calibrated for model 'DeepSeek-67B'" in capsys.readouterr().err
