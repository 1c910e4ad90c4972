"""Keys of full KV blocks for the prefix cache: exact, so no two prefixes ever collide.

A block's key is the packed identity of everything before it, then its own tokens::

    block 0:  root(salt)      || t0 .. t15      root = "r" (no salt) | "s" + salt (UTF-8)
    block i:  "n" + node(i-1) || t(16i) ..       node = an id given once per cached prefix

Token ids are packed as fixed-width little-endian int64, so the tokens are the last
``8 * block_size`` bytes and the parent is all that comes before: a key names exactly
one (salt, token prefix). ``node`` ids are handed out when a prefix is first cached and
never reused, so "n" + node(i-1) stands for the whole prefix before block i.

The index is a dict keyed by these bytes: a hit compares the key in full (no hash
collision can serve one tenant another's KV, the flaw vLLM fixed with SHA-256 after
CVE-2025-25183), and bytes hash with Python's keyed SipHash, so crafted keys cannot
pile onto one slot either. It costs less than a SHA-256 per block.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

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
