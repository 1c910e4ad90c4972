"""`slopilot simulate`: the JSON contract tools read (its keys are
``WindowSummary.to_dict``'s, ``engine/window_summary.py``), the table, metrics, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.cli import main
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate

PER_CLASS_KEYS = {"ttft_mean_ms", "ttft_p99_ms", "tbt_p99_ms", "max_stall_ms",
                  "throughput_tok_s", "goodput_tok_s", "preemptions_per_min",
                  "requests_finished"}


def test_json_has_overall_and_per_class_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= PER_CLASS_KEYS
    assert set(out["classes"]) == {"p0", "p1", "p2"}
    for figures in out["classes"].values():
        assert set(figures) >= PER_CLASS_KEYS
    assert out["requests_finished"] == sum(
        c["requests_finished"] for c in out["classes"].values())
    assert out["requests_finished"] > 0 and out["throughput_tok_s"] > 0


# Every key `simulate --json` has always written: tools read them, so none may go or move.
TOP_KEYS = {"busy_ratio", "calibrated", "classes", "config", "duration_s", "goodput_tok_s",
            "iterations", "kv_usage_max", "kv_usage_mean", "max_stall_ms", "mean_batch_tokens",
            "preemptions_per_min", "preemptions_per_min_recompute", "preemptions_per_min_swap",
            "prefix_hit_rate", "rejected", "replicas", "requests_finished", "scenario",
            "slo_attainment", "tbt_p50_ms", "tbt_p99_ms", "throughput_tok_s", "ttft_mean_ms",
            "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "twin"}
CLASS_KEYS = {"goodput_tok_s", "max_stall_ms", "preemptions_per_min", "requests_finished",
              "slo_attainment", "tbt_p50_ms", "tbt_p99_ms", "throughput_tok_s",
              "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"}


# Keys added since (issue 10: honest figures): added, never renamed.
ACCOUNTING_KEYS = {"requests_arrived", "requests_rejected", "requests_unfinished",
                   "ttft_censored", "offered_tok_s", "goodput_all_tok_s"}
# requests_refused: of the rejected, those turned away for load (a full waiting queue).
# ttft_measured_pct: the percent of the TTFT ranking measured (the rest refused for load).
# ttft_samples: how many requests the TTFT ranking holds (measured, censored and refused),
# what the loop's sample floor counts (sample_floor.py).
# requests_awaiting: those still waiting for a first token at the end (the censored ones),
# as a live window reads its engines' gauge of them (engine/awaiting.py).
ADDED_TOP_KEYS = ACCOUNTING_KEYS | {"busy_ratio_max", "p99_within_slo", "requests_refused",
                                    "ttft_measured_pct", "ttft_samples", "requests_awaiting"}
ADDED_CLASS_KEYS = ACCOUNTING_KEYS | {"p99_within_slo", "slo_ttft_p99_ms", "slo_tbt_p99_ms",
                                      "requests_refused", "ttft_measured_pct", "ttft_samples",
                                      "requests_awaiting"}


def test_json_keys_are_exactly_the_published_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == TOP_KEYS | ADDED_TOP_KEYS
    assert all(set(c) == CLASS_KEYS | ADDED_CLASS_KEYS for c in out["classes"].values())


def test_json_figures_are_honest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "20", "--replicas", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # Busy is per replica (a ratio), not summed over the two.
    assert 0 < out["busy_ratio"] <= out["busy_ratio_max"] <= 1.0
    assert out["goodput_all_tok_s"] >= out["goodput_tok_s"] > 0
    assert out["requests_arrived"] == (out["requests_finished"] + out["requests_unfinished"]
                                       + out["requests_rejected"])
    p2 = out["classes"]["p2"]  # tiny-cpu's P2 is best effort: no P99 verdict
    assert p2["p99_within_slo"] is None and p2["slo_ttft_p99_ms"] is None
    p0 = out["classes"]["p0"]
    assert p0["slo_ttft_p99_ms"] == 300 and isinstance(p0["p99_within_slo"], bool)


def test_progress_goes_to_stderr_and_json_stays_clean(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "5", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # one clean object
    assert "simulate: 5/5 s simulated (100%)" in captured.err and "sim-s/s" in captured.err
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "5", "--json",
                 "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_table_shows_every_class_rejected_prompts_and_the_goodput_definition(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens,class\n"
                     "0,100,10,p1\n1,100,10,p1\n2,900000,10,p1\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines()
            if line.startswith("│") and line.split()[1] in ("p0", "p1", "p2", "all")}
    assert set(rows) == {"p0", "p1", "p2", "all"}
    assert rows["p0"].count(" - ") >= 10  # no traffic: "-", not 0 ms
    assert "requests within SLO" in out and "p99 within SLO" in out
    assert "1 request(s) rejected" in out
    assert "goodput: tokens per second of the requests that met their class's SLO" in out


def test_set_overrides_reach_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "10", "--json",
                 "--set", "token_budget=512", "--set", "chunk_size=256"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["token_budget"], cfg["chunk_size"]) == (512, 256)


def test_table_is_printed_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "10"]) == 0
    out = capsys.readouterr().out
    assert "TBT p99" in out and "goodput" in out and "preemptions/min" in out
    assert "busy per replica" in out


def test_same_seed_same_result() -> None:
    scenario = load_scenario("tiny-cpu")
    a = simulate(scenario, duration_s=15).summary
    b = simulate(scenario, duration_s=15).summary
    assert a == b


def test_metrics_out_writes_the_servers_series(tmp_path: Path) -> None:
    target = tmp_path / "m.prom"
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "15",
                 "--metrics-out", str(target)]) == 0
    families = {f.name: f for f in text_string_to_metric_families(target.read_text())}
    assert "vllm:time_to_first_token_seconds" in families
    assert "vllm:inter_token_latency_seconds" in families
    gen = families["vllm:generation_tokens"]
    assert sum(s.value for s in gen.samples if s.name.endswith("_total")) > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--scenario", "nope"], "unknown scenario 'nope'"),
    (["--scenario", "tiny-cpu", "--set", "token_budget=99"], "token_budget=99 is out of range"),
    (["--scenario", "tiny-cpu", "--set", "budget"], "expected knob=value"),
    (["--scenario", "tiny-cpu", "--set", "speed=3"], "unknown knob 'speed'"),
    (["--scenario", "tiny-cpu", "--replicas", "0"], "replicas=0"),
    (["--scenario", "tiny-cpu", "--duration", "inf"], "--duration inf: expected"),
    (["--scenario", "tiny-cpu", "--duration", "nan"], "--duration nan: expected"),
    (["--scenario", "azure-conv-2023", "--time-scale", "1e308"],
     "time_scale=1e+308: stretches"),
    (["--scenario", "missing.yaml"], "does not exist"),
    (["--scenario", "tiny-cpu", "--profile", "missing.yaml"],
     "--profile missing.yaml: no such file; write one with `slopilot calibrate"),
    (["--scenario", "tiny-cpu", "--profile", "/"], "--profile /: is a folder, not a file"),
])
def test_bad_input_is_a_clear_error(argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mine.csv", "mine.jsonl", "MINE.CSV"])
def test_a_trace_passed_as_scenario_is_one_line_pointing_to_trace(
        tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / name
    secret = "do-not-echo-this-row"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + f"0,5,5,{secret}\n" * 50)
    assert main(["simulate", "--scenario", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--trace {trace}" in err
    assert secret not in err


def test_a_non_mapping_scenario_file_is_quoted_only_in_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("just a long line of text " * 200)
    assert main(["simulate", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert "must be a mapping" in err and len(err) < 400


def test_a_trace_replay_serves_its_last_requests_to_the_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A user replaying a trace asks what happens to its requests: the run follows the
    # last ones past the last arrival instead of cutting them off a second after it.
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens,class\n"
                     "0,800,100,p1\n0.5,2000,400,p1\n1.0,300,300,p0\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(trace), "--json",
                 "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_arrived"] == 3
    assert out["requests_finished"] == 3 and out["requests_unfinished"] == 0
    assert out["ttft_censored"] == 0
    assert out["duration_s"] == 2.0  # rates stay over the trace's span, not the drain


def test_a_cut_trace_replay_stops_where_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,800,100\n0.5,2000,2000\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(trace), "--json",
                 "--quiet", "--duration", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_unfinished"] >= 1  # --duration cuts the run, drain or not


def test_progress_counts_what_was_simulated_when_a_replay_ends_early(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The drain ends once the last request finishes: the final line must not claim the
    # whole 120 s allowance (nor a speed computed from it).
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,800,100\n1.0,300,30\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(trace), "--json"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    done, _, total = last.split(": ", 1)[1].split(" s simulated")[0].partition("/")
    assert last.startswith("simulate: ") and "(100%)" in last
    assert float(done) == float(total) < 20


@pytest.mark.parametrize(("where", "message"), [
    (lambda d: d / "no" / "such" / "m.prom", "the folder"),
    (lambda d: d, "is a folder"),
])
def test_a_bad_metrics_path_is_refused_before_the_run(
        tmp_path: Path, where: object, message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("slopilot.engine.sim.simulator.simulate", never)
    path = where(tmp_path)  # type: ignore[operator]
    assert main(["simulate", "--scenario", "tiny-cpu", "--quiet",
                 "--metrics-out", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-out {path}" in err and message in err and "Traceback" not in err


def test_a_metrics_file_that_cannot_be_written_whole_leaves_the_old_one(
        tmp_path: Path) -> None:
    # A disk that fills mid-write (here: a file-size limit, EFBIG) must not leave the
    # previous run's metrics truncated to half of the new ones.
    import resource
    import signal

    from slopilot.engine.sim.commands import _write_metrics

    target = tmp_path / "metrics.prom"
    target.write_text("# the previous run's metrics\n")
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, limits[1]))
    try:
        with pytest.raises(OSError):
            _write_metrics(str(target), [b"x" * 4096])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert target.read_text() == "# the previous run's metrics\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.prom"]


def test_metrics_files_get_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    # Written via a temporary file (mkstemp's 0600): readers of a plain write still read.
    from slopilot.engine.sim.commands import _write_metrics

    plain = tmp_path / "plain.prom"
    plain.write_bytes(b"x")
    _write_metrics(str(tmp_path / "new.prom"), [b"y"])
    assert (tmp_path / "new.prom").stat().st_mode == plain.stat().st_mode
    plain.chmod(0o640)
    _write_metrics(str(plain), [b"z"])
    assert plain.stat().st_mode & 0o777 == 0o640 and plain.read_bytes() == b"z"


@pytest.mark.parametrize("flag", ["--trace", "--scenario", "--profile"])
def test_metrics_out_over_an_input_is_refused_and_the_input_kept(
        tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # It wrote its Prometheus text over the trace (or the scenario) it had just read.
    from slopilot.engine.sim.scenario import scenario_file
    from tests.support.profiles import profile_file

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("slopilot.engine.sim.simulator.simulate", never)
    if flag == "--trace":
        victim = tmp_path / "t.csv"
        victim.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n")
        argv = ["--trace", str(victim)]
    elif flag == "--scenario":
        victim = tmp_path / "s.yaml"
        victim.write_bytes(Path(str(scenario_file("tiny-cpu"))).read_bytes())
        argv = ["--scenario", str(victim)]
    else:
        victim = profile_file(tmp_path, "p.yaml")
        argv = ["--scenario", "tiny-cpu", "--profile", str(victim)]
    before = victim.read_bytes()
    assert main(["simulate", *argv, "--quiet", "--metrics-out", str(victim)]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-out {victim} is the same file as {flag} {victim}" in err, err
    assert "give --metrics-out another path" in err
    assert victim.read_bytes() == before


def test_a_replicas_metrics_file_over_an_input_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # With two replicas --metrics-out m.prom writes m-r0.prom and m-r1.prom.
    victim = tmp_path / "m-r1.prom"
    victim.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--replicas", "2", "--trace",
                 str(victim), "--quiet", "--metrics-out", str(tmp_path / "m.prom")]) == 2
    assert f"(writes {victim}) is the same file as --trace" in capsys.readouterr().err


_OPEN_LOOP = """  type: open_loop
  arrivals: {{process: poisson, rate: 3}}
  prompt_tokens: {prompt}
  output_tokens: {{dist: fixed, value: 8}}
  shift: {{at_s: 2, output_tokens: {shifted}}}
"""
_SESSIONS = """  type: sessions
  concurrency: 2
  question_tokens: {{dist: fixed, value: 64}}
  output_tokens: {{dist: fixed, value: 8}}
  long_context: {{fraction: 0.5, tokens: {long}}}
"""
_FROM_TRACE = "{dist: empirical, trace: t.csv, field: prompt_tokens}"
_FIXED = "{dist: fixed, value: 100}"


@pytest.mark.parametrize("workload", [
    _OPEN_LOOP.format(prompt=_FROM_TRACE, shifted=_FIXED),  # the review's
    _OPEN_LOOP.format(prompt=_FIXED, shifted=_FROM_TRACE),  # in a later phase
    _SESSIONS.format(long=_FROM_TRACE),                     # any length field
], ids=["prompt_tokens", "shift", "sessions-long-context"])
def test_metrics_out_over_a_trace_an_empirical_length_reads_is_refused(
        tmp_path: Path, workload: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The scenario reads t.csv for its lengths alone (not a trace workload): only a trace
    # workload's file and the profile were inputs, and --metrics-out t.csv overwrote it.
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("slopilot.engine.sim.simulator.simulate", never)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1,300,20\n")
    scenario = tmp_path / "emp.yaml"
    scenario.write_text("name: emp\ngpu: A100\nmodel: llama-3-8b\nduration_s: 5\n"
                        f"workload:\n{workload}")
    before = trace.read_bytes()
    assert main(["simulate", "--scenario", str(scenario), "--quiet",
                 "--metrics-out", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"is the same file as --scenario {scenario} (reads {trace})" in err, err
    assert trace.read_bytes() == before


def test_dispatch_overrides_the_scenarios_policy(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from slopilot.engine.sim.dispatch import Dispatch

    scenario = load_scenario("tiny-cpu")
    figures = {}
    for policy in (None, *Dispatch):
        flag = [] if policy is None else ["--dispatch", policy.value]
        assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "20", "--replicas",
                     "3", "--quiet", "--json", *flag]) == 0
        figures[policy] = json.loads(capsys.readouterr().out)["ttft_mean_ms"]
    for policy in Dispatch:
        run = simulate(dataclasses.replace(scenario, dispatch=policy), duration_s=20,
                       replicas=3)
        assert figures[policy] == pytest.approx(run.summary.to_dict()["ttft_mean_ms"])
    assert figures[None] == figures[Dispatch.RANDOM]  # the default, as tiny-cpu says none
    assert len({figures[p] for p in Dispatch}) == 3


def test_an_unknown_dispatch_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--scenario", "tiny-cpu", "--dispatch", "least_loaded"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dispatch: least_loaded: unknown dispatch policy; use one of: random, " \
           "round_robin, least_requests" in err
