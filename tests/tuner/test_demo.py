"""``slopilot demo`` end to end as a user runs it: its own process, a short run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.local.demo import DemoOptions, live_probe
from slopilot.tuner.tune.stop import EXIT_INTERRUPTED
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.processes import spawned_workers_cpu_ticks
from tests.support.waits import HANG_GUARD_S, progress_timeout_s, wait_for

TINY_CONFIG = {  # tiny-random's config.json (engine/models.py): a checkpoint that loads
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 494,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 2, "torch_dtype": "float32"}


def _demo_command(*args: str) -> list[str]:
    # A replica or Prometheus slow to start on a loaded machine is waited for up to the
    # suite's hang guard, not the demo's 60 s; one that exits still fails at once.
    return [sys.executable, "-m", "slopilot.cli", "demo", "--ready-timeout",
            str(HANG_GUARD_S), *args]


# Lines as printed, not wrapped: rich wraps a pipe's output at 80 columns.
_WIDE = {**os.environ, "COLUMNS": "400"}


def _demo_lines(out: Path) -> list[str]:
    return out.read_text(errors="replace").splitlines() if out.exists() else []


def _alert_and_trial_seen(lines: list[str]) -> bool:
    alert = any("ALERT firing: " in line and "SlopilotTBTP99High[p0" in line
                for line in lines)
    trial = any("] TRIAL " in line and " on canary" in line for line in lines)
    return alert and trial


def _demo_progress(demo: subprocess.Popen[bytes], out: Path) -> tuple[int, int]:
    """What moves while the demo works: its lines, and its simulator worker's CPU (the
    warm-start study before the first trial prints nothing for minutes on a busy
    machine). Its replicas and load generator are left out: they run on in a hang too."""
    return len(_demo_lines(out)), spawned_workers_cpu_ticks(demo.pid)


def _demo_state(demo: subprocess.Popen[bytes], out: Path) -> str:
    lines, ticks = _demo_progress(demo, out)
    return (f"{lines} lines; its simulator worker ran {ticks} clock ticks\n"
            + "\n".join(_demo_lines(out)))


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
# Its waits re-arm on each line and on the simulator worker's CPU, so a guard bounds a
# stall, not the run: pytest's limit covers a guard for each phase that can take long
# on a busy machine (the replicas' start, Prometheus's, the alert, the warm-start study,
# the trial, the end after Ctrl-C), so a hung one still fails with its own message.
@pytest.mark.timeout(progress_timeout_s(6))
def test_demo_shows_the_alert_a_trial_and_writes_the_report(tmp_path: Path) -> None:
    """Run until the P0 TBT alert and a canary trial have printed, however long this
    machine takes while the demo moves (the suite's hang guard bounds only a stall: no
    new line and no simulator CPU for a whole guard), then stopped as a user stops
    it: Ctrl-C ends the loop and the report of the run so far is written. ``--duration``
    is the longest there is, so it never decides the verdict (a 60 s run once ended on a
    busy 2-core machine before its trial).

    ``--max-replicas`` is ``--replicas``: with a replica to add, whether the controller
    retunes (a trial) or scales turns on its twin check, which a busy machine's late
    simulated-GPU steps can sway; at the maximum a retune is its only remedy."""
    report_dir = tmp_path / "report"
    out = tmp_path / "out.txt"
    # A relative report directory, as the default one is: every process the demo starts
    # (replicas, Prometheus in its own working directory) must still find its files.
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            _demo_command("--duration", "3600", "--shift-at", "15", "--replicas", "2",
                          "--max-replicas", "2", "--report-dir", "report"),
            stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path, env=_WIDE)
    try:
        wait_for(lambda: _alert_and_trial_seen(_demo_lines(out)) or demo.poll() is not None,
                 "the demo to print the P0 TBT alert and a trial on the canary",
                 interval_s=0.5, diagnose=lambda: _demo_state(demo, out),
                 progress=lambda: _demo_progress(demo, out))
        assert demo.poll() is None, f"exit {demo.returncode}:\n{out.read_text()}"
        demo.send_signal(signal.SIGINT)
        wait_for(lambda: demo.poll() is not None, "the demo to end after Ctrl-C",
                 interval_s=0.5, diagnose=lambda: _demo_state(demo, out),
                 progress=lambda: _demo_progress(demo, out))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    text = out.read_text()
    assert demo.returncode == EXIT_INTERRUPTED, text
    assert "STOPPED (Ctrl-C)" in text, text
    assert (report_dir / "report.md").is_file() and (report_dir / "timeline.png").is_file()
    assert "report written" in text and "report.md" in text, text


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
# One wait, re-armed on each line and the simulator worker's CPU (as above): pytest's
# limit covers a guard for the replicas' start, Prometheus's, a study and the report.
@pytest.mark.timeout(progress_timeout_s(4))
def test_a_demo_that_runs_its_duration_out_exits_0_with_its_report(tmp_path: Path) -> None:
    """The normal end: the load runs out at ``--duration`` and the report is written.
    Only what any machine's speed must give: not an alert nor a trial (a slow start may
    leave the loop no tick at all, and then no timeline to draw). The run is waited for
    while it moves, not for a fixed total: on a busy machine its starts, a study and
    the report together can take longer than one hang guard."""
    report_dir = tmp_path / "report"
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("wb") as sink, err.open("wb") as errors:
        demo = subprocess.Popen(_demo_command("--duration", "20", "--report-dir", "report"),
                                stdout=sink, stderr=errors, cwd=tmp_path, env=_WIDE)
    try:
        wait_for(lambda: demo.poll() is not None, "the demo to run its duration out",
                 interval_s=0.5, diagnose=lambda: _demo_state(demo, out),
                 progress=lambda: _demo_progress(demo, out))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    out_text = out.read_text(errors="replace")
    assert demo.returncode == 0, out_text + err.read_text(errors="replace")
    assert "STOPPED" not in out_text and "report written" in out_text, out_text
    report = (report_dir / "report.md").read_text()
    assert ("timeline.png" in report) is (report_dir / "timeline.png").is_file(), report


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 5, "max_replicas": 4}, "1 <= replicas <= max-replicas"),
    ({"duration_s": 5}, "--duration 5"),
    ({"executor": "gpu"}, "--executor 'gpu': use one of simulated, torch"),
    ({"model": "tiny-random"}, "add --executor torch"),
    ({"duration_s": 60, "shift_at_s": 60}, "--shift-at 60: .* less than --duration 60"),
    ({"shift_at_s": -1}, "--shift-at -1: expected 0 or more seconds"),
    ({"seed": -1}, "--seed -1: expected a whole number >= 0"),
    # Optuna's samplers take 32-bit seeds; a larger one failed after the replicas started.
    ({"seed": 2**32}, "--seed 4294967296: expected a whole number >= 0 and at most 4294967295"),
    ({"report_dir": Path(__file__)}, "--report-dir .*: is a file, not a folder"),
    # Thousands of replica processes were accepted and started one by one.
    ({"replicas": 500, "max_replicas": 100000},
     r"--replicas 500 --max-replicas 100000: this machine has \d+ CPU.*give --replicas "
     r"and --max-replicas \d+ or fewer"),
    ({"max_replicas": 100000}, r"--max-replicas 100000: .* at most \d+ simulated replicas"
                               r".*give --max-replicas \d+ or fewer"),
    ({"executor": "torch", "max_replicas": 100000}, r"at most \d+ torch replicas"),
    ({"ready_timeout_s": 0}, r"--ready-timeout 0: expected seconds > 0"),
    ({"ready_timeout_s": float("inf")}, r"--ready-timeout inf: expected seconds > 0"),
    ({"ready_timeout_s": float("nan")}, r"--ready-timeout nan: expected seconds > 0"),
])
def test_bad_demo_options_say_what_to_fix(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DemoOptions(**kwargs)  # type: ignore[arg-type]


def test_bad_demo_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    assert main(["demo", "--replicas", "0"]) == 2
    assert "replicas" in capsys.readouterr().err
    # The shift must come within the run: the default --duration is 240 s.
    assert main(["demo", "--shift-at", "240"]) == 2
    assert "--shift-at 240: expected 0 or more seconds, less than --duration 240" in \
        capsys.readouterr().err


def test_the_replica_bound_follows_the_machine_and_admits_the_defaults() -> None:
    from slopilot.tuner.local.demo import local_replica_limit

    assert local_replica_limit("simulated", cpus=1) == 4  # the defaults run anywhere
    assert local_replica_limit("simulated", cpus=16) == 32
    assert local_replica_limit("torch", cpus=1) == 4
    assert local_replica_limit("torch", cpus=16) == 16


@pytest.mark.parametrize(("report_dir", "message"), [
    # '' was Path('.'): the demo wrote its report and run folder into the current one.
    ("", "--report-dir '': empty"),
    ("   ", "--report-dir '   ': empty"),
    # /proc takes no folder: run_demo's mkdir raised FileNotFoundError with a traceback.
    ("/proc/slopilot-demo-test", "--report-dir /proc/slopilot-demo-test: cannot create"),
])
def test_a_report_folder_that_cannot_be_made_is_refused_before_anything_starts(
        report_dir: str, message: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main
    from slopilot.tuner.local import demo

    if report_dir.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")

    def must_not_run(*_: object) -> demo.DemoResult:
        raise AssertionError("the demo started")

    monkeypatch.setattr(demo, "run_demo", must_not_run)
    with contextlib.suppress(SystemExit):  # argparse's refusal exits 2 itself
        assert main(["demo", "--report-dir", report_dir]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err


def test_the_demo_twin_runs_on_a_given_profile(tmp_path: Path) -> None:
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.engine.sim.twin import twin_label
    from slopilot.tuner.local.demo import NAME, twin_scenario
    from tests.support.profiles import profile_file

    scenario = load_scenario(NAME)
    assert twin_scenario(scenario, DemoOptions()) is scenario
    # Simulated replicas: the profile is for the scenario's model.
    llama = profile_file(tmp_path, "llama.yaml")
    twin = twin_scenario(scenario, DemoOptions(profile=llama))
    assert twin_label(twin) == f"calibrated profile {llama}" and twin.slo == scenario.slo
    # Torch replicas: the twin models the served model, so the profile must match it.
    smol = profile_file(tmp_path, "smol.yaml", model="smollm2-135m", device="cpu")
    torch = {"executor": "torch"}
    twin = twin_scenario(scenario, DemoOptions(**torch, model="smollm2-135m", profile=smol))
    assert twin.model == "SmolLM2-135M" and twin.profile is not None
    with pytest.raises(ValueError, match="calibrated for model 'SmolLM2-135M', not "
                                         "'tiny-random'"):
        twin_scenario(scenario, DemoOptions(**torch, model="tiny-random", profile=smol))
    gpu = profile_file(tmp_path, "gpu.yaml", model="smollm2-135m", device="cuda")
    with pytest.raises(ValueError, match="calibrated on a cuda device"):
        twin_scenario(scenario, DemoOptions(**torch, profile=gpu))


def test_the_demo_twin_spreads_arrivals_in_turn_as_its_load_generator_does() -> None:
    """The load generator posts to the replicas round robin (``loadgen.py``): the twin
    that plans the demo's trials and scale-ups must not assume the Service's random
    spread, nor a load-aware one, even for a --scenario that says otherwise."""
    import dataclasses

    from slopilot.engine.sim.dispatch import Dispatch
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.local.demo import twin_scenario

    for name in ("demo", "tiny-cpu"):
        scenario = load_scenario(name)
        for policy in Dispatch:
            given = dataclasses.replace(scenario, dispatch=policy)
            assert twin_scenario(given, DemoOptions()).dispatch is Dispatch.ROUND_ROBIN


def test_torch_replicas_serve_with_the_kernels_their_profile_was_timed_with(
        tmp_path: Path) -> None:
    import dataclasses

    from slopilot.engine.sim.profile_file import DeviceInfo, write_profile
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.local.demo import replica_kernels, twin_scenario
    from tests.support.profiles import make_profile

    scenario = load_scenario("demo-torch")
    torch = {"executor": "torch", "model": "smollm2-135m"}
    for kernels, served in (("torch", "torch"), ("native", "native"), (None, "auto")):
        profile = dataclasses.replace(
            make_profile("smollm2-135m", device="cpu"),
            device=DeviceInfo("cpu", "Test CPU", 2, None, kernels))
        path = write_profile(profile, tmp_path / f"{kernels}.yaml")
        opts = DemoOptions(**torch, profile=path)  # type: ignore[arg-type]
        assert replica_kernels(twin_scenario(scenario, opts), opts) == served
    # Without a profile, or with simulated replicas, the replicas choose as serve does.
    assert replica_kernels(scenario, DemoOptions(**torch)) == "auto"  # type: ignore[arg-type]


def test_a_torch_demo_without_a_profile_says_its_twin_is_a_gpu_prior(tmp_path: Path) -> None:
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.engine.sim.twin import twin_label
    from slopilot.tuner.local.demo import twin_caveat, twin_scenario

    opts = DemoOptions(executor="torch", model="tiny-random")
    assert opts.scenario_name == "demo-torch" and DemoOptions().scenario_name == "demo"
    twin = twin_scenario(load_scenario(opts.scenario_name), opts)
    assert twin.model == "tiny-random"  # the served model, on the scenario's GPU prior
    assert twin_label(twin) == "uncalibrated datasheet roofline (A100-80GB, tp=1)"
    assert "not this CPU" in twin_caveat(twin, opts)
    assert "slopilot calibrate --model tiny-random" in twin_caveat(twin, opts)
    assert twin_caveat(twin, DemoOptions()) == ""
    unknown = tmp_path / "unknown-llm"  # a checkpoint there, of no shape the twin knows
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps(TINY_CONFIG))
    with pytest.raises(ValueError, match="no shape for this checkpoint"):
        twin_scenario(load_scenario("demo-torch"),
                      DemoOptions(executor="torch", model=str(unknown)))


def test_demo_flags_pick_the_executor_and_its_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.cli import main
    from slopilot.tuner.local import demo

    got: list[DemoOptions] = []

    def fake_run(opts: DemoOptions, console: object) -> demo.DemoResult:
        got.append(opts)
        return demo.DemoResult(report=Path("r.md"))

    monkeypatch.setattr(demo, "run_demo", fake_run)
    assert main(["demo"]) == 0
    assert main(["demo", "--executor", "torch"]) == 0
    assert main(["demo", "--model", "tiny-random", "--replicas", "2"]) == 0
    assert main(["demo", "--duration", "60", "--shift-at", "5"]) == 0
    assert main(["demo", "--executor", "torch", "--ready-timeout", "900"]) == 0
    simulated, torch, tiny, shifted, patient = got
    # How long a replica and Prometheus may take to answer at start: the executor's
    # default, or what --ready-timeout gives both.
    assert (simulated.replica_ready_timeout_s, torch.replica_ready_timeout_s,
            simulated.prometheus_ready_timeout_s) == (60, 180, 30)
    assert (patient.replica_ready_timeout_s, patient.prometheus_ready_timeout_s) == (900, 900)
    assert (simulated.executor, simulated.replicas, simulated.duration_s) == ("simulated", 2, 240)
    assert (simulated.shift_s, torch.shift_s, shifted.shift_s) == (120, 360, 5)
    assert (torch.executor, torch.served_model, torch.replicas, torch.max_replicas,
            torch.duration_s, torch.window_s) == ("torch", "smollm2-135m", 1, 1, 720, 60)
    assert (tiny.executor, tiny.served_model, tiny.replicas, tiny.max_replicas) == (
        "torch", "tiny-random", 2, 2)


def test_demo_refuses_a_model_for_the_simulated_executor(
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    assert main(["demo", "--executor", "simulated", "--model", "tiny-random"]) == 2
    assert "add --executor torch" in capsys.readouterr().err


def test_demo_refuses_a_bad_profile_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    assert main(["demo", "--profile", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_stale_profile_is_a_warning_line_of_the_demo_not_a_python_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # simulate and tune say "slopilot simulate: warning: ..." for a profile fitted on an
    # older form; the demo let Python print its StaleProfileWarning with a source line.
    import warnings

    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.local.demo import NAME, twin_scenario
    from tests.support.profiles import profile_file

    stale = profile_file(tmp_path, "old.yaml", form_version=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twin_scenario(load_scenario(NAME), DemoOptions(profile=stale))
    err = capsys.readouterr().err
    assert "slopilot demo: warning: " in err and "form" in err


@pytest.mark.parametrize("window_s", [10.0, 60.0, 12.6])
def test_the_twin_is_checked_on_the_workload_of_the_window_it_is_held_against(
        window_s: float) -> None:
    # The twin check sets the probe's workload against the controller's window: a longer
    # probe window right after the shift held mostly the old prompts (20 s against 10).
    # Whole seconds as the windows themselves are read, as the operator's (daemon.py):
    # rounded, a 12.6 s window was probed over 13 s and judged over 12.
    from slopilot.tuner.prometheus.adapters import range_s

    probe = live_probe("http://127.0.0.1:9", {"slopilot_deployment": "demo"},
                       load_scenario("demo"), DemoOptions(window_s=window_s))
    assert probe.window_s == range_s(1000.0 - window_s, 1000.0)


def test_the_demo_without_prometheus_probes_the_scraped_workload(tmp_path: Path) -> None:
    """Without Prometheus the demo's probe was the base scenario, whose first seconds
    are the pre-shift load: every twin check, warm start and capacity plan after the
    shift simulated ~512-token prompts while the replicas served ~2048-token ones."""
    import contextlib

    from rich.console import Console

    from slopilot.engine.metrics import EngineMetrics
    from slopilot.tuner.local.demo import _start_metrics
    from slopilot.tuner.local.demo_story import Narrator
    from slopilot.tuner.local.scrape import DirectScrape
    from tests.support.prometheus import serve_metrics
    from tests.support.served_workload import Pages, prompt_mean, serve

    metrics, pages = EngineMetrics("demo"), Pages()
    serve(metrics, 300, 512)
    scenario = load_scenario("demo")
    with serve_metrics(lambda: pages.page) as address, contextlib.ExitStack() as stack:

        class Replicas:  # what the sources read of LocalDeployment: its endpoints
            def endpoints(self) -> list[str]:
                return [f"http://{address}"]

        opts = DemoOptions(prometheus=False, window_s=10.0, report_dir=tmp_path / "r")
        sources = _start_metrics(opts, scenario, scenario, Replicas(),  # type: ignore[arg-type]
                                 tmp_path, stack, Narrator(Console(quiet=True), []))
        scrape = sources.windows
        assert isinstance(scrape, DirectScrape)
        pages.take(metrics)
        scrape.poll(now=100.0)
        serve(metrics, 40, 2048, seed=1)  # the shift
        pages.take(metrics)
        scrape.poll(now=110.0)
        measured = sources.probe.measure(110.0)
    assert prompt_mean(measured) == pytest.approx(2048, rel=0.25)
    assert measured.duration_s == 30.0  # the probe the Prometheus wiring has (live_probe)


def test_a_demo_told_not_to_run_prometheus_says_so(tmp_path: Path) -> None:
    # It said "no prometheus binary on PATH" of a Prometheus that --no-prometheus left off.
    import contextlib

    from rich.console import Console

    from slopilot.tuner.local.demo import _start_metrics
    from slopilot.tuner.local.demo_story import Narrator

    class Replicas:  # what the direct scrape reads of LocalDeployment: its endpoints
        def endpoints(self) -> list[str]:
            return []

    lines: list[str] = []
    scenario = load_scenario("demo")
    with contextlib.ExitStack() as stack:
        _start_metrics(DemoOptions(prometheus=False, window_s=10.0,
                                   report_dir=tmp_path / "r"), scenario, scenario,
                       Replicas(), tmp_path, stack,  # type: ignore[arg-type]
                       Narrator(Console(quiet=True), lines))
    assert any("Prometheus turned off (--no-prometheus)" in line for line in lines), lines
    assert not any("no prometheus binary" in line for line in lines), lines


@pytest.mark.parametrize("where", ["report.md", "run/p.yaml"])
def test_a_profile_the_report_would_overwrite_is_refused_before_anything_starts(
        tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main
    from slopilot.tuner.local import demo
    from tests.support.profiles import profile_file

    def must_not_run(*_: object) -> demo.DemoResult:
        raise AssertionError("the demo started")

    monkeypatch.setattr(demo, "run_demo", must_not_run)
    profile = tmp_path / where
    profile.parent.mkdir(exist_ok=True)
    profile_file(profile.parent, profile.name)
    before = profile.read_bytes()
    assert main(["demo", "--report-dir", str(tmp_path), "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert f"--report-dir {tmp_path}" in err and f"--profile {profile}" in err, err
    assert "give --report-dir another folder" in err
    assert profile.read_bytes() == before


@pytest.mark.parametrize("with_profile", [False, True])
def test_a_model_that_is_not_there_is_said_to_be_missing_first(
        tmp_path: Path, with_profile: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # It said "the twin has no shape for this checkpoint; calibrate it (`slopilot
    # calibrate --model /nonexistent ...`)", a command that fails on the same path; with
    # --profile, that the profile was not calibrated for model '/nonexistent'.
    from slopilot.cli import main
    from slopilot.tuner.local import demo
    from tests.support.profiles import profile_file

    def must_not_run(*_: object) -> demo.DemoResult:
        raise AssertionError("the demo started")

    monkeypatch.setattr(demo, "run_demo", must_not_run)
    missing = str(tmp_path / "nonexistent")
    extra = (["--profile", str(profile_file(tmp_path, "p.yaml", model="smollm2-135m",
                                           device="cpu"))] if with_profile else [])
    assert main(["demo", "--model", missing, "--report-dir", str(tmp_path / "r"),
                 *extra]) == 2
    err = capsys.readouterr().err
    assert f"--model {missing}: no such model directory or name" in err, err
    assert "calibrate" not in err and "tiny-random" in err  # the names it takes


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "said"), [("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM")])
def test_a_demo_stopped_mid_run_writes_the_report_of_the_run_so_far(
        tmp_path: Path, sig: str, said: str) -> None:
    """Ctrl-C or SIGTERM mid-run (a real signal, sent once the loop has ticked) stops the
    replicas and still writes the report and the timeline of what ran, said to be cut
    short; it used to exit with nothing written."""
    import os
    import signal

    from rich.console import Console

    from slopilot.tuner.local.demo import run_demo

    ticks: list[float] = []

    def stop(result: object, dep: object) -> bool:
        ticks.append(1.0)
        if len(ticks) == 2:
            os.kill(os.getpid(), getattr(signal, sig))
        return False

    report_dir = tmp_path / "report"
    before = signal.getsignal(signal.SIGTERM)
    opts = DemoOptions(prometheus=False, duration_s=60, report_dir=report_dir, until=stop,
                       ready_timeout_s=HANG_GUARD_S)
    result = run_demo(opts, Console(quiet=True))
    assert signal.getsignal(signal.SIGTERM) == before  # the handler put back
    assert result.stopped_at_s is not None and result.stopped_by == said
    assert result.report_written and len(ticks) == 2
    report = (report_dir / "report.md").read_text()
    assert (report_dir / "timeline.png").is_file()
    assert f"STOPPED by {said}" in report, report


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_once_the_loop_is_over_waits_for_the_report_and_a_second_ends_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals: int) -> None:
    """A SIGTERM while the report is written (the loop run out) lost a report all but
    written; now the first is recorded and the report written, a second ends the run."""
    import os
    import signal

    from rich.console import Console

    from slopilot.tuner.local import demo

    real = demo.write_demo_report

    def terminated_while_writing(*args: object, **kwargs: object) -> Path:
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(demo, "write_demo_report", terminated_while_writing)
    report_dir = tmp_path / "report"
    opts = DemoOptions(prometheus=False, duration_s=60, report_dir=report_dir,
                       until=lambda result, dep: True, ready_timeout_s=HANG_GUARD_S)
    result = demo.run_demo(opts, Console(quiet=True))
    assert result.stopped_by == "SIGTERM" and result.stopped_at_s is None
    assert result.report_written is (signals == 1)
    assert (report_dir / "report.md").is_file() is (signals == 1)


def test_a_stop_while_the_demo_starts_ends_it_without_a_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    from rich.console import Console

    from slopilot.tuner.local import demo
    from slopilot.tuner.local.demo_story import summary_lines

    def interrupted(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the stop should have ended the start")

    monkeypatch.setattr(demo, "_start_replicas", interrupted)
    report_dir = tmp_path / "report"
    result = demo.run_demo(DemoOptions(prometheus=False, duration_s=60,
                                       report_dir=report_dir), Console(quiet=True))
    assert result.stopped_by == "Ctrl-C" and not result.report_written
    assert not (report_dir / "report.md").exists()
    assert summary_lines(result) == [
        "stopped by Ctrl-C before the report was written: no report"]


@pytest.mark.parametrize("with_profile", [False, True])
def test_a_folder_that_is_no_checkpoint_is_said_so_first(
        tmp_path: Path, with_profile: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # It said "the twin has no shape for this checkpoint; calibrate it (`slopilot
    # calibrate --model DIR ...`)", and that calibrate answered "DIR/config.json is
    # missing": the checkpoint is checked before the twin's shape or profile.
    from slopilot.cli import main
    from slopilot.tuner.local import demo
    from tests.support.profiles import profile_file

    def must_not_run(*_: object) -> demo.DemoResult:
        raise AssertionError("the demo started")

    monkeypatch.setattr(demo, "run_demo", must_not_run)
    folder = tmp_path / "notackpt"
    folder.mkdir()
    extra = (["--profile", str(profile_file(tmp_path, "p.yaml", model="smollm2-135m",
                                           device="cpu"))] if with_profile else [])
    assert main(["demo", "--executor", "torch", "--model", str(folder), "--report-dir",
                 str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--model {folder}: {folder / 'config.json'} is missing" in err, err
    assert "calibrate" not in err and "profile" not in err, err
