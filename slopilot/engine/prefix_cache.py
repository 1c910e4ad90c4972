"""The prefix cache's index: full KV blocks by exact prefix keys, so none ever collide.

A block's key is the packed identity of everything before it, then its own tokens::

    block 0:  root(salt)      || t0 .. t15      root = "r" (no salt) | "s" + salt (UTF-8)
    block i:  "n" + node(i-1) || t(16i) ..       node = an id given once per cached prefix

Token ids are packed as fixed-width little-endian int64, so the tokens are the last
``8 * block_size`` bytes and the parent is all that comes before: a key names exactly
one (salt, token prefix). ``node`` ids are handed out when a prefix is first cached and
never reused, so "n" + node(i-1) stands for the whole prefix before block i.

A block carries at most one key, and the index maps that key back to it. One prefix can
have two nodes (cached again after its first blocks were evicted, or after the cache was
switched off and on), so a block can be reached by a second path: registering it through
that path moves its key there (see ``register``).

The index is a dict keyed by these bytes: a hit compares the key in full (no hash
collision can serve one tenant another's KV, the flaw vLLM fixed with SHA-256 after
CVE-2025-25183), and bytes hash with Python's keyed SipHash, so crafted keys cannot
pile onto one slot either. It costs less than a SHA-256 per block.

``PrefixCache`` holds the index and each live request's packed blocks and node chain;
the ``BlockManager`` owns the blocks (reference counts, free and cached pools) and asks it
to look up, register and forget.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from slopilot.engine.request import Request

NO_SALT_ROOT = b"r"
_NODE = struct.Struct("<q").pack


def root_prefix(cache_salt: str | None) -> bytes:
    """The parent of a request's first block; requests with other salts share nothing."""
    if cache_salt is None:
        return NO_SALT_ROOT
    return b"s" + cache_salt.encode("utf-8", "surrogatepass")


def node_prefix(node: int) -> bytes:
    """The parent of the block after the cached prefix ``node``."""
    return b"n" + _NODE(node)


def block_packer(block_size: int) -> Callable[..., bytes]:
    """``pack(*token_ids)`` for exactly one full block."""
    return struct.Struct(f"<{block_size}q").pack


class PrefixCache:
    def __init__(self, block_size: int, enabled: bool) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self._pack = block_packer(block_size)
        # Per block ever handed out: its key, or None (the block manager extends it).
        self.keys: list[bytes | None] = []
        # Key -> (block, the parent bytes of the block after it: the node of the prefix
        # ending in that block).
        self.index: dict[bytes, tuple[int, bytes]] = {}
        self._next_node = 0
        # Per live request: its full blocks' tokens packed, and the nodes of its cached
        # prefix (hits and registered blocks), block by block.
        self._packed: dict[str, list[bytes]] = {}
        self._chains: dict[str, list[bytes]] = {}
        # How many leading blocks of each table have been offered to the cache.
        self.registered: dict[str, int] = {}

    def clear(self) -> list[int]:
        """Forget every key (prefix caching switched off); returns the blocks that had one."""
        keys = self.keys
        keyed = [b for b, _ in self.index.values()]
        for b in keyed:
            keys[b] = None
        self.index.clear()
        self._chains.clear()
        self._packed.clear()
        self.registered.clear()
        return keyed

    def evict(self, block: int) -> None:
        key = self.keys[block]
        if key is not None:
            del self.index[key]
            self.keys[block] = None

    def forget(self, request_id: str) -> None:
        """The request is done: its packed blocks and chain go (a recompute keeps them:
        its tokens, and so its keys, are the same when it runs again)."""
        self._chains.pop(request_id, None)
        self._packed.pop(request_id, None)

    def _packed_blocks(self, request: Request, num_full_blocks: int) -> list[bytes]:
        """The request's first ``num_full_blocks`` blocks of tokens, packed (memoized)."""
        rid = request.request_id
        packed = self._packed.get(rid)
        if packed is None:
            packed = self._packed[rid] = []
        have = len(packed)
        if have < num_full_blocks:
            bs, pack = self.block_size, self._pack
            prompt = request.prompt_token_ids
            num_prompt = len(prompt)
            for start in range(have * bs, num_full_blocks * bs, bs):
                end = start + bs
                packed.append(pack(*(prompt[start:end] if end <= num_prompt
                                     else request.token_slice(start, end))))
        return packed

    def lookup(self, request: Request) -> list[int]:
        """Blocks holding the longest cached prefix; at least one token stays to compute."""
        if not self.enabled:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        packed = self._packed_blocks(request, max_blocks)
        index = self.index
        parent = root_prefix(request.cache_salt)
        hits: list[int] = []
        nodes: list[bytes] = []
        for i in range(max_blocks):
            entry = index.get(parent + packed[i])
            if entry is None:
                break
            hits.append(entry[0])
            parent = entry[1]
            nodes.append(parent)
        self._chains[request.request_id] = nodes
        return hits

    def register(self, request: Request, table: list[int]) -> None:
        """Offer the request's computed full blocks (of ``table``) to later requests."""
        rid = request.request_id
        start = self.registered.get(rid, 0)
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        if num_full <= start:
            return
        packed = self._packed.get(rid)
        if packed is None or len(packed) < num_full:
            packed = self._packed_blocks(request, num_full)
        chain = self._chains.get(rid)
        if chain is None:
            chain = self._chains[rid] = []
        if len(chain) != start:
            start = min(start, len(chain))  # the node chain must reach the block before
            del chain[start:]
        keys, index = self.keys, self.index
        parent = chain[-1] if start else root_prefix(request.cache_salt)
        for i in range(start, num_full):
            key = parent + packed[i]
            entry = index.get(key)
            if entry is None:
                block = table[i]
                old = keys[block]
                if old is None:
                    # Our block is the first with this prefix: cached under a new node.
                    parent = node_prefix(self._next_node)
                    self._next_node += 1
                else:
                    # Our block is cached under another path to these same tokens (two
                    # nodes for one prefix, e.g. when holders of a shared block re-key
                    # it after the cache was switched off and on, each through its own
                    # chain). A block has one key: it moves to our path, reachable from
                    # the root, and keeps its node, so the blocks after it still match.
                    parent = index.pop(old)[1]
                index[key] = (block, parent)
                keys[block] = key
            else:
                # The prefix is cached (maybe in this very block): ours stays private,
                # and the chain goes on from the cached node, so later blocks still match.
                parent = entry[1]
            chain.append(parent)
        self.registered[rid] = num_full
