"""The decode step's roofline on the machine at hand: what it must compute and move, and
how fast this machine's torch kernels can do either.

A decode iteration of a Llama model at batch B is five GEMMs per layer-kind with B rows
(fused q/k/v, o, fused gate/up, down, and the head), plus attention over each row's
context. Its floors::

    compute floor = step FLOPs / peak GEMM FLOP/s    (measured on the step's own shapes)
    memory floor  = step bytes / stream bandwidth    (every weight once, the KV read)

The peak is measured the way the step meets its weights: a model bigger than the
last-level cache streams every weight from DRAM once per iteration, so each shape is
timed cycling through enough copies of its weight to overflow the cache. The in-cache
rate (one weight, reused) is measured too, for reference: the gap between the two is
how much the kernels lose waiting on memory at this row count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from slopilot.engine.executors.kernels import Projection, TorchKernels
from slopilot.engine.executors.llama import LlamaConfig

MIB = 1 << 20
# Working set for a streamed measurement: comfortably above any desktop or server L3.
_STREAM_BYTES = 256 * MIB


@dataclass(frozen=True, slots=True)
class Gemm:
    """``count`` GEMMs of [m, k] x [k, n] per step (count = layers for a per-layer one)."""

    name: str
    m: int
    k: int
    n: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.count

    def weight_bytes(self, itemsize: int) -> int:
        return self.k * self.n * self.count * itemsize


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one decode iteration computes and moves."""

    gemms: tuple[Gemm, ...]
    attention_flops: int
    weight_bytes: int
    kv_bytes: int

    @property
    def flops(self) -> int:
        return sum(g.flops for g in self.gemms) + self.attention_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


def decode_step_cost(cfg: LlamaConfig, batch: int, context: float,
                     itemsize: int = 4) -> StepCost:
    """A decode step of ``batch`` rows, each attending to ``context`` tokens on average."""
    layers, hd = cfg.num_hidden_layers, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    gemms = (
        Gemm("qkv", batch, cfg.hidden_size, q_out + 2 * kv_out, layers),
        Gemm("o", batch, q_out, cfg.hidden_size, layers),
        Gemm("gate_up", batch, cfg.hidden_size, 2 * cfg.intermediate_size, layers),
        Gemm("down", batch, cfg.intermediate_size, cfg.hidden_size, layers),
        Gemm("lm_head", batch, cfg.hidden_size, cfg.vocab_size, 1),
    )
    # Scores and the weighted sum: 2 FLOPs per multiply-add, two products per key.
    attention = round(2 * 2 * batch * layers * cfg.num_attention_heads * hd * context)
    # Every weight once (a tied head is the embedding, read once); the embedding lookup
    # reads only the batch's rows; norms are negligible but counted.
    weights = sum(g.weight_bytes(itemsize) for g in gemms)
    weights += (batch * cfg.hidden_size + (2 * layers + 1) * cfg.hidden_size) * itemsize
    if not cfg.tie_word_embeddings:
        weights += batch * cfg.hidden_size * itemsize
    # Keys and values of every cached position, per layer, read once; the new one written.
    kv = round(2 * layers * kv_out * itemsize * batch * (context + 1))
    return StepCost(gemms=gemms, attention_flops=attention, weight_bytes=weights, kv_bytes=kv)


@dataclass(frozen=True, slots=True)
class ShapeRate:
    gemm: Gemm
    streamed_flops_per_s: float
    in_cache_flops_per_s: float
    kernel: str


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Measured peaks of this machine for a dtype and thread count."""

    dtype: torch.dtype
    threads: int
    shapes: tuple[ShapeRate, ...]
    stream_bytes_per_s: float

    @property
    def gemm_flops_per_s(self) -> float:
        """Peak achievable: the best streamed rate over the decode step's shapes."""
        return max(s.streamed_flops_per_s for s in self.shapes)

    @property
    def in_cache_flops_per_s(self) -> float:
        return max(s.in_cache_flops_per_s for s in self.shapes)

    def best_of(self, other: Ceilings) -> Ceilings:
        """Shape by shape the faster of two measurements (a busy machine only slows)."""
        shapes = tuple(a if a.streamed_flops_per_s >= b.streamed_flops_per_s else b
                       for a, b in zip(self.shapes, other.shapes, strict=True))
        return Ceilings(self.dtype, self.threads, shapes,
                        max(self.stream_bytes_per_s, other.stream_bytes_per_s))


@dataclass(frozen=True, slots=True)
class Roofline:
    cost: StepCost
    ceilings: Ceilings
    compute_floor_s: float = field(init=False)
    memory_floor_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_floor_s",
                           self.cost.flops / self.ceilings.gemm_flops_per_s)
        object.__setattr__(self, "memory_floor_s",
                           self.cost.bytes / self.ceilings.stream_bytes_per_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_floor_s >= self.memory_floor_s else "memory"

    @property
    def floor_s(self) -> float:
        return max(self.compute_floor_s, self.memory_floor_s)

    def fraction(self, step_s: float) -> float:
        """Binding floor over the measured step time: 1.0 is the roofline itself."""
        return self.floor_s / step_s


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


Kernel = Callable[[torch.Tensor], torch.Tensor]


def _matmul(weight: torch.Tensor) -> Kernel:
    transposed = weight.t().contiguous()
    return lambda x: torch.matmul(x, transposed)


def _linear(weight: torch.Tensor) -> Kernel:
    return lambda x: F.linear(x, weight)


def _onednn(weight: torch.Tensor) -> Kernel:
    return Projection(weight, None)


def _engine(kernels: TorchKernels) -> Callable[[torch.Tensor], Kernel]:
    def make(weight: torch.Tensor) -> Kernel:
        proj = Projection(weight, None)
        kernels.prepare([proj])
        return proj
    return make


def gemm_kernels(engine: TorchKernels | None = None) -> dict[str, Callable[[torch.Tensor],
                                                                           Kernel]]:
    """The GEMM kernels on offer for ``x @ weight.T``, by name.

    The engine's projection as ``engine``'s kernels (default torch's ops) ready it: the
    native small-batch GEMM on an AVX-512 or AVX2 build, else oneDNN prepacked on CPU.
    Beside it oneDNN's where the two differ, and plain matmul on either weight layout.
    """
    engine = engine if engine is not None else TorchKernels()
    kernels: dict[str, Callable[[torch.Tensor], Kernel]] = {
        "engine projection": _engine(engine)}
    if engine.native:
        kernels["oneDNN projection"] = _onednn
    kernels["torch.matmul"] = _matmul
    kernels["F.linear"] = _linear
    return kernels


def _time_kernel(calls: list[Kernel], x: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Seconds for one pass over every copy (streamed), and for 8 calls on the first."""
    first = calls[0]
    streamed = _best_time(lambda: [c(x) for c in calls], repeats)
    return streamed, _best_time(lambda: [first(x) for _ in range(8)], repeats)


def measure_gemm(gemm: Gemm, dtype: torch.dtype, repeats: int = 5,
                 stream_bytes: int = _STREAM_BYTES,
                 engine: TorchKernels | None = None) -> ShapeRate:
    """Streamed and in-cache FLOP/s of one shape, the best of ``gemm_kernels(engine)``."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    one = gemm.k * gemm.n * itemsize
    copies = max(2, math.ceil(stream_bytes / one))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(gemm.m, gemm.k, generator=gen).to(dtype)
    flops = 2 * gemm.m * gemm.k * gemm.n
    best_stream, best_cache, best_kernel = 0.0, 0.0, ""
    weights = [torch.randn(gemm.n, gemm.k, generator=gen).to(dtype) for _ in range(copies)]
    with torch.inference_mode():
        for name, make in gemm_kernels(engine).items():
            streamed, in_cache = _time_kernel([make(w) for w in weights], x, repeats)
            if copies * flops / streamed > best_stream:
                best_stream, best_kernel = copies * flops / streamed, name
            best_cache = max(best_cache, 8 * flops / in_cache)
    return ShapeRate(gemm, best_stream, best_cache, best_kernel)


def measure_stream_bandwidth(nbytes: int = _STREAM_BYTES, repeats: int = 5) -> float:
    """Bytes/s of a large copy, read plus write (what STREAM's Copy counts)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_time(lambda: dst.copy_(src), repeats)


def measure_ceilings(gemms: tuple[Gemm, ...], dtype: torch.dtype = torch.float32,
                     repeats: int = 5, engine: TorchKernels | None = None) -> Ceilings:
    """The machine's ceilings; ``engine``: the kernels the step runs, so their own GEMM
    counts among the kernels whose best rate is the peak."""
    shapes = tuple(measure_gemm(g, dtype, repeats, engine=engine) for g in gemms)
    return Ceilings(dtype, torch.get_num_threads(), shapes, measure_stream_bandwidth())


def cpu_description() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and its SIMD and matrix flags, from /proc/cpuinfo."""
    model = "unknown"
    flags: tuple[str, ...] = ()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = tuple(f for f in value.split()
                              if f.startswith(("avx", "amx", "fma", "f16c")))
    return model, flags


def has_native_bf16(flags: tuple[str, ...]) -> bool:
    """bf16 matmuls are native with AVX512-BF16 or AMX; elsewhere they are emulated."""
    return "avx512_bf16" in flags or "amx_bf16" in flags
