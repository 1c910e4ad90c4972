"""The values at a few paths of a JSON text fed in pieces, read by its structure, in memory
bounded whatever the text's length or depth.

A key is read only where the paths name it: ``{"response": {"status": ...}}``'s status,
not a ``status`` anywhere inside its other values. So text that echoes JSON of someone
else's (a request's JSON Schema inside a response) cannot stand for the values read.

The walk keeps, between pieces: whether it is inside a string (and after a backslash),
the containers open along the paths read (each with its key so far, ``KEY_BYTES`` at
most: a longer key is no key read), and below them only a depth count, with the kinds of
the first ``DEPTH_KEPT`` levels to match each bracket. Of a string it keeps nothing but
a key's bytes and a value read at a path (``Read.limit`` bytes); of the rest, nothing.
Strings, numbers and whole containers off the paths are skipped by compiled patterns
(``_BALANCED``), not byte by byte in Python: time linear in the text, at C speed but for
a few steps a read and a few a key on the paths.

Why not a streaming JSON parser (ijson): each one hands over a string whole, so a string
of MBs (a prompt's text, an answer's) is held whole, unbounded.

Where the text is not JSON the value is None, as for ``json.loads`` failing, in what the
walk checks: brackets matched, keys and values in their places along the paths, the text
ended once its value did, each value read a JSON one. Below the paths it checks only the
brackets and the strings' ends (a bad number there passes).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import Any

KEY_BYTES = 64
"""The bytes of a key kept: longer, it is none of the paths' (none is half as long)."""
DEPTH_KEPT = 64
"""The levels below the paths whose bracket kinds are kept; deeper, only a count."""
ITEMS = 8
"""The items an array on the paths may hold (vLLM writes a chunk's one choice)."""
MEMBERS = 256
"""The keys an object on the paths may hold (vLLM's most: a response's 30 or so): each
is a few steps in Python, which an upstream's object of millions would make seconds."""


@dataclasses.dataclass(frozen=True)
class Read:
    """What is read of a value at a path: its ``keys`` (an object's: each a path on) or
    its ``items`` (each of an array's), else the value itself, its first ``limit`` bytes
    kept (an object or array where the paths go into the other kind, too)."""

    keys: Mapping[str, Read] = dataclasses.field(default_factory=dict)
    items: Read | None = None
    limit: int = 4096
    """Past it a string stands as its first bytes, an object or array as a non-empty
    one (``_stand_in``), a number or literal as no JSON (none is so long)."""


class _Expect(enum.Enum):
    VALUE = enum.auto()
    VALUE_OR_CLOSE = enum.auto()
    KEY = enum.auto()
    KEY_OR_CLOSE = enum.auto()
    COLON = enum.auto()
    COMMA_OR_CLOSE = enum.auto()
    END = enum.auto()


class _In(enum.Enum):
    """Where the walk is between pieces."""

    TOKENS = enum.auto()
    """Between the tokens of the containers on the paths."""
    KEY = enum.auto()
    STRING = enum.auto()
    """A string value."""
    SCALAR = enum.auto()
    """A number or literal."""
    SKIP = enum.auto()
    """Inside a container off the paths (or read whole): counted, not walked."""


@dataclasses.dataclass(slots=True)
class _Open:
    """A container on the paths, open."""

    close: int
    path: Read
    value: dict[str, Any] | list[Any]
    key: str | None = None
    members: int = 0


class _Malformed(ValueError):
    """The text is not JSON (or not of the bounded kind read)."""


_SKIPPED = object()
"""A value off the paths: walked over, not read."""
_WS = re.compile(rb"[ \t\r\n]*+")
_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.S)
"""A string's bytes up to its closing quote (or a last backslash, the text's end)."""
_SCALAR = re.compile(rb'[^ \t\r\n,:\[\]{}"]*+')
_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_RUN = rb'[^"{}\[\]]*+'


def balanced(depth: int) -> bytes:
    """A pattern of a container's content, ``depth`` levels deep, its brackets matched
    by kind (``json_scan.nested`` matches any, ``json.loads`` checking its parts)."""
    # Bytes other than quotes and brackets, whole strings, and containers whose brackets
    # match, ``depth`` levels deep; unrolled (runs, then one of the others and a run),
    # and possessive, so a pattern that fails (a container deeper, or cut by the piece's
    # end) is not retried at each of its bytes.
    other = _STRING
    if depth:
        inner = balanced(depth - 1)
        other = rb"(?:" + _STRING + rb"|\{" + inner + rb"\}|\[" + inner + rb"\])"
    return _RUN + rb"(?:" + other + _RUN + rb")*+"


_BALANCED = re.compile(balanced(5), re.S)
"""A container's content up to its end, or to a bracket deeper than 5 levels or a piece's
end: a log probability's entry (4 levels) skipped whole in one search, not a step in
Python for each of its brackets."""
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN = {ord("{"): ord("}"), ord("["): ord("]")}
_CLOSE = frozenset(_OPEN.values())


class PathScan:
    """The values at ``root``'s paths of one JSON text, fed in pieces (``feed``), read
    once it ended (``end``, ``value``)."""

    def __init__(self, root: Read) -> None:
        self._root = root
        self._open: list[_Open] = []
        self._expect = _Expect.VALUE
        self._in = _In.TOKENS
        self._escape = False
        """The piece ended on a backslash inside a string."""
        self._key = bytearray()
        self._long_key = False
        self._path: Read | None = None
        """The path of the value under way outside the tokens (None: off the paths)."""
        self._kept: bytearray | None = None
        """The value's bytes so far, where it is read whole (None: not read)."""
        self._over = False
        """The value ran past its ``limit``: only its first bytes kept."""
        self._from = 0
        """Where in the piece the value's bytes not kept yet start."""
        self._depth = 0
        """(``SKIP``) The containers open below the paths."""
        self._kinds = bytearray()
        """Their closing brackets, the first ``DEPTH_KEPT``."""
        self._in_string = False
        """(``SKIP``) Inside a string of the skipped container."""
        self._top: Any = _SKIPPED
        self.broken = False
        """The text is not JSON (or not of the kind read): ``value`` is None."""

    def feed(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self._walk(data)
        except _Malformed:
            self.broken = True
            self._open, self._kept, self._key = [], None, bytearray()

    def end(self) -> None:
        """The text ended: where its value did not, it is no JSON."""
        if self._in is not _In.TOKENS or self._expect is not _Expect.END:
            self.broken = True

    def value(self) -> Any:
        """The text's value, of its paths only (an object: those of its keys the paths
        name, each read so), as ``json.loads`` has it; None where it is none (not JSON,
        not ended)."""
        if self.broken or self._expect is not _Expect.END:
            return None
        return self._top

    def _walk(self, data: bytes) -> None:
        pos, n = 0, len(data)
        self._from = 0
        while pos < n:
            if self._in is _In.TOKENS:
                pos = self._token(data, pos)
            elif self._in is _In.SKIP:
                pos = self._skip(data, pos)
            elif self._in is _In.SCALAR:
                end = _end(_SCALAR, data, pos)
                if end == n:
                    pos = n
                else:
                    self._done(self._read(data, end))
                    pos = end
            else:
                end, closed = self._string(data, pos)
                if self._in is _In.KEY:
                    if not self._long_key:
                        self._key += data[pos:min(end, pos + KEY_BYTES + 1)]
                        self._long_key = len(self._key) > KEY_BYTES
                    if closed:
                        self._key_done()
                elif closed:
                    self._done(self._read(data, end + 1))
                pos = end + 1 if closed else n
        if self._kept is not None:
            self._keep(data, n)

    def _token(self, data: bytes, pos: int) -> int:
        pos = _end(_WS, data, pos)
        if pos == len(data):
            return pos
        byte, expect = data[pos], self._expect
        if expect is _Expect.VALUE or expect is _Expect.VALUE_OR_CLOSE:
            if byte == 0x5D and expect is _Expect.VALUE_OR_CLOSE:  # ]
                return self._close(pos)
            return self._value(data, pos)
        if expect is _Expect.KEY or expect is _Expect.KEY_OR_CLOSE:
            if byte == _QUOTE:
                self._in, self._key, self._long_key = _In.KEY, bytearray(), False
                self._open[-1].members += 1
                if self._open[-1].members > MEMBERS:
                    raise _Malformed(f"more than {MEMBERS} keys")
                return pos + 1
            if byte == 0x7D and expect is _Expect.KEY_OR_CLOSE:  # }
                return self._close(pos)
        elif expect is _Expect.COLON:
            if byte == 0x3A:  # :
                self._expect = _Expect.VALUE
                return pos + 1
        elif expect is _Expect.COMMA_OR_CLOSE:
            top = self._open[-1]
            if byte == 0x2C:  # ,
                self._expect = _Expect.KEY if top.close == 0x7D else _Expect.VALUE
                return pos + 1
            if byte == top.close:
                return self._close(pos)
        raise _Malformed(f"{chr(byte)!r} where {expect.name} was due")

    def _value(self, data: bytes, pos: int) -> int:
        """A value starts at ``pos``: walked where the paths go into it, read where they
        end at it, else skipped."""
        byte = data[pos]
        path = self._root if not self._open else self._child(self._open[-1])
        if path is not None and byte in _OPEN and (
                path.keys if byte == 0x7B else path.items is not None):
            close = _OPEN[byte]
            self._open.append(_Open(close, path, {} if close == 0x7D else []))
            self._expect = _Expect.KEY_OR_CLOSE if close == 0x7D else _Expect.VALUE_OR_CLOSE
            return pos + 1
        if byte in _CLOSE or byte in b":,":
            raise _Malformed(f"{chr(byte)!r} where a value was due")
        self._path, self._over = path, False
        self._kept = bytearray() if path is not None else None
        self._from = pos
        if byte == _QUOTE:
            self._in = _In.STRING
        elif byte in _OPEN:
            self._in, self._depth, self._kinds = _In.SKIP, 1, bytearray((_OPEN[byte],))
            self._in_string = False
        else:
            self._in = _In.SCALAR
            return pos
        return pos + 1

    def _child(self, container: _Open) -> Read | None:
        if container.close == 0x5D:
            return container.path.items
        return None if container.key is None else container.path.keys.get(container.key)

    def _skip(self, data: bytes, pos: int) -> int:
        """Inside a container off the paths: to its end, or the piece's."""
        n = len(data)
        while pos < n:
            if self._in_string:
                end, closed = self._string(data, pos)
                self._in_string = not closed
                pos = end + 1 if closed else n
                continue
            pos = _end(_BALANCED, data, pos)
            if pos == n:
                break
            byte = data[pos]
            pos += 1
            if byte == _QUOTE:  # a string the piece cut
                self._in_string = True
            elif byte in _OPEN:
                self._depth += 1
                if len(self._kinds) < DEPTH_KEPT:
                    self._kinds.append(_OPEN[byte])
            else:
                if self._depth == len(self._kinds) and self._kinds.pop() != byte:
                    raise _Malformed(f"{chr(byte)!r} closes no container")
                self._depth -= 1
                if not self._depth:
                    self._done(self._read(data, pos))
                    return pos
        return n

    def _string(self, data: bytes, pos: int) -> tuple[int, bool]:
        """The end of the string's bytes in the piece from ``pos``, and whether its
        closing quote is there (at that end)."""
        n = len(data)
        if self._escape:  # the piece before ended on it: this one's first byte is escaped
            self._escape, pos = False, pos + 1
        end = _end(_BODY, data, pos)
        if end < n and data[end] == _BACKSLASH:  # the piece's last byte
            self._escape = True
            return n, False
        return end, end < n

    def _key_done(self) -> None:
        self._in, self._expect = _In.TOKENS, _Expect.COLON
        key = None
        if not self._long_key:
            try:
                key = json.loads(b'"' + bytes(self._key) + b'"')
            except ValueError as e:
                raise _Malformed("a key that is no JSON string") from e
        self._open[-1].key = key

    def _keep(self, data: bytes, end: int) -> None:
        kept, path = self._kept, self._path
        if kept is None or path is None or self._over:
            return
        room = path.limit - len(kept)
        if end - self._from > room:
            kept += data[self._from:self._from + room]
            self._over = True
        else:
            kept += data[self._from:end]
        self._from = end

    def _read(self, data: bytes, end: int) -> Any:
        """The value that ended at ``end`` of the piece, as read (``_SKIPPED``: off the
        paths)."""
        self._in = _In.TOKENS
        if self._kept is None:
            return _SKIPPED
        self._keep(data, end)
        raw, self._kept = bytes(self._kept), None
        if self._over:
            return _stand_in(raw)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _Malformed("a value that is no JSON") from e

    def _close(self, pos: int) -> int:
        done = self._open.pop()
        self._done(done.value)
        return pos + 1

    def _done(self, value: Any) -> None:
        """A value ended: its container's next is a comma or its end."""
        if not self._open:
            self._top, self._expect = value, _Expect.END
            return
        container = self._open[-1]
        self._expect = _Expect.COMMA_OR_CLOSE
        if value is _SKIPPED:
            return
        if isinstance(container.value, dict):
            if container.key is not None:
                container.value[container.key] = value  # the last, as json.loads
        elif len(container.value) < ITEMS:
            container.value.append(value)
        else:
            raise _Malformed(f"more than {ITEMS} items")


def _end(pattern: re.Pattern[bytes], data: bytes, pos: int) -> int:
    """Where ``pattern`` (one that matches the empty text) ends from ``pos``."""
    found = pattern.match(data, pos)
    return pos if found is None else found.end()


def _stand_in(raw: bytes) -> Any:
    """A value past its path's limit, by its first ``raw`` bytes: a string as the ones
    of them that decode (a partial escape or character cut off), an object or array as
    one not empty; a number or literal so long is none vLLM writes."""
    if raw[:1] == b'"':
        for cut in range(8):
            try:
                return json.loads(raw[:len(raw) - cut] + b'"')
            except ValueError:
                continue
        return "..."
    if raw[:1] == b"{":
        return {"...": None}
    if raw[:1] == b"[":
        return [None]
    raise _Malformed("a number or literal past its limit")
