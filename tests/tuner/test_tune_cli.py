"""``slopilot tune`` end to end: the verdict, the windows, the capacity answer, the JSON
keys, the report and bad input."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main

OVERLOAD = """\
name: overload
description: more prefill than one A100 can do at these prompts
gpu: A100
num_gpus: 1
tp: 1
model: llama-3-8b
duration_s: 6
seed: 0
workload:
  type: open_loop
  arrivals: {process: poisson, rate: 16}
  prompt_tokens: {dist: lognormal, mean: 1500, sigma: 0.3, min: 256, max: 4000}
  output_tokens: {dist: fixed, value: 16}
  classes: {p1: 1.0}
slo:
  profile: standard
  classes:
    p1: {ttft_p99_ms: 500, tbt_p99_ms: 200}
"""

TOP_KEYS = {"scenario", "twin", "study", "sampler", "trials", "replicas", "duration_s",
            "windows_kind", "windows", "judged_on", "margin", "feasible", "holds", "verdict",
            "violations", "recommended_replicas", "config", "changes", "capacity",
            "best_trial", "best_candidate", "best",
            "start", "start_fitted", "top", "command", "check_command", "timing", "warnings",
            "too_long", "whole_trace",
            "report"}


def test_tune_prints_the_verdict_and_writes_the_report(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    report = tmp_path / "report"
    code = main(["tune", "--scenario", "tiny-cpu", "--trials", "6", "--duration", "8",
                 "--seeds", "2", "--set", "preemption_mode=recompute",
                 "--bound", "max_num_seqs=16:128", "--report-dir", str(report)])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    assert "Top trials" in out and "Best config against the scenario's start config" in out
    assert "windows: judged on 2 workload seeds, 8 s each" in out
    assert "holds the SLO in every window with 10% headroom on 1 replica" in out
    assert "reproduce: slopilot tune --scenario tiny-cpu --trials 6" in out
    assert "check it on the whole workload: slopilot simulate --scenario tiny-cpu" in out
    assert "sim-s/s" in out
    # Progress from the first simulation (the start config) on, on stderr.
    assert "tuning tiny-cpu on 1 replica, 6 trials" in captured.err
    assert "tune: " in captured.err and "s simulated" in captured.err
    text = (report / "report.md").read_text()
    for section in ("## What each trial was judged on", "## Recommendation",
                    ", per window and class", "Reproduce this study:",
                    "Check the answer on the whole workload:"):
        assert section in text
    assert "| p0 | 300 | 60 |" in text  # tiny-cpu's SLO
    assert "**seed 0: 0-8 s**" in text and "**seed 1: 0-8 s**" in text
    assert "Knob importance is left out: needs at least 8 completed trials" in text
    for png in ("history.png", "terms.png", "pareto.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (report / "importance.png").exists()


def test_tune_json_keys_and_a_resumed_study(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["tune", "--scenario", "tiny-cpu", "--trials", "3", "--duration", "6",
            "--seeds", "1", "--storage", url, "--study-name", "cli", "--sampler", "random",
            "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first) == TOP_KEYS
    assert first["trials"] == 3 and first["study"] == "cli" and first["margin"] == 0.1
    assert first["duration_s"] == 6 and first["windows_kind"] == "seeds"
    assert [w["name"] for w in first["windows"]] == ["seed 0"]
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["trials"] == 6  # the second run continued the same study
    best = second["best"]
    assert set(best["constraints"]) == {"p0.ttft_p99", "p0.tbt_p99", "p1.ttft_p99",
                                        "p1.tbt_p99", "preemptions_per_min"}
    assert best["config"]["chunk_size"] <= best["config"]["token_budget"]
    assert second["start"]["config"]["token_budget"] == 2048  # tiny-cpu's own knobs
    assert len(second["top"]) == 6
    if second["feasible"]:
        assert second["violations"] == [] and second["recommended_replicas"] == 1
        assert second["config"] == best["config"]


def test_an_infeasible_scenario_names_the_terms_and_gets_a_replica_count_that_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "overload.yaml"
    scenario.write_text(OVERLOAD)
    assert main(["tune", "--scenario", str(scenario), "--trials", "3", "--seeds", "1",
                 "--max-replicas", "6", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False
    terms = {v["term"] for v in out["violations"]}
    assert "p1.ttft_p99" in terms
    ttft = next(v for v in out["violations"] if v["term"] == "p1.ttft_p99")
    assert ttft["text"].startswith("P1 TTFT p99 ") and " against 500 ms" in ttft["text"]
    assert out["verdict"].startswith("No configuration tried holds the SLO on 1 replica")
    n = out["recommended_replicas"]
    assert n is not None and 2 <= n <= 6 and out["config"] == out["capacity"]["config"]
    assert out["capacity"]["tried"][str(n)]["feasible"] is True
    if n > 2:
        assert out["capacity"]["tried"][str(n - 1)]["feasible"] is False
    # The answer, simulated as the check command says, holds the SLO.
    check = shlex.split(out["check_command"])
    assert check[:2] == ["slopilot", "simulate"] and f"--replicas {n}" in out["check_command"]
    assert main([*check[1:], "--json", "--quiet"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["classes"]["p1"]["ttft_p99_ms"] <= 500 and sim["p99_within_slo"] is True


def test_a_trace_is_tuned_on_its_busiest_windows(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "mine.csv"
    rows = [f"{t * 0.5:.2f},{2000 if 120 <= t < 160 else 200},20" for t in range(400)]
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    assert main(["tune", "--trace", str(trace), "--trials", "2", "--duration", "20",
                 "--warmup", "5", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "azure-conv-2023+mine" and out["windows_kind"] == "trace"
    names = [w["name"] for w in out["windows"]]
    assert names == ["busiest arrivals", "busiest tokens", "typical"]
    tokens = out["windows"][1]
    assert 50 <= tokens["start_s"] <= 70  # the long prompts at 60-80 s
    assert f"--trace {trace}" in out["command"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--scenario", "no-such"], "unknown scenario 'no-such'"),
    (["--scenario", "tiny-cpu", "--set", "token_budgt=512"], "unknown knob 'token_budgt'"),
    (["--scenario", "tiny-cpu", "--bound", "token_budget=9000:100"], "lo is above hi"),
    (["--scenario", "tiny-cpu", "--bound", "token_budget"], "expected KNOB=LO:HI"),
    (["--scenario", "tiny-cpu", "--bound", "token_budget=abc:def"],
     "--bound token_budget=abc:def: token_budget='abc': expected a whole number"),
    (["--scenario", "tiny-cpu", "--storage", "study.db"], "not a database URL"),
    (["--scenario", "tiny-cpu", "--trials", "0"], "--trials 0: expected at least 1"),
    (["--scenario", "tiny-cpu", "--seeds", "0"], "--seeds 0: expected at least 1"),
    (["--scenario", "tiny-cpu", "--seed", "-1"], "--seed -1: expected a whole number >= 0"),
    (["--scenario", "tiny-cpu", "--seed", "4294967296"],
     "--seed 4294967296: expected a whole number >= 0 and at most 4294967295"),
    (["--scenario", "tiny-cpu", "--replicas", "two"], "--replicas 'two': expected auto"),
    (["--scenario", "tiny-cpu", "--replicas", "0"], "--replicas 0: expected at least 1"),
    (["--scenario", "tiny-cpu", "--warmup", "-3"], "--warmup -3.0: expected seconds >= 0"),
    (["--scenario", "tiny-cpu", "--duration", "0"], "--duration 0.0: expected seconds > 0"),
    ([], "give --scenario NAME|FILE.yaml, or --trace FILE.csv"),
    (["--scenario", "tiny-cpu", "--time-scale", "0.5"], "pass --trace FILE.csv"),
])
def test_bad_input_exits_2_with_the_reason(extra: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("bound", "message"), [
    ("token_budget=9000:100", "--bound token_budget=9000:100: lo is above hi; swap them"),
    ("token_budget=1:99999999",
     "--bound token_budget=1:99999999: leaves the knob's range; use values in [128, 16384]"),
    ("token_budget=512", "--bound token_budget=512: expected two ends, lo and hi"),
    # The docs write ranges 128..8192; that form was "expected two ends" too.
    ("token_budget=4096..256", "--bound token_budget=4096..256: lo is above hi; swap them"),
    # Split at its first "..", 0...1 read as 0 to .1: a narrower range, silently.
    ("kv_watermark=0...1", "--bound kv_watermark=0...1: expected KNOB=LO:HI (or LO..HI)"),
    ("preemption_mode=swap,swap", "--bound preemption_mode=swap,swap: repeats a value"),
])
def test_a_bad_bound_names_the_flag_as_written(bound: str, message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # It named the study's internal "bounds.token_budget=[9000, 100]", not the flag.
    assert main(["tune", "--scenario", "tiny-cpu", "--bound", bound]) == 2
    err = capsys.readouterr().err
    assert message in err and "bounds." not in err, err


@pytest.mark.parametrize(("extra", "message"), [
    (["--windows", "whole"], "--windows whole: a trace's option; tiny-cpu's workload is "
                             "generated"),
    (["--warmup", "10"], "--warmup 10: a trace's option; tiny-cpu's workload is generated"),
    (["--warmup", "30"], "--warmup 30: a trace's option"),  # the default, but said
])
def test_trace_only_flags_on_a_generated_workload_are_refused(
        extra: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # They were ignored without a word (--windows whole quietly judged one seed).
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", "--scenario", "tiny-cpu", *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("workload", "seeds", "message"), [
    (["--trace", "T"], "5", "--seeds 5: a generated workload's option; "),
    (["--scenario", "azure-conv-2023"], "3", "--seeds 3: a generated workload's option; "),
])
def test_seeds_on_a_trace_are_refused(workload: list[str], seeds: str, message: str,
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # They were ignored without a word: a trace is judged on its windows, never on seeds,
    # so a user who asked for 5 got a study no more robust than with 1. The default (3),
    # given, is refused too: the flag was written, and it cannot act.
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,5,5\n1,5,5\n")
    workload = [str(trace) if w == "T" else w for w in workload]
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", *workload, "--seeds", seeds]) == 2
    err = capsys.readouterr().err
    assert message in err and "judged on its windows" in err, err
    assert "leave --seeds out" in err and err.count("\n") == 1, err


def test_a_trace_no_request_of_which_fits_the_deployment_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every request was rejected (prompts past the KV cache, whatever the knobs), no class
    # had a P99 to miss, and the study said "holds the SLO", exit 0, goodput 0. Here a
    # cache of 5,264 tokens holds less than Llama-3-8B's context: the cache decides.
    scenario = tmp_path / "small.yaml"
    scenario.write_text(
        "name: small\ngpu: A100\nnum_gpus: 1\ntp: 1\nmodel: llama-3-8b\n"
        "gpu_memory_utilization: 0.22\nduration_s: 60\nseed: 0\n"
        "workload: {type: trace, trace: azure-llm-2023-conv}\n")
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n"
                     + "".join(f"{t},{6_000 + t},10\n" for t in range(20)))
    assert main(["tune", "--scenario", str(scenario), "--trace", str(trace), "--trials", "1",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--trace {trace}: none of its 20 requests fits" in err, err
    assert "its KV cache holds 5,264 tokens" in err, err
    assert "the shortest is 6,010 tokens (prompt plus output)" in err, err
    assert "give a --scenario whose GPUs hold them" in err, err


def test_a_trace_every_request_of_which_exceeds_the_models_context_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 x H800 hold every one of them, but DeepSeek-67B's context is 4,096 tokens: the
    # server refuses each (400), and the study judged an empty run as holding the SLO.
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n"
                     + "".join(f"{t},{4000 + t},100\n" for t in range(20)))
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    assert main(["tune", "--scenario", "seed-h800x8-deepseek67b", "--trace", str(trace),
                 "--trials", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--trace {trace}: none of its 20 requests fits" in err, err
    assert "deepseek-67b's context of 4,096 tokens" in err, err
    assert "the shortest is 4,100 tokens (prompt plus output)" in err, err
    assert "give a --scenario whose model's context holds them" in err, err


def test_a_trace_whose_requests_partly_fit_is_tuned_on_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "some.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,10000000,10\n"
                     + "".join(f"{t},100,10\n" for t in range(1, 20)))
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feasible"] is True


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


def test_a_trace_given_as_scenario_points_to_trace(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,5,5\n")
    assert main(["tune", "--scenario", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--trace {trace}" in err


def test_help_reads_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert "10 % headroom" in " ".join(out.split()) and "%%" not in out


def test_a_class_without_traffic_reads_dash_not_zero(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "p1.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens,class\n"
                     + "".join(f"{i * 0.2:.1f},300,20,p1\n" for i in range(20)))
    assert main(["tune", "--scenario", "tiny-cpu", "--trace", str(trace), "--trials", "1",
                 "--quiet"]) == 0
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in capsys.readouterr().out.splitlines() if "(of limit)" in line}
    assert rows["P0 TTFT p99 (of limit)"] == ["-", "-"]  # no P0 request: no P99, not 0 %
    assert rows["P0 TBT p99 (of limit)"] == ["-", "-"]
    assert rows["P1 TTFT p99 (of limit)"][0].endswith("%")


@pytest.mark.parametrize("extra", [[], ["--max-replicas", "6"], ["--replicas", "2"],
                                   ["--scenario", "azure-conv-2023", "--max-replicas", "3",
                                    "--warmup", "10", "--windows", "whole"]])
def test_the_reproduce_line_runs_the_same_study(extra: list[str]) -> None:
    import shlex

    from slopilot.cli import build_parser
    from slopilot.tuner.tune.settings import settings_from, tune_command

    parser = build_parser()
    first = settings_from(parser.parse_args(["tune", "--scenario", "tiny-cpu", *extra]))
    line = tune_command(first)
    again = settings_from(parser.parse_args(shlex.split(line)[1:]))
    for field in ("trials", "sampler", "seed", "seeds", "warmup_s", "replicas",
                  "replicas_auto", "max_replicas", "duration_s", "whole", "bounds"):
        assert getattr(again, field) == getattr(first, field), (field, line)


SIMULATE_CLASS_KEYS = {"requests_arrived", "requests_finished", "requests_unfinished",
                       "requests_rejected", "ttft_censored", "goodput_tok_s",
                       "goodput_all_tok_s", "slo_attainment", "p99_within_slo",
                       "slo_ttft_p99_ms", "slo_tbt_p99_ms"}


def test_tune_reports_the_figures_simulate_does(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Busy per replica (mean and max), goodput of output and of all tokens, unfinished,
    censored and rejected counts and the P99 verdict apart from the request share: in the
    text, the JSON (simulate --json's keys, per window) and report.md."""
    scenario = tmp_path / "overload.yaml"
    scenario.write_text(OVERLOAD)
    report = tmp_path / "report"
    args = ["tune", "--scenario", str(scenario), "--trials", "2", "--seeds", "1",
            "--replicas", "1", "--quiet"]
    assert main([*args, "--report-dir", str(report)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for column in ("unfinished", "rejected", "goodput out", "goodput all",
                   "requests within SLO", "p99 within SLO", "no (TTFT)"):
        assert column in out, column
    assert "busy per replica" in out and "% max" in out
    assert "had no first token when the run ended" in out  # overload leaves some waiting
    assert main([*args, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    summary = best["summary"]
    assert {"busy_ratio", "busy_ratio_max", "goodput_all_tok_s", "ttft_censored",
            "requests_unfinished", "requests_rejected", "p99_within_slo"} <= set(summary)
    assert summary["p99_within_slo"] is False
    assert set(summary["classes"]["p1"]) >= SIMULATE_CLASS_KEYS
    assert summary["classes"]["p1"]["ttft_censored"] > 0
    for w in best["windows"]:
        assert set(w["summary"]["classes"]["p1"]) >= SIMULATE_CLASS_KEYS
    assert best["summary"] == best["windows"][0]["summary"]  # one window: it decides
    text = (report / "report.md").read_text()
    for part in ("| unfinished |", "| rejected |", "| goodput all |", "| p99 within SLO |",
                 "no (TTFT)", "busy per replica", "had no first token when the run ended"):
        assert part in text, part


def test_a_report_dir_that_is_a_file_is_refused_before_the_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran before its report folder was checked")

    monkeypatch.setattr("slopilot.tuner.tune.run.run", never)
    taken = tmp_path / "basic.csv"
    taken.write_text("x\n")
    assert main(["tune", "--scenario", "tiny-cpu", "--report-dir", str(taken)]) == 2
    err = capsys.readouterr().err
    assert f"--report-dir {taken}: is a file, not a folder" in err


def test_the_reproduce_and_check_lines_replay_the_very_window_tuned(tmp_path: Path) -> None:
    """Written with %g (six digits), a month-long trace's window 1234567:1238167 came
    back as [1234570, 1238170), and a scale 0.123456789 as 0.123457: the check judged
    other requests than the study did."""
    import shlex

    from slopilot.cli import build_parser
    from slopilot.tuner.tune.settings import check_command, settings_from, tune_command

    trace = tmp_path / "month.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1234600,100,10\n1235000,100,10\n"
                     "1238300,100,10\n")
    parser = build_parser()
    for rate in (["--time-scale", "0.123456789"], ["--target-rate", "3.14159265358979"]):
        first = settings_from(parser.parse_args([
            "tune", "--trace", str(trace), "--trace-window", "1234567.25:1238167", *rate,
            "--duration", "1234.5678901"]))
        for line in (tune_command(first), check_command(first, {}, 1)):
            argv = shlex.split(line)
            assert argv[argv.index("--trace-window") + 1] == "1234567.25:1238167"
            assert float(argv[argv.index(rate[0]) + 1]) == float(rate[1])
        again = settings_from(parser.parse_args(shlex.split(tune_command(first))[1:]))
        assert (again.trace, again.duration_s) == (first.trace, first.duration_s)


@pytest.mark.parametrize("written", ["report.md", "pareto.png"])
def test_a_report_over_an_input_is_refused_before_the_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, written: str) -> None:
    # The report folder's files are written (or, an undrawn plot, removed) after the
    # study: a scenario kept there under one of their names was lost.
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran before its report files were checked")

    monkeypatch.setattr("slopilot.tuner.tune.run.run", never)
    scenario = tmp_path / written
    scenario.write_text(OVERLOAD)
    assert main(["tune", "--scenario", str(scenario), "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"--report-dir {tmp_path} (writes {scenario}) is the same file as "
            f"--scenario {scenario}") in err, err
    assert scenario.read_text() == OVERLOAD


def test_a_study_stored_in_an_input_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(OVERLOAD)
    assert main(["tune", "--scenario", str(scenario), "--trials", "1",
                 "--storage", f"sqlite:///{scenario}"]) == 2
    err = capsys.readouterr().err
    assert f"--storage sqlite:///{scenario}" in err and "same file as --scenario" in err, err
    assert scenario.read_text() == OVERLOAD


@pytest.mark.parametrize(("where", "said"), [
    ("nodir/x.db", "the folder {d}/nodir does not exist; create it or give a file in an "
                   "existing folder"),
    ("adir", "{d}/adir is a folder; name a database file in it, e.g. "
             "sqlite:///{d}/adir/study.db"),
    ("afile/x.db", "{d}/afile is a file, not a folder; give a file in an existing folder"),
    ("fifo", "{d}/fifo is a FIFO (named pipe), not a regular file; give a database file "
             "(a regular file's path)"),
])
def test_a_sqlite_storage_that_cannot_be_written_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, where: str, said: str) -> None:
    # It printed SQLAlchemy's "(sqlite3.OperationalError) unable to open database file"
    # and a sqlalche.me link, where --metrics-out names the missing folder.
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)  # refused before the study
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    os.mkfifo(tmp_path / "fifo")
    url = f"sqlite:///{tmp_path / where}"
    assert main(["tune", "--scenario", "tiny-cpu", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err == f"slopilot tune: --storage {url}: {said.format(d=tmp_path)}\n", err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root passes /proc's writable check")
def test_a_sqlite_storage_in_a_folder_that_takes_no_files_is_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc's mode says root may write there; no file can be made in it.
    monkeypatch.setattr("slopilot.tuner.tune.run.run", None)
    assert main(["tune", "--scenario", "tiny-cpu", "--storage", "sqlite:////proc/x.db"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slopilot tune: --storage sqlite:////proc/x.db: no file can be "
                          "made in /proc ("), err
    assert err.endswith("); give a file in a folder you can write\n"), err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root passes /proc's writable check")
def test_a_report_dir_that_cannot_be_made_is_refused_before_the_study(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc is writable to root by its mode, but no folder can be made there: before,
    the whole study ran and then the report's mkdir raised, losing the verdict."""
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran before its report folder was made")

    monkeypatch.setattr("slopilot.tuner.tune.run.run", never)
    assert main(["tune", "--scenario", "tiny-cpu", "--report-dir",
                 "/proc/slopilot-report"]) == 2
    err = capsys.readouterr().err
    assert "--report-dir /proc/slopilot-report: cannot create it" in err, err


def test_a_report_that_cannot_be_written_keeps_the_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict is printed whatever happens to the report, which fails the command."""
    from slopilot.tuner.tune import run as tune_run

    report = tmp_path / "report"
    study = tune_run.run

    def then_taken(*args: Any, **kwargs: Any) -> Any:
        outcome = study(*args, **kwargs)
        # The report's own name taken by a folder while the study ran (one there before
        # it is refused up front): the writer refuses to replace it.
        (report / "report.md").mkdir(parents=True)
        return outcome

    monkeypatch.setattr(tune_run, "run", then_taken)
    code = main(["tune", "--scenario", "tiny-cpu", "--trials", "1", "--duration", "4",
                 "--seeds", "1", "--quiet", "--report-dir", str(report)])
    captured = capsys.readouterr()
    assert code == 1
    assert "windows: judged on 1 workload seed" in captured.out, captured.out
    assert "reproduce: slopilot tune" in captured.out
    assert f"slopilot tune: cannot write the report in {report}:" in captured.err, \
        captured.err


def test_the_reproduce_and_check_lines_carry_a_given_dispatch() -> None:
    """A study judged under --dispatch is reproduced and checked under it; without the
    flag the lines leave it to the scenario, which they read again."""
    import shlex

    from slopilot.cli import build_parser
    from slopilot.engine.sim.dispatch import Dispatch
    from slopilot.tuner.tune.settings import check_command, settings_from, tune_command

    parser = build_parser()
    plain = settings_from(parser.parse_args(["tune", "--scenario", "tiny-cpu"]))
    assert plain.scenario.dispatch is Dispatch.RANDOM
    assert "--dispatch" not in tune_command(plain) + check_command(plain, {}, 2)
    given = settings_from(parser.parse_args(["tune", "--scenario", "tiny-cpu", "--dispatch",
                                             "least_requests"]))
    assert given.scenario.dispatch is Dispatch.LEAST_REQUESTS
    for line in (tune_command(given), check_command(given, {}, 2)):
        argv = shlex.split(line)
        assert argv[argv.index("--dispatch") + 1] == "least_requests"
    again = settings_from(parser.parse_args(shlex.split(tune_command(given))[1:]))
    assert again.scenario.dispatch is Dispatch.LEAST_REQUESTS


@pytest.mark.parametrize("scale", [["--target-rate", "3.5"], ["--time-scale", "0.125"]])
def test_the_reproduce_and_check_lines_carry_every_trace_flag(tmp_path: Path,
                                                              scale: list[str]) -> None:
    """Each ``TraceOptions`` field, set, comes back from both printed lines: a check that
    left out ``--trace-model`` replayed every model's rows and judged another workload."""
    import dataclasses
    import shlex

    from slopilot.cli import build_parser
    from slopilot.engine.sim.trace_flags import trace_options
    from slopilot.tuner.tune.settings import check_command, settings_from, tune_command

    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     + "".join(f"{i * 0.5},{'GPT-4' if i % 3 else 'ChatGPT'},{100 + i},20,"
                               f"{120 + i},Conversation log\n" for i in range(60)))
    parser = build_parser()
    first = settings_from(parser.parse_args([
        "tune", "--trace", str(trace), "--trace-format", "burstgpt", "--trace-model",
        "GPT-4", "--trace-window", "1.5:20.25", *scale, "--classes", "p0=0.25,p1=0.75"]))
    # Every field but the other of the two scales (one excludes the other).
    unset = {f.name for f in dataclasses.fields(first.trace)
             if getattr(first.trace, f.name) is None}
    assert unset == {"time_scale", "target_rate"} - {scale[0][2:].replace("-", "_")}, unset
    for line in (tune_command(first), check_command(first, {}, 1)):
        again = trace_options(parser.parse_args(shlex.split(line)[1:]))
        assert again == first.trace, line
