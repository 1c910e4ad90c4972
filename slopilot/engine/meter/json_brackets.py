"""The brackets of a window of JSON that are JSON's own (none in a string), each with its
depth, found at C speed whatever the depth and whatever the strings hold.

``json_scan``'s patterns take a container a level at a time, 32 levels at most, and
``json_hops``' a string with a bracket or an escape in it as the end of a hop: a client's
JSON nested hundreds deep, strings of brackets at each level, took tens of calls of Python
a level. Here the window's escapes are blanked, then what its strings hold of brackets
(and of the ``NaN`` and ``Infinity`` that ``json_shells`` counts), in the window's own
length, so that a bracket left is JSON's; the depths are those brackets' running sum:
a few passes of C over the window's bytes and its brackets, and calls by the window, not
by its levels or strings.
"""

from __future__ import annotations

import copy
import itertools
import operator
import re

_ESCAPE = re.compile(rb"\\.", re.S)
_HELD = bytes.maketrans(b"[]{}NI", b"______")
"""What a string holds that would read as JSON's outside it: brackets, and the first
letters of ``NaN`` and ``Infinity``."""
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
"""A bracket's step in depth, plus one (bytes hold no -1)."""
_SHUTS = bytes.maketrans(b"[{]}", b"\x00\x00\x01\x01")
_PAST = [re.compile(rb"(?:[^\[\]{}]*+[\[\]{}]){%d}" % (1 << bit)) for bit in range(20)]
"""Past 2**bit brackets: any count of them in as many patterns as its bits."""
_PAST_OPENS = [re.compile(rb"(?:[^\[{]*+[\[{]){%d}" % (1 << bit)) for bit in range(20)]


class Brackets:
    """``data[start:stop]``'s brackets outside strings (``start`` outside one), and their
    ``depth`` after each, from 0 before the first. Where ``plain``, its strings hold no
    bracket nor escape (``json_hops``' hops take only those), and are read as they are."""

    def __init__(self, data: bytes, start: int, stop: int, plain: bool = False) -> None:
        window = data[start:stop]
        if not plain:
            if b"\\" in window:
                window = _ESCAPE.sub(b"__", window)  # a quote left ends or starts a string
            pieces = window.split(b'"')
            if len(pieces) > 1:
                pieces[1::2] = b'"'.join(pieces[1::2]).translate(_HELD).split(b'"')
                window = b'"'.join(pieces)
        self.start = start
        self.text = window
        """The window with its strings' brackets, ``N`` and ``I`` blanked, and its
        escapes, in as many bytes."""
        self.kinds = self.text.translate(None, _NOT_BRACKETS)
        self.depth = list(map(operator.sub, itertools.accumulate(self.kinds.translate(_STEP)),
                              itertools.count(1)))

    def __len__(self) -> int:
        return len(self.depth)

    def until(self, stop: int) -> Brackets:
        """Those before ``stop`` (a position in ``data``, within the window)."""
        if stop >= self.start + len(self.text):
            return self
        cut = copy.copy(self)
        cut.text = self.text[:stop - self.start]
        cut.kinds = cut.text.translate(None, _NOT_BRACKETS)
        cut.depth = self.depth[:len(cut.kinds)]
        return cut

    def at(self, index: int, since: int = -1, pos: int = 0) -> int:
        """Where the bracket at ``index`` is (a position in ``data``): counted on from the
        one at ``since`` (at ``pos``) where given, else from the window's start."""
        if index == since:
            return pos
        at = pos + 1 - self.start if since >= 0 else 0
        skip, bit = index - since, 0
        while skip:
            if skip & 1:
                found = _PAST[bit].match(self.text, at)
                if found is None:
                    raise IndexError(f"no bracket {index} in the window")
                at = found.end()
            skip >>= 1
            bit += 1
        return self.start + at - 1

    def levels(self) -> dict[int, int]:
        """The last bracket of each level (the depth of the container it opens or
        closes): its index. Of a level as deep as the depth at the end, or less, that is
        the bracket that opens the container still open there."""
        levels = map(operator.add, self.depth, self.kinds.translate(_SHUTS))
        return dict(zip(levels, range(len(self.depth)), strict=True))

    def constants(self, pos: int, stop: int) -> int:
        """The ``NaN``, ``Infinity`` and ``-Infinity`` outside strings from ``pos`` to
        ``stop`` (positions in ``data``): ``json.loads``' constants."""
        pos, stop = pos - self.start, stop - self.start
        return self.text.count(b"NaN", pos, stop) + self.text.count(b"Infinity", pos, stop)


def past_opens(data: bytes, pos: int, stop: int, count: int) -> int:
    """Past the ``count``-th bracket that opens from ``pos`` (in a string too), or -1
    where fewer do before ``stop``."""
    bit = 0
    while count:
        if count & 1:
            found = _PAST_OPENS[bit].match(data, pos, stop)
            if found is None:
                return -1
            pos = found.end()
        count >>= 1
        bit += 1
    return pos


def opening(data: bytes, pos: int, stop: int, count: int) -> int:
    """Where a window from ``pos`` that ``count`` brackets that open at most (in strings
    too: ``PART_CONTAINERS``) ends, ``stop`` at most."""
    past = past_opens(data, pos, stop, count + 1)
    return stop if past < 0 else past - 1
