"""Paged KV block manager: GPU and CPU pools, reference counts, prefix caching.

The manager only answers yes or no (``allocate_slots`` returns False when blocks run
out); the scheduler alone decides whom to preempt.

GPU block states::

    free (no hash)  --allocate-->  used (ref > 0)  --free, hashed-->  cached (ref == 0)
          ^                             |  ^                              |
          +-------free, unhashed--------+  +-------prefix hit (touch)-----+
          +-------------------------------evict (LRU)---------------------+

Full blocks are keyed exactly by the prefix up to and including them, and the request's
cache salt (``prefix_cache.py``): two requests share a block only when they share that
whole prefix and salt. Cached blocks
are evicted least recently freed first; a request frees its blocks tail first, so its
tail is evicted before its head.

Block ids are handed out lazily: ids at or above ``_next_fresh`` have never been used
and cost nothing, so a pool of tens of millions of blocks (a simulated H200 serving a
tiny model) is built at once and costs memory only for the blocks ever touched.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from slopilot.engine.prefix_cache import PrefixCache
from slopilot.engine.request import Request

__all__ = ["BlockManager", "KVStats"]

@dataclass(frozen=True, slots=True)
class KVStats:
    num_gpu_blocks: int
    num_used: int
    num_cached: int
    num_free: int
    num_cpu_blocks: int
    num_cpu_used: int

    @property
    def usage(self) -> float:
        return self.num_used / self.num_gpu_blocks if self.num_gpu_blocks else 0.0


class BlockManager:
    def __init__(self, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 enable_prefix_caching: bool = True) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks}: need at least one KV block")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks={num_cpu_blocks}: must be >= 0")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.block_size = block_size
        self.prefix = PrefixCache(block_size, enable_prefix_caching)
        # Per block ever handed out (ids below _next_fresh): reference count, and key or
        # None (the prefix cache's list, shared).
        self._ref: list[int] = []
        self._key = self.prefix.keys
        self._registered = self.prefix.registered
        self._next_fresh = 0
        # Freed blocks without a key; popped from the end, before any fresh id.
        self._free: list[int] = []
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._tables: dict[str, list[int]] = {}
        self._cpu_free: list[int] = []
        self._cpu_next_fresh = 0
        self._cpu_tables: dict[str, list[int]] = {}
        # CPU blocks read by this iteration's swap-ins: reusable only from the next
        # iteration, or a swap-out in the same batch could overwrite them before the
        # copy-in reads them.
        self._cpu_draining: list[int] = []

    # ---------------------------------------------------------------- queries
    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix.enabled

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-used ones plus evictable cached ones."""
        return (len(self._free) + len(self._cached)
                + self.num_gpu_blocks - self._next_fresh)

    @property
    def num_used_blocks(self) -> int:
        return self._next_fresh - len(self._free) - len(self._cached)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_gpu_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free) + self.num_cpu_blocks - self._cpu_next_fresh

    def stats(self) -> KVStats:
        num_free = len(self._free) + self.num_gpu_blocks - self._next_fresh
        return KVStats(self.num_gpu_blocks, self.num_used_blocks, len(self._cached),
                       num_free, self.num_cpu_blocks,
                       self.num_cpu_blocks - self.num_free_cpu_blocks)

    @property
    def tables(self) -> dict[str, list[int]]:
        """Live block tables by request id (read-only for callers)."""
        return self._tables

    @property
    def cpu_tables(self) -> dict[str, list[int]]:
        """Swapped-out requests' host block tables by request id (read-only for callers)."""
        return self._cpu_tables

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_blocks(self, request_id: str) -> int:
        table = self._tables.get(request_id)
        return len(table) if table is not None else 0

    def num_exclusive_blocks(self, request_id: str) -> int:
        """Blocks that freeing this request would give back (not shared with others)."""
        ref = self._ref
        return sum(1 for b in self._tables.get(request_id, ()) if ref[b] == 1)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._cpu_tables

    def num_swapped_blocks(self, request_id: str) -> int:
        return len(self._cpu_tables.get(request_id, ()))

    # ---------------------------------------------------------------- prefix cache
    def set_prefix_caching(self, enabled: bool) -> None:
        """Switch the prefix cache live. Off forgets every key: cached blocks become
        plain free blocks and no later request hits what was cached before. On again,
        live requests key their full blocks from the root at their next update; a block
        that several of them share keeps one key, that of the last to register it."""
        if enabled == self.prefix.enabled:
            return
        self.prefix.enabled = enabled
        if enabled:
            return  # live requests register their full blocks from the next update
        self.prefix.clear()
        self._free.extend(self._cached)
        self._cached.clear()

    def find_cached_prefix(self, request: Request) -> list[int]:
        """GPU blocks holding the longest cached prefix; at least one token stays to compute.

        Looks only; nothing is taken until ``allocate_slots`` gets the blocks.
        """
        return self.prefix.lookup(request)

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's computed full blocks so later requests can reuse them."""
        if self.prefix.enabled:
            table = self._tables.get(request.request_id)
            if table is not None:
                self.prefix.register(request, table)

    # ---------------------------------------------------------------- allocation
    def _take_free(self) -> int:
        if self._free:
            return self._free.pop()
        b = self._next_fresh
        if b < self.num_gpu_blocks:
            self._next_fresh = b + 1
            self._ref.append(0)
            self._key.append(None)
            return b
        b, _ = self._cached.popitem(last=False)
        self.prefix.evict(b)
        return b

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       cached_blocks: list[int] | None = None,
                       reserve_blocks: int = 0) -> bool:
        """Make room for ``num_new_tokens`` more tokens; False (and no change) if short.

        ``cached_blocks`` (from ``find_cached_prefix``) start a new request's table;
        ``reserve_blocks`` must stay free afterwards (the admission watermark, or room
        held for a P0 that is preempting its way in).
        """
        rid = request.request_id
        table = self._tables.get(rid)
        num_cached = len(cached_blocks) if cached_blocks else 0
        have = (len(table) if table is not None else 0) + num_cached
        need_tokens = request.num_computed_tokens + num_cached * self.block_size \
            + num_new_tokens
        need = -(-need_tokens // self.block_size) - have
        reviving = self._num_reviving(cached_blocks) if cached_blocks else 0
        if need + reviving + reserve_blocks > len(self._free) + len(self._cached) \
                + self.num_gpu_blocks - self._next_fresh:
            return False
        if table is None:
            table = self._tables[rid] = []
        if cached_blocks:
            ref = self._ref
            for b in cached_blocks:
                if ref[b] == 0:
                    del self._cached[b]
                ref[b] += 1
            table.extend(cached_blocks)
            self._registered[rid] = len(table)
        if need > 0:
            table.extend(self._take(need))
        return True

    def _take(self, n: int) -> list[int]:
        """``n`` blocks at reference count 1: freed ones first (most recent first), then
        never-used ones, then the least recently freed cached ones (evicted)."""
        free, ref = self._free, self._ref
        k = min(n, len(free))
        taken = free[len(free) - k:]
        del free[len(free) - k:]
        taken.reverse()
        for b in taken:
            ref[b] = 1
        k = min(n - k, self.num_gpu_blocks - self._next_fresh)
        if k:
            start = self._next_fresh
            self._next_fresh = start + k
            taken.extend(range(start, start + k))
            ref.extend([1] * k)
            self._key.extend([None] * k)
        while len(taken) < n:
            b = self._take_free()  # an eviction
            ref[b] = 1
            taken.append(b)
        return taken

    def _num_reviving(self, cached_blocks: list[int]) -> int:
        # Cached blocks sitting in the evictable pool leave it when they are taken.
        ref = self._ref
        return sum(1 for b in cached_blocks if ref[b] == 0)

    def free_blocks_needed(self, request: Request, num_new_tokens: int,
                           cached_blocks: list[int] | None = None) -> int:
        """How many free blocks ``allocate_slots`` with these arguments would take."""
        num_cached = len(cached_blocks) if cached_blocks else 0
        need_tokens = request.num_computed_tokens + num_cached * self.block_size \
            + num_new_tokens
        need = -(-need_tokens // self.block_size) - self.num_blocks(request.request_id) \
            - num_cached
        return max(need, 0) + (self._num_reviving(cached_blocks) if cached_blocks else 0)

    def free(self, request_id: str, *, keep_chain: bool = False) -> None:
        """Release a request's GPU and CPU blocks (finish, abort, or recompute).

        ``keep_chain``: a recomputed request keeps its tokens, so its keys stay valid.
        """
        self._free_gpu(request_id)
        if not keep_chain:
            self.prefix.forget(request_id)
        cpu = self._cpu_tables.pop(request_id, None)
        if cpu is not None:
            self._cpu_free.extend(cpu)

    def _free_gpu(self, request_id: str) -> None:
        table = self._tables.pop(request_id, None)
        self._registered.pop(request_id, None)
        if table is None:
            return
        ref, keys, cached, free = self._ref, self._key, self._cached, self._free
        for b in reversed(table):
            ref[b] -= 1
            if ref[b] == 0:
                if keys[b] is not None:
                    cached[b] = None
                else:
                    free.append(b)

    # ---------------------------------------------------------------- swap
    def _take_cpu(self) -> int:
        if self._cpu_free:
            return self._cpu_free.pop()
        c = self._cpu_next_fresh
        self._cpu_next_fresh = c + 1
        return c

    def can_swap_out(self, request_id: str) -> bool:
        return self.num_blocks(request_id) <= self.num_free_cpu_blocks

    def swap_out(self, request_id: str) -> list[tuple[int, int]]:
        """Move a request's blocks to host memory; returns (gpu, cpu) copy pairs.

        The GPU blocks are freed at once: the copy runs before the next forward pass
        that could overwrite them. Keyed blocks stay cached on the GPU as well.
        """
        table = self._tables[request_id]
        if len(table) > self.num_free_cpu_blocks:
            raise ValueError(f"not enough CPU blocks to swap out {request_id}")
        pairs = [(g, self._take_cpu()) for g in table]
        self._cpu_tables[request_id] = [c for _, c in pairs]
        # The packed tokens and the node chain stay: they describe tokens, not places.
        self._free_gpu(request_id)
        return pairs

    def swap_in(self, request_id: str, reserve_blocks: int = 0) -> list[tuple[int, int]] | None:
        """Bring a swapped request back; None (and no change) if GPU blocks are short."""
        cpu = self._cpu_tables.get(request_id)
        if cpu is None:
            raise ValueError(f"request {request_id} is not swapped out")
        if len(cpu) + reserve_blocks > self.num_free_blocks:
            return None
        del self._cpu_tables[request_id]
        table = self._tables[request_id] = []
        pairs = []
        for c in cpu:
            g = self._take_free()
            self._ref[g] = 1
            table.append(g)
            pairs.append((c, g))
        self._cpu_draining.extend(cpu)
        return pairs

    def begin_step(self) -> None:
        """Called once per iteration before scheduling: last step's copies are done."""
        if self._cpu_draining:
            self._cpu_free.extend(self._cpu_draining)
            self._cpu_draining.clear()

