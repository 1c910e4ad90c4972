"""Paged KV block manager: GPU and CPU pools, reference counts, prefix caching.

The manager only answers yes or no (``allocate_slots`` returns False when blocks run
out); the scheduler alone decides whom to preempt.

GPU block states::

    free (no hash)  --allocate-->  used (ref > 0)  --free, hashed-->  cached (ref == 0)
          ^                             |  ^                              |
          +-------free, unhashed--------+  +-------prefix hit (touch)-----+
          +-------------------------------evict (LRU)---------------------+

Full blocks are keyed by a hash chain over their tokens, so a block's key depends on
every token before it: two requests share a block only when they share the whole
prefix up to and including it. Cached blocks are evicted least recently freed first;
a request frees its blocks tail first, so its tail is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from slopilot.engine.request import Request

_NO_HASH = -1


class IntegrityError(AssertionError):
    """The block manager's bookkeeping disagrees with itself: a bug, never user error."""


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
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_gpu_blocks
        self._hash = [_NO_HASH] * num_gpu_blocks
        # Popped from the end: low block ids are handed out first.
        self._free: list[int] = list(range(num_gpu_blocks - 1, -1, -1))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._hash_to_block: dict[int, int] = {}
        self._tables: dict[str, list[int]] = {}
        # Hash chain of each live request's full blocks (prefix of its token stream).
        self._chains: dict[str, list[int]] = {}
        # How many leading blocks of each table have been offered to the cache.
        self._registered: dict[str, int] = {}
        self._cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self._cpu_tables: dict[str, list[int]] = {}
        # CPU blocks read by this iteration's swap-ins: reusable only from the next
        # iteration, or a swap-out in the same batch could overwrite them before the
        # copy-in reads them.
        self._cpu_draining: list[int] = []

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-used ones plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - len(self._free) - len(self._cached)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_gpu_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    def stats(self) -> KVStats:
        return KVStats(self.num_gpu_blocks, self.num_used_blocks, len(self._cached),
                       len(self._free), self.num_cpu_blocks,
                       self.num_cpu_blocks - len(self._cpu_free))

    @property
    def tables(self) -> dict[str, list[int]]:
        """Live block tables by request id (read-only for callers)."""
        return self._tables

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_blocks(self, request_id: str) -> int:
        table = self._tables.get(request_id)
        return len(table) if table is not None else 0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._cpu_tables

    def num_swapped_blocks(self, request_id: str) -> int:
        return len(self._cpu_tables.get(request_id, ()))

    # ---------------------------------------------------------------- prefix cache
    def _chain(self, request: Request, num_full_blocks: int) -> list[int]:
        """The hash chain over the request's first ``num_full_blocks`` blocks."""
        chain = self._chains.setdefault(request.request_id, [])
        bs = self.block_size
        parent = chain[-1] if chain else _NO_HASH
        for i in range(len(chain), num_full_blocks):
            parent = hash((parent, *request.token_slice(i * bs, (i + 1) * bs)))
            chain.append(parent)
        return chain

    def find_cached_prefix(self, request: Request) -> list[int]:
        """GPU blocks holding the longest cached prefix; at least one token stays to compute.

        Looks only; nothing is taken until ``allocate_slots`` gets the blocks.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        chain = self._chain(request, max_blocks)
        hits: list[int] = []
        lookup = self._hash_to_block
        for i in range(max_blocks):
            block = lookup.get(chain[i])
            if block is None:
                break
            hits.append(block)
        return hits

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's computed full blocks so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        table = self._tables.get(rid)
        if table is None:
            return
        start = self._registered.get(rid, 0)
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        if num_full <= start:
            return
        chain = self._chain(request, num_full)
        hashes, index = self._hash, self._hash_to_block
        for i in range(start, num_full):
            block, key = table[i], chain[i]
            # A block already hashed came from the cache; a key already indexed is held
            # by another block, and ours stays private.
            if hashes[block] == _NO_HASH and key not in index:
                hashes[block] = key
                index[key] = block
        self._registered[rid] = num_full

    # ---------------------------------------------------------------- allocation
    def _take_free(self) -> int:
        if self._free:
            return self._free.pop()
        block, _ = self._cached.popitem(last=False)
        del self._hash_to_block[self._hash[block]]
        self._hash[block] = _NO_HASH
        return block

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       cached_blocks: list[int] | None = None,
                       reserve_blocks: int = 0) -> bool:
        """Make room for ``num_new_tokens`` more tokens; False (and no change) if short.

        ``cached_blocks`` (from ``find_cached_prefix``) start a new request's table;
        ``reserve_blocks`` must stay free afterwards (the admission watermark).
        """
        rid = request.request_id
        table = self._tables.get(rid)
        num_cached = len(cached_blocks) if cached_blocks else 0
        have = (len(table) if table is not None else 0) + num_cached
        need_tokens = request.num_computed_tokens + num_cached * self.block_size \
            + num_new_tokens
        need = -(-need_tokens // self.block_size) - have
        # Cached blocks sitting in the evictable pool leave it when we take them.
        reviving = 0
        if cached_blocks:
            ref = self._ref
            for b in cached_blocks:
                if ref[b] == 0:
                    reviving += 1
        if need + reviving + reserve_blocks > len(self._free) + len(self._cached):
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
        for _ in range(need):
            b = self._take_free()
            self._ref[b] = 1
            table.append(b)
        return True

    def free(self, request_id: str) -> None:
        """Release a request's GPU and CPU blocks (finish, abort, or recompute)."""
        self._free_gpu(request_id)
        self._chains.pop(request_id, None)
        cpu = self._cpu_tables.pop(request_id, None)
        if cpu is not None:
            self._cpu_free.extend(cpu)

    def _free_gpu(self, request_id: str) -> None:
        table = self._tables.pop(request_id, None)
        self._registered.pop(request_id, None)
        if table is None:
            return
        ref, hashes, cached, free = self._ref, self._hash, self._cached, self._free
        for b in reversed(table):
            ref[b] -= 1
            if ref[b] == 0:
                if hashes[b] != _NO_HASH:
                    cached[b] = None
                else:
                    free.append(b)

    # ---------------------------------------------------------------- swap
    def can_swap_out(self, request_id: str) -> bool:
        return self.num_blocks(request_id) <= len(self._cpu_free)

    def swap_out(self, request_id: str) -> list[tuple[int, int]]:
        """Move a request's blocks to host memory; returns (gpu, cpu) copy pairs.

        The GPU blocks are freed at once: the copy runs before the next forward pass
        that could overwrite them. Hashed blocks stay cached on the GPU as well.
        """
        table = self._tables[request_id]
        if len(table) > len(self._cpu_free):
            raise ValueError(f"not enough CPU blocks to swap out {request_id}")
        pairs = [(g, self._cpu_free.pop()) for g in table]
        self._cpu_tables[request_id] = [c for _, c in pairs]
        # The token hash chain stays: it describes tokens, not where they live.
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

    # ---------------------------------------------------------------- integrity
    def check_integrity(self) -> None:
        """free + used + cached == total, and every count agrees with the tables."""
        refs = [0] * self.num_gpu_blocks
        for table in self._tables.values():
            for b in table:
                refs[b] += 1
        if refs != self._ref:
            raise IntegrityError("reference counts disagree with the block tables")
        free = set(self._free)
        cached = set(self._cached)
        used = {b for b, r in enumerate(self._ref) if r > 0}
        if len(free) != len(self._free):
            raise IntegrityError("a block is on the free list twice")
        if free & cached or free & used or cached & used:
            raise IntegrityError("a block is in two of free / cached / used")
        if len(free) + len(cached) + len(used) != self.num_gpu_blocks:
            raise IntegrityError(
                f"free {len(free)} + cached {len(cached)} + used {len(used)} "
                f"!= total {self.num_gpu_blocks}")
        for b in cached:
            if self._hash[b] == _NO_HASH:
                raise IntegrityError(f"cached block {b} has no hash")
        for key, b in self._hash_to_block.items():
            if self._hash[b] != key:
                raise IntegrityError(f"hash index points at block {b} with another hash")
        if any(h != _NO_HASH for h in (self._hash[b] for b in free)):
            raise IntegrityError("a free block still carries a hash")
        cpu_used = sum(len(t) for t in self._cpu_tables.values())
        cpu_idle = self._cpu_free + self._cpu_draining
        if cpu_used + len(cpu_idle) != self.num_cpu_blocks or \
                len(set(cpu_idle)) != len(cpu_idle):
            raise IntegrityError("CPU blocks are not conserved")
