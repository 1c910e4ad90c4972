"""Simulator speed: simulated seconds per second of one core, on the seed scenario.

Runs `seed-h800x8-deepseek67b` (30 simulated minutes, 8 x H800, DeepSeek-67B TP 8,
120 concurrent chat sessions) at its default knobs several times and reports the
median speed over real time, by wall clock and by this process's CPU time (the
simulator is single-threaded, so CPU time is "one core" even on a busy machine).
Goal: at least 100x faster than real time.

    .venv/bin/python benchmarks/sim_speed.py [--runs 3] [--scenario NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="seed-h800x8-deepseek67b")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=None)
    args = ap.parse_args()
    scenario = load_scenario(args.scenario)
    walls, cpus = [], []
    for i in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        run = simulate(scenario, duration_s=args.duration)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        walls.append(wall)
        cpus.append(cpu)
        s = run.summary.to_dict()
        print(f"run {i}: {s['duration_s']:.0f} s simulated, {s['iterations']:,} iterations, "
              f"{s['requests_finished']:,} requests; wall {wall:.1f} s, cpu {cpu:.1f} s "
              f"({s['duration_s'] / cpu:.0f}x real time per core)")
    sim_s = run.summary.duration_s
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    iters = s["iterations"]
    print(f"RESULT scenario={scenario.name} simulated_s={sim_s:.0f} iterations={iters} "
          f"wall_s={wall:.2f} cpu_s={cpu:.2f} speedup_wall={sim_s / wall:.1f} "
          f"speedup_cpu={sim_s / cpu:.1f} us_per_iteration={cpu / iters * 1e6:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
