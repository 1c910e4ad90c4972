"""``slopilot demo``: registration only; the work is imported in the handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from slopilot.engine.seconds_flag import seconds


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="the closed loop live: replicas, Prometheus, load, controller",
        description="Start local replicas and Prometheus, drive load that shifts half-way "
        "(longer prompts, more P0), and let the controller notice the alert, try configs "
        "on the canary, commit (or scale) and restore the SLO. Prints every decision and "
        "writes a report with a timeline. Ends by itself and leaves nothing running.")
    p.add_argument("--executor", choices=("simulated", "torch"), default=None,
                   help="simulated (default): GPU cost-model replicas in real time; "
                   "torch: real models on this CPU, a CPU's SLO (scenario demo-torch)")
    p.add_argument("--model", default=None,
                   help="the torch replicas' model: tiny-random, smollm2-135m (default) "
                   "or a checkpoint PATH; implies --executor torch")
    p.add_argument("--replicas", type=int, default=None, help="default 2; torch 1")
    p.add_argument("--max-replicas", type=int, default=None, help="default 4; torch 1")
    p.add_argument("--duration", type=seconds("--duration"), default=None, metavar="SECONDS",
                   help="seconds of load, the shift half-way; default 240, torch 720")
    p.add_argument("--shift-at", type=seconds("--shift-at"), default=None, metavar="SECONDS",
                   help="when the load shifts, in seconds since the start; default "
                   "half of --duration")
    p.add_argument("--ready-timeout", type=seconds("--ready-timeout"), default=None,
                   metavar="SECONDS",
                   help="how long each replica and Prometheus may take to answer at start "
                   "(default 60, torch 180; Prometheus 30); a slow or busy machine needs "
                   "more. One that exits fails the start at once")
    # A string, not a Path: Path('') is '.', and an empty flag would write into the
    # current folder.
    p.add_argument("--report-dir", default="reports/demo", metavar="FOLDER",
                   help="where the report, the timeline and the run's files go "
                   "(default reports/demo; created if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="a calibrated cost profile (from `slopilot calibrate`) for the "
                   "controller's twin; default: the scenario's datasheet roofline")
    p.add_argument("--no-prometheus", action="store_true",
                   help="scrape the replicas directly even when prometheus is on PATH")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.local.demo import (
        TORCH_DEFAULTS,
        DemoOptions,
        make_report_dir,
        run_demo,
        twin_scenario,
    )
    from slopilot.tuner.local.demo_stops import exit_code
    from slopilot.tuner.local.demo_story import summary_lines

    executor = args.executor or ("torch" if args.model is not None else "simulated")
    given = {k: v for k, v in (("replicas", args.replicas), ("max_replicas", args.max_replicas),
                               ("duration_s", args.duration), ("shift_at_s", args.shift_at),
                               ("ready_timeout_s", args.ready_timeout))
             if v is not None}
    defaults = {k: v for k, v in TORCH_DEFAULTS.items()
                if executor == "torch" and k not in given}
    if "replicas" in given and "max_replicas" in defaults:
        defaults["max_replicas"] = max(given["replicas"], defaults["max_replicas"])
    try:
        if not args.report_dir.strip():
            raise ValueError(f"--report-dir {args.report_dir!r}: empty; give a folder, "
                             "e.g. reports/demo (it is created if missing)")
        opts = DemoOptions(**{**defaults, **given}, executor=executor, model=args.model,
                           report_dir=Path(args.report_dir), seed=args.seed,
                           prometheus=False if args.no_prometheus else None,
                           profile=args.profile)
        # A bad profile or model, or a folder that cannot be made, fails before anything
        # starts.
        twin_scenario(load_scenario(opts.scenario_name), opts)
        make_report_dir(opts.report_dir)
    except ValueError as exc:
        print(f"slopilot demo: {exc}", file=sys.stderr)
        return 2
    result = run_demo(opts, Console())
    print("\n".join(summary_lines(result)),
          file=sys.stdout if result.report_written else sys.stderr)
    # As a stopped command exits (a supervisor reads it), though the report was written.
    return exit_code(result.stopped_by)
