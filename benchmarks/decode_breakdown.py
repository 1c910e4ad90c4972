"""Where one decode step's time goes: the whole step against its own GEMMs (issue 13).

One SmolLM2-135M decode step at batch 24 (float32, the torch executor), timed in
interleaved rounds against:

- ``gemms``: the step's 121 projections alone, same prepacked weights, same order, on
  fixed inputs (what the roofline's compute floor assumes a step costs); where the
  kernels finish SwiGLU inside the gate/up GEMM, that fused call;
- ``rest``: the step with every projection answered from a preallocated tensor, i.e.
  everything but the GEMMs (norms, RoPE, KV writes, attention, greedy sampling's argmax);
- the same projections timed one by one inside real steps (``gemms_in_step``), and the
  rest of those steps (``rest_in_step``: the step's time minus its GEMMs').

Medians of the rounds; ``step_over_gemms`` is the median of the per-round ratios, so
drift of a shared machine cancels. Where ``gemms_in_step`` exceeds ``gemms``, or
``rest_in_step`` exceeds ``rest``, that part runs slower inside a step than alone: the
GEMMs' weight stream and the step's other ops evict each other's data.

    .venv/bin/python benchmarks/decode_breakdown.py [--rounds 20] [--batch 24] [--context 70]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from slopilot.engine.executors import kernels
from slopilot.engine.executors.batch import FlatBatch, build_batch
from slopilot.engine.executors.kernel_modes import KERNEL_CHOICES
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import ScheduledSeq
from slopilot.engine.request import SamplingParams

_call = kernels.Projection.__call__
_swiglu = kernels.Projection.small_batch_swiglu


def decode_batch(executor: TorchExecutor, batch: int, context: int) -> FlatBatch:
    """``batch`` single-token rows whose contexts spread over ``context`` .. +4."""
    blocks = -(-(context + 5) // executor.block_size)
    seqs = [ScheduledSeq(f"r{i}", [100 + i], context - 1 + i % 5,
                         list(range(i * blocks, (i + 1) * blocks)), True,
                         SamplingParams(max_tokens=64))
            for i in range(batch)]
    return build_batch(seqs, block_size=executor.block_size,
                       num_blocks=executor.kv_cache.num_gpu_blocks,
                       max_model_len=executor.max_model_len, device=executor.device,
                       prompt_logprob_targets={})


@contextmanager
def projections(replacement: Callable[..., torch.Tensor],
                swiglu: Callable[..., torch.Tensor | None]) -> Iterator[None]:
    """Every GEMM of the step through ``replacement``, the MLP's fused SwiGLU GEMM (where
    the kernels fuse it) through ``swiglu``."""
    kernels.Projection.__call__ = replacement  # type: ignore[method-assign]
    kernels.Projection.small_batch_swiglu = swiglu  # type: ignore[method-assign]
    try:
        yield
    finally:
        kernels.Projection.__call__ = _call  # type: ignore[method-assign]
        kernels.Projection.small_batch_swiglu = _swiglu  # type: ignore[method-assign]


def run_as_step(proj: kernels.Projection, x: torch.Tensor) -> torch.Tensor:
    """The projection as the step calls it: a SwiGLU one through its fused kernel if any."""
    fused = proj.small_batch_swiglu(x)
    return fused if fused is not None else proj(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--context", type=int, default=70)
    ap.add_argument("--cpu-kernels", choices=KERNEL_CHOICES, default="auto",
                    help="as `slopilot serve --cpu-kernels`")
    args = ap.parse_args()
    executor = TorchExecutor(args.model, dtype="float32", num_cpu_blocks=0,
                             cpu_kernels=args.cpu_kernels)
    print(f"kernels: {executor.kernels.reason}")
    model = executor.model
    batch = decode_batch(executor, args.batch, args.context)
    projs = model.projections()
    inputs = {p.weight.shape[1]: torch.randn(args.batch, p.weight.shape[1]) for p in projs}
    canned: dict[tuple[int, int], torch.Tensor] = {}
    in_step = [0.0]

    def step() -> None:
        # Greedy's argmax as the sampler takes it: from the executor's kernels.
        model.ops.argmax(model(batch.input_ids, batch.positions, batch.attention,
                               executor.kv_cache, batch.logits_rows))

    def gemms() -> None:
        for p in projs:
            run_as_step(p, inputs[p.weight.shape[1]])

    def canned_call(self: kernels.Projection, x: torch.Tensor,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
        key = (x.shape[0], self.weight.shape[0])
        if key not in canned:
            canned[key] = torch.zeros(key)
        return canned[key] if residual is None else residual

    def canned_swiglu(self: kernels.Projection, x: torch.Tensor) -> torch.Tensor | None:
        if not (self.small_batch and x.shape[0] <= kernels.SMALL_BATCH_ROWS):
            return None  # not fused here: canned_call answers the projection
        key = (x.shape[0], self.weight.shape[0] // 2)
        if key not in canned:
            canned[key] = torch.zeros(key)
        return canned[key]

    def timed_call(self: kernels.Projection, x: torch.Tensor,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
        start = time.perf_counter()
        out = _call(self, x, residual)
        in_step[0] += time.perf_counter() - start
        return out

    def timed_swiglu(self: kernels.Projection, x: torch.Tensor) -> torch.Tensor | None:
        start = time.perf_counter()
        out = _swiglu(self, x)
        in_step[0] += time.perf_counter() - start
        return out

    def rest() -> None:
        with projections(canned_call, canned_swiglu):
            step()

    def timed_step() -> None:
        with projections(timed_call, timed_swiglu):
            step()

    runs: dict[str, Callable[[], None]] = {"step": step, "gemms": gemms, "rest": rest,
                                           "timed_step": timed_step}
    times: dict[str, list[float]] = {k: [] for k in runs}
    gemms_in_step: list[float] = []
    with torch.inference_mode():
        for fn in runs.values():
            fn()
        for _ in range(args.rounds):
            for name, fn in runs.items():
                in_step[0] = 0.0
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                if name == "timed_step":
                    gemms_in_step.append(in_step[0])
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = statistics.median(s / g for s, g in zip(times["step"], times["gemms"], strict=True))
    in_step_ms = statistics.median(gemms_in_step) * 1e3
    # What the step spends outside its GEMMs, in the step itself (timed_step's rounds).
    rest_in_step_ms = statistics.median(
        t - g for t, g in zip(times["timed_step"], gemms_in_step, strict=True)) * 1e3
    print(f"decode step, batch {args.batch}, context ~{args.context}, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds (medians):")
    print(f"  whole step              {ms['step']:7.1f} ms")
    print(f"  its GEMMs back to back  {ms['gemms']:7.1f} ms")
    print(f"  its GEMMs inside steps  {in_step_ms:7.1f} ms")
    print(f"  everything but GEMMs    {ms['rest']:7.1f} ms alone, "
          f"{rest_in_step_ms:.1f} ms inside steps")
    print(f"RESULT step_ms={ms['step']:.1f} gemms_ms={ms['gemms']:.1f} "
          f"gemms_in_step_ms={in_step_ms:.1f} rest_ms={ms['rest']:.1f} "
          f"rest_in_step_ms={rest_in_step_ms:.1f} "
          f"step_over_gemms={ratio:.3f} gemms_in_step_over_gemms="
          f"{in_step_ms / ms['gemms']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
