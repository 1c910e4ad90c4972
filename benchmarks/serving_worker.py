"""slopilot's half of benchmarks/serving_throughput.py: one warm engine, timed on command.

Started by the driver in its own process (so that each allocator variant gets its own
LD_PRELOAD), it loads the model, runs the request set once untimed, prints ``READY``,
then answers one command per stdin line with one ``RESULT_JSON {...}`` line:

    run       all requests at t=0 through continuous batching
    serial    the same requests one at a time
    roofline  this machine's GEMM and bandwidth ceilings for the decode step's shapes
    quit      exit (so does end of input)

The same protocol drives vLLM's peer (benchmarks/peers/vllm_serving_bench.py --serve),
so the driver can interleave rounds of both engines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.executors.kernel_modes import KERNEL_CHOICES
from slopilot.engine.executors.roofline import decode_step_cost, measure_ceilings
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request, SamplingParams

RESULT = "RESULT_JSON "


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, round(q * len(ordered) + 0.4999))) - 1]


class _Stamps:
    """Engine observer: per-request token times and the time of each full decode step."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.first: dict[str, float] = {}
        self.gaps: list[float] = []
        self.decode_steps: list[float] = []

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        if out.num_prefill_tokens == 0 and out.num_decode_tokens == self.batch:
            self.decode_steps.append(elapsed_s)

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.first[req.request_id] = ttft_s

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.gaps.append(gap_s)

    def on_finished(self, req: Request, now: float) -> None:
        return None


def run_engine(executor: TorchExecutor, prompts: list[list[int]], max_tokens: int,
               ignore_eos: bool, serial: bool) -> dict[str, Any]:
    cfg = EngineConfig(token_budget=2048, chunk_size=2048, max_num_seqs=256,
                       kv_watermark=0.0)
    stamps = _Stamps(len(prompts))
    engine = LLMEngine(cfg, executor, executor.num_gpu_blocks, clock=WallClock(),
                       observers=[stamps])
    eos = executor.eos_token_id
    reqs = [Request(f"r{i}", list(p), SamplingParams(max_tokens=max_tokens,
                                                     ignore_eos=ignore_eos),
                    eos_token_id=eos)
            for i, p in enumerate(prompts)]
    start = time.perf_counter()
    if serial:
        for r in reqs:
            r.arrival_time = time.monotonic()
            engine.add_request(r)
            engine.run_until_idle()
    else:
        now = time.monotonic()
        for r in reqs:
            r.arrival_time = now
            engine.add_request(r)
        engine.run_until_idle()
    elapsed = time.perf_counter() - start
    out_tokens = sum(r.num_output_tokens for r in reqs)
    steps = stamps.decode_steps
    return {"tokens_per_s": out_tokens / elapsed, "elapsed_s": elapsed,
            "output_tokens": out_tokens,
            "ttft_p99_ms": percentile(list(stamps.first.values()), 0.99) * 1e3,
            "tbt_p99_ms": percentile(stamps.gaps, 0.99) * 1e3 if stamps.gaps else None,
            "decode_step_ms": statistics.median(steps) * 1e3 if steps else None,
            "decode_steps": len(steps),
            "token_ids": {r.request_id: r.output_token_ids for r in reqs}}


def roofline(executor: TorchExecutor, batch: int, context: float) -> dict[str, Any]:
    """The ceilings in the engine's own dtype: a bfloat16 step meets bfloat16 kernels."""
    cost = decode_step_cost(executor.config, batch, context, executor.dtype.itemsize)
    ceilings = measure_ceilings(cost.gemms, executor.dtype, engine=executor.kernels.kernels)
    return {"dtype": str(executor.dtype).removeprefix("torch."),
            "threads": ceilings.threads, "stream_bytes_per_s": ceilings.stream_bytes_per_s,
            "shapes": [{**asdict(s.gemm), "streamed": s.streamed_flops_per_s,
                        "in_cache": s.in_cache_flops_per_s, "kernel": s.kernel}
                       for s in ceilings.shapes]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--requests", type=Path, required=True,
                    help="JSON list of {prompt_token_ids, max_tokens}")
    ap.add_argument("--respect-eos", action="store_true",
                    help="stop at the end-of-turn token (default: ignore_eos)")
    ap.add_argument("--cpu-kernels", choices=KERNEL_CHOICES, default="auto",
                    help="as `slopilot serve --cpu-kernels`")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="as `slopilot serve --dtype`")
    args = ap.parse_args()
    items = json.loads(args.requests.read_text())
    prompts = [item["prompt_token_ids"] for item in items]
    max_tokens = int(items[0]["max_tokens"])
    ignore_eos = not args.respect_eos
    executor = TorchExecutor(args.model, dtype=args.dtype, num_cpu_blocks=0,
                             cpu_kernels=args.cpu_kernels)
    print(f"kernels: {executor.kernels.reason}", file=sys.stderr, flush=True)
    run_engine(executor, prompts, max_tokens, ignore_eos, serial=False)  # warm-up
    print("READY", flush=True)
    context = statistics.fmean(len(p) for p in prompts) + max_tokens / 2
    env = {k: os.environ.get(k) for k in ("LD_PRELOAD", "OMP_NUM_THREADS")}
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command in ("run", "serial"):
            result = run_engine(executor, prompts, max_tokens, ignore_eos,
                                serial=command == "serial")
        elif command == "roofline":
            result = roofline(executor, len(prompts), context)
        else:
            result = {"error": f"unknown command {command!r}; use run, serial, roofline, quit"}
        result |= {"env": env, "torch_threads": torch.get_num_threads()}
        print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
