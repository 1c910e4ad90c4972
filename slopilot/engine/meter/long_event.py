"""An SSE event past ``MAX_EVENT_BYTES``, read as it passes, with its memory bounded.

vLLM writes such an event for any client that asks: a completions ``echo`` with
``logprobs`` puts a long prompt's text and logprobs in its first chunk (MBs), and a
Responses stream's ``response.completed`` the whole answer, with its logprobs where the
request ``include``s them. Parsed whole, one that never ends would grow the meter without
bound; left unread, as the meter did, any client could take its own streams out of the
verdicts and the client-side histograms by asking for one.

So its bytes are read as they come and none kept but its ``event:`` name (the first
``NAME_BYTES``) and, in its data, the values the judge reads, each at the place vLLM
writes it (``PATHS``), read by the JSON's structure as it streams (``json_paths``): a
Responses event's ``type``, ``delta`` and ``item.type``, its response's ``model``,
``status``, ``incomplete_details.reason`` and ``usage.output_tokens``; a chunk's
``model``, ``usage``, ``error`` and each choice's ``index``, ``finish_reason`` and
output. A client's text is no key (JSON escapes each
quote in a string), and the JSON a client has vLLM echo as JSON (a Responses request's
``metadata``, its tools' JSON Schemas, its ``text.format.schema``, any keys and values
in them) is at other places, read by none: found anywhere in the bytes, the last
``status`` was a schema's that vLLM writes after the response's own. The event is then
the chunk those values make (its paths only: ``json_paths.PathScan.value``), seen when it
ended, as a client's parser sees it; one that is not JSON is unreadable, as it is whole.

What is not kept is not counted: a chunk's ``token_ids`` and ``logprobs`` entries. Its
tokens are its continuous usage's growth (the meter asks vLLM for it on every chat and
completions stream, ``usage_stats``), else one. The gaps do not hang on that count: a
chunk that brings tokens is one gap whatever it brings (``ClientGaps``), so every wait its
client saw is observed as it saw it; the count is only the verdict's tokens, and those
are the stream's final usage where vLLM writes it.
"""

from __future__ import annotations

import enum
from typing import Any

from slopilot.engine.meter.json_paths import PathScan, Read

REACH = 4096
"""The bytes of a value the judge reads kept (vLLM's longest: a model's name); the usage
strip's window (``usage_stats``)."""
NAME_BYTES = 256
"""The bytes of an ``event:`` name kept (vLLM's longest: 40)."""
FLAG_BYTES = 64
"""The bytes kept of a value read only for whether it has any (a text, a delta): past
them, a string stands as its first ones (``json_paths.Read``)."""


class Wire(enum.StrEnum):
    """How a stream lays out its events."""

    CHOICES = "choices"
    """Chat and completions chunks: ``data:`` events of ``choices``, then ``[DONE]``."""
    RESPONSES = "responses"
    """The Responses API's named events (``responses_events``)."""


OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")
"""The delta fields vLLM streams generated tokens in (``reasoning``: its newer spelling of
``reasoning_content``; ``function_call``: the deprecated form of ``tool_calls``)."""
_VALUE = Read(limit=REACH)
_FLAG = Read(limit=FLAG_BYTES)
PATHS: dict[Wire, Read] = {
    Wire.CHOICES: Read(keys={
        "model": _VALUE, "usage": Read(keys={"completion_tokens": _VALUE}), "error": _FLAG,
        "choices": Read(items=Read(keys={
            "index": _VALUE, "finish_reason": _VALUE, "text": _FLAG,
            "delta": Read(keys=dict.fromkeys(OUTPUT_FIELDS, _FLAG))}))}),
    Wire.RESPONSES: Read(keys={
        "type": _VALUE, "delta": _FLAG, "item": Read(keys={"type": _VALUE}),
        "response": Read(keys={
            "model": _VALUE, "status": _VALUE,
            "incomplete_details": Read(keys={"reason": _VALUE}),
            "usage": Read(keys={"output_tokens": _VALUE})})}),
}
"""Where in an event of each wire the judge reads (``stream_judge._chunk``,
``responses_events``): the event's top level, its choices' and its response's."""


class _Line(enum.Enum):
    DATA = "data"
    NAME = "event"
    OTHER = "other"


class LongEvent:
    """One SSE event's lines, fed as they come: its name, and the keys of its data."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.scan = PathScan(PATHS[wire])
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
        """The event's data read as the chunk of its values at ``PATHS``; None where it
        is not a JSON object (unreadable, as a whole event would be)."""
        value = self.scan.value()
        return value if isinstance(value, dict) else None


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
