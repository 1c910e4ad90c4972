"""``slopilot tune``'s start config is a candidate, ranked with the trials by the same
rule: a trial that does not beat it is not recommended, and the verdict, the text, the
JSON and the report say to keep it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main

LIGHT = """\
name: light
description: a trickle of short prompts that no knob below changes the outcome of
gpu: A100
num_gpus: 1
tp: 1
model: llama-3-8b
duration_s: 6
seed: 0
workload:
  type: open_loop
  arrivals: {process: poisson, rate: 2}
  prompt_tokens: {dist: fixed, value: 200}
  output_tokens: {dist: fixed, value: 16}
  classes: {p1: 1.0}
slo:
  profile: standard
  classes:
    p1: {ttft_p99_ms: 500, tbt_p99_ms: 200}
"""

OVERLOAD = LIGHT.replace("name: light", "name: overload").replace(
    "rate: 2}", "rate: 16}").replace("{dist: fixed, value: 200}", "{dist: fixed, value: 1500}")

# The knobs that act on a light load, fixed at the scenario's own values: the tuned rest
# (the preemption knobs, the KV watermark) act only when the KV cache is full, so every
# trial's result is the start config's, to the last digit.
INERT = ["--set", "token_budget=1024", "--set", "chunk_size=512", "--set", "max_num_seqs=256",
         "--set", "preemption_mode=auto", "--set", "p0_preempt_utilization=0.9"]


def _tune(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["tune", *args, "--json", "--quiet"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_trial_that_only_ties_the_start_config_is_not_recommended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Trial 0 scored what the start config did and was recommended anyway, with five
    # knob changes that bought nothing.
    scenario = tmp_path / "light.yaml"
    scenario.write_text(LIGHT)
    out = _tune(capsys, "--scenario", str(scenario), "--trials", "3", "--seeds", "1",
                *INERT)
    assert out["trials"] == 3  # the start config is compared, not spent as a trial
    assert [t["goodput_tok_s"] for t in out["top"]] == [out["start"]["goodput_tok_s"]] * 3
    assert out["top"][0]["config"] != out["start"]["config"]
    assert out["feasible"] is True and out["best_trial"] is None
    assert out["best_candidate"] == "the start config"
    assert out["best"]["config"] == out["start"]["config"]
    assert out["config"] == out["start"]["config"] and out["changes"] == {}
    assert out["recommended_replicas"] == 1
    assert "keep the start config" in out["verdict"], out["verdict"]
    assert "no knob changes" in out["verdict"], out["verdict"]
    # Nothing to --set beyond what the study fixed: the check replays the start config.
    assert "--set kv_watermark" not in out["check_command"]


def test_the_text_and_report_say_to_keep_the_start_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "light.yaml"
    scenario.write_text(LIGHT)
    report = tmp_path / "report"
    assert main(["tune", "--scenario", str(scenario), "--trials", "2", "--seeds", "1",
                 *INERT, "--quiet", "--report-dir", str(report)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "recommended: keep the start config on 1 replica: no knob changes" in out, out
    # One seed, one window: named, not called its worst (test_tune_one_window.py).
    assert "Start config on seed 0, 0-6 s, 1 replica" in out, out
    assert "recommended: 1 replica with" not in out
    text = (report / "report.md").read_text()
    assert "Keep the start config: no knob changes." in text, text


def test_a_trial_that_beats_the_start_config_lists_its_changes(
        capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-cpu's start config (budget and chunk 2048) misses P0's TBT; tuned, one holds.
    out = _tune(capsys, "--scenario", "tiny-cpu", "--trials", "6", "--duration", "8",
                "--seeds", "2", "--set", "preemption_mode=recompute",
                "--bound", "max_num_seqs=16:128")
    assert out["best_trial"] is not None
    assert out["best_candidate"] == f"trial {out['best_trial']}"
    assert out["config"] == out["best"]["config"]
    start = out["start"]["config"]
    assert out["changes"] == {k: v for k, v in out["config"].items() if start.get(k) != v}
    assert out["changes"]


def test_when_nothing_holds_the_start_config_that_ties_is_searched_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every trial misses as the start config does; the capacity search took trial 0's
    # knobs to more replicas, changes bought nothing on one replica.
    scenario = tmp_path / "overload.yaml"
    scenario.write_text(OVERLOAD)
    out = _tune(capsys, "--scenario", str(scenario), "--trials", "2", "--seeds", "1",
                "--max-replicas", "4", *INERT)
    assert out["feasible"] is False and out["best_trial"] is None
    assert out["best_candidate"] == "the start config"
    cap = out["capacity"]
    assert cap["searched"][0]["candidate"] == "the start config"
    assert cap["candidate"] == "the start config", cap
    assert out["recommended_replicas"] is not None and out["changes"] == {}
    assert out["config"] == out["start"]["config"]


def test_the_report_s_capacity_table_lists_every_replica_count_tried(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rep_b3: tuned on 1 replica (the start config at 97 % of a limit), recommended 2;
    the capacity table had only the 2-replica row."""
    scenario = tmp_path / "overload.yaml"
    scenario.write_text(OVERLOAD)
    report = tmp_path / "report"
    out = _tune(capsys, "--scenario", str(scenario), "--trials", "2", "--seeds", "1",
                "--max-replicas", "4", *INERT, "--report-dir", str(report))
    cap = out["capacity"]
    assert "1" not in cap["tried"] and out["recommended_replicas"] > 1, cap
    # The capacity search's candidate is the start config: on 1 replica, its own result.
    assert cap["candidate"] == "the start config", cap
    share = max(out["start"]["constraints"].values()) + 1.0
    table = (report / "report.md").read_text().split("## Capacity")[1].split("```")[0]
    row = next((line for line in table.splitlines() if line.startswith("| 1 |")), None)
    assert row is not None and row.startswith("| 1 | no |"), table
    assert f" {share:.0%} | " in row, (row, share)
    for n in cap["tried"]:
        assert f"\n| {n} | " in table, table
    # What is judged is said: the SLO and the headroom apart, and a check of one fewer.
    assert "| replicas | within SLO | with 10% headroom |" in table, table
    fewer = out["recommended_replicas"] - 1
    assert f"To replay one replica fewer ({fewer}) as the check below does:" in table, table
    section = (report / "report.md").read_text().split("To replay one replica fewer")[1]
    assert f"--replicas {fewer}" in section.split("```")[1].split("\n")[1], section


def test_the_report_carries_the_start_against_best_table_the_terminal_shows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reviewer read the start-vs-best figures only on the terminal: report.md had none,
    so its "keep the start config" or "trial N" had nothing beside it to weigh."""
    scenario = tmp_path / "light.yaml"
    scenario.write_text(LIGHT)
    report = tmp_path / "report"
    assert main(["tune", "--scenario", str(scenario), "--trials", "2", "--seeds", "1",
                 *INERT, "--quiet", "--report-dir", str(report)]) == 0
    out = capsys.readouterr().out
    text = (report / "report.md").read_text()
    assert "The start config (kept) against trial" in out, out
    section = text.split("The start config (kept) against trial")[1]
    assert "|  | start | trial " in section, section
    for row in ("| holds SLO | yes | yes |", "| goodput share |",
                "| goodput tok/s, mean of windows |", "| P1 TTFT p99 (of limit) |",
                "| kv_watermark | 0.05 | "):
        assert row in section, section
    # One builder: each of the report's rows is the terminal's, cell for cell.
    for line in section.split("\n\n")[1].splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert any(all(c in term_line for c in cells if c) for term_line in out.splitlines()
                   if cells[0] in term_line), (line, out)
