"""How long the twin check's window simulation stalls the controller's host process.

The check simulates the measured workload for one window (``tuner/loop/twin_predict``).
Run in the host process, that is pure-Python CPU under the GIL, and the host's event loop
(kopf's in the operator: watch events, peering keep-alives, every other deployment's
handlers) waits it out. Run through ``sim/worker.WorkerTwin`` the host only waits on a
pipe. Side by side, per load, while the host simulates the window (``in_process``) and
while a worker does (``worker``), an asyncio loop in a thread of this process beating
every millisecond: how long the window took, the loop's longest gap between beats and its
beats a second as a share of an idle loop's; the medians over ``--runs``. The GIL passes
between threads every 5 ms (``sys.getswitchinterval``), so the loop is not stopped
outright but slowed: each of its turns waits for the simulation's slice to end.

Loads: open loop at the demo's post-shift shape (Llama-3-8B on A100s, prompts ~2k tokens,
outputs ~256, 40 % P0) at 4 requests a second on 2 replicas, 16 on 8 and 64 on 16.

    .venv/bin/python benchmarks/twin_check_stall.py [--window 120] [--runs 3]

Ends with ``RESULT`` ``LOAD_WHERE_s``, ``LOAD_WHERE_gap_s`` and ``LOAD_WHERE_beats`` per
load and ``WHERE`` (``in_process``, ``worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from slopilot.engine.alert_factors import DEFAULT_FACTORS
from slopilot.engine.sim.scenario import Scenario, load_scenario, parse_scenario
from slopilot.tuner.loop.twin_predict import predicted_p99s
from slopilot.tuner.sim.worker import SimWorker, WorkerTwin

LOADS = {"r4x2": (4.0, 2), "r16x8": (16.0, 8), "r64x16": (64.0, 16)}


def scenario(rate: float, replicas: int) -> Scenario:
    base = load_scenario("demo")
    return parse_scenario({
        "name": f"stall-{rate:g}x{replicas}", "gpu": "A100", "num_gpus": replicas, "tp": 1,
        "model": "llama-3-8b", "duration_s": 120, "seed": 0, "gpu_memory_utilization": 0.9,
        "engine": {"token_budget": 2048, "chunk_size": 2048}, "slo": base.slo.to_dict(),
        "workload": {
            "type": "open_loop", "arrivals": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "mean": 2048, "sigma": 0.7, "min": 256,
                              "max": 4096},
            "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.5, "min": 4,
                              "max": 1024},
            "shared_prefix_tokens": 64, "classes": {"p0": 0.4, "p1": 0.5, "p2": 0.1}}},
        source="twin_check_stall")


class Beats:
    """An event loop in a thread beating every millisecond: the longest gap it saw and
    how many beats it made."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._beat()), daemon=True)

    async def _beat(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            self.count += 1
            last = now

    def __enter__(self) -> Beats:
        self._thread.start()
        time.sleep(0.05)  # its first beats, so that a stall is measured from a beating loop
        self.longest, self.count = 0.0, 0
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Stall:
    seconds: float
    """How long the call took."""
    longest_gap_s: float
    beats_share: float
    """Beats made per second as a share of an idle loop's (``IDLE``)."""


def stall(run: Callable[[], object], idle_rate: float) -> Stall:
    with Beats() as beats:
        t0 = time.perf_counter()
        run()
        took = time.perf_counter() - t0
    return Stall(took, beats.longest, beats.count / took / idle_rate)


def idle_beats_per_s() -> float:
    """Beats a second with nothing else running: what a stall is a share of."""
    with Beats() as beats:
        time.sleep(1.0)
    return beats.count / 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=120.0, help="seconds simulated")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, float] = {}
    idle = idle_beats_per_s()
    with SimWorker() as worker:
        twin = WorkerTwin(worker)
        # its imports paid
        twin.p99s(scenario(1.0, 1), {}, 1, 1.0, seed=0, bucketed=True, factors=DEFAULT_FACTORS)
        for name, (rate, replicas) in LOADS.items():
            sc = scenario(rate, replicas)
            here = [stall(functools.partial(predicted_p99s, sc, {}, replicas, args.window,
                                            seed=0, bucketed=True, factors=DEFAULT_FACTORS), idle)
                    for _ in range(args.runs)]
            there = [stall(functools.partial(twin.p99s, sc, {}, replicas, args.window,
                                             seed=0, bucketed=True, factors=DEFAULT_FACTORS), idle)
                     for _ in range(args.runs)]
            for where, runs in (("in_process", here), ("worker", there)):
                results[f"{name}_{where}_s"] = statistics.median(r.seconds for r in runs)
                results[f"{name}_{where}_gap_s"] = statistics.median(
                    r.longest_gap_s for r in runs)
                results[f"{name}_{where}_beats"] = statistics.median(
                    r.beats_share for r in runs)
            print(f"{rate:g} req/s on {replicas} replicas, {args.window:g} s window: "
                  + "; ".join(
                      f"{where} {results[f'{name}_{where}_s']:.2f} s, the host loop's "
                      f"longest gap {results[f'{name}_{where}_gap_s'] * 1000:.0f} ms, its "
                      f"beats {results[f'{name}_{where}_beats']:.0%} of idle"
                      for where in ("in_process", "worker")))
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
