"""``slopilot tune``: an offline Optuna study on the simulator, with a table and a report.

Registration imports nothing heavy; the handler imports Optuna and the simulator.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slopilot.tuner.study.objective import TrialResult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="search engine knobs for the most goodput within the SLO (simulator)",
        description="Run an Optuna study on a scenario: each trial simulates the scenario "
                    "with suggested knobs and scores goodput under the scenario's SLO.")
    p.add_argument("--scenario", required=True, help="scenario name or YAML path")
    p.add_argument("--trials", type=int, default=30, help="trials to run (default: 30)")
    p.add_argument("--sampler", choices=("tpe", "random"), default="tpe")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default: 0)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL, e.g. sqlite:///study.db (default: in memory); "
                        "an existing study of the same name is resumed")
    p.add_argument("--study-name", default=None, help="default: tune-<scenario>")
    p.add_argument("--duration", type=float, default=None,
                   help="simulated seconds per trial (default: the scenario's)")
    p.add_argument("--set", dest="fixed", action="append", default=[], metavar="KNOB=VALUE",
                   help="fix a knob (not tuned; also applied to the start config)")
    p.add_argument("--bound", dest="bounds", action="append", default=[],
                   metavar="KNOB=LO:HI", help="narrow a knob's range (or KNOB=a,b for "
                   "choices), repeatable")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="tune on a calibrated cost profile (from `slopilot calibrate`) "
                        "instead of the scenario's datasheet GPU")
    p.add_argument("--report-dir", type=Path, default=None,
                   help="write report.md and plots here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_tune)


def _parse_bounds(items: list[str]) -> dict[str, Any]:
    from slopilot.engine.config import ConfigError

    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value:
            raise ConfigError(f"--bound {item!r}: expected KNOB=LO:HI or KNOB=a,b")
        if ":" in value:
            lo, _, hi = value.partition(":")
            out[name.strip()] = [lo, hi]
        else:
            out[name.strip()] = value.split(",")
    return out


def _tune(args: argparse.Namespace) -> int:
    from slopilot.engine.config import ConfigError, parse_set_args
    from slopilot.engine.sim.scenario import ScenarioError, load_scenario
    from slopilot.tuner.study.tuner import StudyStorageError

    try:
        if args.trials < 1:
            raise ValueError(f"--trials {args.trials}: expected at least 1")
        scenario = load_scenario(args.scenario)
        if args.profile:
            from slopilot.engine.sim.commands import attach_profile
            scenario = attach_profile(scenario, args.profile, "tune")
        fixed = parse_set_args(args.fixed)
        bounds = {**_parse_bounds(args.bounds), **fixed}
        return _run(args, scenario, bounds, fixed)
    except (ConfigError, ScenarioError, StudyStorageError, ValueError) as e:
        print(f"slopilot tune: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, scenario: Any, bounds: dict[str, Any],
         fixed: dict[str, str]) -> int:
    import optuna
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from slopilot.engine.sim.twin import twin_label
    from slopilot.tuner.sim.evaluator import SimulatorEvaluator
    from slopilot.tuner.study.space import SearchSpace
    from slopilot.tuner.study.tuner import Tuner, open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = scenario.engine_config()
    space = SearchSpace.from_bounds(bounds, base=base)
    evaluator = SimulatorEvaluator(scenario, duration_s=args.duration)
    start = evaluator.evaluate(base.with_overrides(fixed).to_dict())
    name = args.study_name or f"tune-{scenario.name}"
    tuner = Tuner(open_study(args.storage, name, sampler=args.sampler, seed=args.seed), space)
    console = Console(stderr=args.json)
    best_so_far = [-math.inf]
    with Progress(TextColumn("[bold]tuning[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), console=console,
                  transient=args.json) as progress:
        task = progress.add_task("tune", total=args.trials, status="")

        def advance(number: int, result: TrialResult | None) -> None:
            if result is not None and result.feasible:
                best_so_far[0] = max(best_so_far[0], result.goodput_tok_s)
            best = best_so_far[0]
            progress.update(task, advance=1, status=(
                f"best feasible {best:.1f} tok/s" if math.isfinite(best) else "none feasible yet"))

        tuner.run(evaluator, args.trials, callback=advance)
    best = tuner.best_trial()
    report_path = None
    if args.report_dir is not None:
        from slopilot.tuner.study.report import write_report
        report_path = write_report(tuner, evaluator.slo, args.report_dir, start=start,
                                   title=f"Tuning {scenario.name}")
    if args.json:
        ranked = sorted(tuner.results(), key=lambda nr: _rank(nr[1]), reverse=True)
        print(json.dumps({
            "scenario": scenario.name, "twin": twin_label(scenario), "study": name,
            "sampler": args.sampler,
            "trials": len(tuner.study.trials),
            "best_trial": best[0] if best else None,
            "best": _brief(best[1]) if best else None, "start": _brief(start),
            "top": [{"trial": n, **_brief(r)} for n, r in ranked[:10]],
            "report": str(report_path) if report_path else None,
        }, default=str))
    else:
        _print_tables(console, tuner, start)
        console.print(f"twin: {twin_label(scenario)}")
        if report_path:
            console.print(f"report: {report_path}")
    return 0


def _rank(result: TrialResult) -> tuple[int, float, float]:
    from slopilot.tuner.study.tuner import rank
    return rank(result)


def _brief(r: TrialResult) -> dict[str, Any]:
    s = r.summary.to_dict() if r.summary is not None else {}
    return {"config": dict(r.config), "goodput_tok_s": r.goodput_tok_s,
            "feasible": r.feasible,
            "constraints": dict(zip(r.constraint_names, r.constraints, strict=True)),
            "throughput_tok_s": s.get("throughput_tok_s"),
            "ttft_p99_ms": s.get("ttft_p99_ms"), "tbt_p99_ms": s.get("tbt_p99_ms"),
            "classes": {c: {k: v.get(k) for k in ("ttft_p99_ms", "tbt_p99_ms", "goodput_tok_s")}
                        for c, v in (s.get("classes") or {}).items()}}


def _print_tables(console: Any, tuner: Any, start: TrialResult) -> None:
    from rich.table import Table

    from slopilot.engine.request import Priority

    ranked = sorted(tuner.results(), key=lambda nr: _rank(nr[1]), reverse=True)
    top = Table(title="Top trials")
    for col in ("trial", "goodput tok/s", "feasible", "worst term", "budget", "chunk",
                "max seqs", "mode"):
        top.add_column(col, justify="right")
    for n, r in ranked[:10]:
        worst = max(r.constraints) if r.constraints else 0.0
        top.add_row(str(n), f"{r.goodput_tok_s:.1f}", "yes" if r.feasible else "no",
                    f"{worst:+.2f}", str(r.config.get("token_budget")),
                    str(r.config.get("chunk_size")), str(r.config.get("max_num_seqs")),
                    str(r.config.get("preemption_mode")))
    console.print(top)
    if not ranked:
        console.print("no completed trials")
        return
    best = ranked[0][1]
    cmp = Table(title="Best config against the scenario's start config")
    for col in ("", "start", "best"):
        cmp.add_column(col, justify="right")
    cmp.add_row("goodput tok/s", f"{start.goodput_tok_s:.1f}", f"{best.goodput_tok_s:.1f}")
    cmp.add_row("feasible", "yes" if start.feasible else "no", "yes" if best.feasible else "no")
    for p in Priority:
        for key, label in (("ttft_p99_ms", "TTFT P99"), ("tbt_p99_ms", "TBT P99")):
            a, b = (None if r.summary is None else getattr(r.summary.classes[p], key)
                    for r in (start, best))
            cmp.add_row(f"{p.label} {label} ms", _num(a), _num(b))
    for knob, value in best.config.items():
        cmp.add_row(knob, _knob(start.config.get(knob, "-")), _knob(value))
    console.print(cmp)


def _knob(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _num(v: Any) -> str:
    return "-" if v is None else f"{float(v):.0f}"
