"""The most memory Python held while a trace was read: the readers' copies of a file, told
apart from the file's own size (``tracemalloc``: deterministic, unlike resident memory)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from slopilot.engine.sim.trace import TraceRecord, read_trace


def read_with_peak(path: Path) -> tuple[list[TraceRecord], int]:
    """``read_trace(path)``'s records, and the peak bytes traced while it ran."""
    tracemalloc.start()
    try:
        records = read_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return records, peak
