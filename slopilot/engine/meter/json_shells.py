"""Containers both longer than a part and nested deeper than its pattern, for
``json_steps``: many levels parsed as one part, around a hole that the walk fills.

A client's JSON Schema nested 300 deep in 12 KiB (one of its ``tools``, which vLLM echoes
in a Responses event) fits no part, and its items nest deeper than a part's pattern: the
walk took it level by level, tens of calls of Python each, down to where its items fit,
and back up (139-159 ms of the meter's loop for 0.76 MiB of such tools, 11.5 ms for
``json.loads``). Here the levels that open one in another within half a part are a
*shell*: the text from the outermost's opener to the innermost's, ``PLACEHOLDER`` where
the innermost container is, and, once the walk has parsed that container (its own items
in parts, or a shell of its own), the text from its end to where the shell's levels close
(``Brackets`` finds both, at C speed). ``json.loads`` parses the shell as one part and
puts the container's value in its place (``fill``: its ``parse_constant``). A shell whose
levels do not all close within its part is parsed in shells of its innermost levels, as
many as do; one whose innermost level holds more than a part past the hole is walked at
that level, as any long container is (``closing``, and ``json_steps``' ``_Walk._out``).

The value is ``json.loads``' own: a shell and its hole's container, each valid JSON, make
the text between its levels' brackets (a value's text where a value was), and
``json.loads`` reads its ``NaN``, ``Infinity`` and ``-Infinity`` through the hook alone,
so the hole is the one counted before it. Kept whole or dropped only (``Keep``), as a
client's JSON is; a part's limits hold (``PART_CONTAINERS``, and the part's bytes).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

from slopilot.engine.meter.json_brackets import Brackets, opening, past_opens
from slopilot.engine.meter.json_hops import DOWN, UP, after
from slopilot.engine.meter.json_keep import Keep
from slopilot.engine.meter.json_scan import QUOTE, end_of, opens

PLACEHOLDER = b"NaN"
LEVELS = 2
"""The fewest levels a shell holds, besides its hole: fewer are walked, as they cost
little more walked."""
_CONSTANTS = {name: json.loads(name) for name in ("NaN", "Infinity", "-Infinity")}
"""``json.loads``' own (the same objects: a list holding its NaN equals another's)."""
_CLOSER = {ord("["): b"]", ord("{"): b"}"}


@dataclasses.dataclass(slots=True)
class Shell:
    """Containers one in another that the walk is in, parsed as one part around the one
    it fills (the ``hole``)."""

    keep: Keep | None
    """``WHOLE``, or None: dropped, parsed only to know it is JSON."""
    base: int
    """The containers around its outermost."""
    outer: int
    """Where its outermost's opener is."""
    brackets: Brackets | None
    """Those of the text its levels open in, from its outermost's opener; None where
    that text is brackets that open and no others (a chain: ``DOWN`` took it whole)."""
    opener: dict[int, int]
    """Each level's opener (1 its outermost): its index in ``brackets``."""
    levels: int
    """Its levels still open around the hole."""
    hole: int
    """Where the container the walk fills starts."""
    deepest: int
    """The most containers one in another in its text, from its outermost (a part's)."""
    data: bytes = dataclasses.field(repr=False)
    """The text (a chain's levels are found in it)."""
    value: Any = None
    """The hole's value, once its container ended."""

    def start(self, level: int) -> int:
        """Where ``level``'s opener is."""
        if level == 1:
            return self.outer
        if self.brackets is None:  # each bracket in a chain opens a level
            return past_opens(self.data, self.outer, self.hole + 1, level) - 1
        return self.brackets.at(self.opener[level])

    def constants(self, start: int) -> int:
        """``json.loads``' constants in its text from ``start`` to the hole (none in a
        chain: one that holds any is read by its brackets)."""
        return 0 if self.brackets is None else self.brackets.constants(start, self.hole)

    def opens(self, data: bytes, level: int = 1) -> int:
        """The containers that open in its text from ``level``'s opener to the hole (a
        bracket in a string counted too, as ``PART_CONTAINERS`` counts them)."""
        return opens(data, self.start(level), self.hole)


def opened(data: bytes, at: int, stop: int, containers: int, keep: Keep | None,
           base: int, counted: Brackets | None = None) -> Shell | None:
    """The shell of the containers that open one in another from the one at ``at``,
    within ``stop`` and ``containers`` of them: around the innermost one open at the
    end of that window. None where the container at ``at`` ends within it, or fewer than
    ``LEVELS`` are around that one. ``counted``: the brackets from ``at``, where known."""
    stop = opening(data, at, stop, containers)
    if counted is not None and counted.start == at:  # within its window, or less
        return _around(counted.until(stop), keep, base, data)
    down = end_of(DOWN, data, at, stop)
    if (down == stop or (data[down] == QUOTE and data.find(b'"', down + 1, stop) < 0)) and \
            data.find(b"NaN", at, down) < 0 and data.find(b"Infinity", at, down) < 0:
        # A chain to the window's end (or to a string it cuts): no bracket closes in it.
        innermost = opens(data, at, down)
        if innermost <= LEVELS:
            return None
        hole = max(data.rfind(b"[", at, down), data.rfind(b"{", at, down))
        return Shell(keep, base, at, None, {}, innermost - 1, hole, innermost, data)
    return _around(Brackets(data, at, stop), keep, base, data)


def _around(brackets: Brackets, keep: Keep | None, base: int, data: bytes) -> Shell | None:
    """``opened``, of the brackets of its window."""
    depth = brackets.depth
    if not depth or min(depth) < 1:
        return None  # it ends within the window: not one of those
    innermost = depth[-1]
    if innermost <= LEVELS:
        return None
    opener = brackets.levels()
    hole = brackets.at(opener[innermost])
    deepest = max(itertools.islice(depth, opener[innermost] + 1))
    return Shell(keep, base, brackets.start, brackets, opener, innermost - 1, hole, deepest,
                 data)


@dataclasses.dataclass(frozen=True, slots=True)
class Closing:
    """What of a shell ends within a window from ``start``, past its hole: its innermost
    ``levels`` (0: none), at ``end``, with containers ``deepest`` levels deep below the
    hole's level (its own, past its hole), and ``constants`` of ``json.loads``'."""

    levels: int
    start: int
    end: int
    deepest: int
    constants: int


def closing(shell: Shell, data: bytes, at: int, stop: int, containers: int) -> Closing:
    """What of ``shell`` ends from ``at`` (just past its hole's container) to ``stop``,
    the text holding at most ``containers`` containers."""
    stop = opening(data, at, stop, containers)
    up = end_of(UP, data, at, stop)
    shut = data.count(b"]", at, up) + data.count(b"}", at, up) - opens(data, at, up)
    if shut >= shell.levels:  # brackets that close, and containers of none: all of it
        end = after(data, at, up, shell.levels)
        if data.find(b"NaN", at, end) < 0 and data.find(b"Infinity", at, end) < 0:
            return Closing(shell.levels, at, end, min(1, opens(data, at, end)), 0)
    brackets = Brackets(data, at, stop)
    depth = brackets.depth
    lowest = min(depth, default=0)
    if lowest >= 0:
        return Closing(0, at, at, 0, 0)
    levels = min(-lowest, shell.levels)
    index = depth.index(-levels)
    deepest = max(itertools.islice(depth, index + 1))
    end = brackets.at(index) + 1
    return Closing(levels, at, end, deepest, brackets.constants(at, end))


def text(shell: Shell, data: bytes, level: int,
         closed: Closing | None) -> tuple[int, bytes, int, int]:
    """Where ``level``'s opener is, and ``shell``'s text from there, its hole's container
    ``PLACEHOLDER``, to where ``closed`` ends (or to ``level``'s own bracket that closes,
    where None): and the constants before the placeholder, and in all."""
    start = shell.start(level)
    before = shell.constants(start)
    if closed is None:
        end = _CLOSER[data[start]]
        return start, data[start:shell.hole] + PLACEHOLDER + end, before, before + 1
    return (start, data[start:shell.hole] + PLACEHOLDER + data[closed.start:closed.end],
            before, before + 1 + closed.constants)


def fill(text: str, value: Any, index: int, constants: int) -> Any:
    """``json.loads`` of ``text`` with ``value`` as its ``index``-th constant, of
    ``constants`` (``NaN``, ``Infinity``, ``-Infinity``: each else its own); a
    ``ValueError`` where they are not so many."""
    seen = itertools.count()

    def constant(name: str) -> Any:
        return value if next(seen) == index else _CONSTANTS[name]

    found = json.loads(text, parse_constant=constant)
    if next(seen) != constants:
        raise ValueError(f"{constants} constants where the brackets were read, not so many")
    return found
