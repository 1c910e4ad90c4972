"""``slopilot demo``: the closed loop on real processes, end to end, in a few minutes.

Local replicas (``LocalDeployment``), the real Prometheus with the deployment's rules
(short windows so it reacts in seconds) or, without the binary, a direct scrape of the
replicas, an open-loop load generator whose workload shifts half-way (longer prompts,
more P0), and the production ``Controller`` ticking every second. Every decision is
printed; at the end a report (trials, and a timeline of P99s, knobs and replicas
against the SLO) is written to the report directory.

The story (``scenarios/demo.yaml``): before the shift the relaxed config holds the SLO;
after it, 2k-token prompts in 2048-token chunks stall decodes, the TBT alert fires, the
simulator says other knobs hold the SLO on the same replicas, the canary tries them
and the best is committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from slopilot.engine.executors.kernel_modes import executor_modes
from slopilot.engine.models import ModelNotFoundError, check_model
from slopilot.engine.sim.dispatch import Dispatch
from slopilot.engine.sim.output_paths import check_output_dir
from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.engine.sim.twin import twin_label
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.local.demo_files import RUN_FOLDER, check_demo_files
from slopilot.tuner.local.demo_report import (
    Sample,
    TrialMark,
    demo_report_files,
    write_demo_report,
)
from slopilot.tuner.local.demo_stops import DemoStops, StopPhase, stop_name
from slopilot.tuner.local.demo_story import DemoResult, Narrator, RecordingAlerts, Story, p99s
from slopilot.tuner.local.deployment import READY_TIMEOUT_S, LocalDeployment
from slopilot.tuner.local.loadgen import LoadGenerator, Phase
from slopilot.tuner.local.machine_load import MachineLoad
from slopilot.tuner.local.prometheus_server import READY_TIMEOUT_S as PROMETHEUS_READY_S
from slopilot.tuner.local.prometheus_server import LocalPrometheus, find_prometheus
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.local.scrape_probe import ScrapeProbe
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.ports import (
    AlertReader,
    IterationSource,
    WindowEvaluator,
    WorkloadProbe,
)
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.prometheus.adapters import (
    MIN_WINDOW_REQUESTS,
    PrometheusProbe,
    PrometheusWindows,
)
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.iterations import PrometheusIterations
from slopilot.tuner.prometheus.profiling import probe_window_s
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, RuleOptions, render_rules_yaml
from slopilot.tuner.sim.adapters import SimOffline
from slopilot.tuner.sim.worker import SimWorker, WorkerOffline, WorkerPlanner, WorkerTwin
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.plot_subject import PlotSubject
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import SEED_MAX, open_study
from slopilot.tuner.tune.stop import Terminated

NAME = "demo"
# Seconds where production has minutes (the sustained-breach window: 5 rate windows).
RULES = RuleOptions(interval_s=1, rate_window_s=8, alert_for_s=3, tbt_periods=3,
                    breach_window_s=40)
MIN_CLASS_REQUESTS = 30
"""The requests of each judged class a demo trial is judged on, where a deployment's
default is 100 (``ControllerSettings.min_class_requests``): at the demo's 4 req/s a
trial gathers 100 P0 requests in about a minute, and its two windows and up to four
trials then outlast the four-minute run. Its commits rest on noisier P99s than a
deployment's; the report says so (``restore_rule``)."""
RESTORE_HOLD_S = 2.0 * RULES.rate_window_s
"""How long the SLO must hold, in rate windows wholly after a commit, before the demo
says it is restored (``demo_episodes.py``)."""


def restore_rule() -> str:
    """How the demo's verdicts are judged, in words, for the report."""
    w, n = RULES.rate_window_s, MIN_WINDOW_REQUESTS
    return (f"How these are judged. A commit rests on its trial's window; the finished "
            f"requests in brackets say how many its P99s are of (a window needs {n} to "
            "count; the P99 of fewer than 100 requests is one of their few largest, of "
            "fewer than 50 about their maximum). A trial is judged once each class it is "
            f"judged on has {MIN_CLASS_REQUESTS} requests, its windows extended until then "
            "(a deployment waits for 100: this short run would see no commit). "
            "\"SLO restored\" is said once every "
            f"class is within its SLO and no alert fires in each {w:g} s window (one a "
            f"tick) that starts after the commit took effect, for {RESTORE_HOLD_S:g} s of "
            f"such windows in a row, each on at least {n} finished requests with a sample "
            "of the classes the alert was about; a later such window that misses says "
            "\"SLO missed again\" and withdraws it.")


EXECUTORS = ("simulated", "torch")
REPLICA_READY_S = {"simulated": READY_TIMEOUT_S, "torch": 180.0}
"""How long a starting replica may take to answer /health by default: a torch one loads
its model (and builds its kernels on first use) first."""
TORCH_MODEL = "smollm2-135m"
UntilFn = Callable[[DemoResult, LocalDeployment], bool]


@dataclass(frozen=True)
class DemoOptions:
    replicas: int = 2
    max_replicas: int = 4
    executor: str = "simulated"
    """``simulated``: a GPU cost model in real time; ``torch``: real tokens on this CPU."""
    model: str | None = None
    """The torch executor's model (tiny-random, smollm2-135m or a checkpoint PATH);
    None: smollm2-135m. The simulated executor takes none."""
    scenario: str | None = None
    """The story's scenario (name or file: SLO, start knobs, twin); None: ``demo`` for the
    simulated executor, ``demo-torch`` (a CPU's SLO) for torch."""
    duration_s: float = 240.0
    report_dir: Path = Path("reports/demo")
    seed: int = 0
    tick_s: float = 1.0
    window_s: float = 10.0
    prometheus: bool | None = None
    """None: the real Prometheus when on PATH, else the direct scrape."""
    profile: Path | None = None
    """A calibrated cost profile for the controller's twin; None: the datasheet roofline."""
    shift_at_s: float | None = None
    """When the load shifts; None: half-way."""
    load: tuple[Phase, Phase] | None = None
    """The load before and after the shift; None: ``phases`` for the executor."""
    until: UntilFn | None = None
    """End before ``duration_s`` once this holds (checked every tick; the tests' stop)."""
    ready_timeout_s: float | None = None
    """How long each replica and Prometheus may take to answer at start (``--ready-timeout``);
    None: ``REPLICA_READY_S`` for the executor's replicas, Prometheus' own default. A
    process that exits fails the start at once whatever this is."""

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= self.max_replicas:
            raise ValueError(f"--replicas {self.replicas} --max-replicas {self.max_replicas}: "
                             "need 1 <= replicas <= max-replicas")
        if self.executor in EXECUTORS:
            self._check_replica_limit()
        if not 20 <= self.duration_s <= 3600:
            raise ValueError(f"--duration {self.duration_s:g}: expected 20 to 3600 seconds "
                             "(the shift comes half-way; 60 s shows an alert and a trial)")
        if not 0.2 <= self.tick_s <= 10 or not 4 <= self.window_s <= 120:
            raise ValueError("tick 0.2 to 10 s and window 4 to 120 s")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor {self.executor!r}: use one of {', '.join(EXECUTORS)}")
        if self.executor == "simulated" and self.model is not None:
            raise ValueError(f"--model {self.model}: the simulated executor serves the "
                             "scenario's cost model; add --executor torch to serve a model")
        if self.ready_timeout_s is not None and not 0 < self.ready_timeout_s < math.inf:
            raise ValueError(f"--ready-timeout {self.ready_timeout_s:g}: expected seconds > 0 "
                             "(how long a replica or Prometheus may take to answer at "
                             "start), e.g. 600 on a slow or busy machine")
        if self.shift_at_s is not None and not 0 <= self.shift_at_s < self.duration_s:
            raise ValueError(f"--shift-at {self.shift_at_s:g}: expected 0 or more seconds, "
                             f"less than --duration {self.duration_s:g}")
        # Checked here, not where they are used: the sampler takes the seed and the
        # report goes into its folder only after the replicas have started.
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
                or not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"--seed {self.seed}: expected a whole number >= 0 and at most "
                             f"{SEED_MAX}")
        check_output_dir(self.report_dir, "--report-dir", demo_report_files(self.report_dir))
        if self.model is not None:
            try:
                check_model(self.model)  # before the twin takes it for a model's name
            except ModelNotFoundError as exc:
                raise ValueError(f"--model {self.model}: {exc}") from None
            self._check_checkpoint(self.model)
        check_demo_files(self.report_dir, profile=self.profile, model=self.model,
                         scenario=self.scenario)

    @staticmethod
    def _check_checkpoint(model: str) -> None:
        """A folder given as the model holds a checkpoint the engine loads: checked before
        the twin's shape or a profile, whose errors would send the user to calibrate a
        folder that calibrate then refuses for its missing config.json."""
        folder = Path(model).expanduser()
        if not folder.is_dir():
            return  # a registered name: built on first use, from a config that loads
        from slopilot.engine.executors.loader import CheckpointError, read_config

        try:
            read_config(folder)
        except CheckpointError as exc:
            raise ValueError(f"--model {model}: {exc}") from None

    def _check_replica_limit(self) -> None:
        cpus = machine_cpus()
        limit = local_replica_limit(self.executor, cpus=cpus)
        over = [(flag, value) for flag, value in (("--replicas", self.replicas),
                                                   ("--max-replicas", self.max_replicas))
                if value > limit]
        if over:
            flags = " and ".join(flag for flag, _ in over)
            raise ValueError(
                f"{' '.join(f'{f} {v}' for f, v in over)}: this machine has {cpus} CPU(s), "
                f"which run at most {limit} {self.executor} replicas "
                f"({_PER_CPU_WHY[self.executor]}); give {flags} {limit} or fewer")

    @property
    def torch(self) -> bool:
        return self.executor == "torch"

    @property
    def served_model(self) -> str:
        return self.model or TORCH_MODEL

    @property
    def scenario_name(self) -> str:
        return self.scenario or ("demo-torch" if self.torch else NAME)

    @property
    def replica_ready_timeout_s(self) -> float:
        return self.ready_timeout_s or REPLICA_READY_S[self.executor]

    @property
    def prometheus_ready_timeout_s(self) -> float:
        return self.ready_timeout_s or PROMETHEUS_READY_S

    @property
    def shift_s(self) -> float:
        return self.duration_s / 2 if self.shift_at_s is None else self.shift_at_s


_PER_CPU = {"simulated": 2, "torch": 1}
_PER_CPU_WHY = {
    "simulated": "2 per CPU: each replica paces its simulated GPU in real time on the CPU, "
                 "and a late step reads as a slow GPU",
    "torch": "1 per CPU: each replica runs its model's forward passes on the CPU"}


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_replica_limit(executor: str, *, cpus: int) -> int:
    """How many replicas of ``executor`` one machine of ``cpus`` runs: a share of a CPU
    each, and never fewer than the default ``max_replicas`` (4), which a one-CPU laptop
    runs slowly but runs."""
    return max(4, _PER_CPU[executor] * cpus)


def make_report_dir(report_dir: Path) -> Path:
    """The report folder and its ``run`` folder, made now: one that cannot be made (a
    read-only or special file system such as /proc, which the writable check passes as
    root) is a ValueError naming the flag, not a traceback from the run."""
    work = report_dir / RUN_FOLDER
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--report-dir {report_dir}: cannot create {work}: "
                         f"{exc.strerror or exc}; give a folder you can write on a disk, "
                         "e.g. reports/demo") from None
    return work


# What a torch demo defaults to where the simulated one's defaults would not work on a
# CPU: one replica (a SmolLM2 forward pass takes 0.1-0.3 s here; two replicas would share
# the cores and slow each other down), a window long enough for 8 requests at
# 0.15 req/s, and time after the half-way shift for the alert and four such trials.
TORCH_DEFAULTS = {"replicas": 1, "max_replicas": 1, "duration_s": 720.0, "window_s": 60.0}


def run_label(opts: DemoOptions, started: float) -> str:
    """Which demo run a plot is from: its options as flags and when it started (UTC); a
    live run in real time is not reproduced by its command, so the time names it."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    served = f"--model {opts.served_model} " if opts.torch else ""
    profile = f"--profile {opts.profile.name} " if opts.profile is not None else ""
    return (f"slopilot demo --executor {opts.executor} {served}{profile}--replicas "
            f"{opts.replicas} --duration {opts.duration_s:g} --seed {opts.seed}, "
            f"started {when}")


def twin_scenario(scenario: Scenario, opts: DemoOptions) -> Scenario:
    """The scenario the controller's twin simulates: on ``opts.profile`` when given.

    With torch replicas the twin models the served model, so the profile must be for
    it; with simulated replicas, for the scenario's model. A torch twin without a
    profile is the scenario's datasheet GPU running the served model: a prior, not
    this CPU (``twin_caveat`` says so). Whatever the scenario says, the twin spreads
    arrivals in turn, as the demo's load generator sends them (``loadgen.py``).
    """
    if scenario.dispatch is not Dispatch.ROUND_ROBIN:
        scenario = dataclasses.replace(scenario, dispatch=Dispatch.ROUND_ROBIN)
    if opts.profile is None:
        if not opts.torch:
            return scenario
        from slopilot.engine.sim.profiles import ProfileError, get_model

        try:
            model = get_model(opts.served_model).name
        except ProfileError:
            raise ValueError(
                f"--model {opts.served_model}: the twin has no shape for this checkpoint; "
                f"calibrate it (`slopilot calibrate --model {opts.served_model} --out F`) "
                "and pass --profile F") from None
        return dataclasses.replace(scenario, model=model)
    from slopilot.engine.sim.commands import load_profile_noting
    from slopilot.engine.sim.profile_file import check_profile_for
    from slopilot.engine.sim.twin import with_profile

    profile = load_profile_noting(opts.profile, "demo")
    if opts.torch:
        check_profile_for(profile, model=opts.served_model, device="cpu")
        scenario = dataclasses.replace(scenario, model=profile.model.name)
    return with_profile(scenario, profile)


def replica_kernels(twin: Scenario, opts: DemoOptions) -> str:
    """What torch replicas run a step's non-GEMM ops on (``serve --cpu-kernels``): the
    kernels the twin's profile was timed with, so that the twin and the replicas it
    predicts run the same code; ``auto``, as serve chooses, when the profile does not
    say (or there is none)."""
    if opts.torch and twin.profile is not None:
        return executor_modes(twin.profile.device.kernels)[0]
    return "auto"


def twin_caveat(twin: Scenario, opts: DemoOptions) -> str:
    """What the twin's label leaves unsaid: a torch demo's uncalibrated twin is a GPU."""
    if not opts.torch or twin.profile is not None:
        return ""
    return (f" (a datasheet GPU, not this CPU: its warm starts and capacity plans are a "
            f"prior and the live trials decide; for a twin of this CPU run `slopilot "
            f"calibrate --model {opts.served_model} --out F` and pass --profile F)")


def phases(torch: bool, replicas: int) -> tuple[Phase, Phase]:
    """Before and after the shift (as in ``demo.yaml`` and ``demo-torch.yaml``); a CPU
    torch model takes far less load."""
    if torch:
        return (Phase(0.15 * replicas, 32, 16, {"p0": 0.1, "p1": 0.7, "p2": 0.2}, 0.5, 64),
                Phase(0.15 * replicas, 256, 16, {"p0": 0.4, "p1": 0.5, "p2": 0.1}, 0.5, 512))
    rate = 2.0 * replicas
    return (Phase(rate, 512, 64, {"p0": 0.1, "p1": 0.7, "p2": 0.2}, 0.7, 4096),
            Phase(rate, 2048, 64, {"p0": 0.4, "p1": 0.5, "p2": 0.1}, 0.7, 4096))


@dataclass(frozen=True)
class _Sources:
    """Where the loop reads alerts, trial windows and the workload, and the timeline its
    figures (a lenient evaluator: every window counts)."""

    alerts: AlertReader
    windows: WindowEvaluator
    probe: WorkloadProbe
    timeline: WindowEvaluator
    iterations: IterationSource | None = None
    """Where the twin is checked: the iteration series, from Prometheus or the scrape."""


def run_demo(opts: DemoOptions, console: Console) -> DemoResult:
    """The demo's run. Ctrl-C or SIGTERM (``demo_stops.py``) during its loop ends the
    loop and the report of the run so far is written; while it starts, or a second time
    while it finishes, it ends the run without a report. Either way it returns, with
    ``stopped_by`` and ``report_written`` saying which; the replicas are stopped."""
    result = DemoResult(report=opts.report_dir / "report.md")
    with DemoStops() as stops:
        try:
            _run_demo(opts, console, result, stops)
        except (KeyboardInterrupt, Terminated) as stop:
            result.stopped_by = result.stopped_by or stop_name(stop)
            return result
    result.stopped_by = result.stopped_by or stops.first
    return result


def _run_demo(opts: DemoOptions, console: Console, result: DemoResult,
              stops: DemoStops) -> None:
    import optuna

    # The demo prints its own story; Optuna's per-study INFO lines would interleave it.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.time()
    scenario = load_scenario(opts.scenario_name)
    twin = twin_scenario(scenario, opts)
    work = make_report_dir(opts.report_dir)
    say = Narrator(console, result.lines)
    machine = MachineLoad(os.getpid())
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(SimWorker())  # spawns while the replicas start
        dep = _start_replicas(opts, scenario, twin, work, stack, say)
        say(f"the controller's twin: {twin_label(twin)}{twin_caveat(twin, opts)}")
        sources = _start_metrics(opts, scenario, twin, dep, work, stack, say)
        tuner = ResumableTuner(open_study(None, f"{NAME}-live", seed=opts.seed),
                               SearchSpace.from_bounds(base=scenario.engine_config()))
        recorded = RecordingAlerts(sources.alerts)
        ctl = _controller(opts, scenario, dep, recorded, sources, tuner, worker)
        before, after = opts.load or phases(opts.torch, opts.replicas)
        # A CPU request waits tens of seconds in a queue and takes more to decode.
        load = stack.enter_context(LoadGenerator(dep.endpoints, before, model=NAME,
                                                 seed=opts.seed,
                                                 timeout_s=300.0 if opts.torch else 60.0))
        say(f"load: Poisson {before.rate:g} req/s, prompts ~{before.prompt_mean:g} tokens, "
            f"P0 {before.classes['p0']:.0%}; the shift comes at t+{opts.shift_s:g}s")
        stops.phase = StopPhase.LOOP
        samples = _control_loop(opts, ctl, dep, recorded, sources.timeline, load, after, say,
                                result, machine, stops.deliver)
        stops.finishing()
        load.stop()
        say(f"load stopped: {load.sent} sent: {load.ok} ok, {load.failed} failed, "
            f"{load.dropped} dropped at the concurrency limit, {load.cancelled} still "
            "running when the load stopped (cancelled)")
    result.machine, result.machine_busy = machine.lines(), bool(machine.busy_spans())
    write_demo_report(result.report, tuner, scenario.slo, samples, result.lines,
                      shift_at_s=opts.shift_s, twin=result.twin,
                      subject=PlotSubject.of(twin, run=run_label(opts, started)),
                      result=result, rule=restore_rule(), busy=machine.busy_spans())
    result.report_written = True
    say(f"report written: {result.report} (timeline: {opts.report_dir / 'timeline.png'})")


def _start_replicas(opts: DemoOptions, scenario: Scenario, twin: Scenario, work: Path,
                    stack: contextlib.ExitStack, say: Narrator) -> LocalDeployment:
    kernels = replica_kernels(twin, opts)
    dep = stack.enter_context(LocalDeployment(
        NAME, work, replicas=opts.replicas, max_replicas=opts.max_replicas,
        scenario=opts.scenario_name, executor=opts.executor, model=opts.served_model,
        knobs=scenario.engine, ready_timeout_s=opts.replica_ready_timeout_s,
        cpu_kernels=kernels, slo=scenario.slo))
    kind = (f"torch {opts.served_model} on the CPU, --cpu-kernels {kernels}" if opts.torch
            else f"simulated {scenario.gpu} + {scenario.model} cost model, real time")
    say(f"{opts.replicas} replica(s) up ({kind}): {', '.join(dep.endpoints())}; "
        f"canary {dep.endpoints()[0]}")
    return dep


def _start_metrics(opts: DemoOptions, scenario: Scenario, twin: Scenario,
                   dep: LocalDeployment, work: Path, stack: contextlib.ExitStack,
                   say: Narrator) -> _Sources:
    """The real Prometheus with the deployment's rules, or a direct scrape without it;
    the probe simulates ``twin`` (the scenario on the calibrated profile, when given)."""
    use_prom = find_prometheus() is not None if opts.prometheus is None else opts.prometheus
    if not use_prom:
        scrape = DirectScrape(dep.endpoints, scenario.slo, RULES).start()
        stack.callback(scrape.stop)
        why = ("Prometheus turned off (--no-prometheus)" if opts.prometheus is False
               else "no prometheus binary on PATH")
        say(f"{why}: using a direct scrape of the replicas' /metrics "
            "(same alert conditions, window figures and workload profile)")
        probe = ScrapeProbe(scrape, twin, window_s=probe_window_s(opts.window_s),
                            duration_s=PROBE_DURATION_S)
        return _Sources(scrape, scrape, probe, scrape, scrape)
    rules = work / "rules.yaml"
    rules.write_text(render_rules_yaml(scenario.slo, NAME, options=RULES))
    prom = LocalPrometheus(work / "prometheus", dep.targets_file, [rules],
                           ready_timeout_s=opts.prometheus_ready_timeout_s)
    stack.callback(prom.close)
    prom.start()
    say(f"Prometheus {prom.url} scraping every 1 s, rules: rate window "
        f"{RULES.rate_window_s} s, for {RULES.alert_for_s} s")
    selector = {DEPLOYMENT_LABEL: NAME}
    return _Sources(
        AlertSource(prom.url, NAME),
        PrometheusWindows(prom.url, selector, scenario.slo),
        live_probe(prom.url, selector, twin, opts),
        PrometheusWindows(prom.url, selector, scenario.slo, min_requests=1,
                          load_tolerance=1e9), PrometheusIterations(prom.url, selector))


PROBE_DURATION_S = 30.0
"""What the twin simulates of the probe's workload (the capacity plan's length)."""


def live_probe(url: str, selector: Mapping[str, str], twin: Scenario, opts: DemoOptions
               ) -> PrometheusProbe:
    """The workload probe with Prometheus (without it: ``ScrapeProbe``, the same window)."""
    return PrometheusProbe(url, selector, twin, window_s=probe_window_s(opts.window_s),
                           duration_s=PROBE_DURATION_S)


def _controller(opts: DemoOptions, scenario: Scenario, dep: LocalDeployment,
                alerts: AlertReader, sources: _Sources, tuner: ResumableTuner,
                worker: SimWorker) -> Controller:
    settings = ControllerSettings(
        deployment=NAME, slo=scenario.slo, min_replicas=opts.replicas,
        max_replicas=opts.max_replicas, window_s=opts.window_s, max_trials=4,
        cooldown_s=max(15.0, 2 * opts.window_s), revert_check_s=opts.window_s / 2,
        scale_down_after_s=3600.0, warm_start_k=2, breach_window_s=RULES.breach_window_s,
        min_class_requests=MIN_CLASS_REQUESTS)
    return Controller(settings, dep, alerts, sources.windows, tuner, sources.probe,
                      WorkerPlanner(worker, duration_s=30.0, seed=opts.seed),
                      offline=WorkerOffline(worker, SimOffline(
                          tuner.space, n_trials=12, duration_s=20.0, seed=opts.seed)),
                      iterations=sources.iterations, twin=WorkerTwin(worker))


def _control_loop(opts: DemoOptions, ctl: Controller, dep: LocalDeployment,
                  recorded: RecordingAlerts, timeline: WindowEvaluator, load: LoadGenerator,
                  after: Phase, say: Narrator, result: DemoResult,
                  machine: MachineLoad, lost_stop: Callable[[], None]) -> list[Sample]:
    """Tick every ``tick_s`` until the end, the load shifting half-way; one sample a tick.

    Each tick's events are timed after ``ctl.tick`` returns: what it applied is in effect
    by then, and its lines print then. The trailing window is measured after that, up to
    then: the restore rule judges a commit on windows that start after it."""
    samples: list[Sample] = []
    story = Story(say, result, ctl.settings.slo, RULES.rate_window_s, RESTORE_HOLD_S,
                  MIN_WINDOW_REQUESTS)
    shifted, t0, clock = False, say.t0, say.clock
    busy = False
    next_tick = clock()
    # Ctrl-C or SIGTERM mid-run stops the loop, not the demo: the replicas still stop and
    # the report of the run so far is still written (a user who stopped a long run had
    # nothing to read). Before the loop there is nothing to report: it goes on up.
    try:
        while (now := clock()) - t0 < opts.duration_s:
            lost_stop()  # a Ctrl-C Python swallowed mid-turn (DemoStops.deliver)
            if not shifted and now - t0 >= opts.shift_s:
                shifted = True
                load.set_phase(after)
                say(f"SHIFT: prompts ~{after.prompt_mean:g} tokens, P0 {after.classes['p0']:.0%}")
            # The clock too: a tick that waited on the study or a replica's PUT starts
            # its trial's window when the config is applied, not at ``now``.
            d = ctl.tick(now, clock=clock)
            at = say.elapsed()
            story.alerts_now(recorded.current, at)
            story.decided(d, ctl, at)
            end = clock()
            summary = None
            with contextlib.suppress(WindowRejected, PrometheusUnavailable):
                summary = timeline.measure(end - RULES.rate_window_s, end, canary=False)
            story.window(summary, recorded.current, end - RULES.rate_window_s - t0, end - t0)
            interval = machine.sample(end - t0)
            if interval is not None and interval.busy != busy:
                busy = interval.busy
                say(("MACHINE busy: " if busy else "MACHINE quiet again: ") + interval.describe(),
                    at=end - t0)
            samples.append(_sample(end - t0, summary, dep, ctl))
            if opts.until is not None and opts.until(result, dep):
                say("stopping early: the caller's condition holds")
                break
            next_tick += opts.tick_s
            time.sleep(max(0.0, next_tick - clock()))
    except (KeyboardInterrupt, Terminated) as stop:
        result.stopped_at_s = say.elapsed()
        result.stopped_by = stop_name(stop)
        say(f"STOPPED ({result.stopped_by}): the replicas stop, and the report of the run "
            "so far is written; a second stop ends without it")
    story.finish(say.elapsed(), machine.busy_spans())
    return samples


def _sample(elapsed: float, summary: WindowSummary | None, dep: LocalDeployment,
            ctl: Controller) -> Sample:
    stable, trial = dep.current_config(), ctl.loop.trial
    return Sample(elapsed, p99s(summary), int(stable["token_budget"]),
                  int(stable["chunk_size"]), dep.replicas(),
                  None if trial is None
                  else TrialMark(trial.number, trial.canary, dict(trial.config)))
