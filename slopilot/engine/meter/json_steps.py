"""``json.loads`` of a text held whole, in steps of at most ``step`` bytes, for a caller on
an event loop that lets it run between two.

The meter holds an SSE event up to ``MAX_EVENT_BYTES`` whole and parses it when it ends
(``stream_judge``). A Responses ``response.completed`` with logprobs, or a completions
``echo`` chunk with a prompt's, is one of just under 1 MiB for any client that asks:
parsed in one go, it held every other stream the meter relays for 8-35 ms.

The value is ``json.loads``' own, made of the values of the text's parts, each parsed by
``json.loads`` itself: a run of a container's items (an object's members) whole, in its
brackets; a piece of a string too long for a step, in quotes. The containers too long
for a part are walked, their brackets, commas, colons and keys taken one by one; where
they open one in another (a client's JSON Schema nested hundreds deep), many levels are
parsed as one part around the innermost, which the walk fills (``json_shells``). Valid
JSON splits so into parts valid alone whose values make the whole's: items and members
in their order (a key written twice keeps its last value, as in ``json.loads``), a
string cut between characters only, never inside an escape nor between the two escapes
of a surrogate pair. A part is found by its quotes and brackets (compiled patterns, at C
speed, ``json_scan.CONTENT``; through items nested deeper than those take, by hops of a
few such patterns, ``json_hops``) and then parsed: a step scans at most ``step`` bytes and
parses at most as many, in parts of ``PART_BYTES`` and ``json_scan.PART_CONTAINERS`` at
most (a string's pieces excepted), and walks at most ``TOKENS`` tokens one by one.

Where a part is no JSON, or the text is one the steps do not split (not UTF-8 to
``json.loads``, not an object or array, nested deeper than ``json.loads`` takes here, a
number longer than a step, anything after its value), the text is parsed whole, in one
step: ``json.loads``' own value or error, at its cost. So the value, or the error, is
always ``json.loads``': vLLM writes none of those but a client's JSON that it echoes
nested near a thousand levels deep, and a part that is no JSON makes a text that is
none. Why not a parser of JSON in pieces (ijson, ``json_paths``): its value or its error
is its own, not ``json.loads``' in every case (numbers, escapes, bytes that are not
UTF-8, a key written twice, depth), and the judge reads a held event as its client does.

A caller may keep only some of the value (``Keep``: an object's keys, an array's items or
its count): the rest is parsed part by part and dropped as it goes. Kept whole to its end,
the values of 1 MiB of JSON (a Responses answer's log probabilities, each an object) are
tens of thousands of objects that outlive the garbage collector's young generations: its
next full pass, over every object the process has, fell in one of the steps (6-9 ms in a
bare interpreter, every other such event; as in one ``json.loads``), and their release
in the last (1-2 ms).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator
from typing import Any

from slopilot.engine.meter import json_hops, json_scan, json_shells
from slopilot.engine.meter.json_hops import Hops
from slopilot.engine.meter.json_keep import COUNT, WHOLE, Keep, project
from slopilot.engine.meter.json_scan import (
    COLON,
    COMMA,
    HIGH,
    KEY,
    ONE,
    OPEN,
    PIECE,
    QUOTE,
    WS,
    cut,
    end_of,
    opens,
    unescaped,
)
from slopilot.engine.meter.json_shells import Closing, Shell

__all__ = ["COUNT", "WHOLE", "Keep", "NotStepped", "loads", "project"]

DEPTH = 64
"""The containers the walk opens, one in another, before it asks ``json.loads`` whether
it takes a text so deep (vLLM's own JSON goes 7 deep, down to a Responses answer's
logprobs, whose entries are parts; a client's, which vLLM echoes, as deep as it likes).
``json.loads`` refuses a text nested past the interpreter's recursion limit, less the
frames under way, which the parts of one, each parsed apart, would not reach: past
``DEPTH``, and at each ``DEPTH`` more, the walk asks it (``_Walk._nestable``), and
where it would refuse the text, parses it whole, for its error. The depth asked is the
walk's and its parts' (each at most its containers, ``json_scan.PART_DEPTH`` at most,
below the levels its hops counted)."""
PART_BYTES = 8 << 10
"""The most bytes of a run of items parsed as one part (a step parses several): its
objects, a few hundred, are dropped (where not kept) before the garbage collector's
youngest generation fills (700 objects), so none outlives it to count towards a full
pass. Parts of 64 KiB, thousands of objects, still made one every few events of 1 MiB."""
CONTAINER_BYTES = 8
"""The bytes a container of a part counts for in a step's: ``json.loads`` makes one in
the time it parses some 8 bytes of strings and numbers (vLLM's logprobs, a client's
tools: 8-15 ns a byte), so a step of brackets is as long as one of them."""
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


_CLOSE = {0x7B: 0x7D, 0x5B: 0x5D}


class NotStepped(Exception):
    """The text is not one the steps split, or no JSON: parsed whole."""


@dataclasses.dataclass(slots=True)
class _Open:
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


def loads(data: bytes, step: int, left: int,
          keep: Keep = WHOLE) -> Generator[None, None, tuple[Any, int]]:
    """``project(json.loads(data), keep)``: ``json.loads``' value as ``keep`` keeps it, or
    its error raised. Parsed in steps of at most ``step`` bytes scanned and parsed, the
    first of ``left``, yielding between two; the value comes with the bytes left of the
    last step (0 or less: it is spent)."""
    if step < 2 * ROOM:
        raise ValueError(f"step={step}: a step must hold a part of at least {2 * ROOM} "
                         f"bytes")
    walk = _Walk(data, step, left, keep)
    try:
        return (yield from walk.run())
    except NotStepped:
        pass
    if len(data) > walk.left:
        yield  # a step of its own
        walk.left = step
    return project(json.loads(data), keep), walk.left - len(data)


class _Walk:
    def __init__(self, data: bytes, step: int, left: int, keep: Keep) -> None:
        self.data, self.step, self.left, self.keep = data, step, left, keep
        self.tokens = TOKENS
        """The tokens the step under way may still walk."""
        self.deepest = 0
        """The most containers the walk was in, one in another (or a part's hops)."""
        self.hops = Hops(data)
        """Through items nested deeper than a part, by hops (``json_hops``)."""
        self.shelled = 0
        """The containers the walk is in that its stack does not hold: its shells' levels
        (``json_shells``)."""

    def run(self) -> Generator[None, None, tuple[Any, int]]:
        data, n = self.data, len(self.data)
        if n <= self.step or json.detect_encoding(data) != "utf-8":
            raise NotStepped  # one part, or not UTF-8 (json.loads reads its BOMs, UTF-16)
        pos = yield from self._space(0)
        if pos == n or data[pos] not in OPEN:
            raise NotStepped
        stack = [_opened(data[pos], self.keep)]
        pos += 1
        first, after = True, False  # the container under way just opened; an item just ended
        while True:
            if self.tokens <= 0:
                yield from self._turn()
            self.tokens -= 1
            top = stack[-1]
            pos = yield from self._space(pos)
            if pos == n:
                raise NotStepped  # the text ended inside a container
            byte = data[pos]
            if byte == top.close and (first or after):
                pos += 1
                done = stack.pop()
                counted = done.keep is not None and done.keep.count
                value = [None] * done.count if counted else done.value
                if not stack:
                    if (yield from self._space(pos)) != n:
                        raise NotStepped  # more after the value
                    if self.deepest > DEPTH and not (yield from self._nestable()):
                        raise NotStepped  # json.loads' RecursionError, or its value
                    return value, self.left
                if done.shell is not None:
                    done.shell.value = value
                    pos = yield from self._out(done.shell, stack, pos)
                else:
                    self._put(stack[-1], value)
                first, after = False, True
                continue
            if after:
                if byte != COMMA:
                    raise NotStepped
                pos, after = pos + 1, False
                continue
            first = False
            end, comma = yield from self._run(top, pos, len(stack) + self.shelled)
            if end > pos:
                pos, after = end, not comma
                continue
            # The item alone: longer than a step, or nested deeper than a part.
            if top.close == 0x7D:
                pos = yield from self._key(top, pos)
                pos = yield from self._space(pos)
            byte = data[pos] if pos < n else 0
            if byte in OPEN:
                keep = _child(top)
                shell = yield from self._into(pos, keep, len(stack) + self.shelled)
                if shell is not None:  # many levels at once, then the innermost's
                    self.shelled += shell.levels
                    pos, keep = shell.hole, shell.keep
                    byte = data[pos]
                stack.append(_opened(byte, keep))
                stack[-1].shell = shell
                yield from self._reach(len(stack) + self.shelled)
                pos, first = pos + 1, True
                continue
            item, pos = yield from (self._string(pos) if byte == QUOTE else
                                    self._scalar(pos))
            self._put(top, item)
            after = True

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

    def _into(self, at: int, keep: Keep | None,
              depth: int) -> Generator[None, None, Shell | None]:
        """The shell of the containers that open from the one at ``at`` (a container too
        long for a part, ``depth`` containers deep), where it is kept whole or dropped and
        half a part holds more than ``json_shells.LEVELS`` levels of them."""
        data = self.data
        keep = _uniform(data[at], keep)
        if keep is not None and keep is not WHOLE:
            return None
        room = min(min(PART_BYTES, self.step) // 2, len(data) - at)
        if self.left < room:
            yield from self._turn()
        self.left -= room  # its window scanned
        shell = json_shells.opened(data, at, at + room, json_scan.PART_CONTAINERS // 2,
                                   keep, depth, self.hops.unended)
        if shell is not None:
            yield from self._reach(depth + shell.deepest)
        return shell

    def _out(self, shell: Shell, stack: list[_Open],
             pos: int) -> Generator[None, None, int]:
        """Past ``shell`` (its hole's value in, its container ended at ``pos``): its
        levels that end within a part from there parsed as one, and so on until all have
        (its value put in the container on top of ``stack``), or until its innermost holds
        more than a part past its hole: that level then walked, on top of ``stack``, its
        items so far parsed as one part."""
        data = self.data
        while True:
            if self.tokens <= 0:
                yield from self._turn()
            self.tokens -= 1
            room = min(min(PART_BYTES, self.step) - (shell.hole - shell.outer) -
                       len(json_shells.PLACEHOLDER), len(data) - pos)
            if self.left < room:
                yield from self._turn()
            self.left -= room  # its window scanned
            closing = json_shells.closing(shell, data, pos, pos + room,
                                          json_scan.PART_CONTAINERS - shell.opens(data))
            yield from self._reach(shell.base + shell.levels + closing.deepest)
            if not closing.levels:
                # Past a part at its innermost level: walked there, its items so far one part.
                start, value = yield from self._filled(shell, shell.levels, None)
                shell.levels -= 1
                self.shelled -= 1
                stack.append(_Open(_CLOSE[data[start]], shell.keep, value,
                                   shell=shell if shell.levels else None))
                shell.hole = start
                return pos
            level = shell.levels - closing.levels + 1
            start, value = yield from self._filled(shell, level, closing)
            pos = closing.end
            self.shelled -= closing.levels
            if level == 1:
                self._put(stack[-1], value)
                return pos
            shell.levels, shell.hole, shell.value = level - 1, start, value

    def _filled(self, shell: Shell, level: int,
                closing: Closing | None) -> Generator[None, None, tuple[int, Any]]:
        """Where ``level``'s opener is, and the value of ``shell``'s text from there, its
        hole filled, to where ``closing`` ends (to that level's bracket that closes, where
        None)."""
        start, text, before, constants = json_shells.text(shell, self.data, level, closing)
        made = shell.opens(self.data, level) + (0 if closing is None else json_scan.opens(
            self.data, closing.start, closing.end))
        if self.left < len(text) + CONTAINER_BYTES * made:
            yield from self._turn()
        self.left -= len(text) + CONTAINER_BYTES * made
        try:
            return start, json_shells.fill(text.decode("utf-8", "surrogatepass"),
                                           shell.value, before, constants)
        except (ValueError, RecursionError) as e:
            raise NotStepped from e

    def _part(self, text: bytes) -> Any:
        """One part's value, as ``json.loads`` has it (decoded as it decodes the whole)."""
        try:
            return json.loads(text.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError) as e:
            raise NotStepped from e

    def _put(self, container: _Open, value: Any) -> None:
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

    def _merge(self, container: _Open, part: Any) -> None:
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

    def _run(self, top: _Open, pos: int,
             depth: int) -> Generator[None, None, tuple[int, bool]]:
        """A run of ``top``'s items from ``pos`` parsed whole, as one part: where it
        ends (``pos``: no item fits a part), and whether a comma ended it (else the
        container's end is next). ``top`` is ``depth`` containers deep.

        The run is the container's content up to the step's end (``Hops.content``), cut after
        its last item that ended there (``_cut``); or up to the container's end, where it
        comes first."""
        data, n = self.data, len(self.data)
        at, reach = self.hops.unclosed
        if pos <= at and reach - at >= PART_BYTES // 2 and \
                (at == pos or end_of(KEY, data, pos, at) == at):
            # The item at pos did not end within half a part or more, and a run from it
            # would be no fuller: walked alone, its own items in runs of their own (a
            # second window's scan of each long container, level by level, was a tenth
            # of the parse of a Responses event).
            return pos, False
        while True:
            if self.left < ROOM:
                yield from self._turn()
            room = min(self.left - 2, PART_BYTES)
            window, hops = min(n, pos + room), self.hops.left
            while True:
                stop, deeper, window = self.hops.content(pos, window)
                closed = stop < n and data[stop] == top.close
                end = stop if closed else cut(data, pos, stop, top.close == 0x7D)
                made = opens(data, pos, end)
                if made <= json_scan.PART_CONTAINERS:
                    break
                # Fewer items, as many containers as a part makes; their hops again.
                window, self.hops.left = end_of(json_scan.CONTAINERS, data, pos, end), hops
            if end > pos:
                deeper = max(deeper, min(made, json_scan.PART_DEPTH))  # a part's, at most
                if depth + deeper <= self.deepest:
                    break
                if (yield from self._reach(depth + deeper)):
                    continue  # json.loads was asked: the window again, of what is left
                break
            wider = pos + room < n and room < PART_BYTES
            if (not wider and self.hops.left > 0) or \
                    (self.left == self.step and hops == json_hops.HOPS):
                # No step fuller than this one's rest would widen the window or take more
                # hops: the item is longer than a part, or nested deeper than a step's
                # hops reach, and walked alone now (a turn here took one per such item,
                # thousands an event); the openers its hops went through are walked too,
                # not hopped again at each of their levels.
                if self.hops.failed:
                    self.hops.unhopped = self.hops.failed
                return pos, False
            yield from self._turn()
        self.left -= (end if closed else window) - pos + 2 + CONTAINER_BYTES * made
        opening = b"[" if top.close == 0x5D else b"{"
        self._merge(top, self._part(opening + data[pos:end - (not closed)] +
                                    bytes((top.close,))))
        return end, not closed

    def _key(self, top: _Open, pos: int) -> Generator[None, None, int]:
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


def _opened(byte: int, keep: Keep | None) -> _Open:
    """A container opened by ``byte``, kept as ``keep`` says of its kind."""
    if byte == 0x7B:
        return _Open(0x7D, keep if keep is None or keep.keys is not None else WHOLE, {})
    kind = keep is None or keep.items is not None or keep.count
    return _Open(0x5D, keep if kind else WHOLE, [])


def _uniform(byte: int, keep: Keep | None) -> Keep | None:
    """What is kept of the container ``byte`` opens, where it is dropped (None) or kept
    whole (``WHOLE``, as ``_opened`` keeps it); ``keep`` for the others."""
    if keep is None:
        return None
    if (byte == 0x7B and keep.keys is None) or (byte == 0x5B and keep.items is None and
                                                  not keep.count):
        return WHOLE
    return keep


def _child(container: _Open) -> Keep | None:
    """What is kept of the item under way of ``container``."""
    keep = container.keep
    if keep is None or keep.count:
        return None
    if isinstance(container.value, dict):
        return WHOLE if keep.keys is None else keep.keys.get(container.key)
    return WHOLE if keep.items is None else keep.items

