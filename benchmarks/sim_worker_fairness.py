"""How long a quiet namespace's simulator call waits beside a noisy namespace's queued ones.

Every deployment an operator runs shares its simulator processes (``sim/worker.SimWorker``,
``$SLOPILOT_SIM_WORKERS``). A noisy namespace queues ``--noisy`` calls (many CRs, each
asking for a warm start or a twin window); then a quiet namespace's one call (another
deployment's twin check) arrives. Both ways in one run, on fresh workers each time:

- ``fifo``: every call under one tenant key, first come, first served: the order the
  workers served calls in before they were handed out by namespace;
- ``fair``: the noisy calls under their namespace, the quiet call under its own
  (``sim/fair_turns.FairTurns``), one tenant holding at most ``--per-tenant`` processes at
  once (``$SLOPILOT_SIM_WORKERS_PER_NAMESPACE``; default no cap).

Each call is a real simulator call in the worker process (``--call twin``: the twin
check's window, ``predicted_p99s`` on ``tiny-cpu`` for ``--window`` seconds of traffic)
or a sleep of ``--sleep`` seconds (``--call sleep``); it stamps when it started
(CLOCK_MONOTONIC, one clock across the processes). The quiet call's wait is its start
less the moment it was made; the median over ``--runs``. Also the noisy calls' mean wait,
and the time until every call finished (the fair order must not cost the noisy ones).

    .venv/bin/python benchmarks/sim_worker_fairness.py [--noisy 20] [--workers 1]
        [--per-tenant N]
        [--call twin|sleep] [--window 60] [--sleep 0.2] [--runs 3]

Ends with ``RESULT`` ``MODE_quiet_wait_s``, ``MODE_noisy_wait_s``, ``MODE_all_done_s`` and
``MODE_call_s`` (one call's median run) per ``MODE`` (``fifo``, ``fair``) and
``check_queue_limit_s`` (the twin check's queue bound, which a wait past it exceeds:
that check then goes without the twin).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass

from slopilot.engine.alert_factors import DEFAULT_FACTORS
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.twin_predict import predicted_p99s
from slopilot.tuner.sim.worker import CHECK_QUEUE_TIMEOUT_S, SimWorker

NOISY, QUIET, ONE_KEY = "noisy", "quiet", "everyone"


def twin_window(window_s: float) -> tuple[float, float]:
    """The twin check's window on tiny-cpu, in the worker: when it started and ended."""
    start = time.monotonic()
    scenario = load_scenario("tiny-cpu")
    predicted_p99s(scenario, scenario.engine_config().to_dict(), 1, window_s, seed=0,
                   bucketed=False, factors=DEFAULT_FACTORS)
    return start, time.monotonic()


def nap(seconds: float) -> tuple[float, float]:
    start = time.monotonic()
    time.sleep(seconds)
    return start, time.monotonic()


@dataclass(frozen=True)
class Run:
    quiet_wait_s: float
    noisy_wait_s: float
    all_done_s: float
    call_s: float


def one_run(args: argparse.Namespace, fair: bool) -> Run:
    fn, arg = (twin_window, args.window) if args.call == "twin" else (nap, args.sleep)
    with SimWorker(args.workers, per_tenant=args.per_tenant if fair else None) as w:
        for _ in range(args.workers):  # every process up and its imports paid
            w.call(fn, arg)
        made: dict[str, float] = {}
        ran: dict[str, tuple[float, float]] = {}

        def call(name: str, tenant: str) -> None:
            made[name] = time.monotonic()
            ran[name] = w.call(fn, arg, tenant=tenant)

        threads = []
        start = time.monotonic()
        for i in range(args.noisy):
            thread = threading.Thread(target=call, args=(f"n{i}", NOISY if fair else ONE_KEY))
            thread.start()
            threads.append(thread)
            # Each in its place before the next: the queue's order is the made order.
            while w.waiting + sum(w.held(t) for t in (NOISY, ONE_KEY)) + len(ran) < i + 1:
                time.sleep(0.001)
        quiet = threading.Thread(target=call, args=("quiet", QUIET if fair else ONE_KEY))
        quiet.start()
        for thread in [*threads, quiet]:
            thread.join()
        end = max(e for _, e in ran.values())
    noisy = [ran[f"n{i}"][0] - made[f"n{i}"] for i in range(args.noisy)]
    return Run(quiet_wait_s=ran["quiet"][0] - made["quiet"],
               noisy_wait_s=statistics.fmean(noisy), all_done_s=end - start,
               call_s=statistics.median(e - s for s, e in ran.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noisy", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--per-tenant", type=int, default=None,
                        help="the fair run's cap on one tenant's processes at once")
    parser.add_argument("--call", choices=("twin", "sleep"), default="twin")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, float] = {}
    for mode in ("fifo", "fair"):
        runs = [one_run(args, fair=mode == "fair") for _ in range(args.runs)]
        for field in ("quiet_wait_s", "noisy_wait_s", "all_done_s", "call_s"):
            results[f"{mode}_{field}"] = statistics.median(getattr(r, field) for r in runs)
        print(f"{mode}: quiet waited {results[f'{mode}_quiet_wait_s']:.3f} s beside "
              f"{args.noisy} noisy calls on {args.workers} process(es); noisy waited "
              f"{results[f'{mode}_noisy_wait_s']:.3f} s on average; all done in "
              f"{results[f'{mode}_all_done_s']:.3f} s, a call running "
              f"{results[f'{mode}_call_s']:.3f} s (median)", flush=True)
    results["check_queue_limit_s"] = CHECK_QUEUE_TIMEOUT_S
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
