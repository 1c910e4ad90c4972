"""What the walk of ``json_steps`` takes one at a time, within a step's budget: a token
(whitespace, a member's key, a string in pieces, a number or literal), an item put in the
container it is in (as the caller keeps it), a question to ``json.loads`` (a part's value,
whether it takes a depth); and the containers it is in (``Open``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator
from typing import Any

from slopilot.engine.meter import json_hops
from slopilot.engine.meter.json_hops import Hops
from slopilot.engine.meter.json_keep import WHOLE, Keep, project
from slopilot.engine.meter.json_scan import (
    COLON,
    HIGH,
    ONE,
    PIECE,
    QUOTE,
    WS,
    end_of,
    unescaped,
)
from slopilot.engine.meter.json_shells import Shell

DEPTH = 64
"""The containers the walk opens, one in another, before it asks ``json.loads`` whether
it takes a text so deep (vLLM's own JSON goes 7 deep, down to a Responses answer's
logprobs, whose entries are parts; a client's, which vLLM echoes, as deep as it likes).
``json.loads`` refuses a text nested past the interpreter's recursion limit, less the
frames under way, which the parts of one, each parsed apart, would not reach: past
``DEPTH``, and at each ``DEPTH`` more, the walk asks it (``Tokens._nestable``), and
where it would refuse the text, parses it whole, for its error. The depth asked is the
walk's and its parts' (each at most its containers, ``json_scan.PART_DEPTH`` at most,
below the levels its hops counted)."""
TOKENS = 256
"""The most tokens a step walks one by one (a container's bracket, a comma, a member's key,
an item alone): the loop takes its turn past them, as past ``step`` bytes. A token is a
turn of the walk in Python, some microseconds, where a byte of a part is nanoseconds in
``json.loads``: a step's bytes of items a few bytes long nested deeper than a part (a
client's JSON, which vLLM echoes in a Responses event) are thousands of tokens, and
walked in one step took 50-750 ms."""
ROOM = 16
"""The fewest bytes a step must have left to start on a part (an escape, a key's quote
and colon): with fewer, the loop takes its turn first."""


class NotStepped(Exception):
    """The text is not one the steps split, or no JSON: parsed whole."""


@dataclasses.dataclass(slots=True)
class Open:
    """A container the walk is in."""

    close: int
    keep: Keep | None
    """What is kept of it (``keys`` or ``items`` of its kind, ``count``, ``WHOLE``); None:
    it is left out, parsed only to know it is JSON."""
    value: dict[str, Any] | list[Any]
    key: str = ""
    """(An object's) the key of the member whose value is under way."""
    count: int = 0
    shell: Shell | None = None
    """The shell whose hole it is (its value goes there, not to the container below)."""


class Tokens:
    """A walk's reading of one text, ``step`` bytes a step, ``left`` of them in the one
    under way; what it keeps of it (``keep``)."""

    def __init__(self, data: bytes, step: int, left: int, keep: Keep) -> None:
        self.data, self.step, self.left, self.keep = data, step, left, keep
        self.tokens = TOKENS
        """The tokens the step under way may still walk."""
        self.deepest = 0
        """The most containers the walk was in, one in another (or a part's hops)."""
        self.hops = Hops(data)
        """Through items nested deeper than a part, by hops (``json_hops``)."""

    def _turn(self) -> Generator[None, None, None]:
        yield
        self.left, self.tokens, self.hops.left = self.step, TOKENS, json_hops.HOPS

    def _reach(self, depth: int) -> Generator[None, None, bool]:
        """The walk, or a part's hops, ``depth`` containers deep: past each ``DEPTH`` more,
        ``json.loads`` asked whether it takes the text so far (whether it was asked)."""
        if depth <= self.deepest:
            return False
        crossed = depth // DEPTH > self.deepest // DEPTH
        self.deepest = depth
        if crossed and not (yield from self._nestable()):
            raise NotStepped  # json.loads' RecursionError, at once
        return crossed

    def _nestable(self) -> Generator[None, None, bool]:
        """Whether ``json.loads``, called here, takes a text as deep as the walk and its
        parts went: a text of its brackets, parsed as a part. Called deeper in the stack
        than the whole text's parse, it is the stricter."""
        depth = self.deepest
        if self.left < 2 * depth:
            yield from self._turn()
        self.left -= 2 * depth
        try:
            json.loads("[" * depth + "]" * depth)
        except RecursionError:
            return False
        return True

    def _part(self, text: bytes) -> Any:
        """One part's value, as ``json.loads`` has it (decoded as it decodes the whole)."""
        try:
            return json.loads(text.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError) as e:
            raise NotStepped from e

    def _put(self, container: Open, value: Any) -> None:
        """One item of ``container`` (one of its kept containers: as kept already)."""
        keep = container.keep
        if keep is None:
            return
        if isinstance(container.value, dict):
            if keep.keys is None or container.key in keep.keys:
                container.value[container.key] = value
        elif keep.count:
            container.count += 1
        else:
            container.value.append(value)

    def _merge(self, container: Open, part: Any) -> None:
        """A run of ``container``'s items, parsed whole (``part``: a list or dict)."""
        keep = container.keep
        if keep is None:
            return
        if isinstance(container.value, dict):
            if keep.keys is None:
                container.value.update(part)  # each key at its first place, its last value
            else:
                for key, value in part.items():
                    if (kept := keep.keys.get(key)) is not None:
                        container.value[key] = project(value, kept)
        elif keep.count:
            container.count += len(part)
        elif keep.items is not None:
            container.value.extend(project(value, keep.items) for value in part)
        else:
            container.value.extend(part)

    def _space(self, pos: int) -> Generator[None, None, int]:
        """Past the whitespace at ``pos``."""
        data, n = self.data, len(self.data)
        while True:
            if self.left < ROOM:
                yield from self._turn()
            window = min(n, pos + self.left)
            end = end_of(WS, data, pos, window)
            self.left -= end - pos
            if end < window or window == n:
                return end
            pos = end

    def _key(self, top: Open, pos: int) -> Generator[None, None, int]:
        """The key of ``top``'s member at ``pos`` (a string as any, in pieces where it is
        long), and past its colon."""
        if self.data[pos] != QUOTE:
            raise NotStepped
        top.key, pos = yield from self._string(pos)
        pos = yield from self._space(pos)
        if pos == len(self.data) or self.data[pos] != COLON:
            raise NotStepped
        return pos + 1

    def _scalar(self, pos: int) -> Generator[None, None, tuple[Any, int]]:
        """A number or literal at ``pos``, whole: its value, and where it ends."""
        data, n = self.data, len(self.data)
        while True:
            if self.left < ROOM:
                yield from self._turn()
            window = min(n, pos + self.left)
            end = ONE.match(data, pos, window)
            if end is not None and (end.end() < window or window == n):
                self.left -= end.end() - pos
                return self._part(data[pos:end.end()]), end.end()
            if self.left == self.step:
                raise NotStepped  # longer than a step, or no value
            yield from self._turn()

    def _string(self, pos: int) -> Generator[None, None, tuple[str, int]]:
        """The string at ``pos``, in pieces of a step at most: its value, and where it
        ends."""
        data, n = self.data, len(self.data)
        start, pieces = pos + 1, []
        while True:
            if self.left < ROOM:
                yield from self._turn()
            end = end_of(PIECE, data, start, min(n, start + self.left - 2))
            if end == n:
                raise NotStepped  # never closed
            if data[end] == QUOTE:
                pieces.append(self._part(b'"' + data[start:end + 1]))
                self.left -= end - start + 2
                return "".join(pieces), end + 1
            cut = end
            while cut > max(start, end - 3) and 0x80 <= data[cut] < 0xC0:
                cut -= 1  # not inside a character
            if cut - 6 >= start and HIGH.match(data, cut - 6, cut) and unescaped(data, cut - 6):
                cut -= 6  # not between the escapes of a surrogate pair
            if cut > start:
                pieces.append(self._part(b'"' + data[start:cut] + b'"'))
                self.left -= cut - start + 2
                start = cut
            elif self.left == self.step:
                raise NotStepped  # an escape that is no JSON
            else:
                yield from self._turn()


def opened(byte: int, keep: Keep | None) -> Open:
    """A container opened by ``byte``, kept as ``keep`` says of its kind."""
    if byte == 0x7B:
        return Open(0x7D, keep if keep is None or keep.keys is not None else WHOLE, {})
    kind = keep is None or keep.items is not None or keep.count
    return Open(0x5D, keep if kind else WHOLE, [])


def uniform(byte: int, keep: Keep | None) -> Keep | None:
    """What is kept of the container ``byte`` opens, where it is dropped (None) or kept
    whole (``WHOLE``, as ``opened`` keeps it); ``keep`` for the others."""
    if keep is None:
        return None
    if (byte == 0x7B and keep.keys is None) or (byte == 0x5B and keep.items is None and
                                                  not keep.count):
        return WHOLE
    return keep


def child(container: Open) -> Keep | None:
    """What is kept of the item under way of ``container``."""
    keep = container.keep
    if keep is None or keep.count:
        return None
    if isinstance(container.value, dict):
        return WHOLE if keep.keys is None else keep.keys.get(container.key)
    return WHOLE if keep.items is None else keep.items
