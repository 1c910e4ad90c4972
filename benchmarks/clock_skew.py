"""What an operator whose clock is off Prometheus's reads of a trial's window, as it read
before (every time passed to Prometheus as the operator's clock has it) and through
``prometheus/clock_offset.PrometheusClock`` (moved onto Prometheus's clock).

A real Prometheus (``prometheus`` and ``promtool`` on PATH) holds a real engine's 15 s
scrapes, backfilled so that their present is Prometheus's own now: 2 requests a second
of P0 and of P1 (4/s), config A (P0 TTFT 1.5 s) until the apply, config B (0.3 s) after
it. The trial's window is the loop's: [apply + settle_s (12), now], 120 s after the
apply, every time on an operator's clock ``skew`` s ahead (negative: behind); the
workload probe's arrivals and the backlog wait's queue are read at that ``now``.
True figures: 432 finished, 4.00/s, P0 TTFT P99 ~330 ms, goodput 40 tok/s.

    .venv/bin/python benchmarks/clock_skew.py [--skews -60,-30,-15,0,15,30,45,60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The backfill helpers live with the tests (tests/support), run from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.clock_offset import PrometheusClock
from slopilot.tuner.prometheus.profiling import WorkloadProfile, probe_window_s
from slopilot.tuner.prometheus.query import QueryAt, query_at
from slopilot.tuner.study.evaluator import WindowRejected
from tests.support.backfill import backfill, steady_scrapes
from tests.support.prometheus import find_binaries, start_prometheus

SLO = load_scenario("demo").slo
SELECTOR = {"slopilot_deployment": "d"}
APPLY, ELAPSED, SETTLE = 1500, 120, 12


def operator_clock(skew: float) -> Callable[[], float]:
    """An operator's clock ``skew`` s ahead of this machine's (Prometheus's)."""
    return lambda: time.time() + skew


@dataclass(frozen=True)
class Read:
    text: str
    finished: float | None = None
    """None: the window was rejected."""
    p0_ttft_ms: float | None = None


def row(query: QueryAt, t0: float, skew: float) -> Read:
    start, now = t0 + APPLY + skew + SETTLE, t0 + APPLY + ELAPSED + skew
    probe = WorkloadProfile.measure(lambda expr: query(expr, now), SELECTOR,
                                    probe_window_s(120), now=now).arrival_rate
    windows = PrometheusWindows(query, SELECTOR, SLO)
    queue = windows.queue(now, canary=False)
    arrivals = "None" if queue is None else f"{queue.arrivals_per_s:.2f}"
    side = f"probe {probe:.2f}/s queue {arrivals}/s"
    try:
        s = windows.measure(start, now, canary=False)
    except WindowRejected as exc:
        return Read(f"REJECTED ({exc.reason[:60]}); {side}")
    p0 = s.classes[Priority.P0].ttft_p99_ms
    return Read(f"finished {s.overall.requests_finished:5.1f} rate "
                f"{s.request_rate or 0:.2f}/s P0 TTFT P99 {p0 or 0:5.0f} ms goodput "
                f"{s.overall.goodput_tok_s:4.1f}; {side}", s.overall.requests_finished, p0)


def worst_error(reads: list[Read], truth: Read) -> tuple[float, int]:
    """The largest relative error of the finished count and the P0 TTFT P99 against
    ``truth`` over ``reads``, and how many were rejected (no figure at all)."""
    worst, rejected = 0.0, 0
    for r in reads:
        if r.finished is None or r.p0_ttft_ms is None:
            rejected += 1
            continue
        for got, true in ((r.finished, truth.finished), (r.p0_ttft_ms, truth.p0_ttft_ms)):
            if true:
                worst = max(worst, abs(got - true) / true)
    return worst, rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skews", default="-60,-30,-15,0,15,30,45,60")
    args = parser.parse_args()
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("prometheus and promtool are not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        t0 = float(int(time.time()) - APPLY - ELAPSED)
        lines = steady_scrapes(SLO, t0=t0, end_s=APPLY + ELAPSED, scrape_s=15,
                               per_class_rate=2,
                               ttft_s=lambda second: 1.5 if second <= APPLY else 0.3,
                               labels='instance="10.0.0.1:8000",slopilot_deployment="d",'
                                      'job="slopilot"')
        backfill(binaries, lines, workdir / "data")
        server = start_prometheus(binaries, workdir)
        try:
            truth = row(query_at(server.url), t0, 0.0)  # one clock: the true figures
            before, after = [], []
            for skew in (float(s) for s in args.skews.split(",")):
                aligned = PrometheusClock(query_at(server.url), label="benchmark",
                                          clock=operator_clock(skew))
                before.append(row(query_at(server.url), t0, skew))
                after.append(row(aligned, t0, skew))
                print(f"skew {skew:+4.0f} s before: {before[-1].text}")
                print(f"skew {skew:+4.0f} s after:  {after[-1].text}")
        finally:
            server.stop()
    (err_before, rej_before), (err_after, rej_after) = (worst_error(r, truth)
                                                        for r in (before, after))
    print(f"RESULT skews={len(before)} rejected_before={rej_before} "
          f"rejected_after={rej_after} worst_rel_err_before={err_before:.3f} "
          f"worst_rel_err_after={err_after:.3f}")


if __name__ == "__main__":
    main()
