"""An SSE event past ``MAX_EVENT_BYTES``, read as it passes, with its memory bounded.

vLLM writes such an event for any client that asks: a completions ``echo`` with
``logprobs`` puts a long prompt's text and logprobs in its first chunk (MBs), and a
Responses stream's ``response.completed`` the whole answer, with its logprobs where the
request ``include``s them. Parsed whole, one that never ends would grow the meter without
bound; left unread, as the meter did, any client could take its own streams out of the
verdicts and the client-side histograms by asking for one.

So its bytes are read as they come and none kept but a window (``REACH``): its ``event:``
name (the first ``NAME_BYTES``), and the values of the keys the judge reads in its data
(``KeyScan``). Found in the bytes, ``"usage":`` is a key of the event's JSON: a string
escapes each quote in it, so a client's text (an echoed prompt, a token) writes none.
Where vLLM writes a client's text as a key (a completion's ``top_logprobs``: token ->
logprob) its value is a number, and a key is read only with the kind of value vLLM writes
for it there (the usage an object, a finish reason a string). The event is then the chunk
those values make (``choices_chunk``, ``responses_event``), seen when it ended, as a
client's parser sees it.

What the window cannot hold is not counted: a chunk's ``token_ids`` and ``logprobs``
entries. Its tokens are its continuous usage's growth (the meter asks vLLM for it on
every chat and completions stream, ``usage_stats``), else one. One is the conservative
count: a chunk's wait is its first token's gap and the others it brings came with it,
gap 0 (``ClientGaps``), so counting fewer drops only zero gaps. Every slow wait its client
saw is still observed, and the share of slow gaps reads no lower; the verdict's tokens are
the stream's final usage where vLLM writes it.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

REACH = 4096
"""The bytes a key and its value may take (vLLM's usage: about 100): each is read once
whole in a window of the event's data, which keeps less than twice this between reads."""
NAME_BYTES = 256
"""The bytes of an ``event:`` name kept (vLLM's longest: 40)."""
USAGE_VALUE = rb"\{[^{}]{0,512}(?:\{[^{}]{0,256}\}[^{}]{0,256}){0,2}\}|null"
"""vLLM's usage: counts, one object deep at most (``prompt_tokens_details``), no string."""


class Wire(enum.StrEnum):
    """How a stream lays out its events."""

    CHOICES = "choices"
    """Chat and completions chunks: ``data:`` events of ``choices``, then ``[DONE]``."""
    RESPONSES = "responses"
    """The Responses API's named events (``responses_events``)."""


_WS = rb"[ \t\r\n]{0,64}"
_STRING = re.compile(rb'"((?:[^"\\\x00-\x1f]|\\.){0,256})"|(null)')
_NONEMPTY = re.compile(rb'"[^"]')
_OBJECT = re.compile(rb"\{")
_INT = re.compile(rb"(\d{1,18})(?![\d.eE])")
_CHOICES = re.compile(rb"\[" + _WS + rb'(?:(\])|\{' + _WS + rb'"index"' + _WS + rb":" + _WS +
                      rb"(\d{1,9})(?![\d.eE]))")
_TOOL_CALLS = re.compile(rb"\[" + _WS + rb"\{")
_USAGE = re.compile(USAGE_VALUE)
_EMPTY = "empty"
"""``choices``' value: none (the usage's chunk)."""

_LAST: dict[Wire, frozenset[str]] = {
    Wire.CHOICES: frozenset(),
    Wire.RESPONSES: frozenset({"type", "status", "reason", "output_tokens"})}
"""The keys whose last value is read (the others: their first)."""
_VALUES: dict[Wire, dict[str, re.Pattern[bytes]]] = {
    Wire.CHOICES: {
        "model": _STRING, "choices": _CHOICES, "error": _OBJECT, "finish_reason": _STRING,
        "usage": _USAGE, "text": _NONEMPTY, "content": _NONEMPTY,
        "reasoning_content": _NONEMPTY, "reasoning": _NONEMPTY, "tool_calls": _TOOL_CALLS,
        "function_call": _OBJECT},
    Wire.RESPONSES: {
        "type": _STRING, "delta": _NONEMPTY, "status": _STRING, "reason": _STRING,
        "output_tokens": _INT},
}
"""The keys read in an event of each wire, each with the value vLLM writes for it."""
OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")
"""The delta fields vLLM streams generated tokens in (``reasoning``: its newer spelling of
``reasoning_content``; ``function_call``: the deprecated form of ``tool_calls``)."""
_OUTPUT = ("text", *OUTPUT_FIELDS)
"""A chunk's keys of generated output (``stream_judge._output``): the completion's text,
a chat delta's fields (a chat ``logprobs``' ``content`` is a list, no output)."""


class KeyScan:
    """The values of ``wire``'s keys in a JSON text fed in pieces: each key's first (and
    its last, where it is read: ``_LAST``), read in a window of at most about
    ``3 * REACH`` bytes."""

    def __init__(self, wire: Wire) -> None:
        self._values, self._last = _VALUES[wire], _LAST[wire]
        self._keys = re.compile(b'"(' + b"|".join(k.encode() for k in self._values) +
                                b')"' + _WS + b":" + _WS)
        self.first: dict[str, Any] = {}
        self.last: dict[str, Any] = {}
        self.unread: set[str] = set()
        """The keys found with a value not of vLLM's kind."""
        self.lead: int | None = None
        """The text's first byte that is not whitespace (None: none yet)."""
        self._window: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> None:
        # Read once a window's worth came, so many small reads cost no more than one.
        self._window.append(data)
        self._size += len(data)
        if self._size >= 2 * REACH:
            self._scan(final=False)

    def end(self) -> None:
        self._scan(final=True)

    def _scan(self, *, final: bool) -> None:
        window = b"".join(self._window)
        if self.lead is None and (text := window.lstrip(b" \t\r\n")):
            self.lead = text[0]
        # A key found before ``limit`` has its whole value in the window; the others are
        # read again with the next bytes.
        limit = len(window) if final else len(window) - REACH
        resume = limit
        done = 0
        for key in self._keys.finditer(window):
            if key.start() >= limit:
                break
            if key.start() < done:
                continue  # inside the value read before (a usage's own keys)
            name = key.group(1).decode()
            if name in self.first and name not in self._last:
                continue  # read already, as far as it is read
            value = self._values[name].match(window, key.end())
            done = value.end() if value else key.end()
            resume = max(resume, done)
            if value is None:
                self.unread.add(name)
                continue
            read = _read(value)
            self.first.setdefault(name, read)
            self.last[name] = read
        rest = window[max(resume, 0):] if not final else b""
        self._window, self._size = [rest], len(rest)


def _read(value: re.Match[bytes]) -> Any:
    """A key's value as the chunk's JSON has it (True for the values only seen)."""
    pattern = value.re
    if pattern is _STRING:
        if value.group(2) is not None:
            return None
        try:
            return json.loads(b'"' + value.group(1) + b'"')
        except ValueError:
            return None
    if pattern is _CHOICES:
        return _EMPTY if value.group(1) is not None else int(value.group(2))
    if pattern is _INT:
        return int(value.group(1))
    if pattern is _USAGE:
        try:
            return json.loads(value.group(0))
        except (ValueError, RecursionError):
            return None
    return True


class _Line(enum.Enum):
    DATA = "data"
    NAME = "event"
    OTHER = "other"


class LongEvent:
    """One SSE event's lines, fed as they come: its name, and the keys of its data."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.scan = KeyScan(wire)
        self.name: bytes | None = None
        """The event's name (its last ``event:`` line's first ``NAME_BYTES``)."""
        self.data_lines = 0
        self._line: _Line | None = None
        """The kind of the line under way (None: not known yet, or no line)."""
        self._head = b""
        """The line's first bytes, until they say its kind."""
        self._open = False
        """A line is under way (an empty line ends the event)."""

    def feed(self, piece: bytes, *, ended: bool) -> bool:
        """``piece`` of the event's current line (``ended``: the line ends after it); True
        where it was an empty line, the event's end."""
        if not piece and not ended:
            return False
        if ended and not self._open and not piece:
            self.scan.end()
            return True
        self._open = True
        if self._line is None:
            head = self._head + piece
            if len(head) < 7 and not ended:  # "event: " says a name, "data: " a datum
                self._head = head
                return False
            self._head = b""
            self._line, piece = _kind(head)
            if self._line is _Line.DATA:
                if self.data_lines:
                    self.scan.feed(b"\n")  # SSE joins an event's data lines so
                self.data_lines += 1
            elif self._line is _Line.NAME:
                self.name = b""
        if self._line is _Line.DATA:
            self.scan.feed(piece)
        elif self._line is _Line.NAME and self.name is not None:
            self.name = (self.name + piece[:NAME_BYTES])[:NAME_BYTES]
        if ended:
            self._line, self._open = None, False
        return False

    def chunk(self) -> dict[str, Any] | None:
        """The event's data read as the chunk of the values of its keys; None where it
        is not a JSON object of the wire's form (unreadable, as a whole event would be)."""
        if self.scan.lead != ord("{"):
            return None
        if self.wire is Wire.RESPONSES:
            return responses_event(self.scan, self.name)
        return choices_chunk(self.scan)


def choices_chunk(scan: KeyScan) -> dict[str, Any] | None:
    """A chat or completions chunk as far as the judge reads it. vLLM writes one choice a
    chunk, its ``index`` first, and the chunk's fields before it are the server's (its
    id, object, created, model): the first of each key is the chunk's own."""
    if "choices" in scan.unread:  # not a list of choices each with its index first
        return None
    first = scan.first
    chunk: dict[str, Any] = {}
    if isinstance(model := first.get("model"), str):
        chunk["model"] = model
    if isinstance(usage := first.get("usage"), dict):
        chunk["usage"] = usage
    if first.get("error"):
        chunk["error"] = {}
    index = first.get("choices")
    if index == _EMPTY:
        chunk["choices"] = []
    elif index is not None:
        choice: dict[str, Any] = {"index": index, "finish_reason": first.get("finish_reason")}
        if any(first.get(key) for key in _OUTPUT):
            choice["text"] = "..."  # some output: how much, the usage says
        chunk["choices"] = [choice]
    return chunk


def responses_event(scan: KeyScan, name: bytes | None) -> dict[str, Any]:
    """A Responses event as far as the judge reads it: its type (its SSE name, vLLM's
    own, else its JSON's last ``type``: after the nested ones in vLLM's and the OpenAI
    API's field order), whether its delta has output, and the response's status, its
    incomplete reason and output tokens, each its last (``usage`` is the response's last
    field but ``user``).

    Not its model: the request's metadata, tools and text format, echoed in the
    response, write keys of the client's; so could they a ``status`` or ``reason``, which
    moves the answer only between finished (judged) and failed (judged where it had
    missed already): neither hides a miss, and the latency it was seen with is observed
    either way."""
    event: dict[str, Any] = {}
    kind = name.decode("utf-8", "replace") if name else scan.last.get("type")
    if isinstance(kind, str):
        event["type"] = kind
    if scan.first.get("delta"):
        event["delta"] = "..."
    if scan.first.get("type") == "function_call":  # the item, before the event's type
        event["item"] = {"type": "function_call"}
    response: dict[str, Any] = {}
    if isinstance(status := scan.last.get("status"), str):
        response["status"] = status
    if isinstance(reason := scan.last.get("reason"), str):
        response["incomplete_details"] = {"reason": reason}
    if "output_tokens" in scan.last:
        response["usage"] = {"output_tokens": scan.last["output_tokens"]}
    if response:
        event["response"] = response
    return event


def _kind(head: bytes) -> tuple[_Line, bytes]:
    """A line's kind by its first bytes, and the rest of them: a field's value, after the
    one space SSE allows (``data`` alone is an empty datum)."""
    field, colon, value = head.partition(b":")
    value = value.removeprefix(b" ")
    if field == b"data":
        return _Line.DATA, value
    if field == b"event" and colon:
        return _Line.NAME, value
    return _Line.OTHER, b""
