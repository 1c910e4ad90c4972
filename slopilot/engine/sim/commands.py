"""``slopilot simulate`` and ``slopilot scenarios``: the discrete-event simulator's CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from slopilot.engine.seconds_flag import seconds
from slopilot.engine.sim.dispatch import add_dispatch_argument
from slopilot.engine.sim.trace_flags import TRACE_DEPLOYMENT, add_trace_arguments, trace_options

DEFAULT_SCENARIO = "seed-h800x8-deepseek67b"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="simulate a scenario on the GPU cost model (virtual time)",
        description="Run a named scenario (or a YAML file) through the real scheduler on "
                    "a GPU cost model, as fast as the CPU allows, and report TTFT, TBT, "
                    "throughput and goodput per priority class.")
    p.add_argument("--scenario", default=None,
                   help=f"scenario name or YAML path (default: {DEFAULT_SCENARIO}; with "
                        "--trace, the deployment and SLO it replays on: "
                        f"{TRACE_DEPLOYMENT})")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KNOB=VALUE", help="override an engine knob (repeatable)")
    p.add_argument("--duration", type=seconds("--duration"), default=None,
                   help="simulated seconds (default: the scenario's)")
    p.add_argument("--replicas", type=int, default=None,
                   help="engine replicas (default: the scenario's GPUs / TP)")
    p.add_argument("--seed", type=int, default=None, help="workload seed")
    add_dispatch_argument(p, "the run")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="run the twin on a calibrated cost profile (from `slopilot "
                        "calibrate`) instead of the scenario's datasheet GPU")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (progress stays on stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--metrics-out", metavar="FILE", default=None,
                   help="write each replica's final Prometheus metrics (the same series a "
                        "live server exports) to FILE (FILE-rN.prom with several replicas)")
    add_trace_arguments(p)
    p.set_defaults(func=_simulate)

    s = sub.add_parser("scenarios", help="list the shipped scenarios")
    s.set_defaults(func=_list)


def _simulate(args: argparse.Namespace) -> int:
    from slopilot.engine.config import ConfigError, parse_set_args
    from slopilot.engine.sim.calibrated_domain import DomainWatch, beyond
    from slopilot.engine.sim.cost_model import CostModelError
    from slopilot.engine.sim.output_paths import check_output_file
    from slopilot.engine.sim.profiles import ProfileError
    from slopilot.engine.sim.scenario import ScenarioError
    from slopilot.engine.sim.summary_view import print_summary, simulate_json
    from slopilot.engine.sim.trace_scenario import load_with_trace

    try:
        if args.metrics_out:
            check_output_file(args.metrics_out, "--metrics-out")  # before the run, not after
        scenario = load_with_trace(args.scenario, trace_options(args), DEFAULT_SCENARIO)
        if args.profile:
            scenario = attach_profile(scenario, args.profile, "simulate")
        if args.dispatch is not None:
            scenario = dataclasses.replace(scenario, dispatch=args.dispatch)
        if args.metrics_out:
            _check_metrics_clash(args, scenario)
        overrides = parse_set_args(args.overrides)
        if args.replicas is not None and args.replicas < 1:
            raise ValueError(f"--replicas {args.replicas}: replicas={args.replicas} is not "
                             "a count; give at least 1")
        watch = DomainWatch() if scenario.profile is not None else None
        run, workload = _run(args, scenario, overrides, [] if watch is None else [watch])
    except (ConfigError, ScenarioError, ProfileError, CostModelError, ValueError) as e:
        print(f"slopilot simulate: {e}", file=sys.stderr)
        return 2
    from slopilot.engine.sim.trace import TraceWorkload

    # The replay's records, as the run built them: each spec.records() rescales them all.
    records = workload.records if isinstance(workload, TraceWorkload) else None
    if args.json:
        print(json.dumps(simulate_json(run.summary, scenario.slo), indent=None,
                         sort_keys=True))
    else:
        from slopilot.engine.sim.trace_scenario import replay_note
        from slopilot.engine.sim.workload_spec import TraceSpec

        spec = scenario.workload
        print_summary(run.summary, scenario.slo,
                      note=replay_note(spec, records, workload.duration_s)
                      if records is not None and isinstance(spec, TraceSpec) else "")
    config = scenario.engine_config().with_overrides(overrides)
    # After the figures, as the profile's warnings: they qualify what the table says.
    for warning in (_too_long(scenario, config, run.summary), _cut(args, scenario),
                    _thin(scenario, records), *_doubts(scenario, records),
                    _pace(args, scenario, workload)):
        if warning is not None:
            print(f"slopilot simulate: warning: {warning}", file=sys.stderr)
    if watch is not None and scenario.profile is not None:
        # After the figures, which they qualify: said once a run, not once a step.
        for line in beyond(scenario.profile, watch, config):
            print(f"slopilot simulate: warning: {line}", file=sys.stderr)
    if args.metrics_out:
        # After the figures: a path that went bad during the run (checked before it)
        # loses the metrics file, not the run's result.
        try:
            _write_metrics(args.metrics_out, run.metrics)
        except OSError as e:
            print(f"slopilot simulate: --metrics-out {args.metrics_out}: cannot write: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 1
    return 0


def _too_long(scenario: Any, config: Any, summary: Any) -> str | None:
    """The warning for a run that rejected more than ``too_long.WARN_SHARE`` of its
    requests as too long for one replica; None below it."""
    from slopilot.engine.sim.too_long import of_summary, servable_limit

    limit, _ = servable_limit(scenario, config)
    counted = of_summary(summary, limit)
    return counted.text() if counted is not None and counted.warns else None


def _thin(scenario: Any, records: list[Any] | None) -> str | None:
    """The replay's span and rate in words where it averages under one request a
    minute (``trace_pace.py``); ``records``: the replay's, None for no trace."""
    from slopilot.engine.sim.trace_pace import thin

    if records is None:
        return None
    out = thin(scenario.workload, records)
    return None if out is None else out.text()


def _doubts(scenario: Any, records: list[Any] | None) -> list[str]:
    """What the trace as read gives reason to doubt (``trace_pace.doubts``): a Mooncake
    file in seconds, rows that repeat another; ``records``: the replay's."""
    from slopilot.engine.sim.trace_pace import doubts

    return [] if records is None else doubts(scenario.workload, records)


def _cut(args: argparse.Namespace, scenario: Any) -> str | None:
    """What a cut of the trace leaves out where that is busier than what it keeps."""
    from slopilot.engine.sim.trace_cut import cut_label, left_out
    from slopilot.engine.sim.workload_spec import TraceSpec

    spec = scenario.workload
    if not isinstance(spec, TraceSpec):
        return None
    given = trace_options(args)
    out = left_out(spec, cut_label(spec, given.start_s, given.end_s))
    return None if out is None else out.text()


def _pace(args: argparse.Namespace, scenario: Any, workload: Any) -> str | None:
    """How many of a trace's follow-up turns the run sent before the previous turn's
    answer had ended, with what scaled the gaps between them (``session_pace.py``)."""
    from slopilot.engine.sim.session_pace import pace_warning
    from slopilot.engine.sim.trace import TraceWorkload

    if not isinstance(workload, TraceWorkload):
        return None
    return pace_warning(scenario.workload, trace_options(args), workload.pace)


def load_profile_noting(path: str | Path, command: str) -> Any:
    """The ``CostProfile`` at ``path``; each reason it may be stale is a warning line of
    ``slopilot COMMAND`` on stderr (not a Python warning with its source line)."""
    from slopilot.engine.sim.profile_file import executor_code_hash, load_profile
    from slopilot.engine.sim.profile_types import ProfileFileError

    try:
        profile = load_profile(path, warn=False)
    except ProfileFileError as exc:
        raise ProfileFileError(f"--profile {exc}") from None  # each starts with the path
    for problem in profile.staleness(executor_code_hash()):
        print(f"slopilot {command}: warning: {problem}", file=sys.stderr)
    return profile


def attach_profile(scenario: Any, path: str, command: str) -> Any:
    """``scenario`` on the profile at ``path``; staleness warnings go to stderr."""
    from slopilot.engine.sim.twin import with_profile

    return with_profile(scenario, load_profile_noting(path, command))


def _run(args: argparse.Namespace, scenario: Any, overrides: dict[str, str],
         observers: list[Any]) -> tuple[Any, Any]:
    from slopilot.engine.sim.progress import ProgressReport
    from slopilot.engine.sim.simulator import Measure, simulate
    from slopilot.engine.sim.trace_scenario import replay_measure

    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise ValueError(f"--duration {args.duration}: expected simulated seconds > 0")
    # A whole trace is followed past its last arrival; --duration cuts the run there.
    measure = (replay_measure(scenario) if args.duration is None
               else Measure.whole(args.duration))
    scenario.engine_config().with_overrides(overrides)  # a bad knob fails before the bar
    # Built here, as simulate() would, to read what it counted (a trace's session pace).
    workload = scenario.build_workload(seed=args.seed, duration_s=measure.horizon_s)
    if args.quiet:
        return simulate(scenario, overrides, measure=measure, replicas=args.replicas,
                        seed=args.seed, with_metrics=args.metrics_out is not None,
                        observers=observers, workload=workload), workload
    with ProgressReport("simulate", measure.horizon_s, "s simulated",
                        rate_unit="sim-s/s") as bar:
        run = simulate(scenario, overrides, measure=measure, replicas=args.replicas,
                       seed=args.seed, with_metrics=args.metrics_out is not None,
                       progress=bar.update, observers=observers, workload=workload)
        bar.finish()  # a replay's drain ends once its last request has finished
        return run, workload


def _check_metrics_clash(args: argparse.Namespace, scenario: Any) -> None:
    """No metrics file may be one the run reads (the trace, the scenario, the profile)."""
    from slopilot.engine.sim.output_paths import NamedFile, check_distinct, check_output_target
    from slopilot.engine.sim.run_inputs import metrics_files, run_inputs

    files = metrics_files(args.metrics_out,
                          scenario.replicas if args.replicas is None else args.replicas)
    outputs = [NamedFile("--metrics-out", args.metrics_out,
                         None if str(f) == str(Path(args.metrics_out)) else f)
               for f in files]
    for out in outputs:  # each replica's FILE-rN.prom too, not only FILE
        check_output_target(out)
    check_distinct(outputs, run_inputs(scenario, scenario_arg=args.scenario,
                                       trace_arg=args.trace, profile_arg=args.profile))


def _write_metrics(path: str, renders: list[bytes]) -> None:
    from slopilot.engine.sim.profile_file import write_bytes_atomically
    from slopilot.engine.sim.run_inputs import metrics_files

    # Atomically: a write cut short (a full disk) keeps the previous run's file whole.
    for target, text in zip(metrics_files(path, len(renders)), renders, strict=True):
        write_bytes_atomically(target, text)


def _list(args: argparse.Namespace) -> int:
    from slopilot.engine.sim.scenario import list_scenarios, load_scenario

    for name in list_scenarios():
        print(f"{name:28s} {load_scenario(name).description}")
    return 0
