"""How far the TTFT and token-gap quantiles read from histograms are off the exact ones.

``histogram_quantile`` (the recording rules, the dashboards, any user's query) knows a
quantile only to its bucket and interpolates linearly inside it; a decode step is steady,
so a token gap's P50 and P90 sit wherever that line puts them. This script simulates
each scenario (``--seconds`` of its workload, its default knobs), feeds every class's
first-token times and token gaps (a request turned away for load: a first token never
given, the +Inf bucket) through the engine's real ``EngineMetrics`` as its server does,
reads the P50, P90 and P99 back from the exposition as Prometheus does
(``histogram_quantiles.histogram_quantile``: the same interpolation, checked against promtool by
``tests/tuner/test_rule_quantiles.py``), and compares each with the exact quantile of the
same latencies (linear between closest ranks, as ``vllm bench serve`` and numpy read
them). The SLO verdict (at least 99 % within the class's target, which the alerts read
as the P99 within it) is compared too. It measures
whatever edges the code it runs has: run it on two commits to compare them.

    .venv/bin/python benchmarks/quantile_resolution.py [--seconds 120] [--scenario NAME ...]

Also reported: the series one built-in engine exports (three classes; the latency
histograms' share), its /metrics size and render time, and one histogram observation's
cost on the gap histogram's edges. Ends with ``RESULT key=value ...``: per figure the
largest and the median |error| over every (scenario, class), the verdicts that differ,
and the costs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import timeit
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_quantile
from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loop_truth import percentile, relative_error  # noqa: E402

SCENARIOS = ("tiny-cpu", "demo", "mixed-priority", "prefill-bursts", "long-context",
             "azure-conv-2023", "seed-h800x8-deepseek67b")
QUANTILES = (0.5, 0.9, 0.99)
TTFT = "vllm:time_to_first_token_seconds"
TBT = "vllm:inter_token_latency_seconds"
MIN_SAMPLES = 50  # a class with fewer latencies has no quantile worth comparing


def buckets(exposition: str, metric: str, cls: str) -> dict[float, float]:
    """``metric``'s cumulative bucket counts of class ``cls``, by edge (+Inf as inf)."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == metric + "_bucket" and s.labels.get("priority_class") == cls:
                le = s.labels["le"]
                out[math.inf if le == "+Inf" else float(le)] = s.value
    return out


def read_back(ttft: Sequence[float], gaps: Sequence[float], p: Priority) -> str:
    """The exposition of a fresh engine's metrics after observing these latencies as its
    server does (the refused are added to +Inf by the caller, as the rules add them)."""
    m = EngineMetrics("m")
    for t in ttft:
        m.observe_ttft(p, t)
    for g in gaps:
        m.observe_token_gap(p, g)
    return m.render().decode()


def compare(scenario: str, seconds: float) -> list[dict[str, float | str]]:
    """One row per class with enough latencies: each figure's read-back and exact."""
    sc = load_scenario(scenario)
    run = simulate(sc, duration_s=seconds)
    rows: list[dict[str, float | str]] = []
    for p in Priority:
        c = run.stats.classes[p]
        ttft, gaps = list(c.ttft), list(c.tbt)
        if len(ttft) < MIN_SAMPLES or len(gaps) < MIN_SAMPLES:
            continue
        text = read_back(ttft, gaps, p)
        row: dict[str, float | str] = {"scenario": scenario, "class": p.label,
                                       "first_tokens": len(ttft) + c.refused,
                                       "gaps": len(gaps)}
        for short, metric, values, never in (("ttft", TTFT, ttft, c.refused),
                                             ("tbt", TBT, gaps, 0)):
            hist = buckets(text, metric, p.label)
            hist[math.inf] += never
            exact_values = values + [math.inf] * never
            for q in QUANTILES:
                key = f"{short}_p{round(q * 100)}"
                read, exact = histogram_quantile(q, hist), percentile(exact_values, q)
                row[key + "_read_ms"], row[key + "_exact_ms"] = read * 1e3, exact * 1e3
                row[key + "_err"] = relative_error(read, exact) if math.isfinite(exact) \
                    else math.nan
            target_ms = getattr(sc.slo.class_slo(p), f"{short}_p99_ms")
            if target_ms is not None:
                # The verdict the alerts take, "the P99 within its target": exactly, at
                # least 99 % of the latencies at or under it (a linear P99 between two
                # ranks can say otherwise across a target: the rank's reading, not the
                # buckets'); read back, histogram_quantile's P99 at or under it.
                within = sum(1 for v in values if v <= target_ms / 1e3)
                row[f"{short}_verdict_differs"] = float(
                    (float(row[f"{short}_p99_read_ms"]) <= target_ms)
                    != (within >= 0.99 * len(exact_values)))
        rows.append(row)
    return rows


def costs() -> dict[str, float]:
    """Series and bytes of one engine's /metrics, its render time, one observation's."""
    m = EngineMetrics("m")
    for p in Priority:
        m.observe_ttft(p, 0.1)
        m.observe_token_gap(p, 0.01)
    text = m.render().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    latency = [s for s in samples if s.startswith((TTFT, TBT))]
    edges = sorted(float(e) for e in buckets(text, TBT, "p0") if math.isfinite(e))
    render_s = min(timeit.repeat(m.render, number=20, repeat=5)) / 20
    recorder = HistogramRecorder(edges)
    observe_s = min(timeit.repeat(lambda: recorder.observe(0.0102), number=100_000,
                                  repeat=5)) / 100_000
    return {"series": len(samples), "ttft_tbt_series": len(latency),
            "tbt_edges": len(edges), "metrics_bytes": len(text.encode()),
            "render_ms": render_s * 1e3, "observe_ns": observe_s * 1e9}


def fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:+.1%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="simulated seconds of each scenario's workload")
    ap.add_argument("--scenario", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    rows: list[dict[str, float | str]] = []
    for name in args.scenario:
        t0 = time.perf_counter()
        new = compare(name, args.seconds)
        rows += new
        print(f"{name}: {len(new)} classes ({time.perf_counter() - t0:.1f} s)")
        for r in new:
            cells = [f"{k}={float(r[k + '_read_ms']):.2f}/{float(r[k + '_exact_ms']):.2f} ms "
                     f"({fmt(float(r[k + '_err']))})"
                     for k in ("ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99")]
            print(f"  {r['class']} ({r['first_tokens']:.0f} first tokens, {r['gaps']:.0f} "
                  "gaps): " + ", ".join(cells))
    result: dict[str, str] = {"rows": str(len(rows))}
    for short in ("ttft", "tbt"):
        for q in QUANTILES:
            key = f"{short}_p{round(q * 100)}"
            errs = [abs(float(r[key + "_err"])) for r in rows
                    if not math.isnan(float(r[key + "_err"]))]
            result[f"{key}_err_max"] = f"{max(errs):.3f}" if errs else "nan"
            result[f"{key}_err_median"] = f"{statistics.median(errs):.3f}" if errs else "nan"
        judged = [float(r[f"{short}_verdict_differs"]) for r in rows
                  if f"{short}_verdict_differs" in r]
        result[f"{short}_verdicts_differ"] = f"{int(sum(judged))}/{len(judged)}"
    for key, value in costs().items():
        result[key] = f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
