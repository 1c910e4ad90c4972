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

import json
from collections.abc import Generator
from typing import Any

from slopilot.engine.meter import json_hops, json_scan, json_shells
from slopilot.engine.meter.json_keep import COUNT, WHOLE, Keep, project
from slopilot.engine.meter.json_scan import COMMA, KEY, OPEN, QUOTE, cut, end_of, opens
from slopilot.engine.meter.json_shells import Closing, Shell
from slopilot.engine.meter.json_tokens import (
    DEPTH,
    ROOM,
    NotStepped,
    Open,
    Tokens,
    child,
    opened,
    uniform,
)

__all__ = ["COUNT", "DEPTH", "WHOLE", "Keep", "NotStepped", "loads", "project"]

PART_BYTES = 8 << 10
"""The most bytes of a run of items parsed as one part (a step parses several): its
objects, a few hundred, are dropped (where not kept) before the garbage collector's
youngest generation fills (700 objects), so none outlives it to count towards a full
pass. Parts of 64 KiB, thousands of objects, still made one every few events of 1 MiB."""
CONTAINER_BYTES = 8
"""The bytes a container of a part counts for in a step's: ``json.loads`` makes one in
the time it parses some 8 bytes of strings and numbers (vLLM's logprobs, a client's
tools: 8-15 ns a byte), so a step of brackets is as long as one of them."""

_CLOSE = {0x7B: 0x7D, 0x5B: 0x5D}


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


class _Walk(Tokens):
    def __init__(self, data: bytes, step: int, left: int, keep: Keep) -> None:
        super().__init__(data, step, left, keep)
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
        stack = [opened(data[pos], self.keep)]
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
                keep = child(top)
                shell = yield from self._into(pos, keep, len(stack) + self.shelled)
                if shell is not None:  # many levels at once, then the innermost's
                    self.shelled += shell.levels
                    pos, keep = shell.hole, shell.keep
                    byte = data[pos]
                stack.append(opened(byte, keep))
                stack[-1].shell = shell
                yield from self._reach(len(stack) + self.shelled)
                pos, first = pos + 1, True
                continue
            item, pos = yield from (self._string(pos) if byte == QUOTE else
                                    self._scalar(pos))
            self._put(top, item)
            after = True

    def _into(self, at: int, keep: Keep | None,
              depth: int) -> Generator[None, None, Shell | None]:
        """The shell of the containers that open from the one at ``at`` (a container too
        long for a part, ``depth`` containers deep), where it is kept whole or dropped and
        half a part holds more than ``json_shells.LEVELS`` levels of them."""
        data = self.data
        keep = uniform(data[at], keep)
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

    def _out(self, shell: Shell, stack: list[Open],
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
                stack.append(Open(_CLOSE[data[start]], shell.keep, value,
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

    def _run(self, top: Open, pos: int,
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
