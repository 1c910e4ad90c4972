"""The values of a JSON body counted from its raw bytes as they arrive, before any of it
is parsed: the work ``json.loads`` and pydantic will do is bounded by that count, and a
body past the bound is refused unparsed (``body_items``: by the server's
``request_limits.BodyLimit`` and by the meter).

What costs in parsing a body is the values it makes, not its bytes: 16.5 MB of one ignored
field ``[1, 1, ...]`` (5.5 million items) took ``json.loads`` 0.6-1.8 s and pydantic's
validation 1.2-3.4 s, all holding the GIL (on a worker thread too: both are single C and
Rust calls), while the same bytes as one prompt string parse in milliseconds. So the
count is of items: each comma, ``[`` and ``{`` outside strings (an array item or object
member after the first, a container's first), an upper bound on the items and members a
parse makes, within one per container.

Counted a chunk at a time at C speed: each chunk's complete strings cut out by one
compiled pattern, the structural bytes of the rest counted by ``bytes.count``; a string
a chunk cuts is carried to the next (``in_string``, and whether the chunk ended inside
an escape). ``json.loads``' own checks come later, on what passes: a body that is no JSON
is counted as well as it can be and then refused by the parser.

It also notes whether the body may hold a lone surrogate at all (an ``\\ud800``-
``\\udfff`` escape or such bytes, which Python's JSON reader passes through, or a text
that is not UTF-8): where it cannot, the per-string UTF-8 check
(``protocol._utf8_only``, a Python walk of every value: 3.4 s of the body above) has
nothing to find.
"""

from __future__ import annotations

import re
from contextvars import ContextVar

_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
# A surrogate's escape (any case; \ud800-\udfff) or its UTF-8-like bytes (ED A0-BF),
# found by plain substring search: a first pass by literal is far cheaper than a pattern
# with alternatives at every byte (0.44 s for 22 MB). And a NUL: Python's JSON reader
# takes UTF-16 and UTF-32 too (their ASCII has NULs, which UTF-8 JSON never holds), and
# reads their surrogate code units as they are.
_SURROGATE_MARKS = (b"\\ud", b"\\uD", b"\xed", b"\x00")
_MARK_SPAN = 5  # a mark a chunk's end cuts: its bytes on both sides, checked together


class JsonItems:
    """The running count of one body's items outside strings (``items``), fed its bytes
    in order by ``feed``."""

    def __init__(self) -> None:
        self.items = 0
        self.in_string = False
        self.escaped = False
        """The last chunk ended on a backslash inside a string: the next byte is escaped."""
        self.may_hold_surrogate = False
        self.complete = False
        """Every byte of the body was fed (its last ASGI message read)."""
        self._tail = b""

    def feed(self, chunk: bytes) -> int:
        """Count ``chunk``'s items; the running total."""
        if not chunk:
            return self.items
        self._note_surrogates(chunk)
        pos = 0
        if self.in_string:
            pos = self._string_end(chunk)
            if self.in_string:
                return self.items
        # Outside a string at ``pos``: complete strings cut out, and a quote left after
        # that opens a string the chunk's end cuts (any quote inside it is escaped, and
        # the pattern, from it, reads the same escapes to the same end).
        rest = _STRING.sub(b"", chunk[pos:]) if pos else _STRING.sub(b"", chunk)
        quote = rest.find(b'"')
        head = rest if quote < 0 else rest[:quote]
        self.items += head.count(b",") + head.count(b"[") + head.count(b"{")
        if quote >= 0:
            self.in_string = True
            tail = rest[quote + 1:]
            self.escaped = (len(tail) - len(tail.rstrip(b"\\"))) % 2 == 1
        return self.items

    def _string_end(self, chunk: bytes) -> int:
        """Past the string the last chunk left open: where it ends in ``chunk``, or the
        chunk's end (still in it)."""
        pos = 1 if self.escaped else 0
        self.escaped = False
        while True:
            quote = chunk.find(b'"', pos)
            if quote < 0:
                # An odd run of backslashes at the end (from ``pos``: a byte before it
                # was escaped already): the last escapes the next chunk's first byte.
                run = len(chunk) - max(pos, len(chunk.rstrip(b"\\")))
                self.escaped = run % 2 == 1
                return len(chunk)
            back = quote
            while back > pos and chunk[back - 1] == 0x5C:
                back -= 1
            if (quote - back) % 2 == 0:
                self.in_string = False
                return quote + 1
            pos = quote + 1

    def _note_surrogates(self, chunk: bytes) -> None:
        if self.may_hold_surrogate:
            return
        seam = self._tail + chunk[:_MARK_SPAN]
        self.may_hold_surrogate = any(m in chunk or m in seam for m in _SURROGATE_MARKS)
        # The last bytes of all fed so far, not of this chunk alone: a chunk of one byte
        # (``u`` between ``\\`` and ``d800``) left a seam that held no mark.
        self._tail = (self._tail + chunk)[-_MARK_SPAN:]


BODY_SCAN: ContextVar[JsonItems | None] = ContextVar("slopilot_body_scan", default=None)
"""The scan of the body the request under way is reading (``request_limits.BodyLimit``
sets it for the app it wraps, in the request's task, where FastAPI parses and validates
the body), for the validator to know what the bytes said."""


def surrogate_free() -> bool:
    """Whether the body being validated was scanned whole and none of its bytes can make
    a lone surrogate: then no string of it needs the UTF-8 check."""
    scan = BODY_SCAN.get()
    return scan is not None and scan.complete and not scan.may_hold_surrogate
