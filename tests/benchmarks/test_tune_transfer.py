"""benchmarks/tune_transfer.py's traces: what its cases say they are (figures not asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.trace import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from tune_transfer import write_mooncake, write_mooncake_shift


def test_the_mooncake_trace_is_quiet_then_busy_with_shared_prefixes(tmp_path: Path) -> None:
    write_mooncake(tmp_path / "a.jsonl")
    records = read_trace(tmp_path / "a.jsonl")  # told Mooncake's by its keys
    times = np.array([r.arrival_time for r in records])
    quiet, busy = (times < 600).sum() / 600, (times >= 600).sum() / 1200
    assert quiet < 0.3 and busy > 1.0
    assert all(r.prefix_blocks is not None and r.prefix_blocks[:4] == (0, 1, 2, 3)
               for r in records)
    nominal = sum(r.prompt_tokens + r.output_tokens for r in records)
    assert fresh_tokens(records).sum() < 0.5 * nominal  # most prompt tokens were sent before
    write_mooncake(tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_the_shift_trace_is_busiest_by_tokens_where_the_cache_serves_them(
        tmp_path: Path) -> None:
    write_mooncake_shift(tmp_path / "s.jsonl")
    records = read_trace(tmp_path / "s.jsonl")
    times = np.array([r.arrival_time for r in records])
    fresh = fresh_tokens(records)
    nominal = np.array([r.prompt_tokens + r.output_tokens for r in records], dtype=float)
    follow_ups, documents = (times >= 900) & (times < 1500), (times >= 1500) & (times < 1620)
    # Per second: the follow-ups bring more prompt tokens, the documents more new ones.
    assert nominal[follow_ups].sum() / 600 > 1.5 * nominal[documents].sum() / 120
    assert fresh[documents].sum() / 120 > 4 * fresh[follow_ups].sum() / 600
