"""``json_steps.loads`` of texts nested deeper than a part holds (5 levels in its
brackets): a client's JSON, which vLLM writes back in a held event (a Responses tool's
JSON Schema, in ``response.created``, ``response.in_progress`` and ``response.completed``),
nested as deep as the client likes, its items as many as it likes.

Walked container by container where a part cannot take them, such texts are still
``json.loads``' value, or its error, and parsed in steps, at a cost per step bounded by
the bytes parsed and the containers walked, not by the items.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

import pytest

from slopilot.engine.meter import json_scan, json_steps
from slopilot.engine.meter.json_steps import DEPTH, WHOLE, Keep, project
from slopilot.engine.meter.stream_judge import READS, Wire
from tests.engine.meter.test_json_steps import Parsed, depth, whole


def nested(value: Any, depth: int, key: str | None = None) -> Any:
    """``value`` in ``depth`` arrays (objects of ``key``, where given)."""
    for _ in range(depth):
        value = [value] if key is None else {key: value}
    return value


def created(tools: Any, **more: Any) -> bytes:
    """vLLM's ``response.created`` echoing a client's ``tools``."""
    return json.dumps({"type": "response.created", "sequence_number": 0, "response": {
        "id": "resp_7", "model": "llama", "status": "in_progress", "tools": tools,
        "output": [], **more}}, separators=(",", ":")).encode()


SMALL_DEEP = {"arrays": nested(0, 7), "objects": nested(0, 7, "a"),
              "empty-arrays": nested([], 6), "schema": {"type": "object", "properties": {
                  "a": {"type": "object", "properties": {"b": {"type": "array", "items": {
                      "type": "object", "properties": {"c": {"type": "string"}}}}}}}}}
"""Items of a few bytes each, nested deeper than a part holds."""


@pytest.mark.parametrize("keep", [WHOLE, READS[Wire.RESPONSES]], ids=["whole", "reads"])
@pytest.mark.parametrize("item", SMALL_DEEP)
def test_small_items_nested_deeper_than_a_part_share_a_step(item: str, keep: Keep) -> None:
    """Thousands of them, each walked alone, many a step: one took a step of its own
    where the step under way had less than a whole step left (60,000 steps for an event
    just under 1 MiB, each a turn of the loop that every stream's relay waits on)."""
    text = created([SMALL_DEEP[item]] * 6_000)
    parsed = Parsed(text, 1 << 16, 1 << 16, keep)
    assert parsed.outcome == whole(text, keep)
    assert not parsed.whole
    assert parsed.steps <= 6_000 // 5



def calls_a_step(data: bytes, step: int, keep: Keep) -> tuple[Any, collections.Counter[int]]:
    """``loads``' value, and the calls (Python's and C's) made in each of its steps: a
    step's work in the interpreter, which its bytes do not say where the walk takes
    tokens one by one."""
    calls: collections.Counter[int] = collections.Counter()
    turn = 0

    def profiled(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[turn] += 1

    steps = json_steps.loads(data, step, step, keep)
    sys.setprofile(profiled)
    try:
        while True:
            next(steps)
            turn += 1
    except StopIteration as done:
        return done.value[0], calls
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize("item", SMALL_DEEP)
def test_a_step_walks_a_bounded_number_of_tokens(item: str) -> None:
    """Items a few bytes long nested deeper than a part, taken by the walk bracket by
    bracket: a step's bytes held 5,000 of them, 300,000 calls (a step of 50-750 ms). At
    most ``TOKENS`` a step, a few dozen calls each: a step as long as one of vLLM's
    logprobs, parts of 8 KiB parsed by ``json.loads`` (hundreds of calls, ~1 ms)."""
    keep = READS[Wire.RESPONSES]
    text = created([SMALL_DEEP[item]] * 6_000)
    value, calls = calls_a_step(text, 1 << 16, keep)
    assert value == project(json.loads(text), keep)
    assert max(calls.values()) <= 10_000


LOGPROBS = [{"token": f" w{i}", "logprob": -1.25, "bytes": [32, 119], "top_logprobs": []}
            for i in range(400)]


@pytest.mark.parametrize("depth", [DEPTH + 1, 200, 800])
def test_a_text_nested_deeper_than_vllms_json_is_parsed_in_steps(depth: int) -> None:
    """A tool's JSON Schema nested past ``DEPTH`` (vLLM's own JSON goes 7 deep), in an
    event of a step's bytes and more: ``json.loads``' value, in steps. It was parsed
    whole in one step, the stall of ``json.loads`` on the event (8-35 ms for 1 MiB),
    for any client that sent one. (Whether ``json.loads`` takes its depth is asked of it
    by a text of as many brackets, a part that a step of 4 KiB holds.)"""
    step = 1 << 12
    text = created([{"type": "function", "name": "f", "parameters": nested(
        {"type": "string"}, depth, "items")}], output=[{"content": [{"logprobs": LOGPROBS}]}])
    for keep in (WHOLE, READS[Wire.RESPONSES]):
        parsed = Parsed(text, step, step, keep)
        assert parsed.outcome == whole(text, keep)
        assert not parsed.whole
        assert max(parsed.fed.values()) <= step


def schema(depth: int) -> dict[str, Any]:
    """A JSON Schema of objects ``2 * depth + 1`` levels deep (each in its ``properties``)."""
    value: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        value = {"type": "object", "properties": {f"p{i}": value}, "required": [f"p{i}"]}
    return value


def tool(depth: int) -> dict[str, Any]:
    return {"type": "function", "name": "lookup", "description": "Looks a thing up.",
            "parameters": schema(depth), "strict": False}


def calls(data: bytes, step: int, keep: Keep) -> tuple[Any, int]:
    """``loads``' value, and the calls (Python's and C's) it made in all its steps."""
    value, counted = calls_a_step(data, step, keep)
    return value, sum(counted.values())


@pytest.mark.parametrize("keep", [WHOLE, READS[Wire.RESPONSES]], ids=["whole", "reads"])
@pytest.mark.parametrize("depth", [4, 8])
def test_a_clients_tools_nested_deeper_than_vllms_json_are_parsed_in_parts(
        depth: int, keep: Keep) -> None:
    """A Responses event echoing a client's tools, JSON Schemas of objects 10 and 18 levels
    deep in each tool: runs of whole tools parsed by ``json.loads`` as parts, as vLLM's
    own logprobs are, a few dozen calls for each 8 KiB. They were walked container by
    container, their keys and brackets token by token in Python: 15-50 times
    ``json.loads``' CPU (450-480 ms of the meter's loop for an event of 0.9 MiB, each time
    vLLM echoed it), 15,000-23,000 calls for each 8 KiB."""
    text = created([tool(depth) for _ in range(1_000)])
    value, made = calls(text, 1 << 16, keep)
    assert value == project(json.loads(text), keep)
    assert made <= 200 * (len(text) // json_steps.PART_BYTES + 1)


def chain(depth: int) -> Any:
    """An array of a number and the array one level deeper: each level a hop of its own
    for a pattern that takes brackets and keys only."""
    value: Any = 0
    for _ in range(depth):
        value = [0, value]
    return value


DEEPER = {"arrays": nested(0, 3 * json_scan.PART_DEPTH),
          "objects": nested(0, 3 * json_scan.PART_DEPTH, "a"),
          "chain": chain(3 * json_scan.PART_DEPTH),
          "schema": schema(json_scan.PART_DEPTH + 16)}
"""Items nested past ``PART_DEPTH``, three times over (a JSON Schema past it by 33)."""


@pytest.mark.parametrize("keep", [WHOLE, READS[Wire.RESPONSES]], ids=["whole", "reads"])
@pytest.mark.parametrize("item", DEEPER)
def test_items_nested_past_a_part_are_hopped_through(item: str, keep: Keep) -> None:
    """Items nested deeper than a part's pattern takes, short enough for a part: their
    ends found by hops, a few compiled patterns for a chain of containers or a level of
    a JSON Schema, and the items parsed in runs, 4 calls a level of each at most. Walked
    level by level, they took 20 calls a level and more, for any client that sent a
    tool's schema so deep."""
    items = 300_000 // len(json.dumps(DEEPER[item]))
    text = created([DEEPER[item]] * items)
    value, made = calls(text, 1 << 16, keep)
    assert value == project(json.loads(text), keep)
    assert made <= 4 * depth(DEEPER[item]) * items
