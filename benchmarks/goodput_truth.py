"""Goodput as the loop read it from Prometheus, against what clients got, side by side.

Goodput counts the output tokens of the requests that met their class's SLO (TTFT within
target, at most 1 % of their own gaps over the TBT target). Before the engine judged
each request, the rules read it from histograms: tokens x share of first tokens within
target x share of gaps within target, as if every request had the same few slow gaps.
This script runs the simulator (the real scheduler on a GPU cost model, in virtual time)
with its Prometheus exposition on, and per class reads, in one run:

- ``truth``: the simulator's own per-request count (every token gap, exact);
- ``product``: the histograms' product, computed from each replica's exposition as the
  direct scrape and the rules' fallback compute it (``histogram_quantiles.histogram_share_within``),
  summed over the replicas;
- ``verdicts``: the engine's exported per-request verdicts
  (``slopilot_slo_generation_tokens_total{met="true"}``), which the rules now read.

Each is a share of the class's finished requests' output tokens (the tokens the
exposition's ``request_generation_tokens`` counts; the summary's throughput also holds
requests still running at the end), medians over ``--seeds`` runs.

    .venv/bin/python benchmarks/goodput_truth.py [--seconds 120] [--seeds 1 2 3]

Ends with ``RESULT key=value ...``: per case and class, the product's and the verdicts'
error against the truth, in share points.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_share_within
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.slo import SLOSpec
from slopilot.engine.verdicts import SLO_TOKENS

CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("azure", "azure-conv-2023", {}),
    ("azure_big_budget", "azure-conv-2023", {"token_budget": 4096, "chunk_size": 2048}),
    ("mixed", "mixed-priority", {}),
    ("mixed_big_budget", "mixed-priority", {"token_budget": 4096, "chunk_size": 4096}),
)
_TTFT = "vllm:time_to_first_token_seconds_bucket"
_TBT = "vllm:inter_token_latency_seconds_bucket"
_TOKENS = "vllm:request_generation_tokens_sum"


def _read(text: bytes, slo: SLOSpec) -> tuple[dict[str, float], dict[str, float],
                                               dict[tuple[str, str], dict[float, float]]]:
    """One replica's exposition: tokens and verdict tokens by class, and histograms."""
    tokens: dict[str, float] = {}
    good: dict[str, float] = {}
    hist: dict[tuple[str, str], dict[float, float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            c = s.labels.get("priority_class", "")
            if s.name == _TOKENS:
                tokens[c] = tokens.get(c, 0.0) + s.value
            elif s.name == SLO_TOKENS and s.labels.get("met") == "true" \
                    and s.labels.get("slo") == slo.class_slo(c).label:
                good[c] = good.get(c, 0.0) + s.value
            elif s.name in (_TTFT, _TBT):
                buckets = hist.setdefault((s.name, c), {})
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return tokens, good, hist


def shares(expositions: Sequence[bytes], slo: SLOSpec
           ) -> dict[str, tuple[float, float, float]]:
    """Per class with output: (its finished tokens, product share, verdict share), each
    replica counted by itself as the rules count it, then summed."""
    finished: dict[str, float] = {}
    product: dict[str, float] = {}
    verdicts: dict[str, float] = {}
    for text in expositions:
        tokens, good, hist = _read(text, slo)
        for p in Priority:
            c, cls = p.label, slo.class_slo(p)
            share = 1.0
            for name, limit in ((_TTFT, cls.ttft_p99_ms), (_TBT, cls.tbt_p99_ms)):
                buckets = hist.get((name, c), {})
                if limit is not None and buckets.get(math.inf, 0.0) > 0:
                    share *= histogram_share_within(limit / 1000, buckets)
            finished[c] = finished.get(c, 0.0) + tokens.get(c, 0.0)
            product[c] = product.get(c, 0.0) + tokens.get(c, 0.0) * share
            verdicts[c] = verdicts.get(c, 0.0) + good.get(c, 0.0)
    return {c: (n, product[c] / n, verdicts[c] / n) for c, n in finished.items() if n > 0}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="simulated seconds a run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args(argv)
    result: dict[str, str] = {}
    print(f"{'case':18s} {'class':5s} {'truth':>7s} {'product':>8s} {'verdicts':>9s}")
    for key, name, knobs in CASES:
        scenario = load_scenario(name)
        per_class: dict[str, list[tuple[float, float, float]]] = {}
        for seed in args.seeds:
            run = simulate(scenario, knobs, duration_s=args.seconds, seed=seed,
                           with_metrics=True)
            read = shares(run.metrics, scenario.slo)
            duration = run.summary.duration_s
            for p in Priority:
                if p.label not in read:
                    continue
                finished, product, verdicts = read[p.label]
                truth = run.summary.classes[p].goodput_tok_s * duration / finished
                per_class.setdefault(p.label, []).append((truth, product, verdicts))
        for cls, rows in sorted(per_class.items()):
            truth, product, verdicts = (statistics.median(r[i] for r in rows)
                                        for i in range(3))
            print(f"{key:18s} {cls:5s} {truth:7.3f} {product:8.3f} {verdicts:9.3f}")
            result[f"{key}_{cls}_product_err"] = f"{product - truth:+.3f}"
            result[f"{key}_{cls}_verdicts_err"] = f"{verdicts - truth:+.3f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
