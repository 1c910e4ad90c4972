"""A trace whose hardest minute is a quiet one holding its longest prompts.

600 s of 500-token prompts (20 output tokens): clumps of 24 every 4.8 s from 180 s to
300 s (the busiest minutes, 5 req/s) and one a second elsewhere; in the quiet minute at
420-480 s, two threes of long prompts 30 s apart. Three long prompts are fewer tokens at
once than a clump's 24, so they build no queue beside the busy minutes' (no burst), and
the minute's ~66 requests put its P99 between its two slowest: the long prompts'. On one
H100 with Llama-3-8B (a bare ``--trace``) the clumps' minutes hold P1's 500 ms TTFT with
room to spare (~80 ms) and the long prompts' minute misses it (~540-650 ms).
"""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.sim.trace import TraceRecord

HEAVY = (430.0, 460.0)
"""Where the long prompts arrive, three at a time (trace seconds)."""
HEAVY_PROMPT = 7000


def heavy_minute(heavy_prompt: int = HEAVY_PROMPT) -> list[TraceRecord]:
    """The trace's records, sorted by arrival."""
    out = [TraceRecord(float(t), 500, 20) for t in range(600) if not 180 <= t < 300]
    out += [TraceRecord(180.0 + 4.8 * c + i / 100, 500, 20) for c in range(25)
            for i in range(24)]
    out += [TraceRecord(at + i / 100, heavy_prompt, 20) for at in HEAVY for i in range(3)]
    return sorted(out, key=lambda r: r.arrival_time)


def write_heavy_minute(path: Path) -> Path:
    """The trace as the CSV form (``arrival_time,prompt_tokens,output_tokens``)."""
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(
        f"{r.arrival_time:.3f},{r.prompt_tokens},{r.output_tokens}\n"
        for r in heavy_minute()))
    return path
