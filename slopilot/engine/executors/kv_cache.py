"""Paged KV cache in preallocated tensors, plus a host-memory pool for swapped blocks.

One tensor holds every layer's keys and values so that a block of all layers is one
slice (``[:, :, block]``): on CPU a swap copies each block's slice straight into place,
on CUDA it moves all its blocks in one indexed copy::

    device  [2 (k, v), layers, num_gpu_blocks, block_size, kv_heads, head_dim]
    host    [2 (k, v), layers, num_cpu_blocks, block_size, kv_heads, head_dim]

Per layer, ``k_cache(layer)`` / ``v_cache(layer)`` are views of shape
[num_blocks, block_size, kv_heads, head_dim]; token position p of a sequence lives in
block ``block_table[p // block_size]`` at offset ``p % block_size``.

``scratch_blocks`` more device blocks sit past ``num_gpu_blocks``, outside the block
manager's reach: a decode batch padded to a captured CUDA graph's size writes its padding
rows' keys and values there, and reads them back as the padding of real rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class CacheError(ValueError):
    """A block id is out of range or the cache is sized impossibly."""


class PagedKVCache:
    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, scratch_blocks: int = 0,
                 touch_cpu_blocks: int | None = None) -> None:
        if num_gpu_blocks < 1:
            raise CacheError(
                f"num_gpu_blocks={num_gpu_blocks}: the KV cache needs at least one block; "
                "give more memory or a smaller model")
        if num_cpu_blocks < 0:
            raise CacheError(f"num_cpu_blocks={num_cpu_blocks}: must be >= 0")
        if block_size < 1:
            raise CacheError(f"block_size={block_size}: must be >= 1")
        if scratch_blocks < 0:
            raise CacheError(f"scratch_blocks={scratch_blocks}: must be >= 0")
        if touch_cpu_blocks is not None and touch_cpu_blocks < 0:
            raise CacheError(f"touch_cpu_blocks={touch_cpu_blocks}: must be >= 0 (or None "
                             "for all)")
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.scratch_blocks = scratch_blocks
        self.device = device
        shape = (2, num_layers)
        tail = (block_size, num_kv_heads, head_dim)
        total = num_gpu_blocks + scratch_blocks
        self.gpu = torch.empty(*shape, total, *tail, dtype=dtype, device=device)
        if device.type == "cpu":
            # Host memory is mapped page by page on first write. Left to serving, each
            # never-used block faulted its pages in inside the iteration that first
            # wrote it: the engine's first pass over the pool ran up to 1.5x slower than
            # the same shapes on touched blocks, which is what calibration times (a
            # slot is only read after it is written, so the zeros themselves are moot).
            self.gpu.zero_()
        # Scratch is read as masked padding, where only a finite value keeps its weight's
        # zero a zero: it starts at 0 and only ever receives real keys and values.
        self.gpu[:, :, num_gpu_blocks:].zero_()
        # Pinned host memory makes device-to-host copies asynchronous-capable and fast,
        # and is resident once allocated: pinning locks its pages in.
        pin = device.type == "cuda"
        self.cpu = torch.empty(*shape, num_cpu_blocks, *tail, dtype=dtype, pin_memory=pin)
        # Host blocks whose pages are in memory from the start (the first ones).
        self.resident_cpu_blocks = num_cpu_blocks
        if not pin:
            # torch.empty maps the pool without touching it (torch.zeros is empty, then a
            # write): left so, the first swap-out into each block faulted its pages in
            # (SmolLM2-135M: a first 256-block swap-out 163-243 ms against 15-37 warm),
            # and swap_timeout_ms judged the next victims by it. Written here instead:
            # 0.4-2.6 s a GiB on this project's busy 2-core machine (4 GiB took 1.5 to
            # 10.5 s), resident from then on. The block manager hands out the lowest
            # fresh host blocks first (and reuses freed ones before them), so writing
            # the first ``touch_cpu_blocks`` covers every swap until that many are parked
            # at once; the executor bounds it (``TorchExecutor``), the pool being sized
            # for the worst case (up to 32 GiB, or half the host's free memory).
            touched = num_cpu_blocks if touch_cpu_blocks is None \
                else min(touch_cpu_blocks, num_cpu_blocks)
            self.cpu[:, :, :touched].zero_()
            self.resident_cpu_blocks = touched
        flat = self.gpu.view(2, num_layers, total * block_size, num_kv_heads, head_dim)
        # Views made once: indexing a view costs a few dispatches, twice a layer a step.
        self._flat = [(flat[0, layer], flat[1, layer]) for layer in range(num_layers)]

    @property
    def scratch_slot(self) -> int:
        """The first slot past the managed blocks (the first scratch block's first)."""
        return self.num_gpu_blocks * self.block_size

    @staticmethod
    def block_bytes(*, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                    dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers, keys and values."""
        itemsize = torch.empty(0, dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.gpu[0, layer]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.gpu[1, layer]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer as [num_blocks * block_size, kv_heads, head_dim]."""
        return self._flat[layer]

    def _check(self, ids: Sequence[int], limit: int, where: str) -> None:
        bad = [b for b in ids if not 0 <= b < limit]
        if bad:
            raise CacheError(
                f"{where} block ids {bad} are outside [0, {limit}); the block manager "
                "and the executor disagree on the cache size")

    @staticmethod
    def _copy_blocks(src: torch.Tensor, src_ids: Sequence[int], dst: torch.Tensor,
                     dst_ids: Sequence[int]) -> None:
        """Host to host, block by block, straight into place: a block is 2 x layers
        runs of block_size x kv_heads x head_dim values, copied at memcpy speed. The
        indexed copy (index_select, then index_copy_) gathered the blocks into a fresh
        tensor first, which past glibc's 32 MiB mmap ceiling is mapped anew and faulted
        in page by page on every swap (SmolLM2-135M: 64 blocks and up; 46,081 faults
        at 256), and took about 6x as long (benchmarks/swap_copy.py). The same bytes
        land either way: the block manager never gives a block twice in one swap."""
        for s, d in zip(src_ids, dst_ids, strict=True):
            dst[:, :, d].copy_(src[:, :, s])

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks: pairs of (gpu_block, cpu_block)."""
        if not pairs:
            return
        gpu_ids, cpu_ids = zip(*pairs, strict=True)
        self._check(gpu_ids, self.num_gpu_blocks, "swap-out device")
        self._check(cpu_ids, self.num_cpu_blocks, "swap-out host")
        if self.device.type == "cpu":
            self._copy_blocks(self.gpu, gpu_ids, self.cpu, cpu_ids)
            return
        src = torch.tensor(gpu_ids, device=self.device)
        dst = torch.tensor(cpu_ids)
        self.cpu.index_copy_(2, dst, self.gpu.index_select(2, src).cpu())

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy host blocks back to device blocks: pairs of (cpu_block, gpu_block)."""
        if not pairs:
            return
        cpu_ids, gpu_ids = zip(*pairs, strict=True)
        self._check(cpu_ids, self.num_cpu_blocks, "swap-in host")
        self._check(gpu_ids, self.num_gpu_blocks, "swap-in device")
        if self.device.type == "cpu":
            self._copy_blocks(self.cpu, cpu_ids, self.gpu, gpu_ids)
            return
        src = torch.tensor(cpu_ids)
        dst = torch.tensor(gpu_ids, device=self.device)
        blocks = self.cpu.index_select(2, src).to(self.device, non_blocking=True)
        self.gpu.index_copy_(2, dst, blocks)
