"""The token counts the meter asks vLLM for, and takes out of what its client gets.

vLLM merges the outputs its API server had not written yet into one chunk, so a busy
server's chunks bring several tokens, and says how many only where asked: with
``stream_options: {"include_usage": true, "continuous_usage_stats": true}`` each chunk's
``usage.completion_tokens`` counts its choice's tokens so far (a chat ``echo``'s chunk
0). Without them a chunk's tokens are unknown: its gap is one gap a chunk all the same
(``ClientGaps``, as a client times it), but the tokens a verdict counts (the goodput's)
would be the chunks', and a chat ``echo``'s chunk, which brings none, would read as the
first token (``stream_judge``). vLLM's own ``vllm:inter_token_latency_seconds`` observes
a gap per engine output of a request (one an iteration), however its API server merged
them: where that server falls behind, the meter's gaps are fewer and longer, as its
clients see them.

So the meter asks for continuous usage on every chat and completions stream it judges
(``ask``), and takes out of the answer what the client did not ask for
(``UsageStrip``): each chunk's usage, and the last chunk of usage alone where the client
asked for none. The client gets the bytes vLLM would have written for its own request.
An event past ``MAX_EVENT_BYTES`` (a completions echo with logprobs of a long prompt) is
not held: passed on as it comes but for a window of a few KiB (``REACH``), its usage
taken out where it passes (``_LongCut``). One event is passed on as it came, usage and all: one
whose usage is not vLLM's form (an upstream's with a string in it, or nested deeper).
The Responses API has no such option: its deltas are counted as their logprobs say, else
one a delta (``responses_events``).

vLLM reads ``stream_options`` as its ``StreamOptions``: once given, ``include_usage``
is true unless it says otherwise, and continuous stats need it.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

import pydantic

from slopilot.engine.meter.long_event import REACH
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES


class Asked(enum.Enum):
    """The usage a client asked for on its stream."""

    NONE = "none"
    FINAL = "final"
    """The last chunk's usage (``include_usage``) only."""
    CONTINUOUS = "continuous"
    """Every chunk's too: what the meter asks for; nothing to take out."""


def asked(body: dict[str, Any]) -> Asked | None:
    """What ``body``'s ``stream_options`` ask for, as vLLM reads them; None where vLLM
    would refuse them (400: nothing to change or judge)."""
    options = body.get("stream_options")
    if options is None:
        return Asked.NONE
    if not isinstance(options, dict):
        return None
    include = _lax_bool(options.get("include_usage", True))
    continuous = _lax_bool(options.get("continuous_usage_stats", False))
    if include is None or continuous is None:
        return None
    if not include:
        return Asked.NONE
    return Asked.CONTINUOUS if continuous else Asked.FINAL


def ask(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` asking vLLM for every chunk's usage, the client's other options kept."""
    options = body.get("stream_options")
    return {**body, "stream_options": {**(options if isinstance(options, dict) else {}),
                                       "include_usage": True,
                                       "continuous_usage_stats": True}}


class UsageStrip:
    """An answer's bytes as the client would have had them without the meter's ask: each
    event passed on whole once it ended (a client's SSE parser acts on nothing before),
    byte for byte but for the usage taken out.

    ``asked``: what the client asked for (not ``CONTINUOUS``: nothing would change).
    ``null_usage``: vLLM writes a completions chunk's every field, so without continuous
    stats its usage is ``null``; a chat chunk's usage is left out."""

    def __init__(self, asked: Asked, *, null_usage: bool) -> None:
        self.keep_final = asked is Asked.FINAL
        self.null_usage = null_usage
        self._held = b""
        """The bytes of the event not ended yet."""
        self._line = 0
        """Where in ``_held`` the line under way starts."""
        self._scanned = 0
        """How much of ``_held`` was read for line ends."""
        self._after_cr = False
        """The last event ended on a CR: an LF starting the next piece is part of it."""
        self._dropped = False
        """The last event was taken out whole (its LF with it)."""
        self._long: _LongCut | None = None
        """Inside an event past ``MAX_EVENT_BYTES``: passed on as it comes, not held."""
        self._line_open = False
        """(``_long``) The bytes since the last line end are not an empty line's."""

    def feed(self, data: bytes) -> bytes:
        """What to pass on of ``data``: the events it ends, the held bytes before them."""
        out = []
        if self._long is not None:
            passed, data = self._pass_long(self._long, data)
            out.append(passed)
        if self._after_cr and not self._held and data.startswith(b"\n"):
            if not self._dropped:
                out.append(b"\n")
            data = data[1:]
        buf = self._held + data
        start, line, scanned = 0, self._line, len(buf)
        # From where the last piece's read stopped: read again, each piece of an event
        # made the next slower (1,400 reads of 1 KiB for a 1.4 MiB event: 3 s).
        for end in _LINE_END.finditer(buf, self._scanned):
            if end.start() == line:  # an empty line: the event before it ended
                event = buf[start:end.end()]
                passed = self._event(event) if line > start else event
                out.append(passed)
                self._dropped = not passed
                start = end.end()
            elif end.end() == len(buf) and buf.endswith(b"\r"):
                scanned = end.start()  # the CR of a CRLF, maybe: read with its LF
                break
            line = end.end()
        self._held = buf[start:]
        self._line, self._scanned = line - start, scanned - start
        self._after_cr = not self._held and buf.endswith(b"\r")
        if len(self._held) > MAX_EVENT_BYTES:
            # Not held: a completions echo with logprobs puts a long prompt's in one
            # chunk, MBs. Only this event: once it ends the strip goes on, or the client
            # that asked for no usage would get the last chunk of usage alone, whose
            # empty ``choices`` breaks the usual ``chunk.choices[0]``.
            held, self._held, self._line, self._scanned = self._held, b"", 0, 0
            self._long, self._line_open, self._after_cr = _LongCut(self), False, False
            out.append(self.feed(held))
        return b"".join(out)

    def _pass_long(self, cut: _LongCut, data: bytes) -> tuple[bytes, bytes]:
        """``data`` split after the end of the long event: what of it is passed on, and
        the rest (empty while the event goes on)."""
        pos = 1 if self._after_cr and data.startswith(b"\n") else 0  # the CR's LF
        for end in _LINE_END.finditer(data, pos):
            if end.start() == pos and not self._line_open:  # an empty line: its end
                self._long, self._dropped = None, False
                self._after_cr = end.end() == len(data) and data.endswith(b"\r")
                return cut.feed(data[:end.end()], end=True), data[end.end():]
            pos, self._line_open = end.end(), False
        self._line_open = self._line_open or pos < len(data)
        self._after_cr = data.endswith(b"\r")
        return cut.feed(data, end=False), b""

    def flush(self) -> bytes:
        """The bytes of an event the stream never ended, as they came."""
        held, self._held, self._line, self._scanned = self._held, b"", 0, 0
        if self._long is not None:
            held, self._long = self._long.flush() + held, None
        return held

    def _event(self, raw: bytes) -> bytes:
        usage = _USAGE.search(raw)
        if usage is None:
            return raw
        return self.cut(raw, usage, whole=True)

    def cut(self, raw: bytes, usage: re.Match[bytes], *, whole: bool) -> bytes:
        """``raw`` without the ``usage`` found in it, as the client's request has it;
        ``whole``: ``raw`` is an event, and may go whole (the last chunk, of the usage
        alone), else the part of one that holds the usage."""
        value = usage.group("value")
        if not _whole(value):
            return raw
        null = value == b"null"
        if whole and _NO_CHOICES.search(raw) and not null:  # the usage alone
            return raw if self.keep_final else b""
        if self.null_usage:
            start, end = usage.span("value")
            return raw if null else raw[:start] + b"null" + raw[end:]
        # A chat chunk's: vLLM (and the built-in engine's server) writes none. A null
        # one is a server's that writes it on every chunk once the usage is asked for
        # (OpenAI's): kept where it was.
        if null and self.keep_final:
            return raw
        if comma := _COMMA_BEFORE.search(raw, max(0, usage.start() - _MARGIN), usage.start()):
            return raw[:comma.start()] + raw[usage.end():]
        if after := _COMMA_AFTER.match(raw, usage.end()):
            return raw[:usage.start()] + raw[after.end():]
        return raw  # the chunk's only field: nothing a client could read without it


class _LongCut:
    """The usage taken out of an event past ``MAX_EVENT_BYTES`` as its bytes pass: each
    piece passed on at once but for the last ``REACH`` bytes, the window a usage is found
    whole in (with the ``_MARGIN`` before it, where its comma is), so the event is never
    held. Its first usage is its chunk's: once it is out, or the chunk is the usage's
    alone (``choices`` empty: never so long from vLLM), the rest passes as it comes."""

    def __init__(self, strip: UsageStrip) -> None:
        self.strip = strip
        self._held = b""
        self._from = 0
        """Where in ``_held`` the usage is looked for (the bytes before: searched)."""
        self._done = False

    def feed(self, data: bytes, *, end: bool) -> bytes:
        """What to pass on of the event's next ``data`` (``end``: its last)."""
        if self._done:
            return data
        window = self._held + data
        if not end and len(window) - self._from < 2 * REACH:
            self._held = window  # many small reads cost one search
            return b""
        limit = len(window) if end else len(window) - REACH
        found = _LONG_FIND.search(window, self._from)
        if found is not None and found.start() < limit:
            self._done, self._held = True, b""
            if found.group("value") is None:  # choices empty: the usage's own chunk
                return window
            return self.strip.cut(window, found, whole=False)
        if end:
            self._held = b""
            return window
        keep = max(0, limit - _MARGIN)
        self._held, self._from = window[keep:], limit - keep
        return window[:keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _whole(value: bytes) -> bool:
    """Whether the pattern's usage is the whole value. It reads vLLM's (counts, without a
    string); an upstream's with a brace in a string (``"}"``) stopped inside it, and cut
    there the chunk was JSON no client could read. Read from the same start, a match that
    is itself JSON ended where the value does."""
    try:
        json.loads(value)
    except (ValueError, RecursionError):
        return False
    return True


# A JSON string escapes each quote inside it, so ``"usage":`` is a key wherever it is
# found; vLLM's chunks have no other key of that name than the top level's. Its value is
# counts, one object deep at most (``prompt_tokens_details``), without a string, or null.
_USAGE_VALUE = rb"\{[^{}]{0,512}(?:\{[^{}]{0,256}\}[^{}]{0,256}){0,2}\}|null"
_USAGE = re.compile(rb'"usage"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}(?P<value>' + _USAGE_VALUE +
                    rb")")
_COMMA_BEFORE = re.compile(rb",\s*\Z")
_COMMA_AFTER = re.compile(rb"\s*,")
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_LONG_FIND = re.compile(rb'"choices"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}\[[ \t\r\n]{0,64}\]|' +
                        _USAGE.pattern)
_MARGIN = 128
"""The bytes before a usage its comma may be in (vLLM's: the one right before)."""
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOOL: pydantic.TypeAdapter[bool] = pydantic.TypeAdapter(bool)


def _lax_bool(value: Any) -> bool | None:
    """``value`` as vLLM's request model reads a flag (null: false); None where it refuses
    it."""
    if value is None:
        return False
    try:
        return _BOOL.validate_python(value)
    except pydantic.ValidationError:
        return None
