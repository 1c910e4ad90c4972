"""The calibrated cost model: an iteration's time is coefficients . shape features.

    t(iteration) = sum_k (executor_k + host_k) * feature_k(batch)

Features are the shape sums of ``slopilot.engine.sim.shape`` (tokens, decode rows, KV
tokens read, attention pairs, ...); the coefficients come from ``slopilot calibrate``,
which times the real executor over a designed grid and fits them by non-negative least
squares, and from the engine loop around it (scheduling, bookkeeping, observers: what a
user's token gap includes beyond the forward pass).

Why linear in its coefficients: the fit is a convex problem that always converges, the
simulator evaluates it with one dot product per iteration, and a controller can refit
it from nothing but the ``slopilot_iteration_*`` counters (time and features summed over
a window obey the same linear equation as a single iteration). Why these features: on
a CPU a pass streams the weights once (a constant), multiplies every token through
them (linear in tokens: compute and memory do not overlap there, measured), pays a
fixed cost per attention call (per chunk), and reads and multiplies KV per context
token; the executor pads the decodes' batched attention to the longest context, which
``decode_padded_context`` charges. docs/twin.md has the derivation and the measured fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import mul

from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.sim.cost_model import CostModelError
from slopilot.engine.sim.profile_file import CostProfile
from slopilot.engine.sim.shape import FEATURES, IterationShape, feature_sums, features_of

_GIB = 1024 ** 3
MAX_BLOCKS = 50_000_000
_SWAP = FEATURES.index("swap_blocks")
_SWAP_CALL = FEATURES.index("swap_batches")


class CalibratedCostModel:
    """Implements the simulator's cost-model interface from a ``CostProfile``."""

    calibrated = True

    def __init__(self, profile: CostProfile) -> None:
        self.profile = profile
        self.model = profile.model
        self.tp = profile.tp
        self._executor = tuple(profile.executor.get(f, 0.0) for f in FEATURES)
        self._host = tuple(profile.host.get(f, 0.0) for f in FEATURES)
        self._total = tuple(a + b for a, b in zip(self._executor, self._host, strict=True))
        # The engine loop puts it on every SchedulerOutput (from the simulated executor).
        self.decode_knee_tokens = profile.decode_knee_tokens
        self.graph_batch = profile.device.graph_batch

    @property
    def label(self) -> str:
        return f"calibrated profile {self.profile.source}"

    @property
    def device_name(self) -> str:
        return self.profile.device.name

    # -- iteration time ---------------------------------------------------------------

    def shape_time(self, shape: IterationShape | Sequence[float]) -> float:
        """Seconds for an iteration (or a sum of iterations) of this shape."""
        vec = shape.vector() if isinstance(shape, IterationShape) else shape
        return sum(map(mul, self._total, vec))

    def executor_time(self, shape: IterationShape) -> float:
        """The executor's part alone (what ``ModelRunnerOutput.elapsed_s`` measures)."""
        return sum(map(mul, self._executor, shape.vector()))

    def output_time(self, out: SchedulerOutput, block_size: int = 16) -> float:
        """Seconds from one iteration's start to the next: swaps, pass and loop."""
        swaps = len(out.swap_out) + len(out.swap_in)
        t = sum(map(mul, self._total, features_of(out)))
        if swaps and block_size != self.profile.block_size:
            # The fitted swap cost is per calibrated block; other block sizes scale it.
            t += swaps * (block_size / self.profile.block_size - 1.0) * self._total[_SWAP]
        return t

    def iteration_time(self, batch: Sequence[tuple[int, int]]) -> float:
        """Seconds for ``(new_tokens, context)`` rows, each sampling (datasheet API)."""
        if not batch:
            return 0.0
        return sum(map(mul, self._total, feature_sums(((n, c, True) for n, c in batch),
                                                      knee=self.decode_knee_tokens,
                                                      graph_batch=self.graph_batch)))

    # -- memory and swap --------------------------------------------------------------

    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token // self.tp

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9) -> int:
        """Blocks in the KV cache the calibrated executor had (its own sizing applied)."""
        _check_block_size(block_size)
        blocks = self.profile.kv_cache_bytes // (block_size * self.kv_bytes_per_token())
        if blocks > MAX_BLOCKS:
            raise CostModelError(
                f"{self.profile.source}: memory.kv_cache_bytes="
                f"{self.profile.kv_cache_bytes} is {blocks} blocks of {block_size} tokens; "
                f"the simulator tracks each block and takes at most {MAX_BLOCKS}: use a "
                "larger block_size or check the profile")
        if blocks < 1:
            raise CostModelError(
                f"{self.profile.source}: memory.kv_cache_bytes="
                f"{self.profile.kv_cache_bytes} holds no block of {block_size} tokens "
                f"of {self.kv_bytes_per_token():,} bytes each (model.shape: 2 x num_layers "
                "x num_kv_heads x head_dim x dtype_bytes, over tp); re-run `slopilot "
                "calibrate` (it records the model and the executor's KV cache)")
        return int(blocks)

    def num_cpu_blocks(self, block_size: int, swap_space_gb: float) -> int:
        _check_block_size(block_size)
        if not swap_space_gb >= 0:
            raise CostModelError(f"swap_space_gb={swap_space_gb!r} must be >= 0")
        return int(swap_space_gb * _GIB // (block_size * self.kv_bytes_per_token()))

    def swap_time_per_block(self, block_size: int) -> float:
        """Copy time of one block: the fitted per-block cost, scaled by block size."""
        _check_block_size(block_size)
        return self._total[_SWAP] * block_size / self.profile.block_size

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """One direction's copies of ``num_blocks`` blocks: the fitted per-call cost
        (``swap_batches``) and per-block cost, as ``output_time`` charges them."""
        if num_blocks < 0:
            raise CostModelError(f"num_blocks={num_blocks!r} must be >= 0")
        if num_blocks == 0:
            return 0.0
        return self._total[_SWAP_CALL] + num_blocks * self.swap_time_per_block(block_size)

    def __repr__(self) -> str:
        return f"CalibratedCostModel({self.profile.source!r}, model={self.model.name!r})"


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise CostModelError(f"block_size={block_size!r} must be a positive integer")
