"""Two public traces in their own forms (docs/traces.md), read with the helpers of the
other formats (``trace_formats.py``), so that their errors read alike.

- ``burstgpt`` (HPMLL/BurstGPT): a CSV with ``Timestamp,Model,Request tokens,Response
  tokens,Total tokens,Log Type``; ``Timestamp`` is seconds from the trace's start. A
  failed request has 0 response tokens: it is skipped and counted (a warning on this
  module's logger), as BurstGPT's own ``BurstGPT_without_fails_*.csv`` leave them out; its
  output is unknown, and 0 cannot be replayed. ``Total tokens`` and
  ``Log Type`` are not read; ``Model`` only to pick one model's rows.
- ``mooncake`` (kvcache-ai/Mooncake, FAST'25): JSONL rows ``{"timestamp": ms,
  "input_length": N, "output_length": M, "hash_ids": [...]}``; ``timestamp`` is
  milliseconds from the first request; ``hash_ids`` name the prompt's 512-token blocks,
  equal where prompts share a prefix, and are kept (``TraceRecord.prefix_blocks``) so that
  the replay's prompts share those tokens and the prefix cache sees the sharing.
  Its timestamps are whole milliseconds: those with a fractional part are counted
  (``Fractions``), a sign of a file converted to seconds (``trace_pace.fractional``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.quote import excerpt
from slopilot.engine.sim.trace_fields import DATES, Clock, TraceError, token_count, trace_time
from slopilot.engine.sim.trace_formats import (
    BURSTGPT_COLUMNS,
    CSV_OPTIONAL,
    CsvTable,
    Lines,
    TraceRecord,
    json_objects,
    numbered_rows,
    refuse_empty,
)

log = logging.getLogger(__name__)

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block: Mooncake's KV page (its FAST'25 traces: a 6,758-token
prompt has 14 ids, the last block partly filled)."""
MAX_TRACE_BLOCKS = 10_000_000
"""The most ``hash_ids`` a trace may hold in all (~360 MB as records): 30 times Mooncake's
conversation trace (~300,000), while a gigabyte of ids, allowed by the file size alone,
would be ~6 GB in memory."""
_BLOCK_ID_LIMIT = 2**63
_BURSTGPT_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
_BURSTGPT_UNREAD = ("Total tokens", "Log Type")
"""BurstGPT's own columns, documented as not read (docs/traces.md): no warning."""
_BURSTGPT_FORM = f"BurstGPT's CSV has {','.join(BURSTGPT_COLUMNS)}"
_SHOWN_MODELS = 8


def parse_burstgpt(text: str, label: str, lines: Lines | None = None, *,
                   model: str | None = None) -> list[TraceRecord]:
    """BurstGPT's rows (of ``model`` only, in any case, when given); failed ones skipped."""
    refuse_empty(text, label, ",".join(BURSTGPT_COLUMNS))
    rows = numbered_rows(text, label)
    header = next(rows, (1, None))[1]
    table = CsvTable.of(rows, header, label, required=_BURSTGPT_REQUIRED,
                        optional=("Model", *CSV_OPTIONAL), canonical=_lower,
                        form=_BURSTGPT_FORM, unread=_BURSTGPT_UNREAD)
    if model is not None and not table.has("model"):
        raise TraceError(f"{label}:1: the header {excerpt(table.shown)} has no Model column "
                         f"to pick {excerpt(model)} by; leave the model filter out")
    records = []
    clock = Clock(label)
    models: Counter[str] = Counter()
    failed: list[int] = []
    for line, row in table.rows():
        name = table.field(row, "model").strip() if table.has("model") else ""
        models[name] += 1
        if model is not None and name.casefold() != model.strip().casefold():
            continue
        output = table.count(row, "response tokens", line, lo=0)
        if output == 0:
            failed.append(line)
            continue
        t = clock.read(table.field(row, "timestamp"), line, table.said("timestamp"))
        records.append(TraceRecord(t, table.count(row, "request tokens", line), output,
                                   table.priority(row, line)))
        if lines is not None:
            lines.append(line)
    if model is not None and not records and not failed:
        shown = ", ".join(f"{excerpt(m)[1:-1]} ({n:,} rows)"
                          for m, n in models.most_common(_SHOWN_MODELS))
        raise TraceError(f"{label}: no request of model {excerpt(model)}{_not_ascii(model)}; "
                         f"the trace's models: {shown or 'none'}")
    if failed and not records:
        raise TraceError(f"{label}: all {len(failed):,} requests failed (Response tokens 0); "
                         "nothing to replay")
    if failed:
        log.warning("%s: skipped %s failed request%s (Response tokens 0; the first on line "
                    "%d): a failed request's output is unknown, and BurstGPT's "
                    "without_fails files leave them out too", label, f"{len(failed):,}",
                    "" if len(failed) == 1 else "s", failed[0])
    return records


def _not_ascii(name: str) -> str:
    """Names the characters of ``name`` that are not ASCII: a Cyrillic С pasted from a
    chat prints as the C of the model it was meant to pick."""
    others = sorted({f"U+{ord(c):04X}" for c in name if not c.isascii()})
    if not others:
        return ""
    shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
    return f" (its {shown} {'is' if len(others) == 1 else 'are'} no ASCII letter" \
           f"{'' if len(others) == 1 else 's'})"


def _lower(column: str) -> str:
    name = column.strip().lower()
    return "class" if name == "priority" else name  # as the generic CSV's alias


@dataclass(slots=True)
class Fractions:
    """Mooncake's timestamps given with a fractional part (``0.013``), counted while read:
    its timestamps are whole milliseconds, so most of a file's with one are seconds, not
    milliseconds (``trace_pace.fractional`` says so, how strongly by the rate they replay
    at)."""

    count: int = 0
    line: int = 0
    """The first such timestamp's line, and its value as written."""
    value: str = ""

    def see(self, value: object, line: int) -> None:
        # trace_time has read it as a number of milliseconds: float() takes it again.
        if not float(value).is_integer():  # type: ignore[arg-type]
            if not self.count:
                self.line, self.value = line, excerpt(value)
            self.count += 1


def parse_mooncake(text: str, label: str, lines: Lines | None = None, *,
                   fractions: Fractions | None = None) -> list[TraceRecord]:
    """Mooncake's rows; each timestamp with a fractional part counted in ``fractions``."""
    records: list[TraceRecord] = []
    blocks_in_all = 0
    for line, obj in json_objects(text, label):
        for key in ("input_length", "output_length", "timestamp"):
            if key not in obj:
                raise TraceError(f"{label}:{line}: missing {key}{_other_form(obj, records)}")
        t, kind = trace_time(obj["timestamp"], label, line, "timestamp", unit="milliseconds")
        if kind in DATES:
            raise TraceError(f"{label}:{line}: timestamp={excerpt(obj['timestamp'])} is a "
                             "date; Mooncake's timestamps are milliseconds from the first "
                             "request (0, 3052): convert them, or give a CSV of dates")
        if fractions is not None:
            fractions.see(obj["timestamp"], line)
        prompt = token_count(obj["input_length"], label, line, "input_length", lo=1)
        output = token_count(obj["output_length"], label, line, "output_length", lo=1)
        blocks = _blocks(obj.get("hash_ids"), prompt, label, line)
        blocks_in_all += len(blocks or ())
        if blocks_in_all > MAX_TRACE_BLOCKS:
            raise TraceError(f"{label}:{line}: more than {MAX_TRACE_BLOCKS:,} hash_ids in all "
                             "(each held in memory for the replay): cut the trace to the span "
                             "you replay, e.g. with head -n")
        records.append(TraceRecord(t, prompt, output, prefix_blocks=blocks))
        if lines is not None:
            lines.append(line)
    if records:
        # Milliseconds cannot be told from seconds by their values: the span says which.
        span = max(r.arrival_time for r in records) - min(r.arrival_time for r in records)
        log.info("%s: Mooncake's timestamps read as milliseconds: %s requests over %s s",
                 label, f"{len(records):,}", f"{span:,g}")
    return records


def _other_form(obj: dict[str, Any], records: list[TraceRecord]) -> str:
    if "prompt_tokens" not in obj and "output_tokens" not in obj:
        return ""
    if records:
        return ("; this row is a generic JSONL row (prompt_tokens), the first Mooncake's: "
                "give every row in one format")
    return ("; this row is a generic JSONL row (prompt_tokens): give --trace-format jsonl, "
            "or leave it out")


def _blocks(value: object, prompt: int, label: str, line: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise TraceError(f"{label}:{line}: hash_ids={excerpt(value)} must be a list of block "
                         f"ids (whole numbers >= 0), one per {MOONCAKE_BLOCK_TOKENS} tokens of "
                         "the prompt")
    most = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(value) > most:
        # Past the prompt's blocks an id names no token: a trace hashed with smaller
        # blocks, or a hostile row's millions of ids.
        raise TraceError(
            f"{label}:{line}: {len(value):,} hash_ids for input_length={prompt}, which fills "
            f"{most} block{'' if most == 1 else 's'} of {MOONCAKE_BLOCK_TOKENS} tokens; "
            f"Mooncake's ids are one per {MOONCAKE_BLOCK_TOKENS}-token block: check the "
            "block size the trace was hashed with")
    for i, h in enumerate(value):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < _BLOCK_ID_LIMIT:
            raise TraceError(f"{label}:{line}: hash_ids[{i}]={excerpt(h)} must be a whole "
                             "number >= 0 (below 2^63)")
    return tuple(value)


__all__ = ["MAX_TRACE_BLOCKS", "MOONCAKE_BLOCK_TOKENS", "Fractions", "parse_burstgpt",
           "parse_mooncake"]
