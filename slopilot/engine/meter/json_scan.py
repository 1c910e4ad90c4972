"""The compiled patterns ``json_steps`` finds a part by, at C speed: JSON's tokens, a
container's content down to ``PART_DEPTH`` levels, and where a run of items in it ends
(``cut``). They read quotes and brackets only; ``json.loads`` checks each part they find.
"""

from __future__ import annotations

import re

PART_DEPTH = 32
"""The containers ``CONTENT`` takes, one in another, inside a container: an item nested
deeper is hopped through (``json_hops``). vLLM's own JSON goes 4 deep inside a part
(a log probability's entry); a client's tools, which vLLM echoes in a Responses event,
as deep as their JSON Schemas (10-20 levels for most). At 5 levels, and no hops, each
tool of a schema nested 8 deep was walked container by container, its keys and brackets
token by token: 15-50 times ``json.loads``' CPU. (The pattern grows by a level's few
dozen bytes each: a bracket closes either kind in it.)"""
PART_CONTAINERS = 512
"""The most containers a part makes (brackets that open in its bytes; one in a string
counted too). Of ``PART_BYTES`` alone, a part of brackets (arrays in arrays, a few bytes
each) made thousands: they outlived the young generation (a part's objects under way when
it filled), and brought its full passes into the steps (steps of 6-24 ms)."""

WS = re.compile(rb"[ \t\n\r]*+")
_SCALAR = rb'[^ \t\n\r,:\[\]{}"]++'
STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
RUN = rb'[^"{}\[\]]*+'


def nested(depth: int) -> bytes:
    """A pattern of a container's content, its containers ``depth`` levels deep at most."""
    # Bytes other than quotes and brackets, whole strings, and containers, unrolled (runs,
    # then one of the others and a run), possessive so that a pattern that fails (a
    # container deeper, or cut by the window's end) is not retried at each of its bytes.
    # A bracket closes any kind (``json_paths.balanced`` matches kinds, in a pattern twice
    # as long for each level): a part whose kinds do not match is no JSON to ``json.loads``.
    other = STRING
    if depth:
        other = rb"(?:" + STRING + rb"|[\[{]" + nested(depth - 1) + rb"[\]}])"
    return RUN + rb"(?:" + other + RUN + rb")*+"


CONTENT = re.compile(nested(PART_DEPTH), re.S)
"""A container's content up to its end, or to a step's end, or a bracket ``PART_DEPTH``
levels deeper: its last bytes outside strings and brackets are the container's own, and a
comma there ends an item."""
CONTAINERS = re.compile(rb"(?:[^\[{]*+[\[{]){%d}" % PART_CONTAINERS)
"""The bytes up to the ``PART_CONTAINERS``-th bracket that opens."""
KEY = re.compile(STRING + rb"[ \t\n\r]*+:[ \t\n\r]*+", re.S)
ONE = re.compile(_SCALAR)
PIECE = re.compile(rb'(?:[^"\\]++|\\[^u]|\\u[0-9a-fA-F]{4})*+')
"""A string's bytes up to its end, or to an escape a step's end would cut (or one that is
no JSON, which its part then says)."""
HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
"""A surrogate pair's first escape: ``json.loads`` joins it to a second right after it."""
QUOTE, BACKSLASH, COMMA, COLON = ord('"'), ord("\\"), ord(","), ord(":")
OPEN = {ord("{"): ord("}"), ord("["): ord("]")}
SHUT = frozenset(OPEN.values())


def end_of(pattern: re.Pattern[bytes], data: bytes, pos: int, window: int) -> int:
    """Where ``pattern`` (one that matches the empty text) ends from ``pos``, in the
    bytes before ``window``."""
    found = pattern.match(data, pos, window)
    return pos if found is None else found.end()


def cut(data: bytes, pos: int, stop: int, members: bool) -> int:
    """Where a run of items from ``pos`` ends, its content read to ``stop``: past the last
    comma between two of its items (``pos``: none). Past its last string or bracket the
    content is the container's own (numbers, literals, colons, commas); in an object, where
    that holds no comma (a member's key, then its value cut), the comma is before the key;
    where a string or container ends the content, its comma is past ``stop``, and the run
    ends before it. A cut that is not between two items is one whose part is no JSON."""
    for _ in range(2):
        last = max(data.rfind(b'"', pos, stop), data.rfind(b"]", pos, stop),
                   data.rfind(b"}", pos, stop))
        comma = data.rfind(b",", max(pos, last + 1), stop)
        if comma < 0 and members and last > pos and data[last] == QUOTE:
            opening = last  # the key's opening quote: the first not escaped before its end
            while (opening := data.rfind(b'"', pos, opening)) >= 0 and \
                    not unescaped(data, opening):
                pass
            if opening > pos:
                before = max(data.rfind(b'"', pos, opening), data.rfind(b"]", pos, opening),
                             data.rfind(b"}", pos, opening))
                comma = data.rfind(b",", max(pos, before + 1), opening)
        if comma > pos:
            return comma + 1  # an item before it, at least
        if last <= pos:
            return pos
        stop = end_of(CONTENT, data, pos, last)  # the content without that last one
    return pos


def opens(data: bytes, pos: int, stop: int) -> int:
    """The brackets that open from ``pos`` to ``stop`` (in strings too)."""
    return data.count(b"[", pos, stop) + data.count(b"{", pos, stop)


def unescaped(data: bytes, at: int) -> bool:
    """Whether the byte at ``at`` is no escape's (an even run of backslashes before it): a
    quote that ends its string, a backslash that starts an escape."""
    first = at
    while first > 0 and data[first - 1] == BACKSLASH:
        first -= 1
    return (at - first) % 2 == 0
