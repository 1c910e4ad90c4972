"""The few top-level fields of a request's JSON body that the meter reads
(``request_plan``), found in steps of bounded size, nothing else of the body kept.

A body is its client's, up to ``--max-body-mb``. Parsed whole (``json.loads``), its
values cost far more than its bytes: 8 MiB of one-token prompts (``[[1],[1],...]``) made
about 300 MB of lists and ints, past the meter's 256 MiB limit, and held the event loop
(the GIL, on a thread too) for 1.3 s. The meter needs a few top-level fields (``stream``,
``n``, ``stream_options``, the token limits) and how many prompts a completions batch
holds. Those are read here by walking the body's bytes: each value read is parsed by
``json.loads`` (``VALUE_BYTES`` at most: a longer one stands as ``TOO_LONG``, which no
field's reader takes), every other value skipped by its quotes and brackets, a batch's
prompts counted, none of them made.

The walk takes ``STEP_BYTES`` of the body at most at a time, and ``TOKENS`` tokens one
by one in Python, and yields between two (``scan``: a generator whose caller, on the
event loop, lets it run). Strings, and containers up to 5 levels deep, are skipped by
compiled patterns at C speed (``json_paths.balanced``); a run of a batch's prompts, each
a string or a flat list of token ids, is counted by one.

What it checks of the JSON: the top-level object's keys, colons, commas and end, the
values read (``json.loads``), everywhere the strings' ends and the brackets' kinds, and
the depth (``DEPTH``: ``json.loads`` refuses a text nested so deep). Not the numbers and
literals it skips, nor the characters inside strings: a body that passes and is no JSON
is one vLLM answers 400, counted as invalid as any such (``proxy.is_invalid``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Generator, Iterator
from typing import Any

from slopilot.engine.meter.json_paths import balanced

STEP_BYTES = 64 << 10
"""The most bytes of the body walked in one step (the judge's steps are as long:
``stream_judge.STEP_BYTES``)."""
TOKENS = 1024
"""The most tokens taken one by one in Python in a step (a key, a bracket past the
patterns' depth, an item of a batch that is no run): a few hundred microseconds."""
VALUE_BYTES = 4096
"""The most bytes of a value read: vLLM's fields the meter reads are a number, a flag or
a small object (``stream_options``)."""
KEY_BYTES = 64
"""A longer key is none the meter reads."""
DEPTH = 1000
"""The containers open one in another past which the body is no JSON: ``json.loads``
refuses one nested so deep (the interpreter's recursion limit, 1,000 by default, less
the frames under way), and vLLM answers it 400. Counted where walked one by one: up to 5
more levels skipped whole by a pattern are not."""


class _TooLong:
    def __repr__(self) -> str:
        return "TOO_LONG"


TOO_LONG: Any = _TooLong()
"""A value read past ``VALUE_BYTES``: none of vLLM's types takes it (``_lax`` reads it
as refused)."""


@dataclasses.dataclass
class Fields:
    """What the meter reads of a body that is a JSON object."""

    values: dict[str, Any]
    """Each key read that the object has, its value as ``json.loads`` has it (the last,
    where it is written twice), ``TOO_LONG`` past ``VALUE_BYTES``."""
    spans: dict[str, tuple[int, int]]
    """Where each key read is written (its last member): from its key's opening quote
    to its value's end."""
    counted: int | None = None
    """The items of the counted key's value where it is a list of strings and lists
    (vLLM's batch of prompts: texts or token lists); None where it is no such list."""
    end: int = 0
    """Where the object's closing brace is."""


class _NotJSON(ValueError):
    pass


def scan(body: bytes | bytearray, keys: frozenset[str], count: str | None = None, *,
         step: int = STEP_BYTES) -> Generator[None, None, Fields | None]:
    """The ``keys`` of ``body``'s top-level object, and the items of ``count``'s list,
    in steps of at most ``step`` bytes (a ``yield`` between two); None where the body is
    no JSON object."""
    walk = _Walk(body, step)
    try:
        return (yield from walk.fields(keys, count))
    except _NotJSON:
        return None


def read(body: bytes | bytearray, keys: frozenset[str],
         count: str | None = None) -> Fields | None:
    """``scan``, in one go."""
    steps = scan(body, keys, count)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


_WS = re.compile(rb"[ \t\r\n]*+")
_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.S)
"""A string's bytes up to its closing quote (or a last backslash, the step's end)."""
_SCALAR = re.compile(rb'[^ \t\r\n,:\[\]{}"]*+')
_BALANCED = re.compile(balanced(5), re.S)
"""A container's content up to its end, or to a bracket deeper than 5 levels, or a
string or container the step's end cuts."""
_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_PROMPT = rb'[ \t\r\n]*+(?:' + _STRING + rb'|\[[^\[\]{}"]*+\])[ \t\r\n]*+,'
_PROMPTS = re.compile(rb"(?:" + _PROMPT + rb")*+", re.S)
"""A run of a batch's prompts, each a string or a flat list (token ids), each with the
comma after it."""
_ONE_PROMPT = re.compile(_PROMPT + rb"()", re.S)
"""One of them: ``findall`` of its empty group lists the empty bytes, made once."""
_QUOTE, _COLON, _COMMA = ord('"'), ord(":"), ord(",")
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = b"{}[]"
_CLOSES = {_OPEN_OBJECT: _CLOSE_OBJECT, _OPEN_ARRAY: _CLOSE_ARRAY}
_NO_VALUE = frozenset(b"]},:")
_BOM = b"\xef\xbb\xbf"


class _Walk:
    """One walk of a body, from ``pos``; its steps end at ``until`` (``step`` bytes
    after the last's end) or after ``TOKENS`` tokens."""

    def __init__(self, body: bytes | bytearray, step: int) -> None:
        self.body, self.size, self.step = body, len(body), step
        self.pos = 0
        self.until = min(step, self.size)
        self.tokens = TOKENS

    def fields(self, keys: frozenset[str],
               count: str | None) -> Generator[None, None, Fields]:
        if self.body[:3] == _BOM:  # json.loads reads a body in UTF-8 with its BOM
            self.pos = 3
        yield from self._ws()
        if self._byte() != _OPEN_OBJECT:
            raise _NotJSON("not an object")
        self.pos += 1
        found = Fields({}, {})
        yield from self._ws()
        if self._byte() != _CLOSE_OBJECT:
            while True:
                yield from self._token()
                if self._byte() != _QUOTE:
                    raise _NotJSON("a key that is no string")
                start = self.pos
                key = _key((yield from self._string(keep=KEY_BYTES + 2)))
                yield from self._ws()
                if self._byte() != _COLON:
                    raise _NotJSON("a key without its colon")
                self.pos += 1
                yield from self._ws()
                if key == count and self._byte() == _OPEN_ARRAY:
                    found.counted = yield from self._items()
                elif key is not None and key in keys:
                    found.values[key] = yield from self._read()
                    found.spans[key] = (start, self.pos)
                else:
                    if key == count:
                        found.counted = None  # the last is the one read
                    yield from self._value()
                yield from self._ws()
                byte = self._byte()
                if byte == _CLOSE_OBJECT:
                    break
                if byte != _COMMA:
                    raise _NotJSON("a member without a comma or end after it")
                self.pos += 1
                yield from self._ws()
        found.end = self.pos
        self.pos += 1
        yield from self._ws()
        if self.pos < self.size:
            raise _NotJSON("bytes after the object")
        return found

    def _next_step(self) -> Iterator[None]:
        yield
        self.until = min(self.pos + self.step, self.size)
        self.tokens = TOKENS

    def _token(self) -> Iterator[None]:
        """One token taken in Python."""
        self.tokens -= 1
        if self.tokens <= 0:
            yield from self._next_step()

    def _byte(self) -> int:
        if self.pos >= self.size:
            raise _NotJSON("the body ends inside its value")
        return self.body[self.pos]

    def _run(self, pattern: re.Pattern[bytes]) -> Iterator[None]:
        """Past what ``pattern`` (possessive, matching the empty text) matches from
        ``pos``, over steps' ends."""
        while True:
            self.pos = _end(pattern, self.body, self.pos, self.until)
            if self.pos < self.until or self.until >= self.size:
                return
            yield from self._next_step()

    def _ws(self) -> Iterator[None]:
        return self._run(_WS)

    def _string(self, keep: int = 0) -> Generator[None, None, bytes | None]:
        """Past the string at ``pos``; its bytes, quotes and all, where they are at most
        ``keep``."""
        start = self.pos
        self.pos += 1
        while True:
            self.pos = _end(_BODY, self.body, self.pos, self.until)
            if self.pos < self.until:
                if self.body[self.pos] == _QUOTE:
                    self.pos += 1
                    break
                # A backslash whose escaped byte is past the step's end: both taken.
                self.pos += 2
                if self.pos > self.size:
                    raise _NotJSON("a string that does not end")
                self.until = max(self.until, self.pos)
                continue
            if self.until >= self.size:
                raise _NotJSON("a string that does not end")
            yield from self._next_step()
        return bytes(self.body[start:self.pos]) if self.pos - start <= keep else None

    def _value(self) -> Iterator[None]:
        """Past the value at ``pos``."""
        byte = self._byte()
        if byte == _QUOTE:
            yield from self._string()
        elif byte in _CLOSES:
            self.pos += 1
            yield from self._inside(bytearray((_CLOSES[byte],)))
        elif byte in _NO_VALUE:
            raise _NotJSON(f"{chr(byte)!r} where a value was due")
        else:
            start = self.pos
            yield from self._run(_SCALAR)
            if self.pos == start:
                raise _NotJSON("a value that is none")

    def _inside(self, closes: bytearray) -> Iterator[None]:
        """Past the containers open at ``pos`` (``closes``: the brackets that close
        them, the innermost last)."""
        while closes:
            yield from self._run(_BALANCED)
            byte = self._byte()
            yield from self._token()
            if byte == _QUOTE:
                yield from self._string()
            elif byte in _CLOSES:
                if len(closes) >= DEPTH:
                    raise _NotJSON("nested past json.loads' depth")
                closes.append(_CLOSES[byte])
                self.pos += 1
            elif byte == closes[-1]:
                closes.pop()
                self.pos += 1
            else:
                raise _NotJSON(f"{chr(byte)!r} closes no container")

    def _read(self) -> Generator[None, None, Any]:
        """The value at ``pos``, as ``json.loads`` has it (``TOO_LONG`` past
        ``VALUE_BYTES``)."""
        start = self.pos
        yield from self._value()
        if self.pos - start > VALUE_BYTES:
            return TOO_LONG
        try:
            return json.loads(self.body[start:self.pos])
        except (ValueError, RecursionError) as e:
            raise _NotJSON("a value read that is no JSON") from e

    def _items(self) -> Generator[None, None, int | None]:
        """Past the array at ``pos``: its items' count where each is a string or an
        array (vLLM's batch of prompts), else (or empty) None."""
        self.pos += 1
        yield from self._ws()
        if self._byte() == _CLOSE_ARRAY:
            self.pos += 1
            return None
        count = 0
        while True:
            # Counted a step's run at a time: the count's list is of a step's items.
            start = self.pos
            self.pos = _end(_PROMPTS, self.body, start, self.until)
            if self.pos > start:
                count += len(_ONE_PROMPT.findall(self.body, start, self.pos))
            if self.pos == self.until < self.size:
                yield from self._next_step()
                continue
            # One item walked: the last (no comma after it), one of lists or strings the
            # patterns do not take whole (nested, or cut by the step's end), or no prompt.
            yield from self._ws()
            yield from self._token()
            byte = self._byte()
            if byte == _QUOTE:
                yield from self._string()
            elif byte == _OPEN_ARRAY:
                self.pos += 1
                yield from self._inside(bytearray((_CLOSE_ARRAY,)))
            else:
                # A number, an object, a literal: one list of token ids, or none vLLM
                # reads as a batch. The rest is skipped as any array's.
                yield from self._value()
                yield from self._inside(bytearray((_CLOSE_ARRAY,)))
                return None
            count += 1
            yield from self._ws()
            byte = self._byte()
            self.pos += 1
            if byte == _CLOSE_ARRAY:
                return count
            if byte != _COMMA:
                raise _NotJSON("an item without a comma or end after it")
            yield from self._ws()


def _end(pattern: re.Pattern[bytes], data: bytes | bytearray, pos: int, until: int) -> int:
    """Where ``pattern`` (one that matches the empty text) ends from ``pos``."""
    found = pattern.match(data, pos, until)
    return pos if found is None else found.end()


def _key(raw: bytes | None) -> str | None:
    """A key's string (its escapes read), None for one longer than any read."""
    if raw is None:
        return None
    try:
        key = json.loads(raw)
    except ValueError as e:
        raise _NotJSON("a key that is no JSON string") from e
    return key if isinstance(key, str) else None
