"""``json_steps.loads`` of containers both longer than a part and nested deeper than its
pattern takes: a client's JSON Schema nested 300 deep in 12 KiB (one of its ``tools``,
which vLLM echoes in ``response.created`` and ``response.completed``), arrays or objects
nested hundreds deep around a long list, or deeper than ``json.loads`` takes at all.

Such a container was walked level by level down to where its items fit a part: tens of
calls of Python a level, 139-159 ms of the meter's loop for 0.76 MiB of such tools where
``json.loads`` takes 11.5 ms, for any client that sends them. Its work is counted in calls
(Python's and C's, as ``test_json_steps_depth`` counts them), per KiB of the text, whatever
its depth; its value, or its error, is ``json.loads``' own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter import json_scan, json_steps
from slopilot.engine.meter.json_steps import WHOLE, Keep, project
from slopilot.engine.meter.stream_judge import READS, STEP_BYTES, StreamJudge, Verdict, Wire
from slopilot.engine.slo import ClassSLO
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_json_steps import (
    MUTANTS,
    Parsed,
    encoded,
    json_values,
    layouts,
    limits,
    texts,
    whole,
)
from tests.engine.meter.test_json_steps_depth import calls, calls_a_step, created, nested

CALLS_PER_KIB = 80
"""The calls a KiB of such a text may take, at any depth: ``json.loads``' own work is per
byte (a container for some 8 of them); runs of a client's tools that fit parts take up to
25 a KiB (``test_json_steps_depth``), these 27-76 (arrays and objects in turn, each with
containers beside the one deeper, the most)."""
LONG = list(range(2_500))
"""A list of 10 KiB: longer than a part (8 KiB)."""


def schema(depth: int) -> dict[str, Any]:
    """A JSON Schema of objects ``2 * depth + 1`` levels deep, each described and each in
    its ``properties`` (``benchmarks/long_event_cost.py``'s ``deeper`` case's)."""
    value: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        value = {"type": "object", "description": f"Level {i}.",
                 "properties": {f"p{i}": value}, "required": [f"p{i}"]}
    return value


def mixed(depth: int, inner: Any) -> Any:
    """Arrays and objects in turn, each with items before and after the one deeper
    (containers among them)."""
    for i in range(depth):
        inner = ([1, {"k": [2, "s"]}, inner, {"z": []}, 3] if i % 2 else
                 {"a": 1, "b": [2, [3]], "c": inner, "d": {"e": None}})
    return inner


def quoted(depth: int, inner: Any) -> Any:
    """Objects whose keys and strings hold brackets, quotes, escapes and what looks like
    the placeholder a part might use (``NaN``, ``Infinity``)."""
    for i in range(depth):
        inner = {'[{"k': '"]}\\', f"n{i}": inner, "u": "\\u005d\u00e9\U0001f600 NaN",
                 "-Infinity": ["}", "{", "[[", '\\"]']}
    return inner


def numbers(depth: int, inner: Any) -> Any:
    """Arrays of numbers of every form around the one deeper."""
    for _ in range(depth):
        inner = [1.5e300, -0.0, 12345678901234567890, inner, -1e-300, 0, True, None]
    return inner


LONG_DEEP = {
    "schema-300": schema(150),
    "arrays-300": nested(LONG, 300),
    "arrays-800": nested(LONG, 800),
    "objects-300": nested(LONG, 300, "a"),
    "mixed-300": mixed(300, LONG),
    "quoted-300": quoted(300, ["]}{[" + str(i) + '\\"' for i in range(1_200)]),
    "numbers-300": numbers(300, [i / 7 for i in range(600)]),
    "long-at-each-level": mixed(60, [LONG] * 2),
}
"""Containers longer than a part and nested deeper than its pattern, 14-50 KB each."""


@pytest.mark.parametrize("keep", [WHOLE, READS[Wire.RESPONSES]], ids=["whole", "reads"])
@pytest.mark.parametrize("item", LONG_DEEP)
def test_a_long_and_deep_container_costs_per_kib_not_per_level(item: str, keep: Keep) -> None:
    """A Responses event echoing such tools: ``json.loads``' value, in a number of calls
    bounded by its KiB. Walked level by level, a schema nested 300 deep in 12 KiB took
    ~1,000 calls a KiB, arrays nested 800 deep around a list of 10 KiB ~2,500."""
    text = long_deep(item)
    value, made = calls(text, 1 << 16, keep)
    assert value == project(json.loads(text), keep)
    assert made <= CALLS_PER_KIB * (len(text) >> 10)


def long_deep(item: str) -> bytes:
    """A Responses event echoing 150 KB of one of ``LONG_DEEP`` (two of them at least)."""
    return created([LONG_DEEP[item]] * max(2, 150_000 // len(json.dumps(LONG_DEEP[item]))))


@pytest.mark.parametrize("item", LONG_DEEP)
def test_a_long_and_deep_containers_steps_are_as_short_as_others(item: str) -> None:
    """What bounds any step still bounds theirs: at most a step's bytes given to
    ``json.loads``, ``PART_CONTAINERS`` (and its own) in one part, and as many calls as
    a step of items nested deeper than a part may take (``test_json_steps_depth``; these
    take 700-1,700)."""
    text, keep = long_deep(item), READS[Wire.RESPONSES]
    parsed = Parsed(text, 1 << 16, 1 << 16, keep)
    assert parsed.outcome == whole(text, keep)
    assert not parsed.whole
    assert max(parsed.fed.values()) <= 1 << 16
    if item != "arrays-800":  # whose depth json.loads is asked of, in as many brackets
        assert parsed.most_made <= json_scan.PART_CONTAINERS + 1
    _, made = calls_a_step(text, 1 << 16, keep)
    assert max(made.values()) <= 10_000


def too_deep(item: str, depth: int) -> bytes:
    """``LONG`` nested ``depth`` deep, as ``json.dumps`` writes it (which refuses to)."""
    inner = json.dumps(LONG).encode()
    if item == "arrays":
        return b"[" * depth + inner + b"]" * depth
    if item == "objects":
        return b'{"a": ' * depth + inner + b"}" * depth
    level = b'{"type": "object", "description": "Level.", "properties": {"p": '
    return level * (depth // 2) + inner + b'}, "required": ["p"]}' * (depth // 2)


@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    """``json.loads`` goes as deep as the interpreter's recursion limit, and Hypothesis
    raises that limit while its tests run, leaving it raised where it was changed
    meanwhile: a full suite's worker read 2,000 levels whole after one. These tests are of
    CPython's default."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


@pytest.mark.usefixtures("default_recursion_limit")
@pytest.mark.parametrize("depth", [1_000, 2_000])
@pytest.mark.parametrize("item", ["arrays", "objects", "schema"])
def test_a_long_container_deeper_than_json_loads_takes_is_its_recursion_error(
        item: str, depth: int) -> None:
    """Past the interpreter's recursion limit ``json.loads`` refuses a text: the steps
    find so as their walk goes down (``json_steps.DEPTH``) and parse the text whole, for
    ``json.loads``' own ``RecursionError``, in a number of calls bounded by its KiB (the
    walk went down level by level first, ~2,000 calls a KiB)."""
    text = created(["@", *[LONG_DEEP["schema-300"]] * 4]).replace(
        b'"@"', too_deep(item, depth), 1)
    parsed = Parsed(text, 1 << 16, 1 << 16)
    assert parsed.outcome == whole(text) == ("error", "RecursionError")
    assert parsed.whole
    assert calls_to_error(text) <= CALLS_PER_KIB * (len(text) >> 10)


def test_a_long_and_deep_container_kept_whole_is_whole_all_the_way_down() -> None:
    """Kept whole because its place keeps another kind (an object where an array's items
    are kept): each of its containers too, however deep, whatever that keep says of
    their kinds."""
    inner = [[{"b": 1, "c": 2}]] * 3_000
    doc = {"a": nested(inner, 200, "k"), "z": 1}
    keep = Keep(keys={"a": Keep(items=Keep(keys={"b": WHOLE})), "z": WHOLE})
    text = json.dumps(doc).encode()
    parsed = Parsed(text, 1 << 14, 1 << 14, keep)
    assert parsed.outcome == whole(text, keep)
    assert not parsed.whole


def calls_to_error(text: bytes) -> int:
    """The calls (Python's and C's) ``loads`` made up to its ``RecursionError``."""
    made = [0]

    def profiled(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            made[0] += 1

    steps = json_steps.loads(text, 1 << 16, 1 << 16)
    sys.setprofile(profiled)
    try:
        with pytest.raises(RecursionError):
            for _ in steps:
                pass
    finally:
        sys.setprofile(None)
    return made[0]


def judged_created(tools: bytes) -> list[Verdict]:
    """The verdicts of a Responses stream of 3 tokens whose ``response.created`` echoes
    ``tools``, each event read in its steps as the proxy reads it."""
    s = wire.ResponsesStream()
    first = s.created().replace(b'"tools":[]', b'"tools":' + tools, 1)
    assert len(first) > STEP_BYTES
    judge = StreamJudge(ClassSLO(ttft_p99_ms=60_000, tbt_p99_ms=60_000), 0.0,
                        wire=Wire.RESPONSES)
    for event, at in [(first, 0.05), (s.message_added(), 0.2), (s.text("a"), 0.2),
                      (s.text("bc"), 0.25), (s.completed(3), 0.3)]:
        for _ in judge.read_steps(event, at):
            pass
    return judge.verdicts(1.0)


@pytest.mark.usefixtures("default_recursion_limit")
def test_a_held_event_too_deep_for_json_loads_leaves_the_stream_unjudged() -> None:
    """The client's own parser refuses the event (``RecursionError``): the judge does
    too, and judges none of the stream, its loop not broken; 300 deep, it is judged."""
    schemas = json.dumps([LONG_DEEP["schema-300"]] * 8).encode()
    assert judged_created(b"[" + too_deep("arrays", 2_000) + b", " + schemas[1:]) == []
    assert judged_created(schemas) == [Verdict(True, 3)]


def chain(levels: list[tuple[bool, list[Any], list[Any]]], inner: Any) -> Any:
    """``inner`` in a container a level, outermost first: an array or an object (each
    member a key of its own), the items before the one deeper and those after it."""
    for is_array, before, after in reversed(levels):
        if is_array:
            inner = [*before, inner, *after]
        else:
            members = [*before, inner, *after]
            inner = {f"k{i}": v for i, v in enumerate(members)}
    return inner


levels = st.lists(st.tuples(st.booleans(), st.lists(json_values, max_size=1),
                            st.lists(json_values, max_size=2)), min_size=3, max_size=40)
"""Containers one in another, each with a few items beside the one deeper."""
long_deep_values = st.builds(chain, levels,
                             st.lists(json_values | texts, min_size=4, max_size=40))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(long_deep_values, st.booleans(), layouts, st.integers(32, 300), st.data())
def test_a_long_and_deep_text_is_json_loads_value_or_error_in_steps(
        doc: Any, ascii_only: bool, layout: dict[str, Any], step: int,
        data: st.DataObject) -> None:
    """Any chain of containers, each with any items beside the one deeper, around a list
    longer than a part (parts of 8 bytes and up, steps of 32 bytes and up, a part's
    pattern of 0-2 levels), as written or with bytes inserted, dropped or replaced:
    ``json.loads``' value or error, and no step gives ``json.loads`` more than its
    bytes."""
    text = bytearray(encoded(doc, ascii_only, layout))
    edits = data.draw(st.integers(0, 2), label="edits")
    for _ in range(edits):
        at = data.draw(st.integers(0, len(text)), label="at")
        new = data.draw(st.sampled_from(MUTANTS), label="bytes")
        text[at:at + data.draw(st.integers(0, 2), label="dropped")] = new
    parsed = Parsed(bytes(text), step, data.draw(st.integers(0, step), label="left"),
                    part=data.draw(st.integers(8, 2 * step) | st.just(2 * step), label="part"),
                    limits=data.draw(limits, label="limits"))
    assert parsed.outcome == whole(bytes(text))
    assert edits or not parsed.whole or len(text) <= step
    assert parsed.whole or max(parsed.fed.values(), default=0) <= step
