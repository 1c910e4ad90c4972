"""The trace flags ``simulate`` and ``tune`` share (docs/traces.md); registration
imports nothing heavy, the options are parsed and checked in ``trace_scenario.py``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from slopilot.engine.sim.trace_formats import FORMATS, TRACE_DEPLOYMENT

if TYPE_CHECKING:
    from slopilot.engine.sim.trace_scenario import TraceOptions

__all__ = ["TRACE_DEPLOYMENT", "add_trace_arguments", "trace_options"]



def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The trace flags ``simulate`` and ``tune`` share (docs/traces.md)."""
    g = p.add_argument_group("trace replay (docs/traces.md)")
    g.add_argument("--trace", metavar="FILE", default=None,
                   help="replay this trace (CSV: arrival_time,prompt_tokens,output_tokens"
                        "[,class]; Azure's or BurstGPT's CSV; JSONL; or Mooncake's JSONL) "
                        "on the scenario's deployment "
                        f"and SLO (default scenario with --trace: {TRACE_DEPLOYMENT})")
    g.add_argument("--trace-format", choices=FORMATS, default=None,
                   help="the trace's format (default: by its suffix and header)")
    g.add_argument("--trace-model", metavar="NAME", default=None,
                   help="replay only this model's requests, from a trace that names them "
                        "(BurstGPT's Model column: ChatGPT or GPT-4)")
    g.add_argument("--trace-window", metavar="START:END", default=None,
                   help="replay only trace seconds [START, END) (from its first request, "
                        "before scaling); either end may be left out")
    scale = g.add_mutually_exclusive_group()
    scale.add_argument("--time-scale", type=float, default=None,
                       help="multiply every arrival offset (0.5 replays twice as fast)")
    scale.add_argument("--target-rate", type=float, default=None, metavar="REQ_S",
                       help="pick the time scale that gives this many requests per second")
    g.add_argument("--classes", default=None, metavar="p0=S,p1=S,p2=S",
                   help="each class's share of the requests the trace gives no class, a "
                        "fraction from 0 to 1, at most 1 in all; the rest are p1 (the "
                        "default): p0=0.2 sends 20%% as p0 and 80%% as p1")


def trace_options(args: argparse.Namespace) -> TraceOptions:
    from slopilot.engine.sim.trace_scenario import TraceOptions, parse_classes, parse_window

    start, end = parse_window(args.trace_window)
    return TraceOptions(path=args.trace, fmt=args.trace_format, model=args.trace_model,
                        start_s=start, end_s=end,
                        time_scale=args.time_scale, target_rate=args.target_rate,
                        classes=parse_classes(args.classes))

