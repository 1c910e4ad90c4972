"""``slopilot demo``: registration only; the work is imported in the handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="the closed loop live: replicas, Prometheus, load, controller",
        description="Start local replicas and Prometheus, drive load that shifts half-way "
        "(longer prompts, more P0), and let the controller notice the alert, try configs "
        "on the canary, commit (or scale) and restore the SLO. Prints every decision and "
        "writes a report with a timeline. Ends by itself and leaves nothing running.")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-replicas", type=int, default=4)
    p.add_argument("--model", default=None,
                   help="a torch model (e.g. smollm2-135m: real tokens on the CPU); "
                   "default: the simulated executor in real time")
    p.add_argument("--duration", type=float, default=240.0, metavar="SECONDS",
                   help="seconds of load; the shift comes half-way")
    p.add_argument("--report-dir", type=Path, default=Path("reports/demo"))
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
    from slopilot.tuner.local.demo import NAME, DemoOptions, run_demo, twin_scenario

    try:
        opts = DemoOptions(replicas=args.replicas, max_replicas=args.max_replicas,
                           model=args.model, duration_s=args.duration,
                           report_dir=args.report_dir, seed=args.seed,
                           prometheus=False if args.no_prometheus else None,
                           profile=args.profile)
        twin_scenario(load_scenario(NAME), opts)  # a bad profile fails before anything starts
    except ValueError as exc:
        print(f"slopilot demo: {exc}", file=sys.stderr)
        return 2
    result = run_demo(opts, Console())
    print(f"summary: alert at {_t(result.alert_at_s)}, {result.trials} trial(s), "
          f"commit/scale at {_t(result.commit_at_s)}, SLO restored at "
          f"{_t(result.restored_at_s)}; report {result.report}")
    return 0


def _t(v: float | None) -> str:
    return "-" if v is None else f"t+{v:.0f}s"
