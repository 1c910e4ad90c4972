"""The work a trace's requests bring once shared prefixes are counted as cached.

A trace may say which prompt tokens an earlier prompt already sent: Mooncake's
``hash_ids`` name a prompt's 512-token blocks (equal ids, equal tokens, when the
prefix before them is equal too), and a JSONL session's later turn opens with its
earlier turns' prompt. The replay gives those prompts the same tokens, so the engine's
prefix cache serves them, and a minute of follow-up turns with long shared contexts
costs a fraction of the prefill its prompt lengths suggest, while a minute of fresh
documents costs all of it. Ranking minutes by their prompt lengths then picks the
wrong minute as the busiest (``windows.trace_windows``).

``fresh_tokens`` counts what a request's prefill has to compute if every prefix sent
before were still cached (the cache is taken as unbounded: a deployment whose cache
evicts them recomputes some, so a minute of shared prefixes is weighed somewhat light;
its requests still count in the busiest-arrivals window), plus its output tokens.
Without blocks or sessions every prompt token counts, as it always did.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.trace_public import MOONCAKE_BLOCK_TOKENS


def fresh_tokens(records: Sequence[TraceRecord]) -> np.ndarray:
    """Per record (in the order given, which is arrival order): its prompt tokens that
    no earlier record's prompt sent as the same prefix, plus its output tokens."""
    out = np.empty(len(records), dtype=np.float64)
    # Mooncake's blocks as a trie of prefixes: a node is a prefix of blocks, keyed by
    # its parent's node and its last block id (one int: a tuple costs twice the memory,
    # and a trace may name 10,000,000 blocks), and holds how many of that last block's
    # tokens some prompt sent (a prompt's last block may be cut short).
    children: dict[int, int] = {}
    sent = array("H", [0])  # node 0: the empty prefix; a block's count fits 16 bits
    longest_turn: dict[int, int] = {}  # session -> its longest prompt so far
    for i, r in enumerate(records):
        shared = 0
        if r.prefix_blocks is not None:
            shared = _walk(r.prefix_blocks, r.prompt_tokens, children, sent)
        elif r.session_id is not None:
            shared = min(r.prompt_tokens, longest_turn.get(r.session_id, 0))
            longest_turn[r.session_id] = max(longest_turn.get(r.session_id, 0),
                                             r.prompt_tokens)
        out[i] = r.prompt_tokens - shared + r.output_tokens
    return out


def _walk(blocks: tuple[int, ...], prompt: int, children: dict[int, int],
          sent: array[int]) -> int:
    """The tokens of ``blocks``' prefix that earlier prompts sent; records this prompt's."""
    shared, node, matching = 0, 0, True
    for depth, block in enumerate(blocks):
        own = min(MOONCAKE_BLOCK_TOKENS, prompt - depth * MOONCAKE_BLOCK_TOKENS)
        if own <= 0:
            break
        key = node << 64 | block  # block ids are below 2^63 (trace_public)
        child = children.get(key)
        if child is None:
            child = children[key] = len(sent)
            sent.append(0)
        if matching:
            # Past a block sent short, the next tokens were never sent after this prefix.
            got = min(own, sent[child])
            shared += got
            matching = got == MOONCAKE_BLOCK_TOKENS
        sent[child] = max(sent[child], own)
        node = child
    return shared
