"""``slopilot tune``: an offline Optuna study on the simulator, with a verdict and a report.

Registration imports nothing heavy; the run lives in ``tuner/tune/`` (study, capacity
answer, output), imported by the handler.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slopilot.engine.seconds_flag import seconds
from slopilot.engine.sim.dispatch import add_dispatch_argument
from slopilot.engine.sim.trace_flags import TRACE_DEPLOYMENT, add_trace_arguments
from slopilot.engine.sim.window_kinds import kinds_text
from slopilot.tuner.tune.settings import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MAX_TOO_LONG,
    DEFAULT_SEEDS,
    DEFAULT_WARMUP_S,
    share,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="search engine knobs for the most goodput within the SLO (simulator)",
        description="Run an Optuna study on a scenario: each trial simulates the "
                    f"scenario's representative windows (a trace's, {kinds_text()}; or "
                    "several seeds) with suggested knobs and counts as holding "
                    "the SLO only if every term holds in every window with 10 % "
                    "headroom. When none holds, it says what is missed and how many "
                    "replicas would hold it.")
    p.add_argument("--scenario", default=None,
                   help="scenario name or YAML path (required unless --trace, which runs on "
                        f"{TRACE_DEPLOYMENT}'s deployment and SLO by default)")
    p.add_argument("--trials", type=int, default=30, help="trials to run (default: 30)")
    p.add_argument("--sampler", choices=("tpe", "random"), default="tpe")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default: 0)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL, e.g. sqlite:///study.db (default: in memory); "
                        "an existing study of the same name is resumed")
    p.add_argument("--study-name", default=None, help="default: tune-<scenario>")
    w = p.add_argument_group("what each trial is judged on")
    w.add_argument("--duration", type=seconds("--duration"), default=None,
                   help="simulated seconds per window (default: 60 for a trace, the "
                        "scenario's duration for a generated workload)")
    w.add_argument("--windows", choices=("auto", "whole"), default="auto",
                   help=f"auto: a trace's windows ({kinds_text()}), or "
                        "--seeds seeds of a generated workload; whole: the "
                        "whole trace in one window (exact, slower; a trace only)")
    w.add_argument("--seeds", type=int, default=None,
                   help=f"workload seeds per trial (default: {DEFAULT_SEEDS}; a generated "
                        "workload only)")
    w.add_argument("--warmup", type=seconds("--warmup"), default=None,
                   help=f"trace seconds simulated before each window (default: "
                        f"{DEFAULT_WARMUP_S:g}, or as long as the trace's requests live "
                        "where longer; a trace only)")
    w.add_argument("--replicas", default="auto", metavar="auto|N",
                   help="replicas to tune at (default auto: the scenario's); when no config "
                        "holds the SLO, the capacity search looks for the smallest count "
                        "above it that does")
    w.add_argument("--max-replicas", type=int, default=DEFAULT_MAX_REPLICAS,
                   help=f"the capacity search's upper bound (default: {DEFAULT_MAX_REPLICAS})")
    w.add_argument("--max-too-long", type=share("--max-too-long"), default=None,
                   metavar="SHARE",
                   help="the share of a trace's requests too long for one replica (past "
                        "its model's context or KV cache, rejected whatever the knobs) "
                        "above which the SLO does not hold, 0 to 1 or a percent (default: "
                        f"{DEFAULT_MAX_TOO_LONG:g}); raise it to accept those rejections "
                        "knowingly (a trace only)")
    add_dispatch_argument(w, "each trial and the capacity search")
    p.add_argument("--set", dest="fixed", action="append", default=[], metavar="KNOB=VALUE",
                   help="fix a knob (not tuned; also applied to the start config)")
    p.add_argument("--bound", dest="bounds", action="append", default=[],
                   metavar="KNOB=LO:HI", help="narrow a knob's range (LO..HI too; KNOB=a,b for "
                   "choices), repeatable; the start config is fitted into it")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="tune on a calibrated cost profile (from `slopilot calibrate`) "
                        "instead of the scenario's datasheet GPU")
    p.add_argument("--report-dir", type=Path, default=None,
                   help="write report.md and plots here")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (progress stays on stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_trace_arguments(p)
    p.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    from slopilot.tuner.tune.run import main

    return main(args)
