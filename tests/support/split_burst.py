"""A trace whose burst the whole-trace check's old stride split (``length / 3``): two
spikes 39.5 s apart, each of two 8,000-token P1 prompts at one instant, over a steady
3 req/s of 200-token P1 prompts, 200 s in all.

On one H100 with Llama-3-8B (the bare ``--trace`` deployment) each spike alone leaves a
45 s window's P1 TTFT p99 at ~370-420 ms, within the 450 ms that 10 % headroom on 500 ms
allows; a window holding both (from the first spike, 21 s, to 66 s) reads ~490 ms. The
45 s windows every 15 s start at 15 s (the first spike, not the second at 60.5 s) and at
30 s (the second alone): none holds the burst whole.
"""

from __future__ import annotations

from pathlib import Path

SPIKES_S = (21.0, 60.5)
SPAN_S = 200.0
RATE = 3.0


def write_split_burst(path: Path) -> Path:
    rows = [(i / RATE, 200, 20) for i in range(int(SPAN_S * RATE))]
    rows += [(t, 8000, 5) for t in SPIKES_S for _ in range(2)]
    rows.sort()
    path.write_text("arrival_time,prompt_tokens,output_tokens,class\n" + "".join(
        f"{a:.3f},{p},{o},p1\n" for a, p, o in rows))
    return path
