"""What tune's whole-trace check costs on a trace, and what it says.

The trace replayed on its bare ``--trace`` deployment with the start config over
``--replicas``, judged over windows of ``--window`` seconds as ``tune`` judges its answer
(``whole_check``: the grid's windows, and a second replay for those the TTFT and TBT
sweeps find worse off it). Run it on two trees to compare them: the CPU seconds it took
(the figure to compare on a shared machine), the wall seconds, the verdict, the replays
and the figures, and one RESULT line.

    PYTHONPATH=<tree> .venv/bin/python benchmarks/whole_check_cost.py \\
        slopilot/data/traces/azure-llm-2023-conv.csv [--window 60] [--replicas 1]
"""

from __future__ import annotations

import argparse
import time

from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace
from slopilot.tuner.sim.robust import RobustEvaluator, plan_windows
from slopilot.tuner.tune.whole_check import whole_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--window", type=float, default=60.0, help="window length, s")
    ap.add_argument("--replicas", type=int, default=1)
    args = ap.parse_args()
    scenario = load_with_trace(None, TraceOptions(path=args.trace), default="")
    evaluator = RobustEvaluator(scenario, plan_windows(scenario, duration_s=args.window))
    whole = plan_windows(scenario, whole=True)
    cpu, wall = time.process_time(), time.perf_counter()
    check = whole_check(evaluator, whole, {}, args.replicas, args.replicas,
                        window_s=args.window)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tried = check.to_dict()["tried"][0]
    print(tried["figures"])
    print(f"RESULT holds={tried['holds']} replays={tried['replays']} "
          f"windows={tried['windows']} cpu_s={cpu:.1f} wall_s={wall:.1f}")


if __name__ == "__main__":
    main()
