"""Replay of recorded request traces: CSV (Azure's, BurstGPT's or a minimal one) or JSONL
(Mooncake's or a minimal one), windowed and time-scaled.

The formats (``trace_formats.py``, ``trace_public.py``, docs/traces.md): a CSV with
``arrival_time,prompt_tokens,output_tokens[,class]``; Azure's ``TIMESTAMP,ContextTokens,
GeneratedTokens``; BurstGPT's ``Timestamp,Model,Request tokens,Response tokens,...``; JSONL
with the CSV's names per line plus an optional ``session_id``; Mooncake's ``timestamp``
(ms), ``input_length``, ``output_length`` and ``hash_ids``.

Times are taken relative to the first request, then cut to a window, then scaled:
``time_scale`` multiplies every offset (0.5 replays twice as fast), or ``target_rate``
picks the scale that gives that many requests per second. Traces hold lengths, not text,
so prompts are synthetic tokens; requests of one session share their session's token
stream, so a later (longer) turn has an earlier turn's prompt as its prefix; and prompts
naming the same Mooncake blocks share those blocks' tokens. What is drawn for a request
(its prompt, its class where the trace gives none) comes from its place in the trace as
read, so a cut of it (a ``--trace-window``, a tuner's window) replays the same requests.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np

from slopilot.engine.bounded_read import FileTooLarge, read_bounded
from slopilot.engine.read_errors import unreadable
from slopilot.engine.request import Priority
from slopilot.engine.sim.quote import excerpt
from slopilot.engine.sim.session_pace import SessionPace, SessionTurns
from slopilot.engine.sim.trace_fields import MAX_SECONDS, TraceError
from slopilot.engine.sim.trace_formats import (
    FORMATS,
    Lines,
    TraceRecord,
    is_burstgpt_header,
    is_mooncake_row,
    numbered_rows,
    parse_azure,
    parse_csv,
    parse_jsonl,
)
from slopilot.engine.sim.trace_public import (
    MOONCAKE_BLOCK_TOKENS,
    Fractions,
    parse_burstgpt,
    parse_mooncake,
)
from slopilot.engine.sim.trace_repeats import Repeats, repeats
from slopilot.engine.sim.trace_span import StrayGap, stray_gap
from slopilot.engine.sim.workload import (
    DEFAULT_VOCAB_SIZE,
    ClassMix,
    RequestSpec,
    SyntheticPrompt,
    TokenSampler,
    child_rng,
)

# A trace is read whole and held as records: past these a file is refused, from its size
# unread, then from its lines before any is parsed, rather than by the kernel's OOM
# killer. A line costs ~260 bytes at the parse's peak however short it is (1M lines of a
# compact CSV, 11.9 MB: 258 MB), so the size alone let 1 GiB of file be ~22 GB of memory;
# 5M lines is ~1.3 GB (measured: 1.36 GB resident; ``tune`` reads it again in its
# worker). At both limits, 5M rows of 200 bytes, the bytes and the text are held
# together while decoded: 2.2 GB resident for a CSV, 3.0 GB for Mooncake's JSONL. The
# stray-gap check (trace_span.py) adds 12 bytes a row (1M rows: 243 -> 258 MB peak).
MAX_TRACE_BYTES = 1 << 30
MAX_TRACE_ROWS = 5_000_000

MAX_TARGET_RATE = 1e6
"""Requests per second: thousands of times what a replica serves. Past it a target rate
replays the whole trace in an instant (1e300 was taken: every arrival at 0)."""

# Traces shipped in slopilot/data/traces (see the README there for sources and licences).
BUILTIN_TRACES = {"azure-llm-2023-conv": "azure-llm-2023-conv.csv"}
_TOKENS, _PRIORITY, _SESSION_TOKENS, _BLOCK_TOKENS = 21, 22, 23, 24
# Classes are drawn for this many consecutive requests at once (one generator each, not
# one per request: 5M requests' generators would take minutes).
_CLASS_BLOCK = 4096


def trace_source(name_or_path: str | Path) -> Traversable | Path:
    """A shipped trace by name (``azure-llm-2023-conv``) or a file path."""
    key = str(name_or_path)
    if key in BUILTIN_TRACES:
        return resources.files("slopilot").joinpath("data", "traces", BUILTIN_TRACES[key])
    path = Path(name_or_path)
    if not path.is_file():
        raise TraceError(
            f"trace {key!r} is neither a file nor a shipped trace; shipped traces: "
            f"{', '.join(BUILTIN_TRACES)}")
    return path


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace as read: its records (``read_trace``), and the gap that sets a stray time
    apart from the rest, if one does (``trace_span.py``), refused where a replay's cut
    holds both sides of it."""

    records: list[TraceRecord]
    stray: StrayGap | None
    fmt: str = "csv"
    """The format it was read as (named, or told from the file: ``FORMATS``)."""
    repeats: Repeats | None = None
    """Its rows that repeat an earlier row exactly (``trace_repeats.py``), kept."""
    fractions: Fractions | None = None
    """A Mooncake trace's timestamps with a fractional part (``Fractions``); None for
    another format."""


def read_trace(name_or_path: str | Path, *, fmt: str | None = None,
               model: str | None = None) -> list[TraceRecord]:
    """All records, sorted by arrival, times relative to the first request; ``model``
    keeps one model's rows of a trace that names them (BurstGPT's)."""
    return load_trace(name_or_path, fmt=fmt, model=model).records


def load_trace(name_or_path: str | Path, *, fmt: str | None = None,
               model: str | None = None) -> Trace:
    """``read_trace``'s records, with the stray gap among their times found while each
    one's line is known."""
    source = trace_source(name_or_path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"trace format {fmt!r} is unknown; use one of: {', '.join(FORMATS)}")
    try:
        data = (read_bounded(source, MAX_TRACE_BYTES) if isinstance(source, Path)
                else source.read_bytes())
    except FileTooLarge as e:
        size = _size(e.size) if e.size is not None else f"over {_size(MAX_TRACE_BYTES)}"
        raise TraceError(
            f"{name_or_path}: the trace is {size}; at most "
            f"{_size(MAX_TRACE_BYTES)} is read (whole, into memory): cut it to the span "
            "you replay, e.g. with head -n") from None
    except OSError as e:
        raise TraceError(f"{name_or_path}: {unreadable(e)}") from None
    label = str(name_or_path)
    # Ended as the csv module ends a row: at an LF, a CRLF or a bare CR (a file of
    # CR-ended rows counted by its LFs was one line, and 1 GiB of it ~45 GB in memory).
    ends = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    n_lines = ends + (not data.endswith((b"\n", b"\r")))
    if n_lines > MAX_TRACE_ROWS + 1:  # the rows and a header
        raise TraceError(
            f"{label}: the trace has {n_lines:,} lines; at most {MAX_TRACE_ROWS:,} are read "
            f"(~260 bytes each in memory while parsed): cut it to the span you replay, e.g. "
            f"with head -n {MAX_TRACE_ROWS + 1}")
    try:
        # utf-8-sig: a byte-order mark (Excel, PowerShell) is dropped, not read as part
        # of the first column's name.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TraceError(_not_utf8(label, data, e.start)) from None
    del data  # up to a gigabyte, its text now held instead
    fmt = fmt or _format_of(source.name, text)
    if model is not None and fmt != "burstgpt":
        raise TraceError(f"{label}: a model filter ({excerpt(model)}) needs a trace with a "
                         f"Model column (BurstGPT's); this one is {fmt}: leave it out")
    fractions = Fractions() if fmt == "mooncake" else None
    parsers: dict[str, Callable[[str, str, Lines], list[TraceRecord]]] = {
        "csv": parse_csv, "azure-csv": parse_azure, "jsonl": parse_jsonl,
        "burstgpt": functools.partial(parse_burstgpt, model=model),
        "mooncake": functools.partial(parse_mooncake, fractions=fractions)}
    parse = parsers[fmt]
    lines: Lines = array("I")
    records = parse(text, label, lines)
    if not records:
        raise TraceError(f"{label}: the trace has no requests")
    del text
    assert len(lines) == len(records), "a parser appends each record's line"
    stray = stray_gap(records, lines, label)
    repeated = repeats(records, lines, label)
    del lines
    records.sort(key=lambda r: r.arrival_time)  # stable: rows at one time keep their order
    t0 = records[0].arrival_time
    # In place, each parsed record freed as its replacement is made: two lists of them
    # were the read's peak.
    for i, r in enumerate(records):
        records[i] = replace(r, arrival_time=r.arrival_time - t0, index=i)
    return Trace(records, stray, fmt, repeated, fractions)


def _format_of(name: str, text: str) -> str:
    """By the suffix, else by the first line (docs/traces.md): a JSONL row is an object,
    a CSV starts with its header. Read as JSONL, a CSV named .txt (or with no suffix)
    was "not valid JSON". Then BurstGPT's CSV by its header, Mooncake's JSONL by its
    first row's keys."""
    suffix = name.lower().rpartition(".")[2] if "." in name else ""
    head = text[:4096]  # not the whole text: a trace may be a gigabyte
    if suffix == "csv" or (suffix not in ("jsonl", "ndjson", "json")
                           and head.lstrip()[:1] != "{"):
        try:
            # Two lines: Excel's "sep=," may come first, and numbered_rows skips it.
            lines = "\n".join(head.split("\n", 2)[:2])
            header = next(numbered_rows(lines, name), (1, None))[1]
        except TraceError:  # said by the CSV parser, with its line
            return "csv"
        return "burstgpt" if is_burstgpt_header(header) else "csv"
    first = text.lstrip().partition("\n")[0]
    try:
        row = json.loads(first)
    except (ValueError, RecursionError):
        return "jsonl"  # whose parser says what is wrong with the line, and where
    return "mooncake" if isinstance(row, dict) and is_mooncake_row(row) else "jsonl"


_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -c"), (b"PK\x03\x04", "zip", "unzip -p"),
               (b"(\xb5/\xfd", "zstd", "zstd -dc"), (b"BZh", "bzip2", "bzip2 -dc"),
               (b"\xfd7zXZ\x00", "xz", "xz -dc"))
"""Magic numbers of the compressions a downloaded trace comes in (the public ones as
.csv.gz or .zip), each with the command that writes its text to stdout: to stdout
because ``gunzip FILE``, ``unxz`` and ``bunzip2`` refuse a file without their suffix
("unknown suffix -- ignored"), and a gzip file saved as .csv has none."""

_COMPRESSED_SUFFIXES = (".gz", ".zip", ".zst", ".zstd", ".bz2", ".xz")


def _unpacked_name(label: str) -> str:
    """Where the unpacking command writes: the file less its compression's suffix, or,
    where it has none or a file of that name is there, beside it as
    ``NAME.unpacked.csv`` (never the file itself, nor another over which it writes)."""
    path = Path(label)
    if path.suffix.lower() in _COMPRESSED_SUFFIXES:
        path = path.with_suffix("")
        if not path.exists():  # one already there is not written over by a pasted command
            return str(path)
    return str(path.with_name(f"{path.stem}.unpacked{path.suffix}"))


def _shell_path(name: str) -> str:
    """``name`` quoted to paste into a shell, never read as an option (``-x.csv.gz``:
    gunzip's ``-x``; unzip takes no ``--``)."""
    return shlex.quote(f"./{name}" if name.startswith("-") else name)


def _not_utf8(label: str, data: bytes, at: int) -> str:
    # Said with its line and the fix: Python's codec text gives an offset in bytes and
    # reads as a crash, and "invalid continuation byte" tells a user nothing to do.
    for magic, kind, command in _COMPRESSED:
        if data.startswith(magic):
            unpack = (f"{command} {_shell_path(label)} > "
                      f"{_shell_path(_unpacked_name(label))}")
            return (f"{label}: {kind}-compressed (its first bytes say so); a trace is "
                    f"UTF-8 text (CSV or JSONL): unpack it ({unpack}) and give the file "
                    "it writes")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return (f"{label}: UTF-16 text (its byte-order mark says so); a trace is UTF-8: "
                "save it as UTF-8 (Excel: CSV UTF-8)")
    line = data.count(b"\n", 0, at) + 1
    return (f"{label}:{line}: not UTF-8 text (byte 0x{data[at]:02x}); a trace is UTF-8 text "
            "(CSV or JSONL): save it as UTF-8, or check that this file is the trace")


def _size(n: int) -> str:
    """``n`` bytes in the binary units the limit is set in (1 GiB), and exactly: a file a
    byte over the limit rounds to the limit itself."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f}".rstrip("0").rstrip(".") + f" {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def window(records: list[TraceRecord], *, start_s: float = 0.0, end_s: float | None = None,
           max_requests: int | None = None) -> list[TraceRecord]:
    """Requests in [start_s, end_s) of trace time, at most ``max_requests``, re-based to 0."""
    if end_s is not None and end_s <= start_s:
        raise TraceError(f"end_s={end_s} must be greater than start_s={start_s}")
    if max_requests is not None and max_requests < 1:
        raise TraceError(f"max_requests={max_requests}: must be at least 1")
    kept = [r for r in records
            if r.arrival_time >= start_s and (end_s is None or r.arrival_time < end_s)]
    kept = kept[:max_requests]
    if not kept:
        # Name the window as the flag reads (no Python "None" for an open end) and the
        # span the trace has, so that the user can see how far off the window is.
        end = "end" if end_s is None else f"{end_s:g}"
        span = ("" if not records else "; the trace's requests arrive at "
                f"{min(r.arrival_time for r in records):g}-"
                f"{max(r.arrival_time for r in records):g} s")
        raise TraceError(f"no requests in the window [{start_s:g}, {end}){span}; widen it")
    return [replace(r, arrival_time=r.arrival_time - start_s) for r in kept]


def mean_rate(records: list[TraceRecord]) -> float:
    """Requests per second between the first and the last arrival."""
    span = records[-1].arrival_time - records[0].arrival_time
    if len(records) < 2 or span <= 0:
        raise TraceError("the rate of a trace needs two requests at different times")
    return (len(records) - 1) / span


def rescale(records: list[TraceRecord], *, time_scale: float | None = None,
            target_rate: float | None = None) -> list[TraceRecord]:
    """Stretch (time_scale > 1) or compress the arrivals; give one of the two, or neither."""
    if time_scale is not None and target_rate is not None:
        raise TraceError("give time_scale or target_rate, not both")
    if target_rate is not None:
        if not (math.isfinite(target_rate) and target_rate > 0):
            raise TraceError(f"target_rate={target_rate}: must be a positive req/s")
        if target_rate > MAX_TARGET_RATE:
            raise TraceError(f"target_rate={target_rate:g}: above {MAX_TARGET_RATE:,.0f} "
                             "req/s, past any deployment (the whole trace in an instant); "
                             "give requests per second, e.g. 5")
        time_scale = mean_rate(records) / target_rate
    if time_scale is None:
        return list(records)
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise TraceError(f"time_scale={time_scale}: must be a positive factor (0.5 = 2x rate)")
    # Past MAX_SECONDS the span is no run anyone waits for, and past a float it is inf.
    span = max(r.arrival_time for r in records) * time_scale
    if not span <= MAX_SECONDS:
        given = f"time_scale={time_scale:g}" if target_rate is None else \
            f"target_rate={target_rate:g} (time_scale={time_scale:g})"
        raise TraceError(f"{given}: stretches the trace to {span:.3g} s, past {MAX_SECONDS:g} "
                         "s; give a smaller factor (0.5 = 2x rate)")
    return [replace(r, arrival_time=r.arrival_time * time_scale) for r in records]


class TraceWorkload:
    """Open-loop replay of trace records (arrivals and lengths as recorded)."""

    def __init__(self, records: list[TraceRecord], *, seed: int = 0,
                 vocab_size: int = DEFAULT_VOCAB_SIZE, classes: ClassMix | None = None,
                 duration_s: float | None = None) -> None:
        if not records:
            raise TraceError("records is empty: a replay needs at least one request")
        if seed < 0:
            raise TraceError(f"seed={seed}: must be >= 0")
        self.records = records
        self.seed = seed
        self.tokens = TokenSampler(vocab_size)
        self.classes = classes or ClassMix.only(Priority.P1)
        self.duration_s = duration_s
        self.pace = SessionPace()
        """The last replay's follow-up turns sent before their previous answer ended."""
        # (session, turn) -> its next turn's arrival, for each turn yielded and not yet
        # answered or refused: what ``pace`` is counted from.
        self._waiting: dict[tuple[int | None, int], float] = {}

    def initial(self) -> Iterator[RequestSpec]:
        # Prompts are drawn only when read (``SyntheticPrompt``): the simulator rejects
        # one no deployment holds by its length alone. So each prompt has its own stream
        # (per request, or per session), and drawing one never shifts another's tokens.
        # A request's draws (its class, its prompt) come from its place in the whole
        # trace (``TraceRecord.index``), not in this replay: a tuner's window, cut from
        # the trace, then replays the very requests the whole replay has there.
        classes = _ClassDraws(self.seed, self.classes)
        # A session's stream is dropped here once its last turn is yielded: the turns
        # not yet drawn hold it (their prompt's draw), and it goes with the last of them.
        # Held to the replay's end, every session's was: ~60 GB for 1M chat rows.
        streams: dict[int, _SessionStream] = {}
        turns = SessionTurns.of(self.records)
        self.pace = SessionPace()
        self._waiting.clear()
        for i, r in enumerate(self.records):
            if self.duration_s is not None and r.arrival_time >= self.duration_s:
                return
            key = i if r.index is None else r.index
            priority = r.priority if r.priority is not None else classes.of(key)
            turn, last = 0, True
            if turns is not None and r.session_id is not None:
                turn = int(turns.turn[i])
                follows = float(turns.next_arrival[i])
                # A next turn past the run's end never arrives: this is its last.
                last = follows == math.inf or (self.duration_s is not None
                                               and follows >= self.duration_s)
                if not last:
                    self._waiting[(r.session_id, turn)] = follows
            if r.prefix_blocks is not None:
                prompt = SyntheticPrompt(r.prompt_tokens, functools.partial(
                    self._blocks, r.prefix_blocks, key))
            elif r.session_id is None:
                prompt = SyntheticPrompt(r.prompt_tokens, functools.partial(
                    self.tokens.sample, child_rng(self.seed, _TOKENS, key)))
            else:
                prompt = SyntheticPrompt(r.prompt_tokens, self._stream(
                    streams, r.session_id, last=last).prefix)
            yield RequestSpec(arrival_time=r.arrival_time, prompt_token_ids=prompt,
                              max_tokens=r.output_tokens, priority=priority,
                              session_id=r.session_id, turn=turn)

    def on_finish(self, spec: RequestSpec, all_token_ids: list[int],
                  now: float) -> list[RequestSpec]:
        follows = self._waiting.pop((spec.session_id, spec.turn), None)
        if follows is not None:
            self.pace.answered(follows, now)
        return []

    def on_rejected(self, spec: RequestSpec, now: float) -> list[RequestSpec]:
        # No answer for the next turn to wait for (the trace sends it all the same).
        self._waiting.pop((spec.session_id, spec.turn), None)
        return []

    def _stream(self, streams: dict[int, _SessionStream], session: int, *,
                last: bool) -> _SessionStream:
        """``session``'s stream, made at its first turn; let go of at its ``last``."""
        stream = streams.pop(session, None) if last else streams.get(session)
        if stream is None:
            stream = _SessionStream(self.tokens,
                                    child_rng(self.seed, _SESSION_TOKENS, session))
            if not last:
                streams[session] = stream
        return stream

    def _blocks(self, blocks: tuple[int, ...], i: int, n: int) -> list[int]:
        """Request ``i``'s ``n`` prompt tokens: each named block's own tokens (drawn from
        its id alone, so every prompt naming it holds the same ones), then the request's
        own past the last block."""
        ids: list[int] = []
        for block in blocks:
            if len(ids) >= n:
                break
            ids += self.tokens.sample(child_rng(self.seed, _BLOCK_TOKENS, block),
                                      MOONCAKE_BLOCK_TOKENS)
        if len(ids) < n:
            ids += self.tokens.sample(child_rng(self.seed, _TOKENS, i), n - len(ids))
        return ids[:n]


class _ClassDraws:
    """The class of the request at each place in the trace: drawn for a block of
    ``_CLASS_BLOCK`` places at once from the block's own stream, so that it depends on
    the place alone, not on where a replay starts."""

    def __init__(self, seed: int, classes: ClassMix) -> None:
        self.seed = seed
        self.classes = classes
        self._block = -1
        self._drawn = np.empty(0, dtype=np.int64)

    def of(self, index: int) -> Priority:
        block, at = divmod(index, _CLASS_BLOCK)
        if block != self._block:  # a replay reads its places in order: one block held
            self._drawn = self.classes.sample_many(child_rng(self.seed, _PRIORITY, block),
                                                   _CLASS_BLOCK)
            self._block = block
        return Priority(int(self._drawn[at]))


class _SessionStream:
    """One session's token stream: every turn's prompt is a prefix of it, so a later
    (longer) turn starts with the earlier turn's prompt. It grows only as far as a drawn
    prompt reads, so a turn the deployment rejects unread costs nothing. Held as an
    array (2 bytes a token for 32,000 ids), not a list of ints (~40), and grown by the
    same draws from ``rng`` in the same order as ever: a generator's draws in pieces
    differ from one draw of their sum, and the tokens are what the prefix cache hits."""

    def __init__(self, sampler: TokenSampler, rng: np.random.Generator) -> None:
        self.sampler = sampler
        self.rng = rng
        self.ids: np.ndarray = sampler.sample_array(rng, 0)

    def prefix(self, n: int) -> list[int]:
        if len(self.ids) < n:
            more = self.sampler.sample_array(self.rng, n - len(self.ids))
            self.ids = np.concatenate((self.ids, more))
        ids: list[int] = self.ids[:n].tolist()
        return ids
