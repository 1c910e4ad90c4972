"""Where does one iteration's time go on a GPU, and how much does it scatter?

The calibrated twin can be no closer to the engine than the engine is to itself. On the
device machine the twin's fidelity run measured an iteration noise floor of 33 % with the
GPU 0-22 % busy: the engine is host-bound there. This script times the same iteration
over and over, through the executor's public ``execute()`` as calibration does, and
splits each one into:

- ``wall``: the executor's own elapsed time (what calibration and the twin use);
- ``cpu``: the Python thread's CPU time in it (host work, plus any spin-wait on the GPU);
- ``gpu``: CUDA events around it (the device's span: kernels and the gaps between them).

It also times an empty kernel launch (a 1-element add) to give the host's per-launch
cost, and counts the CUDA kernels one iteration launches (torch.profiler). Each shape
runs at torch's default intra-op threads and at one thread.

    python3 benchmarks/gpu_step_jitter.py            # on the device machine
    .venv/bin/python benchmarks/gpu_step_jitter.py --device cpu --iters 20   # here

Ends with ``RESULT launch_us=... <shape>_wall_ms=... <shape>_gpu_ms=... <shape>_spread=...``
(spread: interquartile range over the median of ``wall``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check import SMOLLM2_SHAPE

from slopilot.engine.calibrate.design import ShapeSpec
from slopilot.engine.calibrate.harness import BlockPlan
from slopilot.engine.executors.tiny_random import build_tiny_random
from slopilot.engine.executors.torch_runner import TorchExecutor

SHAPES = {
    "decode8": ShapeSpec(tuple((1, 256, True) for _ in range(8)), "decode"),
    "decode32": ShapeSpec(tuple((1, 256, True) for _ in range(32)), "decode"),
    "chunk256": ShapeSpec(((256, 0, True),), "prefill"),
}


def launch_us(device: torch.device, n: int = 2000) -> float:
    """Host cost of one tiny kernel launch, the GPU never the bottleneck."""
    x = torch.zeros(1, device=device)
    for _ in range(50):
        x.add_(1)
    _sync(device)
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    _sync(device)
    return (time.perf_counter() - t) / n * 1e6


def kernels_per_iteration(ex: TorchExecutor, spec: ShapeSpec, plan: BlockPlan) -> int:
    from torch.profiler import ProfilerActivity, profile

    if ex.device.type != "cuda":
        return 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ex.execute(plan.output(spec))
    return sum(e.count for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA)


def time_shape(ex: TorchExecutor, spec: ShapeSpec, plan: BlockPlan, iters: int
               ) -> dict[str, list[float]]:
    out = plan.output(spec)
    cuda = ex.device.type == "cuda"
    for _ in range(5):
        ex.execute(out)
    wall, cpu, gpu = [], [], []
    for _ in range(iters):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        c0 = time.thread_time()
        result = ex.execute(out)
        cpu.append(time.thread_time() - c0)
        wall.append(result.elapsed_s)
        if cuda:
            end.record()
            end.synchronize()
            gpu.append(begin.elapsed_time(end) / 1e3)
    return {"wall": wall, "cpu": cpu, "gpu": gpu}


class _StepTimes:
    """An engine observer keeping each step's executor time."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step(self, engine: object, out: object, elapsed_s: float, now: float) -> None:
        self.seconds.append(elapsed_s)

    def on_finished(self, *args: object) -> None: ...
    def on_first_token(self, *args: object) -> None: ...
    def on_token_gap(self, *args: object) -> None: ...


def served_decodes(ex: TorchExecutor, iters: int) -> tuple[list[float], Any]:
    """Eight requests of 256 prompt tokens decoding through the engine loop, as a server
    runs them: each step's executor time, then a profile of three more steps."""
    from torch.profiler import ProfilerActivity, profile

    from slopilot.engine.config import EngineConfig
    from slopilot.engine.engine import LLMEngine
    from slopilot.engine.request import Request, SamplingParams

    steps = _StepTimes()
    engine = LLMEngine(EngineConfig(token_budget=2048, max_num_seqs=32), ex,
                       ex.num_gpu_blocks, ex.num_cpu_blocks, observers=[steps])
    for i in range(8):
        engine.add_request(Request(f"s{i}", [3 + (i * 7 + j) % 50 for j in range(256)],
                                   SamplingParams(max_tokens=iters + 20, ignore_eos=True)))
    for _ in range(5):  # the prefill, then warm decodes
        engine.step()
    del steps.seconds[:]
    for _ in range(iters):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if ex.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            engine.step()
    return steps.seconds, prof


def harness_profile(ex: TorchExecutor, spec: ShapeSpec, plan: BlockPlan) -> Any:
    from torch.profiler import ProfilerActivity, profile

    out = plan.output(spec)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if ex.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            ex.execute(out)
    return prof


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(xs: list[float]) -> tuple[float, float, float, float]:
    """median, p10, p90 (ms) and the interquartile spread over the median."""
    if not xs:
        return (float("nan"),) * 4
    q = statistics.quantiles(xs, n=20)
    quart = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    return med * 1e3, q[1] * 1e3, q[17] * 1e3, (quart[2] - quart[0]) / med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--decode-graphs", default="auto,off,piecewise",
                    help="the executor's graph modes to time side by side, in one process: "
                    "decode-graph modes, and piecewise (decode graphs and the passes with "
                    "chunks as piece replays); keys of a mode past the first carry it")
    ap.add_argument("--one-thread", action="store_true",
                    help="also time each shape at one intra-op thread")
    ap.add_argument("--profiles", action="store_true",
                    help="print torch.profiler tables of a served and a harness decode8")
    args = ap.parse_args()
    device = torch.device(args.device)
    default_threads = torch.get_num_threads()
    result: dict[str, float] = {"launch_us": launch_us(device)}
    print(f"device {args.device}; one empty kernel launch {result['launch_us']:.1f} us; "
          f"torch {torch.__version__}, {default_threads} intra-op threads by default")
    modes = args.decode_graphs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "smollm2-shaped-random"
        build_tiny_random(path, seed=0, shape=SMOLLM2_SHAPE)
        for n, mode in enumerate(modes):
            piecewise = mode == "piecewise"
            pieces = ("cuda" if device.type == "cuda" else "padded") if piecewise else "off"
            ex = TorchExecutor(path, device=args.device, dtype=args.dtype, kv_cache_gb=1.0,
                               num_cpu_blocks=64, max_model_len=1024,
                               decode_graphs="auto" if piecewise else mode,
                               piecewise_graphs=pieces, max_graph_tokens=512)
            graphs = ex.capture_decode_graphs(32, 512)
            tag = "" if n == 0 else f"_{mode}"
            print(f"decode graphs {mode}: {graphs} captured")
            plan = BlockPlan.for_specs(list(SHAPES.values()), ex.block_size)
            for name, spec in SHAPES.items():
                if n and spec.kind != "decode" and not piecewise:
                    continue  # a chunk runs eagerly in every decode-graph mode
                launches = kernels_per_iteration(ex, spec, plan)
                threads_list = [default_threads] + ([1] if args.one_thread else [])
                for threads in threads_list:
                    torch.set_num_threads(threads)
                    t = time_shape(ex, spec, plan, args.iters)
                    w, c, g = _stats(t["wall"]), _stats(t["cpu"]), _stats(t["gpu"])
                    print(f"{name} ({spec.describe()}), graphs {mode}, {threads} thread(s), "
                          f"{launches} kernels: wall {w[0]:.2f} ms (p10 {w[1]:.2f}, p90 "
                          f"{w[2]:.2f}, spread {w[3]:.0%}); cpu {c[0]:.2f} ms; gpu span "
                          f"{g[0]:.2f} ms (p10 {g[1]:.2f}, p90 {g[2]:.2f})")
                    key = f"{name}{tag}" + ("" if threads == default_threads else "_1thread")
                    result |= {f"{key}_wall_ms": w[0], f"{key}_gpu_ms": g[0],
                               f"{key}_spread": w[3]}
                    if threads == default_threads:
                        result |= {f"{key}_cpu_ms": c[0], f"{key}_kernels": float(launches)}
                torch.set_num_threads(default_threads)
            # The same decode batch through the engine loop, as a server runs it.
            served, prof = served_decodes(ex, args.iters // 3)
            w = _stats(served)
            print(f"served decode8 (engine loop), graphs {mode}: wall {w[0]:.2f} ms "
                  f"(p10 {w[1]:.2f}, p90 {w[2]:.2f}, spread {w[3]:.0%})")
            result |= {f"served_decode8{tag}_wall_ms": w[0],
                       f"served_decode8{tag}_spread": w[3]}
            if args.profiles:
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
                print("harness decode8:")
                print(harness_profile(ex, SHAPES["decode8"], plan).key_averages().table(
                    sort_by="self_cpu_time_total", row_limit=14))
            del ex
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
