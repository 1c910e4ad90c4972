"""A small Mooncake-form trace whose hardest minute is not its busiest by tokens.

Quiet for its first 240 s (0.5 req/s of fresh 2-block prompts); then 180 s of busy
follow-ups (8 req/s in 20 sessions, each turn the session's 8-13 blocks plus one new:
~48,000 prompt tokens a second, nearly all a prefix an earlier turn sent, so the prefix
cache serves them); then a minute of fresh documents (``fresh_rate`` req/s of 10 new
blocks: fewer tokens than the follow-ups' minute, every one of them prefilled); quiet to
600 s. On one H100 with Llama-3-8B (a bare ``--trace``) the follow-ups hold the SLO and
the documents' minute queues past it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FOLLOW_UPS = (240.0, 420.0)
"""Where the busy follow-ups arrive (trace seconds)."""
DOCUMENTS = (420.0, 480.0)
"""Where the fresh documents arrive."""
SPAN_S = 600.0


def mooncake_shift(path: Path, *, fresh_rate: float = 6.0, seed: int = 7) -> Path:
    """Write the trace (Mooncake's JSONL: timestamps in ms, 512-token blocks) to ``path``."""
    rng = random.Random(seed)
    rows: list[tuple[float, list[int]]] = []
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        next_id += k
        return list(range(next_id - k, next_id))

    t = 0.0
    while (t := t + rng.expovariate(0.5)) < SPAN_S:
        if not FOLLOW_UPS[0] <= t < DOCUMENTS[1]:
            rows.append((t, fresh(2)))
    sessions = [fresh(8) for _ in range(20)]
    t = FOLLOW_UPS[0]
    while (t := t + rng.expovariate(8.0)) < FOLLOW_UPS[1]:
        k = rng.randrange(len(sessions))
        kept = sessions[k] if len(sessions[k]) < 13 else sessions[k][:8]
        sessions[k] = kept + fresh(1)
        rows.append((t, list(sessions[k])))
    t = DOCUMENTS[0]
    while (t := t + rng.expovariate(fresh_rate)) < DOCUMENTS[1]:
        rows.append((t, fresh(10)))
    rows.sort()
    lines = [json.dumps({"timestamp": round(at * 1000),
                         "input_length": len(blocks) * 512 - rng.randrange(256),
                         "output_length": rng.randint(20, 80), "hash_ids": blocks})
             for at, blocks in rows]
    path.write_text("\n".join(lines) + "\n")
    return path
