"""The block manager's invariants, checked from outside its hot paths.

Free + cached + used blocks account for every block ever handed out, reference counts
agree with the block tables, every cached block carries a key and the key index points
back at it, and host (CPU) blocks are conserved. O(blocks ever used): tests, the
simulator's check flag and ``slopilot serve --check-integrity`` run it; serving never.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slopilot.engine.block_manager import BlockManager


class IntegrityError(AssertionError):
    """The block manager's bookkeeping disagrees with itself: a bug, never user error."""


def check_block_manager(kv: BlockManager) -> None:
    """Raise IntegrityError at the first invariant that does not hold."""
    touched = kv._next_fresh
    refs = [0] * touched
    for table in kv._tables.values():
        for b in table:
            if not 0 <= b < touched:
                raise IntegrityError(f"block {b} in a table was never handed out")
            refs[b] += 1
    if refs != kv._ref or len(kv._key) != touched:
        raise IntegrityError("reference counts disagree with the block tables")
    free = set(kv._free)
    cached = set(kv._cached)
    used = {b for b, r in enumerate(kv._ref) if r > 0}
    if len(free) != len(kv._free):
        raise IntegrityError("a block is on the free list twice")
    if free & cached or free & used or cached & used:
        raise IntegrityError("a block is in two of free / cached / used")
    if any(not 0 <= b < touched for b in free):
        raise IntegrityError("a never-used block is on the free list")
    if len(free) + len(cached) + len(used) != touched:
        raise IntegrityError(
            f"free {len(free)} + cached {len(cached)} + used {len(used)} "
            f"!= handed out {touched}")
    for b in cached:
        if kv._key[b] is None:
            raise IntegrityError(f"cached block {b} has no key")
    nodes = set()
    for key, (b, node) in kv.prefix.index.items():
        if kv._key[b] != key:
            raise IntegrityError(f"key index points at block {b} with another key")
        nodes.add(node)
    if len(nodes) != len(kv.prefix.index):
        raise IntegrityError("two cached prefixes share a node id")
    if any(kv._key[b] is not None for b in free):
        raise IntegrityError("a free block still carries a key")
    if sum(k is not None for k in kv._key) != len(kv.prefix.index):
        raise IntegrityError("a keyed block is missing from the key index")
    cpu_used = sum(len(t) for t in kv._cpu_tables.values())
    cpu_idle = kv._cpu_free + kv._cpu_draining
    if cpu_used + len(cpu_idle) != kv._cpu_next_fresh or \
            len(set(cpu_idle)) != len(cpu_idle):
        raise IntegrityError("CPU blocks are not conserved")
