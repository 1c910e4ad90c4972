"""A class the trial's config starves of first tokens, as the loop reads it from Prometheus.

The review's case (s4): one replica, P0 at 3 req/s served in 0.1-0.5 s; P1 at 1 req/s
served alike until the trial's config took over at 300 s, then given no first token (its
clients wait on). The trial's window is [312, 420] s. Each pod's series are made from the
requests as a scrape every 15 s would read them, and the loop's own expressions
(``PrometheusWindows``) are evaluated on them by ``promtool test rules``; the window is
then judged as ``trial_window.running_trial`` judges it (the floor, its decisive miss, the
score and its headroom). ``--without-gauge``: the series as an engine without
``slopilot_requests_awaiting_first_token`` exports them (before it existed).
``--lucky``: two P1 requests served in 200 ms in the window.

    .venv/bin/python benchmarks/starved_class.py [--without-gauge] [--lucky]

Needs ``promtool`` on PATH.
"""

from __future__ import annotations

import argparse
import bisect
import random
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.utils import floatToGoString

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.metric_names import AWAITING
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.slo import WITHIN_TTFT_TARGET
from slopilot.engine.verdicts import SLO_TOKENS
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.study.objective import HEADROOM, holds, score
from slopilot.tuner.study.sample_floor import shortfall, starved

SLO = load_scenario("demo").slo
SEL = {"d": "x"}
START, END, PERIOD, FLOOR = 312, 420, 15, 100
TARGET_S = {"p0": 0.8, "p1": 1.5}
SLO_LABEL = {"p0": "ttft_p99_ms=800.0,tbt_p99_ms=60.0",
             "p1": "ttft_p99_ms=1500.0,tbt_p99_ms=150.0"}


@dataclass
class Req:
    cls: str
    arrival: float
    first: float | None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (when, gap s)
    tokens: int = 10

    @property
    def finish(self) -> float | None:
        return self.gaps[-1][0] if self.gaps else self.first


def arrivals(cls: str, t0: float, t1: float, rate: float, rng: random.Random,
             served: bool = True) -> list[Req]:
    out, t = [], t0
    while (t := t + rng.expovariate(rate)) < t1:
        first = t + rng.uniform(0.1, 0.5)
        out.append(Req(cls, t, first, [(first + 0.03 * (i + 1), 0.03) for i in range(9)])
                   if served else Req(cls, t, None))
    return out


def series(reqs: list[Req], gauge: bool) -> list[dict[str, str]]:
    """promtool's input series (1 s steps), one scrape every ``PERIOD`` s up to ``END``."""
    out: dict[str, dict[int, float]] = {}

    def put(name: str, labels: dict[str, str], t: int, v: float) -> None:
        key = name + "{" + ",".join(f'{k}="{x}"' for k, x in sorted({**SEL, **labels,
                                                                      "instance": "a"
                                                                      }.items())) + "}"
        out.setdefault(key, {})[t] = v

    for t in range(0, END + 1, PERIOD):
        put("up", {}, t, 1)
        put("vllm:num_requests_running", {}, t, 0)
        put("vllm:num_requests_waiting", {}, t, sum(
            1 for r in reqs if r.arrival <= t and (r.first is None or r.first > t)))
        put("vllm:num_preemptions_total", {}, t, 0)
        for cls in ("p0", "p1", "p2"):
            lb = {"priority_class": cls}
            mine = [r for r in reqs if r.cls == cls]
            done = [r for r in mine if r.finish is not None and r.finish <= t]
            put("vllm:e2e_request_latency_seconds_count", lb, t, len(done))
            put("vllm:request_generation_tokens_sum", lb, t, sum(r.tokens for r in done))
            for name, values in (
                    ("vllm:time_to_first_token_seconds", sorted(
                        r.first - r.arrival for r in mine
                        if r.first is not None and r.first <= t)),
                    ("vllm:inter_token_latency_seconds", sorted(
                        g for r in mine for when, g in r.gaps if when <= t))):
                for edge in TOKEN_LATENCY_BUCKETS:
                    put(f"{name}_bucket", {**lb, "le": floatToGoString(edge)}, t,
                        bisect.bisect_right(values, edge + 1e-12))
                put(f"{name}_bucket", {**lb, "le": "+Inf"}, t, len(values))
                put(f"{name}_count", lb, t, len(values))
            if cls in SLO_LABEL:
                put(SLO_TOKENS, {**lb, "slo": SLO_LABEL[cls], "met": "true"}, t,
                    sum(r.tokens for r in done))
                put(SLO_TOKENS, {**lb, "slo": SLO_LABEL[cls], "met": "false"}, t, 0)
            if gauge:
                waits = [t - r.arrival for r in mine
                         if r.arrival <= t and (r.first is None or r.first > t)]
                past = sum(1 for w in waits if cls in TARGET_S and w > TARGET_S[cls])
                put(AWAITING, {**lb, WITHIN_TTFT_TARGET: "false"}, t, past)
                put(AWAITING, {**lb, WITHIN_TTFT_TARGET: "true"}, t, len(waits) - past)
    rows = []
    for key, points in out.items():
        tokens, last = [], -1
        for t in sorted(points):
            if t - last > 1:
                tokens.append(f"_x{t - last - 1}")
            tokens.append(repr(points[t]))
            last = t
        rows.append({"series": key, "values": " ".join(tokens)})
    return rows


class Promtool:
    """A ``QueryAt`` answered by ``promtool test rules`` over fixed input series."""

    def __init__(self, rows: list[dict[str, str]], workdir: Path) -> None:
        self.rows, self.workdir = rows, workdir

    def __call__(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        assert at is not None
        test = {"evaluation_interval": "1s", "tests": [{
            "interval": "1s", "input_series": self.rows,
            "promql_expr_test": [{"expr": expr, "eval_time": f"{round(at)}s",
                                  "exp_samples": [{"labels": '{never="1"}', "value": 0}]}]}]}
        (self.workdir / "t.yaml").write_text(yaml.safe_dump(test, width=10**9))
        run = subprocess.run(["promtool", "test", "rules", "t.yaml"], cwd=self.workdir,
                             capture_output=True, text=True, check=False)
        got = re.search(r"got: (.*)", run.stdout + run.stderr)
        if got is None:
            raise RuntimeError((run.stdout + run.stderr)[-2000:])
        if got.group(1).strip() == "nil":
            return []
        return [{"metric": dict(re.findall(r'(\w+)="([^"]*)"', labels)),
                 "value": [at, str(float(value))]}
                for labels, value in re.findall(r"\{([^}]*)\} (\S+?)(?:, |$)", got.group(1))]


def verdict(summary: Any) -> str:
    """``trial_window.running_trial``'s verdict on the window, the alert about P0."""
    bound = frozenset({"p0"}) | starved(summary, SLO, FLOOR)
    result = score(summary, SLO)
    missed = {name.split(".")[0] for name, value
              in zip(result.constraint_names, result.constraints, strict=True)
              if "." in name and value > 0}
    decisive = any(label not in bound or shortfall(
        summary, SLO, FLOOR, END - START, frozenset({label})) is None for label in missed)
    short = shortfall(summary, SLO, FLOOR, END - START, bound)
    if short is not None and not decisive:
        return f"extended ({short.describe()})"
    if not result.feasible:
        return "infeasible: reverted"
    return "commit" if holds(result, HEADROOM) else "confirming window"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--without-gauge", action="store_true")
    ap.add_argument("--lucky", action="store_true")
    args = ap.parse_args()
    rng = random.Random(4)
    reqs = (arrivals("p0", 0, 500, 3, rng) + arrivals("p1", 0, 300, 1, rng)
            + arrivals("p1", 300, 500, 1, rng, served=False))
    if args.lucky:
        reqs += [Req("p1", at, at + 0.2, [(at + 0.5, 0.03)]) for at in (330.0, 360.0)]
    waiting = [r for r in reqs if r.arrival <= END and (r.first is None or r.first > END)
               and r.cls == "p1"]
    with tempfile.TemporaryDirectory() as tmp:
        query = Promtool(series(reqs, not args.without_gauge), Path(tmp))
        summary = PrometheusWindows(query, SEL, SLO).measure(START, END, canary=False)
    p1 = summary.classes[Priority.P1]
    print(f"RESULT gauge={not args.without_gauge} lucky={args.lucky} "
          f"p1_waiting_truth={len(waiting)} "
          f"p1_oldest_wait_s={END - min(r.arrival for r in waiting):.0f} "
          f"p1_ttft_p99_ms={p1.ttft_p99_ms} p1_ttft_samples={p1.ttft_samples} "
          f"p1_requests_awaiting={p1.requests_awaiting} "
          f"feasible={score(summary, SLO).feasible} verdict={verdict(summary)!r}")


if __name__ == "__main__":
    main()
