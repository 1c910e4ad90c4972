"""Parsers of the trace file formats (see ``trace.py`` and docs/traces.md).

- ``azure-csv``: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure's LLM inference
  traces), read as the generic CSV, its names aliases of the generic ones;
- ``csv``: a header naming ``arrival_time`` (seconds, or an ISO date; ``timestamp`` also
  works), ``prompt_tokens``, ``output_tokens`` and optionally ``class`` (``p0``, ``p1``,
  ``p2``; ``priority`` also works) and ``session_id``; another column is named in a
  warning, once, and not read;
- ``jsonl``: one object per line with the same names; other keys are named in a
  warning, once, each with the first line it is on, and not read;
- ``burstgpt`` and ``mooncake``: two public traces' own forms (``trace_public.py``), told
  by their header and keys with ``is_burstgpt_header`` and ``is_mooncake_row``.

Errors name the file, the line and the field, and quote at most a short excerpt of the
offending row: a trace is data a user (or an attacker) supplies, never echoed whole.
"""

from __future__ import annotations

import csv
import difflib
import json
import logging
import math
import re
import shlex
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeAlias

import numpy as np

from slopilot.engine.json_keys import DuplicateKey, loads_unique
from slopilot.engine.request import Priority
from slopilot.engine.sim.quote import excerpt
from slopilot.engine.sim.trace_fields import (
    Clock,
    TraceError,
    canonical,
    token_count,
    trace_class,
)

log = logging.getLogger(__name__)

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens")
CSV_OPTIONAL = ("class", "session_id")
"""Read where a CSV has them, whatever its form (Azure's and BurstGPT's headers too): a
class beside Azure's exact header was left unread, and P0 rows replayed as P1."""
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type")
FORMATS = ("csv", "azure-csv", "burstgpt", "jsonl", "mooncake")
# The scenario whose deployment and SLO a bare ``--trace`` runs on (1 x H100, Llama-3-8B,
# the standard SLO). Here, beside the formats, because the trace flags name both when
# they register, and registration must import nothing heavy (trace_flags.py).
TRACE_DEPLOYMENT = "azure-conv-2023"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    arrival_time: float
    prompt_tokens: int
    output_tokens: int
    priority: Priority | None = None
    session_id: int | None = None
    """A conversation: its turns (in arrival order) are each a prefix of the next, one
    token stream; a JSONL session's shorter turn starts one of its own."""
    prefix_blocks: tuple[int, ...] | None = None
    """The ids of the prompt's 512-token blocks (Mooncake's ``hash_ids``): prompts with
    equal ids up to a block share their tokens up to its end, as their prefix."""
    index: int | None = None
    """Its place in the whole trace as read (sorted by arrival): the request's identity,
    from which its drawn class and prompt tokens come, so that a window cut from the
    trace replays the requests the whole replay has there (``TraceWorkload``)."""


Lines: TypeAlias = "array[int]"
"""Each record's line (typecode ``I``), in the order of the records returned. Kept
beside the records, 4 bytes a row, rather than on each record (a field there, ~36 bytes
a row, was 180 MB over 5M rows), for an error that names a row once they are sorted
(``trace_span.py``)."""


def parse_csv(text: str, label: str, lines: Lines | None = None) -> list[TraceRecord]:
    """A CSV trace, Azure's header read as aliases of the generic names; each record's
    line appended to ``lines``."""
    refuse_empty(text, label, f"{','.join(CSV_COLUMNS)}[,class] (or Azure's "
                              f"{','.join(_AZURE_COLUMNS)})")
    rows = numbered_rows(text, label)
    header = next(rows, (1, None))[1]
    other = ("; this is BurstGPT's header: give --trace-format burstgpt, or leave it out"
             if is_burstgpt_header(header) else "")
    return _generic_records(rows, header, label, lines, other)


def _generic_records(rows: Iterator[tuple[int, list[str]]], header: list[str] | None,
                     label: str, lines: Lines | None, other: str = "") -> list[TraceRecord]:
    """The records under ``header``: the generic CSV's columns, Azure's names among their
    aliases, so that a class beside either header is read alike."""
    table = CsvTable.of(rows, header, label, required=CSV_COLUMNS, optional=CSV_OPTIONAL,
                        canonical=canonical,
                        form=f"a CSV trace starts with {','.join(CSV_COLUMNS)}[,class] (or "
                             f"Azure's {','.join(_AZURE_COLUMNS)}){other}")
    records = []
    clock = Clock(label)
    sessions: dict[object, int] = {}
    by_text: dict[str, int] = {}
    # Looked up once, not per row: a million rows' lookups were seconds.
    at, said = table.column["arrival_time"], table.said("arrival_time")
    session_at, has_class = table.column.get("session_id"), table.has("class")
    prompt_at, prompt_said = table.column["prompt_tokens"], table.said("prompt_tokens")
    output_at, output_said = table.column["output_tokens"], table.said("output_tokens")
    for line, row in table.rows():
        session = None
        if session_at is not None and (given := row[session_at].strip()):
            session = by_text.get(given)
            if session is None:  # a session's later turns skip the regexes
                session = by_text[given] = sessions.setdefault(_csv_session_key(given),
                                                               len(sessions))
        records.append(TraceRecord(
            clock.read(row[at], line, said),
            token_count(row[prompt_at], label, line, prompt_said, lo=1),
            token_count(row[output_at], label, line, output_said, lo=1),
            table.priority(row, line) if has_class else None, session))
        if lines is not None:
            lines.append(line)
    return _in_sessions(records, lines, len(sessions))


_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ZERO_LED = re.compile(r"[+-]?0[0-9]")
_EXACT = 2 ** 53
"""Below it a float holds every whole number exactly; above, 2**53 + 1 reads as 2**53."""


def _csv_session_key(text: str) -> object:
    """A CSV's session id as a key, the one a JSONL row's id of the same text gets: an
    integer's int, a number with a point or an exponent read as JSON reads it
    (``_number_key``), else the text. So ``1``, ``1.0`` and ``1e0`` are one session (pandas
    writes an id column ``1.0`` once it held a NaN), and ``1.5``, ``1.50`` and ``15e-1``
    one: keyed as their texts, they were three sessions where a JSONL trace of the same
    ids (JSON numbers) had one.

    An integer is keyed exactly: keyed as a float, two 64-bit ids (a hash's, a
    snowflake's) were one session, one token stream. Leading zeros (``0042``) make an id
    text, not 42. ASCII digits only: ``float`` also takes ``1_0`` and other scripts'
    digits; past a float (``1e400``) the text. A decimal no double gives back (17 digits
    of an epoch's fraction, ``1e-400``) is keyed by its exact value (``_Exact``): a JSONL
    number has lost what tells two such ids apart, a CSV's text has not."""
    if _ZERO_LED.match(text):
        return text
    if _WHOLE.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # past int()'s 4,300 digits: no id a JSONL row could match
            return text
    if not _DECIMAL.fullmatch(text):
        return text
    number = float(text)
    if not math.isfinite(number):
        return text
    exact = Decimal(text)
    # A double that gives the id back (1.5, 0.1) is keyed as JSON's; one that does not
    # (17 digits of an epoch's fraction, 1e-400) by its exact value: as the double, two
    # ids it cannot tell apart were one session, silently.
    return _number_key(number) if Decimal(repr(number)) == exact else _Exact(exact)


@dataclass(frozen=True, slots=True)
class _Exact:
    """A CSV's decimal session id that no double gives back, keyed by its exact value
    (``1.2345678901234567891`` and ``1.23456789012345678910`` one session)."""

    value: Decimal


@dataclass(frozen=True, slots=True)
class _Rounded:
    """A whole float past 2**53 as a session key: kept apart from the integer ids, which
    are exact, as it may have been rounded to one of them."""

    value: float


def _number_key(number: float) -> object:
    """A session id written with a point or an exponent as a key, in a CSV or a JSONL:
    the float JSON reads it as (the one kind of number JSON has), equal floats one session
    and a whole one under 2**53 the session of the integer it equals. Past 2**53 a float
    is no longer exact (``9007199254740993.0`` reads as ...992), and keyed as the float it
    was the session of the 64-bit integer id it rounded to."""
    return _Rounded(number) if number.is_integer() and abs(number) >= _EXACT else number


@dataclass(frozen=True, slots=True)
class CsvTable:
    """A CSV trace's rows read by column name: in any order, beside other columns (a slice
    saved by pandas, ``df.to_csv(path)``, has its index as an unnamed first column)."""

    label: str
    width: int
    shown: str
    """The header as written, for errors."""
    first: str
    """The header's first name, stripped: a row starting otherwise repeats no header."""
    column: dict[str, int]
    """Each wanted column's index, by its canonical name."""
    spelled: dict[str, str]
    """Each wanted column as the header spells it: errors name ContextTokens, not
    prompt_tokens."""
    numbered: Iterator[tuple[int, list[str]]]

    @classmethod
    def of(cls, numbered: Iterator[tuple[int, list[str]]], header: list[str] | None,
           label: str, *, required: tuple[str, ...], optional: tuple[str, ...] = (),
           canonical: Callable[[str], str], form: str,
           unread: tuple[str, ...] = ()) -> CsvTable:
        """The table under ``header``; ``form`` says what such a CSV starts with when the
        header lacks a ``required`` column. A column none of ``required``, ``optional``
        and ``unread`` (a format's own columns, documented as not read) names is warned
        of, once: left unread silently, a class column beside Azure's header replayed
        its P0 rows as P1."""
        names = [canonical(h) for h in header or ()]
        missing = [c for c in required if canonical(c) not in names]
        if missing:
            refuse_other_separator(header, label)
            raise TraceError(f"{label}:1: the header {excerpt(','.join(header or ()))} lacks "
                             f"{', '.join(missing)}; {form}")
        assert header is not None
        for name in (*required, *optional):
            # Refused, not the first taken: which of two times (or classes) the user meant
            # is theirs to say, as a JSONL row giving class and priority is refused.
            at = [i for i, n in enumerate(names) if n == canonical(name)]
            if len(at) > 1:
                times = "twice" if len(at) == 2 else f"{len(at)} times"
                raise TraceError(
                    f"{label}:1: the header gives {name} {times} (columns {at[0] + 1} and "
                    f"{at[1] + 1}: {excerpt(header[at[0]].strip())}, "
                    f"{excerpt(header[at[1]].strip())}); keep one")
        column = {canonical(n): names.index(canonical(n))
                  for n in (*required, *optional) if canonical(n) in names}
        _warn_unread(header, names, {canonical(n) for n in (*required, *optional, *unread)},
                     label, (*required, *optional))
        return cls(label, len(names), ",".join(h.strip() for h in header), header[0].strip(),
                   column,
                   {name: header[i].strip() for name, i in column.items()}, numbered)

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """Each row that is not blank, with its line, checked against the header's width;
        the blank ones (no value in any field: ``,,``) are counted, and the count logged
        once they are all read."""
        blank, first_blank = 0, 0  # a count, not each line: a file of ,, rows is no list
        first = self.first
        for line, row in self.numbered:
            if not row or not "".join(row).strip():
                blank += 1
                first_blank = first_blank or line
                continue
            # The first field first: joining every row's fields cost an Azure CSV 12-18%.
            if row[0].strip() == first and ",".join(f.strip() for f in row) == self.shown:
                refuse_repeated_header(self.label, line)
            if len(row) <= max(self.column.values()):
                raise TraceError(f"{self.label}:{line}: expected {self.width} columns "
                                 f"({excerpt(self.shown)}), got {len(row)}: {excerpt(row)}")
            refuse_wide(row, self.width, self.label, line)
            yield line, row
        if blank:
            log.warning("%s: skipped %s blank row%s (no value in any field; the first on "
                        "line %d)", self.label, f"{blank:,}", "" if blank == 1 else "s",
                        first_blank)

    def priority(self, row: list[str], line: int) -> Priority | None:
        """The row's class, None where the header has no class column or the field is
        empty (``--classes`` decides)."""
        if not self.has("class") or not self.field(row, "class").strip():
            return None
        return trace_class(self.field(row, "class").strip(), self.label, line,
                           self.said("class"))

    def has(self, name: str) -> bool:
        return name in self.column

    def field(self, row: list[str], name: str) -> str:
        return row[self.column[name]]

    def said(self, name: str) -> str:
        return self.spelled[name]

    def count(self, row: list[str], name: str, line: int, *, lo: int = 1) -> int:
        """The column's token count, its errors naming the column as the header does."""
        return token_count(self.field(row, name), self.label, line, self.said(name), lo=lo)


def _warn_unread(header: list[str], names: list[str], known: set[str], label: str,
                 read: tuple[str, ...]) -> None:
    # pandas writes its index first (df.to_csv(path)); an empty name elsewhere is most
    # likely a trailing comma.
    unread = [excerpt(header[i].strip()) if header[i].strip() else
              f"column {i + 1} (unnamed: pandas' index?)" if i == 0 else
              f"column {i + 1} (an empty header name)"
              for i, name in enumerate(names) if name not in known]
    if unread:
        log.warning("%s: %d column%s not read: %s; a CSV trace reads %s (docs/traces.md): "
                    "rename a column meant as one of them", label, len(unread),
                    "" if len(unread) == 1 else "s", ", ".join(unread), ", ".join(read))


JSONL_KEYS = frozenset(("arrival_time", "timestamp", "prompt_tokens", "output_tokens",
                        "class", "priority", "session_id"))
"""The keys a generic JSONL row's object is read by (matched exactly, as JSON keys are)."""


class UnreadKeys:
    """The keys of a JSONL trace's rows that none of ``JSONL_KEYS`` names, each with the
    first line it is on, for one warning once the rows are read, as a CSV's other columns
    are named: dropped silently, ``"sesion_id"`` replayed every turn as a conversation of
    its own. At most ``NAMED`` are kept: a file whose rows each bring a key of their own
    is no list held in memory."""

    NAMED = 20

    def __init__(self) -> None:
        self.first: dict[str, int] = {}
        self.more = False

    def see(self, obj: dict[str, Any], line: int) -> None:
        """``obj``'s other keys (the caller has found some: ``JSONL_KEYS`` is no
        superset of its keys), each kept with ``line`` the first time it is seen."""
        for key in obj:
            if key in JSONL_KEYS or key in self.first:
                continue
            if len(self.first) < self.NAMED:
                self.first[key] = line
            else:
                self.more = True

    def warn(self, label: str) -> None:
        if not self.first:
            return
        named = [f"{excerpt(key)} (first on line {line}{_meant(key)})"
                 for key, line in self.first.items()]
        count = (f"{len(named)} key{'' if len(named) == 1 else 's'}" if not self.more
                 else f"over {len(named)} keys")
        log.warning("%s: %s not read: %s%s; a JSONL trace reads arrival_time (or timestamp), "
                    "prompt_tokens, output_tokens, class (or priority), session_id "
                    "(docs/traces.md): rename a key meant as one of them", label, count,
                    ", ".join(named), ", and others" if self.more else "")


def _meant(key: str) -> str:
    """The read key ``key`` most likely misspells, as ``; session_id?``; empty for none
    close (``Class``, a JSON key's case: ``class``)."""
    close = difflib.get_close_matches(key.strip().lower(), JSONL_KEYS, n=1, cutoff=0.8)
    return f"; {close[0]}?" if close else ""


def refuse_repeated_header(label: str, line: int) -> None:
    # Two files joined with cat: read as a row, its names were "not a time".
    raise TraceError(f"{label}:{line}: the header row repeats here (files joined with cat?); "
                     "a trace has one header: delete this line (join files with "
                     "tail -n +2 b.csv >> a.csv, which leaves the second header out)")


def is_burstgpt_header(header: list[str] | None) -> bool:
    """Whether a CSV header names BurstGPT's token columns (its only names no other
    format has)."""
    names = {h.strip().lower() for h in header or ()}
    return {"request tokens", "response tokens"} <= names


def is_mooncake_row(obj: dict[str, Any]) -> bool:
    """Whether a JSONL row gives Mooncake's lengths rather than the generic names."""
    return "input_length" in obj or "output_length" in obj


def refuse_other_separator(header: list[str] | None, label: str) -> None:
    # A locale's Excel saves "CSV" with semicolons, a spreadsheet export may use tabs:
    # told as missing columns, the user saw the very names the error asked for.
    if header is None or len(header) != 1:
        return
    for sep, said in ((";", "';'"), ("\t", "tabs")):
        if sep in header[0]:
            raise TraceError(
                f"{label}:1: the header {excerpt(header[0])} is separated by {said}, not "
                "commas; a CSV trace's fields are separated by commas: save it with commas "
                "(Excel: CSV UTF-8)")


def _rows(text: str) -> Any:
    """A CSV reader over ``text``: rows end at newlines only, and a quoted field keeps its
    own (``str.splitlines()`` would also split at U+2028, form feeds and other separators
    a field may hold, and glue a quoted multi-line field back without its newline)."""
    return csv.reader(_source_lines(text))


def _source_lines(text: str) -> Iterator[str]:
    """``text``'s lines with their ends, as ``io.StringIO(text, newline="")`` gives them
    (ended by an LF, a CRLF or a bare CR), one at a time: StringIO held the whole text
    again at 4 bytes a character, a 1 GB trace ~6 GB while it was parsed."""
    start = 0
    for end in _SOURCE_LINE_END.finditer(text):
        yield text[start:end.end()]
        start = end.end()
    if start < len(text):
        yield text[start:]


_SOURCE_LINE_END = re.compile(r"\r\n|\r|\n")


def refuse_empty(text: str, label: str, header: str) -> None:
    # Said as such: judged as a header, an empty file read "the header '' lacks ...".
    if not text.strip():
        raise TraceError(f"{label}: the file is empty; a CSV trace starts with {header} "
                         "and has a row per request")


def numbered_rows(text: str, label: str) -> Iterator[tuple[int, list[str]]]:
    """``_rows`` with each row's line; the csv module's own refusals (a field past its
    131,072-character limit) become a ``TraceError`` naming the line."""
    reader = _rows(text)
    last_line: int | None = None  # the text's, counted once: per row it was quadratic
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise TraceError(f"{label}:{reader.line_num}: {e}; a trace's fields are times, "
                             "token counts and classes: check that this is a CSV trace") \
                from None
        if start == 1 and (sep := excel_separator(row)) is not None:
            if sep == ",":
                continue  # Excel's hint of the separator it wrote; the header follows
            raise TraceError(
                f"{label}:1: Excel's line sep={sep} says the fields are separated by "
                f"{sep!r}; a CSV trace's fields are separated by commas: save it with "
                "commas (Excel: CSV UTF-8)")
        if reader.line_num > start:
            last_line = _last_line(text) if last_line is None else last_line
            if _open_quote_to_the_end(text, reader.line_num, last_line):
                # The csv module reads a quote left open as a field running to the end
                # of the file; told from the row's last line, the error named the wrong
                # line and a row the user never wrote.
                    raise TraceError(
                    f'{label}:{start}: a quote (") opened on this line is never closed, '
                    "so the rest of the file reads as one field; close it or remove it")
        # The row's first line: a quoted field over several lines was told at its last.
        yield start, row


def excel_separator(row: list[str]) -> str | None:
    """The separator an Excel first line ``sep=;`` names (read as a CSV row: ``sep=,``
    is ``['sep=', '']``), or None for any other row."""
    joined = ",".join(row).strip()
    if len(joined) == 5 and joined[:4].lower() == "sep=":
        return joined[4]
    return None


def _last_line(text: str) -> int:
    """The number of ``text``'s last line as the csv reader numbers it (its source ends a
    line at an LF, a CRLF or a bare CR)."""
    ends = text.count("\n") + text.count("\r") - text.count("\r\n")
    return ends + (0 if text.endswith(("\n", "\r")) else 1)


def _open_quote_to_the_end(text: str, line: int, last_line: int) -> bool:
    """Whether a row that ended on ``line`` ran to the end of ``text`` (its last line
    ``last_line``) inside a quote: it ended there, and the file's quotes do not pair up
    (a closed field's, with "" inside, always do)."""
    return line >= last_line and text.count('"') % 2 == 1


def refuse_wide(row: list[str], width: int, label: str, line: int) -> None:
    # A field past the header's is no column of the trace but a comma inside a value:
    # "1,500" read as prompt 1, output 500, and the real output dropped. Trailing empty
    # fields (a comma ending each row) say nothing and are read.
    if any(field.strip() for field in row[width:]):
        raise TraceError(
            f"{label}:{line}: {len(row)} fields, the header has {width}: {excerpt(row)}; a "
            "length written with a thousands separator (1,500) splits in two: write 1500 "
            "(or quote a field that holds a comma)")


def parse_azure(text: str, label: str, lines: Lines | None = None) -> list[TraceRecord]:
    refuse_empty(text, label, ",".join(_AZURE_COLUMNS))
    rows = numbered_rows(text, label)
    header = next(rows, (1, None))[1]
    if header is None or tuple(h.strip() for h in header[:3]) != _AZURE_COLUMNS:
        raise TraceError(f"{label}:1: expected the header {','.join(_AZURE_COLUMNS)}, "
                         f"got {excerpt(header)}")
    return _generic_records(rows, header, label, lines)


def json_objects(text: str, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each line's JSON object with its line; blank lines are skipped."""
    # Lines end at "\n" only: a JSON string may hold U+2028 or U+0085, where
    # str.splitlines() would cut it (a "\r" before the "\n" is JSON whitespace).
    for line, raw in enumerate(_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            obj: Any = loads_unique(raw)
        except DuplicateKey as e:
            # JSON keeps the last silently: a prompt of 5,000 tokens read as 100, where a
            # CSV giving a column twice is refused.
            raise TraceError(f"{label}:{line}: {excerpt(e.key)} given twice in one object; "
                             "JSON keeps only the last: keep the one you mean") from None
        except (ValueError, RecursionError) as e:
            # JSONDecodeError; an integer past 4,300 digits; or brackets nested past the
            # decoder's recursion limit (a few kB of "[").
            why = (e.msg if isinstance(e, json.JSONDecodeError) else
                   "nested too deep" if isinstance(e, RecursionError) else "a number too long")
            raise TraceError(f"{label}:{line}: not valid JSON ({why}): {raw[:80]!r}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{label}:{line}: expected a JSON object, got {raw[:80]!r}"
                             + (_json_lines_hint(label) if isinstance(obj, list) else ""))
        yield line, obj


def _json_lines_hint(label: str) -> str:
    # A .json file usually holds one array of the rows; a trace is read as JSON Lines.
    out = label[:-len(".json")] if label.lower().endswith(".json") else label
    out = shlex.quote(f"./{out}" if out.startswith("-") else out) + ".jsonl"
    src = shlex.quote(f"./{label}" if label.startswith("-") else label)
    return (f"; a JSON trace is read as JSON Lines, one object per line, not an array of "
            f"them: write it so with jq -c '.[]' {src} > {out} and give that file")


def _lines(text: str) -> Iterator[str]:
    """``text.split("\n")`` one line at a time: the list of a gigabyte's lines was a
    second copy of it, held to the end of the parse."""
    start = 0
    while (end := text.find("\n", start)) >= 0:
        yield text[start:end]
        start = end + 1
    yield text[start:]


def parse_jsonl(text: str, label: str, lines: Lines | None = None) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    clock = Clock(label)
    sessions: dict[object, int] = {}
    unread, read_only = UnreadKeys(), JSONL_KEYS.issuperset  # one test a row, in C
    for line, obj in json_objects(text, label):
        if not read_only(obj):
            unread.see(obj, line)
        times = [k for k in ("arrival_time", "timestamp") if obj.get(k) is not None]
        if len(times) > 1:
            # Which the user meant is theirs to say, as the CSV's two columns are.
            raise TraceError(f"{label}:{line}: arrival_time and timestamp both given "
                             f"({excerpt(obj['arrival_time'])}, {excerpt(obj['timestamp'])}); "
                             "give one")
        key = times[0] if times else "arrival_time"
        if key not in obj:
            raise TraceError(f"{label}:{line}: missing arrival_time (or timestamp)")
        t = clock.read(obj[key], line, key)
        for name in ("prompt_tokens", "output_tokens"):
            if name not in obj:
                other = ("" if not is_mooncake_row(obj) else
                         "; this row is Mooncake's (input_length), the first a generic JSONL "
                         "row: give every row in one format" if records else
                         "; this row is Mooncake's (input_length): give --trace-format "
                         "mooncake, or leave it out")
                raise TraceError(f"{label}:{line}: missing {name}{other}")
        prompt = token_count(obj["prompt_tokens"], label, line, "prompt_tokens", lo=1)
        output = token_count(obj["output_tokens"], label, line, "output_tokens", lo=1)
        priority = None
        # The CSV's names: ``class``, or ``priority`` (docs/traces.md).
        given = [k for k in ("class", "priority") if obj.get(k) is not None]
        if len(given) > 1:
            raise TraceError(f"{label}:{line}: class and priority both given "
                             f"({excerpt(obj['class'])}, {excerpt(obj['priority'])}); "
                             "give one")
        if given:
            priority = trace_class(obj[given[0]], label, line, given[0])
        session = None
        if obj.get("session_id") is not None:
            # A string or a number names a session; numbered in order of first appearance.
            session = sessions.setdefault(_session_key(obj["session_id"], label, line),
                                          len(sessions))
        records.append(TraceRecord(t, prompt, output, priority, session))
        if lines is not None:
            lines.append(line)
    unread.warn(label)
    return _in_sessions(records, lines, len(sessions))


def _in_sessions(records: list[TraceRecord], lines: Lines | None,
                 sessions: int) -> list[TraceRecord]:
    """``records`` as read where none names a session; else in arrival order (their
    ``lines`` too), as ``_conversations``."""
    if not sessions:
        return records
    if lines is not None:
        # The records are put in arrival order (stably, as below): their lines too.
        arrivals = np.fromiter((r.arrival_time for r in records), np.float64, len(records))
        order = np.argsort(arrivals, kind="stable")
        lines[:] = array(lines.typecode, np.asarray(lines)[order].tobytes())
    return _conversations(records, sessions)


def _conversations(records: list[TraceRecord], next_id: int) -> list[TraceRecord]:
    """The records in arrival order, a session's turn shorter than its last given a
    session id of its own, which the session's later turns then keep.

    A session's turns share one token stream, each a prefix of the next: the history a
    chat client resends. A shorter turn is not that (the client cut or edited the
    history); as the stream's prefix it was served whole from the prefix cache, which a
    real server would not do. So it starts a conversation: fresh tokens, and the longer
    turns after it continue it."""
    records.sort(key=lambda r: r.arrival_time)  # stable, as ``read_trace``'s
    last: dict[int, tuple[int, int]] = {}  # session -> (its conversation's id, last turn)
    for i, r in enumerate(records):
        if r.session_id is None:
            continue
        conversation, length = last.get(r.session_id, (r.session_id, 0))
        if r.prompt_tokens < length:
            conversation, next_id = next_id, next_id + 1
        last[r.session_id] = (conversation, r.prompt_tokens)
        if conversation != r.session_id:
            records[i] = replace(r, session_id=conversation)
    return records


def _session_key(value: object, label: str, line: int) -> object:
    """A session id as a key, as a CSV's of the same text (``_csv_session_key``): a
    string, or a number, equal numbers one session (1 and 1.0: JSON has one kind of
    number, and pandas writes an id column as 1.0 once it held a NaN); "1" is another.
    true (equal to 1 as a key), an object, an array or NaN (no two equal) names none, and
    is refused rather than merged with another's turns."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return _number_key(value)
    raise TraceError(f"{label}:{line}: session_id={excerpt(value)} names no session; a "
                     "session id is a string or a number (the same for every turn of a "
                     "conversation): give one, or leave the key out")
