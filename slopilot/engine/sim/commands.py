"""``slopilot simulate`` and ``slopilot scenarios``: the discrete-event simulator's CLI."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="simulate a scenario on the GPU cost model (virtual time)",
        description="Run a named scenario (or a YAML file) through the real scheduler on "
                    "a GPU cost model, as fast as the CPU allows, and report TTFT, TBT, "
                    "throughput and goodput per priority class.")
    p.add_argument("--scenario", default="seed-h800x8-deepseek67b",
                   help="scenario name or YAML path (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KNOB=VALUE", help="override an engine knob (repeatable)")
    p.add_argument("--duration", type=float, default=None,
                   help="simulated seconds (default: the scenario's)")
    p.add_argument("--replicas", type=int, default=None,
                   help="engine replicas (default: the scenario's GPUs / TP)")
    p.add_argument("--seed", type=int, default=None, help="workload seed")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="run the twin on a calibrated cost profile (from `slopilot "
                        "calibrate`) instead of the scenario's datasheet GPU")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--metrics-out", metavar="FILE", default=None,
                   help="write each replica's final Prometheus metrics (the same series a "
                        "live server exports) to FILE (FILE-rN.prom with several replicas)")
    p.set_defaults(func=_simulate)

    s = sub.add_parser("scenarios", help="list the shipped scenarios")
    s.set_defaults(func=_list)


def _simulate(args: argparse.Namespace) -> int:
    from slopilot.engine.config import ConfigError, parse_set_args
    from slopilot.engine.sim.cost_model import CostModelError
    from slopilot.engine.sim.profiles import ProfileError
    from slopilot.engine.sim.scenario import ScenarioError, load_scenario
    from slopilot.engine.sim.simulator import simulate

    try:
        scenario = load_scenario(args.scenario)
        if args.profile:
            scenario = attach_profile(scenario, args.profile, "simulate")
        overrides = parse_set_args(args.overrides)
        run = simulate(scenario, overrides, duration_s=args.duration,
                       replicas=args.replicas, seed=args.seed,
                       with_metrics=args.metrics_out is not None)
    except (ConfigError, ScenarioError, ProfileError, CostModelError, ValueError) as e:
        print(f"slopilot simulate: {e}", file=sys.stderr)
        return 2
    if args.metrics_out:
        _write_metrics(args.metrics_out, run.metrics)
    if args.json:
        print(json.dumps(run.summary.to_dict(), indent=None, sort_keys=True))
    else:
        print_summary(run.summary.to_dict())
    return 0


def attach_profile(scenario: Any, path: str, command: str) -> Any:
    """``scenario`` on the profile at ``path``; staleness warnings go to stderr."""
    from slopilot.engine.sim.profile_file import executor_code_hash, load_profile
    from slopilot.engine.sim.twin import with_profile

    profile = load_profile(path, warn=False)
    for problem in profile.staleness(executor_code_hash()):
        print(f"slopilot {command}: warning: {problem}", file=sys.stderr)
    return with_profile(scenario, profile)


def _write_metrics(path: str, renders: list[bytes]) -> None:
    from pathlib import Path

    target = Path(path)
    if len(renders) == 1:
        target.write_bytes(renders[0])
        return
    for i, text in enumerate(renders):
        target.with_name(f"{target.stem}-r{i}{target.suffix or '.prom'}").write_bytes(text)


def _list(args: argparse.Namespace) -> int:
    from slopilot.engine.sim.scenario import list_scenarios, load_scenario

    for name in list_scenarios():
        print(f"{name:28s} {load_scenario(name).description}")
    return 0


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = summary["config"]
    title = (f"{summary['scenario']}: {summary['duration_s']:.0f} s simulated, "
             f"{summary['replicas']} replica(s), budget {cfg['token_budget']}, "
             f"chunk {cfg['chunk_size']}")
    table = Table(title=title)
    for col in ("class", "finished", "TTFT mean", "TTFT p99", "TBT p50", "TBT p99",
                "max stall", "tok/s", "goodput", "SLO met"):
        table.add_column(col, justify="right")
    rows = [(name, c) for name, c in summary["classes"].items() if c["requests_finished"]]
    rows.append(("all", summary))
    for name, c in rows:
        met = c["slo_attainment"]
        table.add_row(
            name, str(c["requests_finished"]), _ms(c["ttft_mean_ms"], 0),
            _ms(c["ttft_p99_ms"], 0), _ms(c["tbt_p50_ms"], 1),
            _ms(c["tbt_p99_ms"], 1), _ms(c["max_stall_ms"], 1),
            f"{c['throughput_tok_s']:,.0f}", f"{c['goodput_tok_s']:,.0f}",
            "-" if met is None else f"{met:.0%}")
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(table)
    if "twin" in summary:
        console.print(f"twin: {summary['twin']}")
    console.print(
        f"preemptions/min {summary['preemptions_per_min']:.1f} "
        f"(recompute {summary['preemptions_per_min_recompute']:.1f}, "
        f"swap {summary['preemptions_per_min_swap']:.1f}); "
        f"busy {summary['busy_ratio']:.0%}; KV mean {summary['kv_usage_mean']:.0%} "
        f"max {summary['kv_usage_max']:.0%}; prefix hits {summary['prefix_hit_rate']:.0%}; "
        f"{summary['iterations']:,} iterations")


def _ms(value: float | None, digits: int) -> str:
    """A latency cell; "-" where the class had no samples (the summary's None)."""
    return "-" if value is None else f"{value:.{digits}f} ms"
