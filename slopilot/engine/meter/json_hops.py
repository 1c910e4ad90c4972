"""Past items nested deeper than a part's pattern takes (``json_scan.CONTENT``,
``PART_DEPTH`` levels), by hops of a few compiled patterns, so that ``json_steps`` parses
such items in runs as it parses shallow ones, rather than walking them level by level.
"""

from __future__ import annotations

import bisect
import re
import sys

from slopilot.engine.meter import json_scan
from slopilot.engine.meter.json_brackets import Brackets, past_opens
from slopilot.engine.meter.json_scan import OPEN, SHUT, end_of, opens

HOPS = 512
"""The most hops a step takes through items nested deeper than ``PART_DEPTH``
(``Hops.through``): a hop is a few compiled patterns, about a microsecond, and takes
a chain of containers one in another whole, or a level of a JSON Schema (its
``properties`` in, its ``required`` out)."""

ITEM_HOPS = 2
"""The most hops through one item before its brackets are counted instead
(``Brackets``, ``Hops.counted``): a chain of containers, or a JSON Schema, takes 2 (down
its openers, up its closers and ``required``), but arrays and objects in turn, each
holding a container beside the one deeper, took 2 a level (an item 300 deep, 600 hops:
1,200 calls a KiB), as did a string holding a bracket or an escape at each level."""
_FIRST_COUNT = 1 << 10
"""The bytes of an item whose brackets are counted first (then all the window's: a byte
counted twice at most)."""
_PLAIN = rb'[^"\[\]{}]++|"[^"\\\[\]{}]*+"'
"""Bytes outside strings and brackets, or a string without a bracket or an escape."""
_QUOTED = rb'"[^"\\\[\]{}]*+"'
DOWN = re.compile(rb'(?:[^"\]}]++|' + _QUOTED + rb")*+")
"""Up to a bracket that closes (or a string with a bracket or an escape in it): each
bracket that opens there is inside the one before, as many levels as they open in one hop
(``Hops.through``)."""
UP = re.compile(rb'(?:[^"\[{]++|[\[{](?:' + _PLAIN + rb")*+[\]}]|" + _QUOTED + rb")*+")
"""From a bracket that closes, up to a container in which one is (or a string with a
bracket or an escape in it): brackets that close, and containers of none, as many levels
as the first close in one hop (a JSON Schema's ``"required": [...]`` at each)."""
_BRACKETS = re.compile(rb"[\]}]++|[\[{]")
"""A run of brackets that close, or one that opens."""
_RUNS = 8
_NEVER = sys.maxsize


class Hops:
    """The hops through one text's items nested deeper than a part, ``left`` of them in
    the step under way, and what the last ones that failed left to the walk."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.left = HOPS
        """The hops the step under way may still take (``through``)."""
        self.failed: list[tuple[int, int]] = []
        """The containers the last hops that failed left open, each its parent's first
        item: the runs of ``DOWN`` that opened them, in their order."""
        self.unclosed = (-1, -1)
        """The last container a run stopped at that does not end before the window's
        end, and that end (its scan not done again by the run that starts at it)."""
        self.unhopped: list[tuple[int, int]] = []
        """The containers no run hops through (``failed``, where it was a run's first
        item): they do not end within a part, and are walked, each at its level."""
        self.unended: Brackets | None = None
        """The brackets of the last container ``counted`` found not to end before its
        window (``json_shells`` takes its levels from them)."""

    def content(self, pos: int, window: int) -> tuple[int, int, int]:
        """Where a container's content from ``pos`` stops, before ``window``, as
        ``CONTENT``'s, but past its items nested deeper than a part (``through``): at its
        end, at the window's, or at an item that does not end before it or past the step's
        hops. And the containers its items open one in another by hops (a part's pattern
        holds ``PART_DEPTH`` more below each), and the window, before hops, brought to the
        part's ``PART_CONTAINERS`` (so as not to hop past them)."""
        data = self.data
        stop, deeper, counted = end_of(json_scan.CONTENT, data, pos, window), 0, False
        self.failed = []
        while stop < window and data[stop] in OPEN and not _within(self.unhopped, stop):
            if opens(data, stop, window) <= json_scan.PART_DEPTH:
                self.unclosed = (stop, window)
                break  # not nested past a part, so not ended before the window
            if not counted and opens(data, pos, window) > json_scan.PART_CONTAINERS:
                window, counted = end_of(json_scan.CONTAINERS, data, pos, window), True
                stop = end_of(json_scan.CONTENT, data, pos, window)
                continue
            counted = True
            end, depth = self.through(stop, window)
            if end < 0:
                if self.left > 0:
                    self.unclosed = (stop, window)
                break
            deeper = max(deeper, depth)
            stop = end_of(json_scan.CONTENT, data, end, window)
        return stop, deeper, window

    def through(self, at: int, window: int) -> tuple[int, int]:
        """Past the container at ``at``, nested deeper than ``CONTENT`` takes, before
        ``window``: where it ends (-1: not before it, or past the step's hops), and the
        containers it holds one in another, at most (as many as its hops counted, and
        ``CONTENT``'s containers below them).

        A hop is a run of ``DOWN`` (the brackets that open, down to one that closes) or
        of ``UP`` (those that close, and containers of no container), their count the
        depth's change, then the content at that depth by ``CONTENT``: a few compiled
        patterns for a chain of containers, or for each level of a JSON Schema, where the
        walk took tens of tokens of Python. Strings are whole to the patterns, so a
        bracket counted is none of theirs; one that closes a container of the other kind
        makes a part that is no JSON to ``json.loads``."""
        data, item, hops = self.data, at, 0
        depth, deepest, ended = 0, 0, 0
        opened: list[list[int]] = []  # each run of brackets that open: where, how many
        # of them are open, how many it opened, and the runs that closed before it
        while at < window and self.left > 0:
            if hops == ITEM_HOPS:
                return self.counted(item, window)
            self.left -= 1
            hops += 1
            byte = data[at]
            if byte in OPEN:
                end = end_of(DOWN, data, at, window)
                count = opens(data, at, end)
                opened.append([at, end, count, count, ended])
                depth += count
                deepest = max(deepest, depth)
            elif byte in SHUT:
                end = end_of(UP, data, at, window)
                shut = data.count(b"]", at, end) + data.count(b"}", at, end) - \
                    opens(data, at, end)
                if shut >= depth:
                    return after(data, at, end, depth), deepest
                depth -= shut
                ended += 1
                while shut:  # the runs whose containers all ended
                    gone = min(shut, opened[-1][2])
                    opened[-1][2] -= gone
                    shut -= gone
                    if not opened[-1][2]:
                        opened.pop()
            else:
                break  # a string that does not end before the window, or no JSON
            at = end_of(json_scan.CONTENT, data, end, window)
            deepest = max(deepest, depth + min(opens(data, end, at), json_scan.PART_DEPTH))
        # The containers the walk comes to first, each its parent's first item: a run from
        # one would fail as this one did. After one that holds items that ended, a run
        # from the next starts past them, with a window of its own.
        self.failed = []
        for start, end, left, count, before in opened:
            if self.failed and before != opened[0][4]:
                break
            self.failed.append((start, end if left == count else
                                past_opens(data, start, end, left)))
        return -1, deepest

    def counted(self, at: int, window: int) -> tuple[int, int]:
        """``through``, by the brackets of the container at ``at`` counted (``Brackets``):
        in its first ``_FIRST_COUNT`` bytes, else up to ``window`` (those of one that does
        not end before it kept: ``unended``)."""
        stop, deepest = at, 0
        while stop < window:
            stop = window if stop > at else min(window, at + _FIRST_COUNT)
            brackets = Brackets(self.data, at, stop)
            depth = brackets.depth
            try:
                end = depth.index(0)
            except ValueError:
                deepest = max(depth, default=0)
                continue
            return brackets.at(end) + 1, max(depth[:end])
        self.failed = []
        self.unended = brackets if stop > at else None
        return -1, deepest


def _within(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether ``at`` is inside one of ``spans`` (in their order, none over another)."""
    found = bisect.bisect_right(spans, (at, _NEVER)) - 1
    return found >= 0 and at < spans[found][1]


def after(data: bytes, at: int, end: int, count: int) -> int:
    """Past the ``count``-th bracket from ``at`` that closes a container open there
    (``UP``'s, to ``end``): a run of brackets at a time, then, past a few runs (a JSON
    Schema's ``required`` at each level), by the brackets' depth (``Brackets``)."""
    inside = 0  # the containers of none opened since
    for runs, found in enumerate(_BRACKETS.finditer(data, at, end)):
        start, stop = found.span()
        if runs == _RUNS:
            brackets = Brackets(data, start, end, plain=True)
            return brackets.at(brackets.depth.index(-inside - count)) + 1
        if data[start] in OPEN:
            inside += 1
            continue
        closing = min(inside, stop - start)  # theirs first
        inside -= closing
        if stop - start - closing >= count:
            return start + closing + count
        count -= stop - start - closing
    raise AssertionError("fewer brackets than counted")
