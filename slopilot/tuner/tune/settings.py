"""``slopilot tune``'s flags, checked once into ``TuneSettings``, and the commands that
reproduce a run (the tune itself, and the simulation that checks its answer)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slopilot.engine.config import ConfigError, parse_set_args
from slopilot.engine.sim.dispatch import Dispatch
from slopilot.engine.sim.output_paths import check_output_dir
from slopilot.engine.sim.scenario import Scenario, ScenarioError
from slopilot.engine.sim.too_long import WARN_SHARE, TooLong
from slopilot.engine.sim.trace_flags import trace_options
from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace
from slopilot.engine.sim.window_kinds import kinds_text
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.tune.start import StartConfig, fit_start, search_space

if TYPE_CHECKING:  # the simulator is heavy to import, and this module is read at start
    from slopilot.engine.sim.session_pace import SessionPace
    from slopilot.tuner.sim.robust import WindowPlan

DEFAULT_MAX_REPLICAS = 16
"""``--max-replicas``: the capacity search's upper bound unless the user names one."""
DEFAULT_WARMUP_S = 30.0
"""``--warmup`` left out: trace seconds simulated before each window, or the trace's
request lifetime where longer (``tuner/sim/robust.WARMUP_S``, the same figure, and
``plan_windows``; --help says it without importing the simulator)."""
DEFAULT_SEEDS = 3
"""``--seeds``: workload seeds per trial of a generated workload unless the user names some."""
DEFAULT_MAX_TOO_LONG = WARN_SHARE
"""``--max-too-long``: above this share of a trace's requests too long for one replica the
verdict does not hold; the share ``tune`` warns above (``engine/sim/too_long.py``)."""


@dataclass(frozen=True)
class TuneSettings:
    scenario: Scenario
    trace: TraceOptions
    scenario_arg: str | None
    bounds: Mapping[str, Any]
    fixed: Mapping[str, str]
    space: SearchSpace
    start: StartConfig
    """The scenario's knobs with ``fixed``, fitted to the bounds (``start.py``)."""
    trials: int
    sampler: str
    seed: int
    storage: str | None
    study_name: str
    duration_s: float | None
    whole: bool
    seeds: int
    warmup_s: float | None
    """``--warmup`` as given; None: what the trace's requests need (``plan_windows``)."""
    replicas: int
    replicas_auto: bool
    max_replicas: int
    report_dir: Path | None
    json: bool
    quiet: bool
    raw_bounds: tuple[str, ...] = field(default=())
    profile: str | None = None
    """The calibrated cost profile the twin runs on (``--profile``); None: the datasheet."""
    dispatch: Dispatch | None = None
    """``--dispatch`` as given (``scenario`` carries it); None: the scenario's own."""
    too_long: TooLong | None = None
    """A trace's requests one replica of the start config never serves (too long for it,
    rejected unjudged: ``engine/sim/too_long.py``); None for a generated workload."""
    max_too_long: float = DEFAULT_MAX_TOO_LONG
    """``--max-too-long``: above this share of ``too_long`` nothing holds (knobs and
    replicas serve none of them), whatever the study finds on the rest."""


def parse_bounds(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        # The docs write a range 128..8192, so that form is one too. An end that begins
        # or ends in a dot beside the ".." (0...1) is a typo's: read, it narrows the range.
        ends = value.partition("..") if ".." in value else value.partition(":")
        if not sep or not name.strip() or not value or (
                ends[1] == ".." and (ends[0].endswith(".") or ends[2].startswith("."))):
            raise ConfigError(f"--bound {item}: expected KNOB=LO:HI (or LO..HI) or "
                              "KNOB=a,b")
        if ends[1]:
            out[name.strip()] = [ends[0], ends[2]]
        else:
            out[name.strip()] = value.split(",")
    return out


def share(flag: str) -> Callable[[str], float]:
    """argparse type: a share from 0 to 1, ``0.05``, or a percent, ``5%``."""
    def parse(text: str) -> float:
        said = text.strip()
        try:
            value = float(said[:-1]) / 100 if said.endswith("%") else float(said)
        except ValueError:
            value = math.nan
        if not 0 <= value <= 1:  # nan too
            raise argparse.ArgumentTypeError(
                f"{flag} {text}: expected a share from 0 to 1 (e.g. 0.05 or 5%)")
        return value
    return parse


def _count(flag: str, value: int, lo: int) -> int:
    if isinstance(value, bool) or value < lo:
        raise ValueError(f"{flag} {value}: expected at least {lo}")
    return value


def _seconds(flag: str, value: float | None, *, zero_ok: bool) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{flag} {value}: expected seconds {'>=' if zero_ok else '>'} 0")
    return value


def _check_fits(scenario: Scenario, trace: TraceSpec, config: Mapping[str, Any], *,
                given: bool) -> TooLong:
    """How many of the trace's requests one replica never serves (the model's context, at
    most its KV cache: ``Scheduler.can_ever_finish``, the server's rule); a trace none of
    whose requests fits is refused: each is rejected whatever the knobs, no class has a
    P99 left to miss, and the study would call an empty verdict holding the SLO."""
    from slopilot.engine.sim import too_long  # heavy (the simulator): not at registration

    records = trace.records()
    counted = too_long.count(scenario, scenario.engine_config().with_overrides(config),
                             records)
    if counted.requests < counted.of:
        return counted
    limit = counted.limit
    named = f"--trace {trace.trace}" if given else f"{scenario.name}'s trace {trace.trace}"
    shortest = min(r.prompt_tokens + r.output_tokens for r in records)
    where = f"{scenario.name} ({scenario.tp} x {scenario.gpu}, {scenario.model})"
    if limit.bound == "context":
        said = (f"it serves at most {scenario.model}'s context of {limit.tokens:,} tokens "
                f"(its KV cache holds {limit.kv_tokens:,})")
    else:
        said = f"its KV cache holds {limit.tokens:,} tokens"
    raise ValueError(
        f"{named}: none of its {len(records):,} requests fits one replica of {where}: "
        f"{said}, the shortest is {shortest:,} tokens (prompt plus output), so every "
        f"request would be rejected whatever the knobs; {limit.fix()}, or check that the "
        "prompt and output columns hold lengths in tokens")


def _check_set_and_bound(fixed: Mapping[str, str], raw_bounds: list[str]) -> None:
    """Refused, not merged: ``--set`` fixes a knob the study then never tunes, so a
    ``--bound`` on the same knob would be dropped without a word (inside its range or
    not), and the user asked for two different studies."""
    for item in raw_bounds:
        name = item.partition("=")[0].strip()
        if name in fixed:
            raise ConfigError(
                f"--set {name}={fixed[name]} and --bound {item} both name {name}: --set "
                f"fixes it, --bound tunes it; give --set {name}={fixed[name]} to fix it, "
                f"or --bound {item} to tune it, not both", name)


def settings_from(args: argparse.Namespace) -> TuneSettings:
    """The checked settings; ValueError (ConfigError, ScenarioError) names the flag."""
    trace = trace_options(args)
    if args.scenario is None and trace.path is None:
        raise ScenarioError("give --scenario NAME|FILE.yaml, or --trace FILE.csv to replay a "
                            "trace (see slopilot scenarios)")
    scenario = load_with_trace(args.scenario, trace, default="")
    profile = getattr(args, "profile", None)
    if profile:
        from slopilot.engine.sim.commands import attach_profile
        scenario = attach_profile(scenario, profile, "tune")
    dispatch = getattr(args, "dispatch", None)
    if dispatch is not None:
        scenario = dataclasses.replace(scenario, dispatch=dispatch)
    warmup = _seconds("--warmup", args.warmup, zero_ok=True)
    if not isinstance(scenario.workload, TraceSpec):
        # Refused, not ignored: a user who asks for them expects them to act, and a
        # generated workload has no windows to widen or warm up (docs/tuning.md).
        trace_only = ["--windows whole"] if args.windows == "whole" else []
        trace_only += [] if warmup is None else [f"--warmup {warmup:g}"]
        if trace_only:
            raise ValueError(
                f"{trace_only[0]}: a trace's option; {scenario.name}'s workload is "
                "generated, and each of its --seeds runs is judged whole from t=0 (no "
                f"windows, no warm-up): leave {trace_only[0].split()[0]} out")
    elif args.seeds is not None:
        # Refused, not ignored, for the same reason: a trace is judged on its windows, so
        # more seeds would buy no robustness the user could see.
        raise ValueError(
            f"--seeds {args.seeds}: a generated workload's option; {scenario.name}'s "
            f"workload is a trace, judged on its windows ({kinds_text()}), "
            "not on seeds: leave --seeds out (--windows whole judges all of the trace)")
    max_too_long = getattr(args, "max_too_long", None)
    if max_too_long is not None and not isinstance(scenario.workload, TraceSpec):
        # Refused, not ignored: only a trace's requests are counted against the context.
        raise ValueError(
            f"--max-too-long {max_too_long:g}: a trace's option; {scenario.name}'s workload "
            "is generated, and tune counts the requests too long to serve of a trace "
            "only: leave --max-too-long out")
    seeds = _count("--seeds", DEFAULT_SEEDS if args.seeds is None else args.seeds, 1)
    fixed = parse_set_args(args.fixed)
    stated = parse_bounds(args.bounds)
    _check_set_and_bound(fixed, args.bounds)
    base = scenario.engine_config()
    space = search_space({**stated, **fixed}, fixed, args.bounds, base)
    start = fit_start(base, fixed, space, [k for k in stated if k not in fixed])
    too_long = None
    if isinstance(scenario.workload, TraceSpec):
        too_long = _check_fits(scenario, scenario.workload, start.config,
                               given=trace.path is not None)
    replicas_text = str(args.replicas).strip().lower()
    if replicas_text == "auto":
        replicas, auto = scenario.replicas, True
    else:
        try:
            replicas, auto = int(replicas_text), False
        except ValueError:
            raise ValueError(f"--replicas {args.replicas!r}: expected auto or a count, "
                             "e.g. 2") from None
        _count("--replicas", replicas, 1)
    max_replicas = _count("--max-replicas", args.max_replicas, 1)
    from slopilot.tuner.study.storage import SEED_MAX  # optuna: not at registration
    if not 0 <= args.seed <= SEED_MAX:
        # Checked here: the sampler refuses it without naming the flag.
        raise ValueError(f"--seed {args.seed}: expected a whole number >= 0 and at most "
                         f"{SEED_MAX}")
    if args.report_dir is not None:
        # The report is written after the whole study: a bad folder is refused first.
        from slopilot.tuner.study.report import report_files
        check_output_dir(args.report_dir, "--report-dir", report_files(args.report_dir))
    if isinstance(args.storage, str):
        _check_storage_file(args.storage)
    _check_clashes(args, scenario, profile)
    return TuneSettings(
        scenario=scenario, trace=trace, scenario_arg=args.scenario,
        bounds={**stated, **fixed}, fixed=fixed, space=space, start=start,
        trials=_count("--trials", args.trials, 1), sampler=args.sampler, seed=args.seed,
        storage=args.storage, study_name=args.study_name or f"tune-{scenario.name}",
        duration_s=_seconds("--duration", args.duration, zero_ok=False),
        whole=args.windows == "whole", seeds=seeds,
        warmup_s=warmup,
        replicas=replicas, replicas_auto=auto, max_replicas=max_replicas,
        report_dir=args.report_dir, json=args.json, quiet=args.quiet,
        raw_bounds=tuple(args.bounds), profile=profile or None, dispatch=dispatch,
        too_long=too_long,
        max_too_long=DEFAULT_MAX_TOO_LONG if max_too_long is None else max_too_long)


def _check_storage_file(url: str) -> None:
    """A ``sqlite:///`` storage's file can be made or opened, checked as the other outputs
    are, before any work: SQLAlchemy's "unable to open database file" names neither the
    flag nor the folder. SQLite writes its journal beside the file, so its folder must
    take new files even where the file exists."""
    from slopilot.engine.sim.output_paths import output_problem
    from slopilot.tuner.study.storage_url import shown, sqlite_file

    db = sqlite_file(url)
    if db is None:
        return
    path = Path(db)
    said = f"--storage {shown(url)}"
    if path.is_dir():
        raise ValueError(f"{said}: {path} is a folder; name a database file in it, e.g. "
                         f"sqlite:///{path / 'study.db'}")
    # SQLite opens what stands there: a FIFO or a device gave a bare "disk I/O error",
    # a symlink into a missing folder "unable to open database file".
    problem = output_problem(path)
    if problem is not None:
        raise ValueError(f"{said}: {path} {problem}; give a database file (a regular "
                         "file's path)")
    folder = path.parent
    if not folder.exists():
        raise ValueError(f"{said}: the folder {folder} does not exist; create it or give a "
                         "file in an existing folder")
    if not folder.is_dir():
        raise ValueError(f"{said}: {folder} is a file, not a folder; give a file in an "
                         "existing folder")
    try:  # by trying: root passes os.access where no file can be made (/proc)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".slopilot-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"{said}: no file can be made in {folder} ({exc.strerror}); give "
                         "a file in a folder you can write") from None
    try:
        if path.exists():
            with path.open("r+b"):
                pass
    except OSError as exc:
        raise ValueError(f"{said}: {path} cannot be written ({exc.strerror}); give a file "
                         "you can write") from None


def _check_clashes(args: argparse.Namespace, scenario: Scenario, profile: str | None) -> None:
    """No file the study writes (its report after the last trial, its SQLite storage
    from the first) is one the run reads."""
    from slopilot.engine.sim.output_paths import NamedFile, check_distinct
    from slopilot.engine.sim.run_inputs import run_inputs
    from slopilot.tuner.study.report import report_files
    from slopilot.tuner.study.storage_url import shown, sqlite_file

    outputs = []
    db = sqlite_file(args.storage) if isinstance(args.storage, str) else None
    if db is not None:
        outputs.append(NamedFile("--storage", shown(args.storage), Path(db)))
    if args.report_dir is not None:
        outputs += [NamedFile("--report-dir", str(args.report_dir), f, folder=True)
                    for f in report_files(args.report_dir)]
    check_distinct(outputs, run_inputs(scenario, scenario_arg=args.scenario,
                                       trace_arg=args.trace, profile_arg=profile))


def cut_warning(s: TuneSettings) -> str | None:
    """What a cut of the trace leaves out where that is busier than what it keeps
    (``engine/sim/trace_cut.py``); None for a generated workload, no cut or a cut that
    keeps the trace's busiest minute."""
    if not isinstance(s.scenario.workload, TraceSpec):
        return None
    from slopilot.engine.sim.trace_cut import cut_label, left_out

    spec = s.scenario.workload
    out = left_out(spec, cut_label(spec, s.trace.start_s, s.trace.end_s))
    return None if out is None else out.text()


def thin_warning(s: TuneSettings, plan: WindowPlan) -> str | None:
    """The replay's span and rate in words where its windows average under one request
    (``engine/sim/trace_pace.py``): a verdict on next to no load, often a trace of
    milliseconds read as seconds; None for a generated workload or one busy enough."""
    if not isinstance(s.scenario.workload, TraceSpec):
        return None
    from slopilot.engine.sim.trace_pace import WINDOW_S, thin

    spec = s.scenario.workload
    length = max((w.length_s for w in plan.windows), default=WINDOW_S) \
        if plan.kind == "trace" else WINDOW_S
    out = thin(spec, spec.records(), length)
    return None if out is None else out.text()


def trace_doubts(s: TuneSettings) -> tuple[str, ...]:
    """What ``simulate`` says of the trace as read (``engine/sim/trace_pace.py``'s
    ``doubts``): a Mooncake file in seconds, rows that repeat another; none for a
    generated workload."""
    if not isinstance(s.scenario.workload, TraceSpec):
        return ()
    from slopilot.engine.sim.trace_pace import doubts

    spec = s.scenario.workload
    return tuple(doubts(spec, spec.records()))


def pace_warning(s: TuneSettings, pace: SessionPace) -> str | None:
    """What ``simulate`` says of a replay's follow-up turns sent before the previous
    answer had ended (``engine/sim/session_pace.py``), of the start config's replay of
    the windows; None for a generated workload or where nothing is worth saying."""
    if not isinstance(s.scenario.workload, TraceSpec):
        return None
    from slopilot.engine.sim.session_pace import pace_warning as said

    return said(s.scenario.workload, s.trace, pace, "the start config's replay")


def warmup_warning(s: TuneSettings, plan: WindowPlan) -> str | None:
    """What to tell a user whose ``--warmup`` is shorter than the trace's requests live:
    it is used as given (the user's to choose), but its windows start on an engine
    emptier than the trace ever leaves it, and their verdict may not hold on the whole
    trace. None when it is long enough, not given, or no window has a warm-up."""
    life = plan.lifetime
    if s.warmup_s is None or life is None or plan.kind != "trace" \
            or s.warmup_s >= life.seconds:
        return None
    return (f"--warmup {s.warmup_s:g}: shorter than the {life.seconds:,.0f} s this trace's "
            f"requests need ({life.describe()}): each window starts with the requests of "
            f"the last {s.warmup_s:g} s only, on a KV cache emptier than the whole trace "
            "leaves it, and a verdict judged there may not hold on the whole trace; give "
            f"--warmup {math.ceil(life.seconds)} or more, or leave --warmup out (it is "
            "then sized to the trace)")


def _workload_flags(s: TuneSettings) -> list[str]:
    out = [] if s.scenario_arg is None else ["--scenario", s.scenario_arg]
    t = s.trace
    if t.path is not None:
        out += ["--trace", t.path]
    if t.fmt is not None:
        out += ["--trace-format", t.fmt]
    if t.model is not None:
        out += ["--trace-model", t.model]
    if t.start_s is not None or t.end_s is not None:
        lo = "" if t.start_s is None else _exact(t.start_s)
        hi = "" if t.end_s is None else _exact(t.end_s)
        out += ["--trace-window", f"{lo}:{hi}"]
    if t.time_scale is not None:
        out += ["--time-scale", _exact(t.time_scale)]
    if t.target_rate is not None:
        out += ["--target-rate", _exact(t.target_rate)]
    if t.classes is not None:
        out += ["--classes", ",".join(f"{p.label}={_exact(w)}" for p, w in t.classes.shares.items()
                                      if w)]
    if s.profile is not None:
        out += ["--profile", s.profile]
    if s.dispatch is not None:  # else the scenario's own, which the command reads again
        out += ["--dispatch", s.dispatch.value]
    return out


def tune_command(s: TuneSettings) -> str:
    """The ``slopilot tune`` command line that runs this study again."""
    argv = ["slopilot", "tune", *_workload_flags(s), "--trials", str(s.trials),
            "--sampler", s.sampler, "--seed", str(s.seed)]
    if s.duration_s is not None:
        argv += ["--duration", _exact(s.duration_s)]
    if s.whole:
        argv += ["--windows", "whole"]
    if not isinstance(s.scenario.workload, TraceSpec) and s.seeds != DEFAULT_SEEDS:
        argv += ["--seeds", str(s.seeds)]
    if s.warmup_s is not None:  # given, even at 30 s: left out, it is sized to the trace
        argv += ["--warmup", _exact(s.warmup_s)]
    if not s.replicas_auto:
        argv += ["--replicas", str(s.replicas)]
    if s.max_replicas != DEFAULT_MAX_REPLICAS:
        argv += ["--max-replicas", str(s.max_replicas)]
    if s.max_too_long != DEFAULT_MAX_TOO_LONG:
        argv += ["--max-too-long", _exact(s.max_too_long)]
    for name, value in s.fixed.items():
        argv += ["--set", f"{name}={value}"]
    for item in s.raw_bounds:
        argv += ["--bound", item]
    if s.storage is not None:
        argv += ["--storage", s.storage, "--study-name", s.study_name]
    return shlex.join(argv)


def check_command(s: TuneSettings, config: Mapping[str, Any], replicas: int) -> str:
    """The ``slopilot simulate`` line that replays the whole workload with ``config``."""
    argv = ["slopilot", "simulate", *_workload_flags(s), "--replicas", str(replicas)]
    base = s.scenario.engine_config().to_dict()
    for name, value in config.items():
        if base.get(name) != value:
            argv += ["--set", f"{name}={_knob(value)}"]
    return shlex.join(argv)


def _exact(x: float) -> str:
    """``x`` as a flag takes it back exactly: the reproduce and check lines must replay
    the very window, scale and rate tuned (``%g``'s six digits moved a month-long trace's
    window by seconds)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _knob(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # exact: the check must simulate the very config tuned
    return str(getattr(value, "value", value))
