"""Rows of a trace that repeat an earlier row in every field read: counted, and kept.

Two exports that overlap, joined as docs/traces.md joins files (``tail -n +2 b.csv >>
a.csv``), hold each overlapping request twice, at the same microsecond with the same
lengths: a reviewer's trace joined with itself replayed twice its load, P1's TTFT p99
from 530 ms to 33 s, and nothing said. Two identical requests at one instant can be
real (a client's retry, a fan-out), so the rows are kept and replayed, and the count
is a warning (``trace_pace.doubts``) with the first such line and the one it repeats.

Compared is what the replay reads of a row (``TraceRecord``: time, lengths, class,
session, Mooncake's blocks): a column it does not read is named apart (``trace_formats``).
Only rows at a time another row shares are compared, found with one sorted array of the
times (8 bytes a row): a trace of distinct times, as Azure's microseconds are, costs
that sort and nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from slopilot.engine.sim.trace_formats import TraceRecord


@dataclass(frozen=True, slots=True)
class Repeats:
    """A trace's rows that repeat an earlier row exactly."""

    label: str
    count: int
    line: int
    """The first line that repeats an earlier one, and the line it repeats."""
    of: int

    def text(self) -> str:
        rows = "row repeats" if self.count == 1 else "rows repeat"
        return (f"{self.label}: {self.count:,} {rows} an earlier row in every field read "
                f"(time, lengths, class, session, blocks; the first: line {self.line:,} "
                f"repeats line {self.of:,}); they are kept and replayed as requests of their "
                "own, as two identical requests at one instant can be. If the file joins "
                "exports that overlap, drop the repeats (awk '!seen[$0]++' FILE > OUT "
                "keeps the first of each line) and give that file (docs/traces.md)")


def repeats(records: Sequence[TraceRecord], lines: Sequence[int],
            label: str) -> Repeats | None:
    """The rows of ``records`` (in the order read, each row's line in ``lines``) equal to
    an earlier one, or None where there is none."""
    n = len(records)
    if n < 2:
        return None
    times = np.fromiter((r.arrival_time for r in records), np.float64, n)
    ordered = np.sort(times)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    shared = np.unique(ordered[1:][same])
    del ordered, same
    # Only the rows at a shared time, grouped by it, each group in the order read (a
    # stable sort): the earlier of two equal rows is seen first.
    picked = np.flatnonzero(np.isin(times, shared))
    picked = picked[np.argsort(times[picked], kind="stable")]
    count, first, of = 0, 0, 0
    seen: dict[TraceRecord, int] = {}  # one time's rows: a group, not the trace, held
    at = None
    for i in picked.tolist():
        record, line = records[i], lines[i]
        if record.arrival_time != at:
            at = record.arrival_time
            seen.clear()
        earlier = seen.setdefault(record, line)
        if earlier != line:
            count += 1
            if not first or line < first:
                first, of = line, earlier
    return Repeats(label, count, first, of) if count else None
