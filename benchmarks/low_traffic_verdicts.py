"""How often the trial rule commits a config that truly misses, at low traffic.

One long stationary run of one replica (tiny-cpu's A100 and Llama-3-8B; Poisson arrivals,
40 % P0 of prompts around 1536 tokens) gives the true P0 TTFT P99 of its config; the P0
SLO is then set so that it reads 1.0, 1.1, 1.25, 1.5 x the SLO. Trials are cut from the
same run back to back and judged by the loop's rule (``trial_window.py``): a window of
``window_s`` past the first ``settle_s``, measured again over all of the trial since then
until each judged class it served holds ``--floor`` requests (0: the rule before the
floor), at most ``max_trial_s`` a window (each from its own start); it commits when it
holds with ``HEADROOM`` to spare, or holds and a confirming window (under the same floor)
holds too.

    .venv/bin/python benchmarks/low_traffic_verdicts.py --rate 0.3 --minutes 1200 --floor 100

Every figure is the share of trials that committed (a false commit where the true P99
is over the SLO); trials that ran out of time unjudged commit nothing.
"""

from __future__ import annotations

import argparse
import bisect
import copy
from pathlib import Path
from typing import Any

import yaml

from slopilot.engine.request import Priority
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.objective import HEADROOM, holds, score, unmeasured
from slopilot.tuner.study.sample_floor import shortfall

ROOT = Path(__file__).resolve().parent.parent
WINDOW_S, SETTLE_S, TICK_S, MIN_REQUESTS, WARMUP_S = 120.0, 12.0, 15.0, 10, 300.0
FACTORS = (1.0, 1.1, 1.25, 1.5)


def scenario(rate: float, minutes: float, p0_ttft_ms: float = 400.0) -> Scenario:
    data = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["name"], data["duration_s"] = "lowtraffic", minutes * 60
    workload = data["workload"]
    workload["arrivals"]["rate"] = rate
    workload.pop("shift")
    workload["prompt_tokens"] = {"dist": "lognormal", "mean": 1536, "sigma": 0.5,
                                 "min": 256, "max": 3072}
    workload["classes"] = {"p0": 0.4, "p1": 0.5, "p2": 0.1}
    data["slo"]["classes"]["p0"]["ttft_p99_ms"] = p0_ttft_ms
    return parse_scenario(data, source="lowtraffic")


class Windows:
    """``SimCluster.summary`` of a finished run, on the time-ordered event lists cut to the
    range first: the cluster scans every event of the run for each window, and a long run
    holds millions of engine steps."""

    NAMES = ("ttft", "gaps", "finished", "steps", "refused", "arrived")

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.full: list[dict[str, list[Any]]] = []
        self.keys: list[dict[str, list[float]]] = []
        for rep in cluster.reps + cluster.retired:
            ev = rep.recorder.ev
            rows = {n: list(getattr(ev, n)) for n in self.NAMES}
            self.full.append(rows)
            self.keys.append({n: [r if isinstance(r, float) else r[0] for r in v]
                              for n, v in rows.items()})

    def summary(self, start: float, end: float) -> WindowSummary:
        reps = self.cluster.reps + self.cluster.retired
        for rep, rows, keys in zip(reps, self.full, self.keys, strict=True):
            for n in self.NAMES:
                lo, hi = bisect.bisect_left(keys[n], start), bisect.bisect_left(keys[n], end)
                setattr(rep.recorder.ev, n, rows[n][lo:hi])
        return self.cluster.summary(start, end)


def _window(c: Windows, slo: SLOSpec, start: float, t: float, began: float, floor: int,
            max_trial_s: float, end: float) -> tuple[WindowSummary | None, float]:
    """The window from ``start``, extended tick by tick until it holds ``floor`` of each
    judged class; (None, when) where the trial's cap or the run's end comes first."""
    t = max(t, start + WINDOW_S - SETTLE_S if start == began + SETTLE_S else start + WINDOW_S)
    while t <= end:
        s = c.summary(start, t)
        usable = s.overall.requests_finished >= MIN_REQUESTS and \
            "p0" not in unmeasured(s, slo)
        if usable and shortfall(s, slo, floor, t - start) is None:
            return s, t
        if t - began >= max_trial_s:
            return None, t
        t += TICK_S
    return None, end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=0.3)
    ap.add_argument("--minutes", type=float, default=1200.0)
    ap.add_argument("--floor", type=int, default=100)
    ap.add_argument("--max-trial-s", type=float, default=1200.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    sc = scenario(a.rate, a.minutes)
    c = SimCluster(sc, dict(sc.engine), replicas=1, seed=a.seed)
    end = a.minutes * 60
    c.advance(end)
    true = c.summary(WARMUP_S, end).classes[Priority.P0].ttft_p99_ms
    w = Windows(c)
    assert true is not None
    print(f"rate {a.rate}/s, floor {a.floor}: true P0 TTFT P99 {true:.0f} ms over "
          f"{a.minutes:g} min")
    result = [f"rate={a.rate:g}", f"floor={a.floor}", f"true_p0_ttft_p99_ms={true:.0f}"]
    for f in FACTORS:
        slo = scenario(a.rate, 1, p0_ttft_ms=true / f).slo
        trials = commits = unjudged = 0
        began = WARMUP_S
        while began + WINDOW_S <= end:
            trials += 1
            first, t = _window(w, slo, began + SETTLE_S, began, began, a.floor,
                               a.max_trial_s, end)
            ok = False
            if first is None:
                unjudged += 1
            else:
                r = score(first, slo)
                if r.feasible and not holds(r, HEADROOM):
                    # The confirming window gets max_trial_s from its own start.
                    second, t = _window(w, slo, t, t, t, a.floor, a.max_trial_s, end)
                    unjudged += second is None
                    ok = second is not None and score(second, slo).feasible
                else:
                    ok = r.feasible
            commits += ok
            began = t
        print(f"  true P99 = {f:4.2f} x SLO: {trials:3d} trials, committed "
              f"{commits / trials:5.1%}, unjudged {unjudged}", flush=True)
        result += [f"committed_at_{f:g}x={commits / trials:.3f}",
                   f"unjudged_at_{f:g}x={unjudged}"]
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
