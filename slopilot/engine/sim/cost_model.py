"""A roofline cost model: how long one engine iteration takes on a given GPU and model.

One iteration is one forward pass over a mixed batch (prefill chunks and decodes).
Its time is the sum of four phases, each the slower of its compute and memory time
(the GPU overlaps the two inside a kernel, not across kernels):

    overhead  +  linear layers      max(matmul FLOPs / (peak * eff),    weight bytes / bw)
              +  attention          max(QK and PV FLOPs / (peak * eff), KV bytes read / bw)
              +  tensor parallelism 2 all-reduces per layer over NVLink (ring, + latency)

Tile quantization: matmuls run on whole 128-row tiles, so M tokens cost like M rounded
up to the tile (129 tokens cost as much as 256). All figures are per GPU shard.

Calibration (8 x H800, DeepSeek-67B, TP 8; see tests/engine/sim/test_cost_model.py):
decode-only ~30 seqs 6-8 ms, a 256-token mixed iteration 8-9.5 ms, a 3000-token
unchunked prefill with decodes 90-110 ms. The defaults below land there; each says
where it comes from, and the one fitted rather than sourced (comm_overlap) says so.
The seeds also imply 10-12 ms for a full 512-token iteration, which no bf16 roofline
meets together with the unchunked figure (512 tokens are 8.5 ms at 100% of the H800's
peak); the model charges ~17 ms there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul

from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.sim.profiles import GPUProfile, ModelProfile, resolve_gpu, resolve_model

_GIB = 1024 ** 3
ALLOWED_TP = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class IterationCost:
    """One iteration's time split into its roofline terms (seconds, per GPU)."""

    overhead_s: float
    linear_compute_s: float
    linear_memory_s: float
    attention_compute_s: float
    attention_memory_s: float
    comm_s: float

    @property
    def total_s(self) -> float:
        return (self.overhead_s + max(self.linear_compute_s, self.linear_memory_s)
                + max(self.attention_compute_s, self.attention_memory_s) + self.comm_s)

    @property
    def linear_is_compute_bound(self) -> bool:
        return self.linear_compute_s > self.linear_memory_s


class CostModelError(ValueError):
    """The GPU / model / TP combination or a factor is invalid; the message names the fix."""


def _fraction(name: str, value: float) -> float:
    if not 0 < value <= 1:
        raise CostModelError(f"{name}={value!r} must be in (0, 1]")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:
        raise CostModelError(f"{name}={value!r} must be >= 0")
    return float(value)


class CostModel:
    """Iteration, swap and memory-sizing figures for one (GPU, model, TP) deployment.

    Efficiency factors (defaults and their sources):
      mm_efficiency=0.6: share of dense bf16 peak that cuBLAS/CUTLASS GEMMs reach on the
          per-shard shapes of a 67B-70B model at TP 8 (K or N of 1-5k), counting the
          norm/activation kernels between them; large square GEMMs reach ~0.7-0.75 on
          H100, prefill end to end in vLLM/SGLang measures ~0.5-0.6 MFU.
          Small batches need no separate efficiency curve: below ~200 tokens the
          weight reads dominate, and partial tiles are charged by tile quantization.
      attn_efficiency=0.35: FlashAttention-2 forward reaches ~35-45% of H100 peak at
          head dim 128; a long prefill with only 8 heads per GPU fills fewer SMs.
      bw_efficiency=0.9: streaming weight/KV reads reach ~90% of HBM peak.
      comm_efficiency=1.0: ring all-reduce bytes go at the per-direction NVLink rate.
      comm_overlap=0.95 (fitted): share of the all-reduce transfer time hidden behind
          compute. The seeds' H800 prefill (~33 us per token at TP 8) leaves no room
          for the ~27 us per token a serialized ring all-reduce would take at the
          H800's 200 GB/s per direction, so nearly all of it must overlap, as engines
          that overlap communication with compute do. Set 0 to serialize them.
      allreduce_latency_s=3e-6: vLLM's custom all-reduce over NVLink P2P for small
          messages (~3-5 us per call on 8 GPUs).
      iteration_overhead_s=0.3e-3: scheduling, input preparation, sampling and the
          launch gaps CUDA graphs do not hide (decode-only iterations of the seeds'
          run leave ~1 ms beyond weights and KV reads for this and the all-reduces).
      tile_tokens=128: the M tile of Hopper/Ampere bf16 GEMM kernels.
      pcie_efficiency=0.6: KV blocks are many small scattered copies (a few KiB per
          layer), well below the ~80% of PCIe peak that large pinned copies reach.
      swap_latency_s=50e-6: fixed cost of one swap batch (launch and stream sync).
      activation_reserve_bytes=2 GiB: peak activations, CUDA graphs and workspaces
          that vLLM's memory profiler sets aside before sizing the KV cache.
    """

    def __init__(self, gpu: GPUProfile | str, model: ModelProfile | str, tp: int = 1, *,
                 mm_efficiency: float = 0.6, attn_efficiency: float = 0.35,
                 bw_efficiency: float = 0.9, comm_efficiency: float = 1.0,
                 comm_overlap: float = 0.95, allreduce_latency_s: float = 3e-6,
                 iteration_overhead_s: float = 0.3e-3, tile_tokens: int = 128,
                 pcie_efficiency: float = 0.6, swap_latency_s: float = 50e-6,
                 activation_reserve_bytes: int = 2 * _GIB) -> None:
        self.gpu = resolve_gpu(gpu)
        self.model = resolve_model(model)
        self.tp = tp
        self._check_tp()
        self.mm_efficiency = _fraction("mm_efficiency", mm_efficiency)
        self.attn_efficiency = _fraction("attn_efficiency", attn_efficiency)
        self.bw_efficiency = _fraction("bw_efficiency", bw_efficiency)
        self.comm_efficiency = _fraction("comm_efficiency", comm_efficiency)
        self.pcie_efficiency = _fraction("pcie_efficiency", pcie_efficiency)
        if not 0 <= comm_overlap < 1:
            raise CostModelError(f"comm_overlap={comm_overlap!r} must be in [0, 1)")
        self.comm_overlap = float(comm_overlap)
        self.allreduce_latency_s = _non_negative("allreduce_latency_s", allreduce_latency_s)
        self.iteration_overhead_s = _non_negative("iteration_overhead_s", iteration_overhead_s)
        self.swap_latency_s = _non_negative("swap_latency_s", swap_latency_s)
        if isinstance(tile_tokens, bool) or not isinstance(tile_tokens, int) or tile_tokens < 1:
            raise CostModelError(f"tile_tokens={tile_tokens!r} must be a positive integer "
                                 "(1 disables tile quantization)")
        self.tile_tokens = tile_tokens
        self.activation_reserve_bytes = int(_non_negative(
            "activation_reserve_bytes", activation_reserve_bytes))
        self._precompute()

    def _check_tp(self) -> None:
        m, tp = self.model, self.tp
        if isinstance(tp, bool) or not isinstance(tp, int) or tp not in ALLOWED_TP:
            raise CostModelError(f"tp={tp!r}: tensor parallelism must be one of "
                                 f"{', '.join(map(str, ALLOWED_TP))} (GPUs in one node)")
        if m.num_heads % tp:
            raise CostModelError(f"tp={tp} does not divide {m.name}'s num_heads="
                                 f"{m.num_heads}; use a TP size that divides it")
        # Like vLLM: KV heads are split when tp divides them, replicated when they divide tp.
        if m.num_kv_heads % tp and tp % m.num_kv_heads:
            raise CostModelError(f"tp={tp} and {m.name}'s num_kv_heads={m.num_kv_heads} "
                                 "must divide one another; pick another TP size")
        if m.intermediate_size % tp:
            raise CostModelError(f"tp={tp} does not divide {m.name}'s intermediate_size="
                                 f"{m.intermediate_size}; use a TP size that divides it")
        if tp > 1 and self.gpu.nvlink_bandwidth == 0:
            raise CostModelError(f"tp={tp} needs NVLink but {self.gpu.name} has none; "
                                 "use tp=1")

    def _precompute(self) -> None:
        g, m, tp = self.gpu, self.model, self.tp
        lm_head_params = m.embedding_params
        self.kv_heads_per_shard = max(1, m.num_kv_heads // tp)
        self.weight_bytes_per_gpu = m.total_params * m.dtype_bytes // tp
        # What one forward pass streams from HBM: every linear layer plus the LM head
        # (the input embedding is a gather of a few rows).
        streamed = (m.linear_params + lm_head_params) * m.dtype_bytes / tp
        bw = g.hbm_bandwidth * self.bw_efficiency
        self._t_weights = streamed / bw
        self._flops_per_token = 2.0 * m.linear_params / tp
        self._flops_per_sampled = 2.0 * lm_head_params / tp
        self._inv_peak_mm = 1.0 / (g.peak_flops * self.mm_efficiency)
        # QK^T and PV: 2 FLOPs per multiply-add, 2 matmuls, per (query, key) pair and head.
        self._s_per_attn_pair = (4.0 * m.head_dim * (m.num_heads // tp) * m.num_layers
                                 / (g.peak_flops * self.attn_efficiency))
        self._s_per_kv_token = self.kv_bytes_per_token() / bw
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            link = g.nvlink_bandwidth / 2 * self.comm_efficiency
            calls = 2 * m.num_layers
            exposed = 1.0 - self.comm_overlap
            self._t_comm_fixed = calls * self.allreduce_latency_s
            self._s_comm_per_token = (calls * ring * m.hidden_size * m.dtype_bytes / link
                                      * exposed)
        else:
            self._t_comm_fixed = 0.0
            self._s_comm_per_token = 0.0
        self._pcie = g.pcie_bandwidth * self.pcie_efficiency
        need = self.weight_bytes_per_gpu + self.activation_reserve_bytes
        if need >= g.memory_bytes:
            raise CostModelError(
                f"{m.name} at tp={tp} needs {need / _GIB:.1f} GiB per GPU for weights and "
                f"activations but {g.name} has {g.memory_bytes / _GIB:.1f} GiB; raise tp "
                "or use a GPU with more memory")

    calibrated = False
    # No decode_spill term: the roofline has no cache model (see sim/shape.py).
    decode_knee_tokens: int | None = None
    # No eager_passes term either: the roofline counts no kernel launches.
    graph_batch: int | None = None

    @property
    def label(self) -> str:
        """What outputs say about the twin: this one is not measured against anything."""
        return f"uncalibrated datasheet roofline ({self.gpu.name}, tp={self.tp})"

    @property
    def device_name(self) -> str:
        return self.gpu.name

    # -- iteration time -------------------------------------------------------------

    def output_time(self, out: SchedulerOutput, block_size: int = 16) -> float:
        """Seconds for one planned iteration: its swaps (before the pass) plus the pass."""
        batch = [(len(s.token_ids), s.start_pos) for s in out.seqs]
        return (self.iteration_time(batch) + self.swap_time(len(out.swap_out), block_size)
                + self.swap_time(len(out.swap_in), block_size))

    def iteration_time(self, batch: Sequence[tuple[int, int]]) -> float:
        """Seconds for one forward pass over ``batch``.

        Each item is ``(num_new_tokens, num_computed_tokens_before)`` for one scheduled
        sequence: a prefill chunk (new tokens > 1) or a decode (1 new token). An empty
        batch costs nothing. Called once per simulated iteration, so it aggregates the
        batch with C-level builtins instead of a Python loop.
        """
        if not batch:
            return 0.0
        lin_c, lin_m, attn_c, attn_m, comm = self._phase_times(batch)
        return (self.iteration_overhead_s + (lin_c if lin_c > lin_m else lin_m)
                + (attn_c if attn_c > attn_m else attn_m) + comm)

    def phases(self, batch: Sequence[tuple[int, int]]) -> IterationCost:
        """The same figure as ``iteration_time``, split into its roofline terms."""
        if not batch:
            return IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return IterationCost(self.iteration_overhead_s, *self._phase_times(batch))

    def _phase_times(self, batch: Sequence[tuple[int, int]]
                     ) -> tuple[float, float, float, float, float]:
        ns, cs = zip(*batch, strict=True)
        if min(ns) < 1 or min(cs) < 0:
            bad = next(item for item in batch if item[0] < 1 or item[1] < 0)
            raise CostModelError(
                f"batch item {bad!r}: expected (num_new_tokens >= 1, "
                "num_computed_tokens >= 0)")
        tokens = sum(ns)
        tiles = -(-tokens // self.tile_tokens) * self.tile_tokens
        lin_c = (tiles * self._flops_per_token
                 + len(ns) * self._flops_per_sampled) * self._inv_peak_mm
        cached = sum(cs)
        # New token i of a row attends to every cached token and to new tokens 0..i.
        if tokens == len(ns):  # decode only (every n is 1): skip the two dot products
            pairs = cached + tokens
        else:
            pairs = sum(map(mul, ns, cs)) + 0.5 * (sum(map(mul, ns, ns)) + tokens)
        attn_c = pairs * self._s_per_attn_pair
        attn_m = (cached + tokens) * self._s_per_kv_token
        comm = self._t_comm_fixed + tokens * self._s_comm_per_token
        return lin_c, self._t_weights, attn_c, attn_m, comm

    # -- memory and swap ------------------------------------------------------------

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token on one GPU shard (KV heads split over TP)."""
        m = self.model
        return 2 * m.num_layers * self.kv_heads_per_shard * m.head_dim * m.dtype_bytes

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9) -> int:
        """KV blocks that fit in the GPU memory left after weights and activations."""
        self._check_block_size(block_size)
        if not 0 < gpu_memory_utilization <= 1:
            raise CostModelError(f"gpu_memory_utilization={gpu_memory_utilization!r} must "
                                 "be in (0, 1]")
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        free = budget - self.weight_bytes_per_gpu - self.activation_reserve_bytes
        if free < block_size * self.kv_bytes_per_token():
            raise CostModelError(
                f"no room for a KV cache: {self.model.name} at tp={self.tp} leaves "
                f"{free / _GIB:.2f} GiB of {self.gpu.name}'s memory at "
                f"gpu_memory_utilization={gpu_memory_utilization}; raise it or raise tp")
        return int(free // (block_size * self.kv_bytes_per_token()))

    def num_cpu_blocks(self, block_size: int, swap_space_gb: float) -> int:
        """KV blocks that fit in ``swap_space_gb`` GiB of host memory (per GPU shard)."""
        self._check_block_size(block_size)
        if not swap_space_gb >= 0:
            raise CostModelError(f"swap_space_gb={swap_space_gb!r} must be >= 0")
        return int(swap_space_gb * _GIB // (block_size * self.kv_bytes_per_token()))

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks between GPU and host over PCIe."""
        self._check_block_size(block_size)
        if num_blocks < 0:
            raise CostModelError(f"num_blocks={num_blocks!r} must be >= 0")
        if num_blocks == 0:
            return 0.0
        return self.swap_latency_s + num_blocks * self.swap_time_per_block(block_size)

    def swap_time_per_block(self, block_size: int) -> float:
        """The per-block part of ``swap_time`` (seconds per block, without the latency)."""
        self._check_block_size(block_size)
        return block_size * self.kv_bytes_per_token() / self._pcie

    @staticmethod
    def _check_block_size(block_size: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise CostModelError(f"block_size={block_size!r} must be a positive integer")

    def __repr__(self) -> str:
        return f"CostModel(gpu={self.gpu.name!r}, model={self.model.name!r}, tp={self.tp})"
