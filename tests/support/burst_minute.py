"""A trace whose hardest minute is neither its busiest by arrivals nor by tokens: a
reviewer's trace (their generator, seed 3), drawn here from its own seed.

600 s of on/off traffic, 20 req/s for 10 s of every 30 s and 0.5 req/s between,
log-normal prompts (median ~400 tokens, at most 6,000) with 3 % of them 7,000 tokens,
classes P1 and P2 (70/30). At ``--time-scale 0.7`` on one H100 with Llama-3-8B, one
on-burst holds several 7,000-token prompts: the whole replay reads P1 TTFT p99 ~528 ms
against 500 ms on 1 replica (~352 ms on 2), while 45 s windows chosen by load, burst and
P99-rank prompt all read ~425-447 ms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_burst_minute(path: Path, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    span = 600.0
    times: list[float] = []
    x = 0.0
    while x < span:
        x += rng.exponential(1 / (20.0 if (x % 30) < 10 else 0.5))
        if x < span:
            times.append(x)
    n = len(times)
    prompt = np.clip(rng.lognormal(6.0, 0.8, n).astype(int), 5, 6000)
    prompt[rng.random(n) < 0.03] = 7000
    output = np.clip(rng.lognormal(4.3, 0.7, n).astype(int), 1, 1000)
    cls = rng.choice(["p1", "p2"], n, p=[0.7, 0.3])
    path.write_text("arrival_time,prompt_tokens,output_tokens,class\n" + "".join(
        f"{a:.3f},{b},{c},{d}\n" for a, b, c, d in zip(times, prompt, output, cls,
                                                        strict=True)))
    return path
