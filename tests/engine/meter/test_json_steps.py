"""``json_steps.loads``: ``json.loads``' value, or its error, for any bytes, parsed in
steps of at most ``step`` bytes where the text is JSON the steps split (and whole, in one
step, where it is not).

The steps are small here (32 bytes and up) so that texts of a few hundred bytes take
every path a held event of 1 MiB takes at 64 KiB: runs of items, containers walked,
strings and keys in pieces, cut wherever a step's end falls.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter import json_hops, json_scan, json_steps
from slopilot.engine.meter.json_steps import COUNT, WHOLE, Keep, loads, project


@dataclasses.dataclass(frozen=True)
class Limits:
    """A part's other limits than its bytes, and a step's hops (``json_steps``' own by
    default): a part of few levels and containers, and few hops, take the hops and the
    walk through texts of a few hundred bytes as deep ones of 1 MiB take them."""

    depth: int = json_scan.PART_DEPTH
    containers: int = json_scan.PART_CONTAINERS
    hops: int = json_hops.HOPS

    @contextmanager
    def applied(self) -> Iterator[None]:
        with mock.patch.multiple(
                json_scan, PART_DEPTH=self.depth, PART_CONTAINERS=self.containers,
                CONTENT=re.compile(json_scan.nested(self.depth), re.S),
                CONTAINERS=re.compile(rb"(?:[^\[{]*+[\[{]){%d}" % self.containers)), \
                mock.patch.object(json_hops, "HOPS", self.hops):
            yield


limits = st.builds(Limits, depth=st.sampled_from([0, 1, 2, json_scan.PART_DEPTH]),
                   containers=st.sampled_from([1, 3, json_scan.PART_CONTAINERS]),
                   hops=st.sampled_from([1, 2, 5, json_hops.HOPS]))


class Parsed:
    """One ``loads`` driven to its end (its runs of items parsed ``part`` bytes at most,
    and within ``limits``): its value (repr) or error (type), the bytes ``json.loads``
    was given in each step and the brackets that open in them (the containers it made),
    the most of those in one text, whether the text was parsed whole, and the steps it
    took."""

    def __init__(self, data: bytes, step: int, left: int, keep: Keep = WHOLE,
                 part: int = json_steps.PART_BYTES, limits: Limits = Limits()) -> None:
        self.fed: collections.Counter[int] = collections.Counter()
        self.made: collections.Counter[int] = collections.Counter()
        self.most_made = 0
        self.whole = False
        turn = 0
        with self._counting(data, lambda: turn), limits.applied(), \
                mock.patch.object(json_steps, "PART_BYTES", part):
            steps = loads(data, step, left, keep)
            try:
                while True:
                    next(steps)
                    turn += 1
            except StopIteration as done:
                self.outcome: tuple[str, str] = ("value", repr(done.value[0]))
            except (ValueError, RecursionError) as e:
                self.outcome = ("error", type(e).__name__)
        self.steps = turn + 1

    @contextmanager
    def _counting(self, data: bytes, turn: Any) -> Iterator[None]:
        real = json.loads

        def counted(s: str | bytes, *args: Any, **kwargs: Any) -> Any:
            self.whole = self.whole or s is data
            self.fed[turn()] += len(s)
            text = s if isinstance(s, str) else s.decode("latin-1")
            made = text.count("[") + text.count("{")
            self.made[turn()] += made
            self.most_made = max(self.most_made, made)
            return real(s, *args, **kwargs)

        with mock.patch.object(json, "loads", counted):
            yield


def whole(data: bytes, keep: Keep = WHOLE) -> tuple[str, str]:
    try:
        return ("value", repr(project(json.loads(data), keep)))
    except (ValueError, RecursionError) as e:
        return ("error", type(e).__name__)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


TRICKY = ['"', "\\", "/", "\n", "\x00", "\x1f", "\x7f", "\u00e9", "\u2028", "\U0001f600",
          "\ud83d", "\ude00", "u", "0", " ", ",", ":", "[", "]", "{", "}"]
"""Characters a cut must not split or misread: escapes, several bytes in UTF-8, the two
halves of a surrogate pair (alone, as ``json.loads`` may read them), JSON's own."""
texts = st.lists(st.sampled_from(TRICKY) | st.text(max_size=4), max_size=24).map("".join)
scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20) |
           st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 1e300]) |
           texts)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) |
                           st.dictionaries(texts, inner, max_size=6), max_leaves=40)
documents = st.lists(json_values, max_size=6) | st.dictionaries(texts, json_values,
                                                                 max_size=6)
layouts = st.sampled_from([dict(separators=(",", ":")), dict(separators=(", ", ": ")),
                           dict(indent=1), dict(indent="\t\r\n")])


def encoded(doc: Any, ascii_only: bool, layout: dict[str, Any]) -> bytes:
    # Surrogates alone are JSON (escaped) and UTF-8 to json.loads' decoder, as written so.
    return json.dumps(doc, ensure_ascii=ascii_only, **layout).encode("utf-8", "surrogatepass")


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(documents, st.booleans(), layouts, st.integers(32, 300), st.data())
def test_json_is_json_loads_value_in_steps_of_at_most_a_step(
        doc: Any, ascii_only: bool, layout: dict[str, Any], step: int,
        data: st.DataObject) -> None:
    """Any object or array, however written, any step: ``json.loads``' value (its
    types, its keys' order, a float's sign), the text never parsed whole, and no step
    given ``json.loads`` more than ``step`` bytes."""
    text = encoded(doc, ascii_only, layout)
    parsed = Parsed(text, step, data.draw(st.integers(0, step), label="left"),
                    part=data.draw(st.integers(8, 2 * step), label="part"),
                    limits=data.draw(limits, label="limits"))
    assert parsed.outcome == whole(text)
    assert not parsed.whole or len(text) <= step
    assert max(parsed.fed.values(), default=0) <= step  # a text of brackets: none


NAMES = ["a", "b", "\u00e9", 'q"']
keeps = st.recursive(st.sampled_from([WHOLE, COUNT]), lambda inner: st.builds(
    Keep, keys=st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)) | st.builds(
    Keep, items=inner), max_leaves=8)
"""What a caller keeps: some keys of objects, the items or the count of arrays."""
named = st.recursive(scalars, lambda inner: st.lists(inner, max_size=8) | st.dictionaries(
    st.sampled_from(NAMES) | texts, inner, max_size=5), max_leaves=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(st.sampled_from(NAMES), named, max_size=4) | st.lists(named, max_size=4),
       keeps, st.booleans(), st.integers(32, 96), st.data())
def test_what_is_kept_is_json_loads_value_kept_so(
        doc: Any, keep: Keep, twice: bool, step: int, data: st.DataObject) -> None:
    """Any keys, items or counts kept of any JSON (a key written twice, too): ``json.loads``'
    value, kept so; the rest parsed and dropped, the text never parsed whole."""
    text = encoded(doc, True, dict(separators=(", ", ": ")))
    if twice:
        text = text.replace(b'"a": ', b'"a": [1, {"b": 2}], "a": ', 1)
    parsed = Parsed(text, step, data.draw(st.integers(0, step), label="left"), keep,
                    part=data.draw(st.integers(8, 2 * step), label="part"),
                    limits=data.draw(limits, label="limits"))
    assert parsed.outcome == whole(text, keep)
    assert not parsed.whole or len(text) <= step


MUTANTS = [b'"', b"\\", b",", b":", b"[", b"]", b"{", b"}", b" ", b"\x0b", b"\x00", b"\xff",
           b"\x80", b"\xc3", b"\xed\xa0\x80", b"u", b"0", b"-", b"e", b"+", b".", b"n", b"t",
           b"NaN", b"\\u", b"\\ud83d", b"\xef\xbb\xbf"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(documents, st.booleans(), layouts, st.integers(32, 300), st.data())
def test_any_text_has_json_loads_value_or_error(
        doc: Any, ascii_only: bool, layout: dict[str, Any], step: int,
        data: st.DataObject) -> None:
    """JSON with bytes inserted, dropped or replaced anywhere (most of it no JSON, some
    still JSON): ``json.loads``' value, or its error."""
    text = bytearray(encoded(doc, ascii_only, layout))
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        at = data.draw(st.integers(0, len(text)), label="at")
        edit = data.draw(st.sampled_from(["insert", "drop", "replace"]), label="edit")
        new = data.draw(st.sampled_from(MUTANTS), label="bytes")
        if edit == "insert":
            text[at:at] = new
        elif edit == "drop":
            del text[at:at + len(new)]
        else:
            text[at:at + len(new)] = new
    parsed = Parsed(bytes(text), step, step, part=data.draw(st.integers(8, 2 * step)),
                    limits=data.draw(limits, label="limits"))
    assert parsed.outcome == whole(bytes(text))


@pytest.mark.parametrize("item", [b'{"w": -1.25}', b'"w"', b"[1, 2]", b"12"],
                         ids=["object", "string", "array", "number"])
@pytest.mark.parametrize("members", [False, True], ids=["items", "members"])
def test_a_run_cut_right_after_an_item_ends_before_it(item: bytes, members: bool) -> None:
    """A step's end, or a part's, that falls right after an item, its comma past it, at
    every offset: the run ends at the item before, and the text takes a step a step's
    bytes (a walk item by item took one a few items, 1,000 steps for 20 KiB)."""
    if members:
        text = b"{" + b", ".join(b'"k%d": %s' % (i, item) for i in range(1_500)) + b"}"
    else:
        text = b"[" + b", ".join([item] * 1_500) + b"]"
    for step in range(64, 64 + 3 * len(item) + 12):
        for part in (step - 2, 40):
            parsed = Parsed(text, step, step, part=part)
            assert parsed.outcome == whole(text)
            assert parsed.steps <= 2 * len(text) // min(step, part) + 2


@pytest.mark.parametrize("step", range(32, 64))
def test_a_string_is_cut_between_characters_never_in_an_escape_or_a_pair(step: int) -> None:
    """Every cut a step of 32-63 bytes makes through escapes, surrogate pairs (escaped,
    one alone, and text like one after an escaped backslash) and characters of 2 to 4
    bytes: the string as ``json.loads`` has it, in pieces."""
    value = ("\\u00e9\\ud83d\\ude00\\ud83d\\ud83d\\ude00\\\\u00e9\\\\ud83d\\\\\\ud83d"
             "\\ude00\\\"") * 8
    raw = "\u00e9\U0001f600\u00e9\u2028a" * 8
    text = ('{"k\\ud83d\\ude00": "' + value + '", "' + raw + '": ["' + raw + '", "' +
            value + '"]}').encode()
    parsed = Parsed(text, step, step)
    assert parsed.outcome == whole(text)
    assert not parsed.whole


def test_a_key_written_twice_keeps_its_last_value_at_its_first_place() -> None:
    """In one part and across parts, as ``json.loads`` has it."""
    text = (b'{"a": 1, "b": [' + b"2, " * 40 + b'2], "a": {"c": 3}, "a": [' + b"4, " * 40 +
            b'4], "d": 5, "b": 6}')
    parsed = Parsed(text, 48, 48)
    assert parsed.outcome == whole(text)
    assert json.loads(text) == {"a": [4] * 41, "b": 6, "d": 5}


@pytest.mark.parametrize(("text", "outcome"), [
    (b"\xef\xbb\xbf" + json.dumps({"a": ["x" * 10] * 20}).encode(), "value"),
    (json.dumps({"a": ["x" * 10] * 20}).encode("utf-16"), "value"),
    (json.dumps({"a": ["x" * 10] * 20}).encode("utf-16-le"), "value"),
    (b"[" * 5000 + b"]" * 5000, "error"),
    (b'{"a": ' + b"1" * 5000 + b"}", "error"),
    (b'{"a": 1' + b"0" * 500 + b".5}", "value"),
    (b'"' + b"x" * 500 + b'"', "value"),
    (b"  \n" + json.dumps(["x" * 10] * 20).encode() + b"\r\n\t", "value"),
    (json.dumps(["x" * 10] * 20).encode() + b"\x0c", "error"),
    (json.dumps(["x" * 10] * 20).encode() + b"[]", "error"),
], ids=["utf-8-bom", "utf-16", "utf-16-le", "past-recursion",
        "int-past-4300-digits", "number-past-a-step", "not-a-container", "json-spaces",
        "form-feed-after", "more-after"])
def test_what_the_steps_do_not_split_is_parsed_whole(text: bytes, outcome: str) -> None:
    """``json.loads``' encodings, depth and numbers, and the text around its value:
    parsed whole, its value or error ``json.loads``' own."""
    parsed = Parsed(text, 64, 64)
    assert parsed.outcome == whole(text)
    assert parsed.outcome[0] == outcome


@pytest.mark.parametrize("text", [
    b'{"a": [' + b'"x", ' * 30 + b'"x",]}',
    b'{"a": "' + b"x" * 200 + b'\n"}',
    b'{"a": "' + b"x" * 200 + b'\\x"}',
    b'{"a": "' + b"x" * 200 + b'\\ud83"}',
    b'{"a": "' + b"x" * 200 + b'\xc3"}',
    b'{"a": "' + b"x" * 200 + b'\xed\xa0\x80"}',
    b'{"a": [' + b"1, " * 60 + b"01]}",
    b'{"a": [' + b"1, " * 60 + b"tru]}",
    b'{"a": [' + b"1, " * 60 + b"1}",
    b'{"a" [' + b"1, " * 60 + b"1]}",
    b'{"a": [' + b"1, " * 60 + b"1]",
    b'{"a": [' + b"1, " * 60 + b",1]}",
    b'{"a": [' + b"1, " * 60 + b"1], , " + b'"b": 1' * 20 + b"}",
    b'{"a": [' + b"1, " * 60 + b"1] " + b'"b": [' + b"1, " * 60 + b"1]}",
], ids=["trailing-comma", "control-character", "bad-escape", "cut-escape", "cut-utf-8",
        "surrogate-in-utf-8", "leading-zero", "bad-literal", "mismatched", "no-colon",
        "unclosed", "two-commas", "two-commas-between-members", "no-comma"])
def test_json_loads_error_is_its_own(text: bytes) -> None:
    """Where a part is no JSON: the whole is none, with ``json.loads``' error (a
    surrogate written in UTF-8 is one it reads)."""
    parsed = Parsed(text, 64, 64)
    assert parsed.outcome == whole(text)


@pytest.mark.parametrize("item", [[[[[0]]]], [[], {}, [1]], {"a": [{}]}],
                         ids=["nested", "empty", "mixed"])
def test_a_part_of_brackets_makes_few_containers(item: Any) -> None:
    """Containers a few bytes each: a part makes ``PART_CONTAINERS`` at most (and its
    own), a step as many as its bytes at ``CONTAINER_BYTES`` each. By bytes alone, a part
    of 8 KiB made 2,000-4,000, which outlived the garbage collector's young generation,
    and a step of 64 KiB 30,000: steps of 4-24 ms."""
    text = json.dumps([item] * 12_000, separators=(",", ":")).encode()
    step = 1 << 16
    parsed = Parsed(text, step, step)
    assert parsed.outcome == whole(text)
    assert parsed.most_made <= json_scan.PART_CONTAINERS + 1
    assert max(parsed.made.values()) <= step // json_steps.CONTAINER_BYTES + \
        json_scan.PART_CONTAINERS + 1
