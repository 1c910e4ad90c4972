"""Keys of full KV blocks for the prefix cache: a SHA-256 chain over the tokens.

A block's key is ``sha256(parent key || its token ids)``, and the first block's parent
is ``sha256(domain || cache_salt)``::

    root = H("slopilot-kv-v1" 0x00 salt)
    k0   = H(root || t0 .. t15)      k1 = H(k0 || t16 .. t31)      k2 = ...

so a key names the whole prefix up to and including its block, and two requests share a
block only when they share that prefix and the salt. SHA-256, not Python's ``hash()``:
a tenant who can craft a collision could otherwise read another tenant's KV (vLLM moved
to SHA-256 for the same reason, CVE-2025-25183). Token ids are packed as fixed-width
little-endian int64, so no two token sequences of one block size pack alike.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

_DOMAIN = b"slopilot-kv-v1\x00"


def root_key(cache_salt: str | None) -> bytes:
    """The parent of a request's first block; requests with other salts share nothing."""
    salt = b"" if cache_salt is None else b"\x01" + cache_salt.encode("utf-8", "surrogatepass")
    return hashlib.sha256(_DOMAIN + salt).digest()


def block_packer(block_size: int) -> Callable[..., bytes]:
    """``pack(*token_ids)`` for exactly one full block."""
    return struct.Struct(f"<{block_size}q").pack


def extend_chain(chain: list[bytes], root: bytes, tokens: Callable[[int, int], list[int]],
                 block_size: int, pack: Callable[..., bytes], num_blocks: int) -> None:
    """Append the keys of blocks ``len(chain) .. num_blocks - 1`` to ``chain``.

    ``tokens(start, end)`` returns the token ids in ``[start, end)``.
    """
    sha = hashlib.sha256
    parent = chain[-1] if chain else root
    for i in range(len(chain), num_blocks):
        parent = sha(parent + pack(*tokens(i * block_size, (i + 1) * block_size))).digest()
        chain.append(parent)
