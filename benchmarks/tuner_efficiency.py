"""Tuner efficiency: trials TPE and random search need to match a 300+-point grid.

Three scenarios, one per SLO tier, each loaded to where the knobs decide goodput: one
A100 shared with other work (gpu_memory_utilization 0.3, so the KV cache holds ~60k
tokens and admission, preemption and the P0 fast path matter), Llama-3-8B, with half
the traffic P2 (no SLO) so the load past what P0/P1 need is throughput to win or lose:

- strict: chat (short prompts, 20 % P0), P0 TTFT 200 ms / TBT 30 ms;
- standard: bursty mixed priority (gamma arrivals, cv 3, prompts clipped at 2,048), P0
  TTFT 400 ms / TBT 60 ms, P1 TTFT 1.25 s. (It was prompts to 7,000 with P0 TTFT 300 ms
  and P1 1 s: judged on three seeds with headroom, as ``tune`` judges, no config could
  hold that, since a seed whose P0 draws a prompt of several thousand tokens cannot
  prefill it in 300 ms on this A100; the tier was changed after that miss, to a
  feasible region of about the old size, docs/tuner_efficiency.md.)
- relaxed: long prompts (~2k tokens), P1 TTFT 2 s / TBT 200 ms.

The grid sweeps token_budget (8 points on its alignment grid) x chunk_size (4 fractions
of the budget) x max_num_seqs (4, log-spaced) x p0_preempt_utilization (3), the way
vLLM's auto_tune sweeps its grid; the best feasible goodput on it is the reference.
TPE and random search then run on the same four knobs (continuous, not gridded),
several sampler seeds each, until a trial is feasible with >= 95 % of the grid's
goodput (or the trial cap).

Every config, grid or search, is judged as ``slopilot tune`` judges it
(``tuner/sim/robust.RobustEvaluator``): on ``--workload-seeds`` seeds of the workload,
feasible only if every SLO term holds in every seed with the loop's 10 % headroom, its
objective the worst seed's goodput share.

    .venv/bin/python benchmarks/tuner_efficiency.py [--seeds 7] [--max-trials 100]
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.sim.robust import RobustEvaluator, plan_windows
from slopilot.tuner.study.grid_sweep import grid_sweep
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner

_DEPLOYMENT: dict[str, Any] = {
    "gpu": "A100", "num_gpus": 1, "tp": 1, "model": "llama-3-8b", "seed": 0,
    "gpu_memory_utilization": 0.3, "engine": {},
}
_RATES = {"strict": 18.0, "standard": 6.0, "relaxed": 3.0}


def _workload(tier: str, rate: float) -> dict[str, Any]:
    if tier == "strict":
        return {"type": "open_loop", "arrivals": {"process": "poisson", "rate": rate},
                "prompt_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.7,
                                  "min": 16, "max": 2048},
                "output_tokens": {"dist": "lognormal", "mean": 128, "sigma": 0.5,
                                  "min": 4, "max": 512},
                "shared_prefix_tokens": 64, "classes": {"p0": 0.2, "p1": 0.3, "p2": 0.5}}
    if tier == "standard":
        return {"type": "open_loop", "arrivals": {"process": "gamma", "rate": rate, "cv": 3},
                "prompt_tokens": {"dist": "lognormal", "mean": 800, "sigma": 0.9,
                                  "min": 16, "max": 2048},
                "output_tokens": {"dist": "lognormal", "mean": 180, "sigma": 0.7,
                                  "min": 8, "max": 1000},
                "shared_prefix_tokens": 128, "classes": {"p0": 0.1, "p1": 0.4, "p2": 0.5}}
    return {"type": "open_loop", "arrivals": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "mean": 2048, "sigma": 0.5,
                              "min": 256, "max": 7000},
            "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.6,
                              "min": 8, "max": 1024},
            "classes": {"p0": 0.05, "p1": 0.45, "p2": 0.5}}


TIERS: dict[str, dict[str, Any]] = {
    "strict": {"p0": {"ttft_p99_ms": 200, "tbt_p99_ms": 30},
               "p1": {"ttft_p99_ms": 500, "tbt_p99_ms": 50}},
    "standard": {"p0": {"ttft_p99_ms": 400, "tbt_p99_ms": 60},
                 "p1": {"ttft_p99_ms": 1250, "tbt_p99_ms": 100}},
    "relaxed": {"p0": {"ttft_p99_ms": 500, "tbt_p99_ms": 100},
                "p1": {"ttft_p99_ms": 2000, "tbt_p99_ms": 200}},
}
SHAPES = {"strict": "chat, Poisson, 20 % P0, prompts ~256",
          "standard": "bursty (gamma cv 3), 10 % P0, prompts ~800 (max 2,048)",
          "relaxed": "long prompts ~2048, Poisson, 5 % P0"}
GRID_POINTS = {"token_budget": 8, "chunk_size": 4, "max_num_seqs": 4,
               "p0_preempt_utilization": 3}
TARGET = 0.95
NOTES = (
    "How to read it: the grid is the reference (best feasible goodput over its configs); "
    "a search run counts the trials until one is feasible with >= 95 % of that goodput. "
    "Runs at the cap never got there and count as the cap in the median. \"grid hits\" "
    "is the fraction of grid configs that are feasible with >= 95 % of the best: the "
    "chance one random config succeeds, so 1 / hits is what random search should need. "
    "Goodput counts the output tokens of requests that met their class's SLO (P2 has "
    "none), so past what P0/P1 need, a config's goodput is how much P2 work it fits in "
    "without breaking the P0/P1 latency terms. Every config is judged as `slopilot tune` "
    "judges it: on several workload seeds, feasible only with 10 % headroom on every SLO "
    "term in every seed, its objective (\"goodput\" in the table) the worst seed's goodput "
    "share (output tokens within SLO over output tokens asked for). The sampler is "
    "Optuna's multivariate TPE with 5 random start trials and the SLO terms as constraints "
    "(slopilot.tuner.study.storage.make_sampler).")


def tier_slo(tier: str) -> SLOSpec:
    return SLOSpec.from_dict(_slo_data(tier))


def _slo_data(tier: str) -> dict[str, Any]:
    return {"profile": "standard", "classes": TIERS[tier], "max_preemptions_per_min": 10}


def bench_scenario(tier: str, rate: float, duration_s: float) -> Scenario:
    data = copy.deepcopy(_DEPLOYMENT)
    data.update(name=f"tuner-efficiency-{tier}", duration_s=duration_s,
                workload=_workload(tier, rate), slo=_slo_data(tier))
    return parse_scenario(data, source="tuner_efficiency")


def space() -> SearchSpace:
    # The grid's four knobs are tuned; the rest stay at the engine defaults.
    return SearchSpace.from_bounds({"preemption_mode": "auto", "recompute_max_tokens": 512,
                                    "max_preemptions_per_step": 2, "swap_timeout_ms": 50.0,
                                    "kv_watermark": 0.05})


_EVALUATORS: dict[str, RobustEvaluator] = {}


def _init(rates: Mapping[str, float], duration_s: float, seeds: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for t in TIERS:
        sc = bench_scenario(t, rates[t], duration_s)
        _EVALUATORS[t] = RobustEvaluator(sc, plan_windows(sc, seeds=seeds))


def evaluate(tier: str, config: Mapping[str, Any]) -> TrialResult:
    return _EVALUATORS[tier].evaluate(config)


def _grid_job(args: tuple[str, dict[str, Any]]) -> TrialResult:
    return evaluate(*args)


def trials_to_target(sampler: str, seed: int, tier: str, target: float,
                     max_trials: int) -> int | None:
    tuner = Tuner(open_study(None, f"{sampler}-{tier}-{seed}", sampler=sampler, seed=seed),
                  space())
    for i in range(1, max_trials + 1):
        number, config = tuner.ask()
        result = evaluate(tier, config)
        tuner.tell(number, result)
        if result.feasible and result.value >= target:
            return i
    return None


def _search_job(args: tuple[str, int, str, float, int]) -> tuple[str, str, int, int | None]:
    sampler, seed, tier, target, max_trials = args
    return sampler, tier, seed, trials_to_target(sampler, seed, tier, target, max_trials)


def spread(results: list[TrialResult]) -> dict[str, float]:
    """How much the grid's goodput varies: the case for tuning at all."""
    feasible = sorted(r.value for r in results if r.feasible)
    if not feasible:
        return {"feasible": 0, "best": 0.0, "median": 0.0, "hits": 0.0}
    best = feasible[-1]
    hits = sum(g >= TARGET * best for g in feasible)
    return {"feasible": len(feasible), "best": best, "median": statistics.median(feasible),
            "all_median": statistics.median(r.value for r in results),
            "hits": hits / len(results)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=7, help="sampler seeds per method")
    ap.add_argument("--max-trials", type=int, default=100, help="cap per search")
    ap.add_argument("--duration", type=float, default=30.0, help="simulated seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workload-seeds", type=int, default=3,
                    help="workload seeds each config is judged on (tune's default: 3)")
    ap.add_argument("--grid-only", action="store_true", help="print the grid's spread only")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    for tier, rate in _RATES.items():
        ap.add_argument(f"--{tier}-rate", type=float, default=rate,
                        help=f"arrivals per second in the {tier} scenario")
    args = ap.parse_args(argv)
    rates = {t: getattr(args, f"{t}_rate") for t in TIERS}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    grid = grid_sweep(space(), GRID_POINTS)
    ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
    with ctx.Pool(args.workers, initializer=_init,
                  initargs=(rates, args.duration, args.workload_seeds)) as pool:
        flat = pool.map(_grid_job, [(t, c) for t in TIERS for c in grid], chunksize=4)
        grid_s = time.perf_counter() - t0
        by_tier = {t: flat[i * len(grid):(i + 1) * len(grid)] for i, t in enumerate(TIERS)}
        spreads = {t: spread(by_tier[t]) for t in TIERS}
        for t, s in spreads.items():
            best = max((r for r in by_tier[t] if r.feasible), key=lambda r: r.value,
                       default=None)
            knobs = {k: best.config[k] for k in GRID_POINTS} if best else None
            print(f"grid {t}: " + " ".join(f"{k}={v:.3g}" for k, v in s.items())
                  + f" best_config={knobs}", flush=True)
        if any(s["feasible"] == 0 for s in spreads.values()):
            raise SystemExit("a tier has no feasible grid config; lower its rate")
        if args.grid_only:
            return 0
        jobs = [(sampler, seed, tier, TARGET * spreads[tier]["best"], args.max_trials)
                for tier in TIERS for sampler in ("tpe", "random") for seed in range(args.seeds)]
        found = pool.map(_search_job, jobs, chunksize=1)
    total_s = time.perf_counter() - t0

    def runs(sampler: str, tier: str) -> list[int | None]:
        return [n for s, t, _, n in found if s == sampler and t == tier]

    def med(sampler: str, tier: str) -> float:
        # A search that never got there counts as the cap (a lower bound on its need).
        return statistics.median(n if n is not None else args.max_trials
                                 for n in runs(sampler, tier))

    lines = [
        f"Command: `.venv/bin/python benchmarks/tuner_efficiency.py --seeds {args.seeds} "
        f"--max-trials {args.max_trials} --workload-seeds {args.workload_seeds}` "
        f"({args.workers} workers; grid {grid_s:.0f} s, total {total_s:.0f} s).",
        "",
        f"Deployment: 1 x A100 (gpu_memory_utilization 0.3), Llama-3-8B, "
        f"{args.duration:g} s simulated per window, {args.workload_seeds} workload seeds per "
        f"config, 50 % P2. Trials = median over {args.seeds} sampler seeds to reach a "
        f"feasible config with >= {TARGET:.0%} of the grid's best feasible objective "
        f"(cap {args.max_trials}).",
        "",
        "| SLO tier | workload | req/s | grid configs | grid feasible | grid goodput share "
        "best / median feasible | grid hits (>= 95 %, feasible) | "
        "TPE trials (median) | TPE runs at cap | random trials (median) | "
        "random runs at cap | grid / TPE |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kv = [f"grid_configs={len(grid)}"]
    for tier in TIERS:
        s = spreads[tier]
        tpe, rnd = med("tpe", tier), med("random", tier)
        cap = {m: sum(n is None for n in runs(m, tier)) for m in ("tpe", "random")}
        lines.append(
            f"| {tier} | {SHAPES[tier]} | {rates[tier]:g} | {len(grid)} | {s['feasible']:.0f} "
            f"| {s['best']:.1%} / {s['median']:.1%} | {s['hits']:.1%} | {tpe:g} | "
            f"{cap['tpe']} of {args.seeds} | {rnd:g} | {cap['random']} of {args.seeds} | "
            f"{len(grid) / tpe:.1f} |")
        kv += [f"{tier}_grid_goodput_share={s['best']:.4f}", f"{tier}_grid_hits={s['hits']:.3f}",
               f"{tier}_tpe_trials={tpe:g}", f"{tier}_random_trials={rnd:g}"]
    worst_tpe = max(med("tpe", t) for t in TIERS)
    kv += [f"tpe_trials_max_median={worst_tpe:g}",
           f"speedup_grid_over_tpe={len(grid) / worst_tpe:.1f}", f"total_s={total_s:.0f}"]
    table = "\n".join(lines)
    print(table)
    result = "RESULT " + " ".join(kv)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# Tuner efficiency\n\n{table}\n\n{NOTES}\n\n```\n{result}\n```\n")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
