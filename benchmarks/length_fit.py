"""How far the workload probe's fit of a token-length distribution is off the truth.

The probe (``tuner/prometheus/profiling.length_profile``) knows a window's prompt and
output lengths only as a histogram: the mean exactly (``_sum / _count``), the spread from
the bucket counts. The engine's token histograms have power-of-two edges, vLLM's 1-2-5
ones (``build_1_2_5_buckets``), and the probe reads either. This script draws lognormal
lengths over a grid of means and spreads (log-space sigma), puts them in both bucket
layouts, fits each, and compares the fitted sigma with the true one. It measures
whatever fit the code it runs has: run it on two commits to compare them.

    .venv/bin/python benchmarks/length_fit.py [--samples 20000] [--seeds 5]

Ends with ``RESULT key=value ...``: per layout the largest and the median |sigma error|
over the grid (median over seeds per cell).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slopilot.engine.metrics import TOKEN_BUCKETS
from slopilot.tuner.prometheus.profiling import length_profile

MEANS = (40, 64, 300, 512, 1000, 2048, 8000)
SIGMAS = (0.05, 0.15, 0.2, 0.3, 0.5, 0.7, 1.2)


def one_two_five(max_model_len: int) -> list[float]:
    """vLLM's edges for its token-count histograms: 1, 2, 5, 10, 20, 50, ..."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            edge = m * 10**exponent
            if edge > max_model_len:
                return out
            out.append(float(edge))
        exponent += 1


def fitted_sigma(edges: list[float], mean: float, sigma: float, samples: int,
                 seed: int) -> float:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, samples)
    buckets = {e: float(np.sum(values <= e)) for e in [*edges, math.inf]}
    return length_profile(buckets, float(values.sum()), float(len(values))).sigma


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    layouts = {"engine": list(TOKEN_BUCKETS), "vllm": one_two_five(32_768)}
    worst: dict[str, float] = {}
    typical: dict[str, float] = {}
    for name, edges in layouts.items():
        print(f"{name} edges: fitted sigma (median of {args.seeds} seeds) per mean x sigma")
        print("mean   " + " ".join(f"{s:>6}" for s in SIGMAS))
        errors = []
        for mean in MEANS:
            row = []
            for sigma in SIGMAS:
                fit = statistics.median(fitted_sigma(edges, mean, sigma, args.samples, seed)
                                        for seed in range(args.seeds))
                row.append(fit)
                errors.append(abs(fit - sigma))
            print(f"{mean:<6} " + " ".join(f"{f:6.3f}" for f in row))
        worst[name], typical[name] = max(errors), statistics.median(errors)
    print(f"RESULT engine_max_err={worst['engine']:.3f} "
          f"engine_median_err={typical['engine']:.3f} vllm_max_err={worst['vllm']:.3f} "
          f"vllm_median_err={typical['vllm']:.3f}")


if __name__ == "__main__":
    main()
