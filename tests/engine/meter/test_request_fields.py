"""``request_fields``: a body's top-level fields and its prompts' count, as ``json.loads``
has them, in steps of any size, and None where the body is no JSON object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter.request_fields import DEPTH, TOO_LONG, VALUE_BYTES, read, scan

KEYS = frozenset({"stream", "n", "stream_options", "max_tokens"})


def loaded(body: bytes) -> tuple[dict[str, Any], int | None] | None:
    """What the scan should find, by ``json.loads``: the keys read, and the prompts of a
    list of strings and lists (a batch's)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    prompt = data.get("prompt")
    batch = isinstance(prompt, list) and prompt and all(
        isinstance(p, str | list) for p in prompt)
    return {k: v for k, v in data.items() if k in KEYS}, len(prompt) if batch else None


def stepped(body: bytes, step: int) -> tuple[dict[str, Any], int | None] | None:
    steps = scan(body, KEYS, "prompt", step=step)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            found = done.value
            return None if found is None else (found.values, found.counted)


scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(alphabet='ab"\\,[]{}: \n\u00e9', max_size=8)
keys = st.sampled_from(["stream", "n", "stream_options", "max_tokens", "prompt", "model",
                        'str"eam', "x" * 70]) | st.text(max_size=6)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    keys, inner, max_size=4), max_leaves=20)
prompts = st.lists(st.text(alphabet='ab"\\,[]{} ', max_size=6)
                   | st.lists(st.integers(0, 99), max_size=4) | values, max_size=12)
bodies = st.dictionaries(keys, values, max_size=5).flatmap(
    lambda d: st.one_of(st.just(d), prompts.map(lambda p: {**d, "prompt": p})))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(bodies, st.integers(1, 40), st.sampled_from([None, 0, 2]), st.booleans())
def test_the_fields_are_json_loads_ones_in_steps_of_any_size(
        body: dict[str, Any], step: int, indent: int | None, ascii_only: bool) -> None:
    """Any object (the keys read inside other values too, escaped or not, spaced or not,
    a batch of prompts or another prompt), walked in steps of 1 byte up."""
    data = json.dumps(body, indent=indent, ensure_ascii=ascii_only).encode()
    assert stepped(data, step) == loaded(data)


@pytest.mark.parametrize("body", [
    b'[1, 2]', b'"x"', b'{"a": }', b'{"a": 1,}', b'{"a": 1} x', b'{"a": [1, 2}',
    b'{"a": "x', b'{"a" 1}', b'{1: 2}', b'{"n": 01x}', b'{"a": "\\q"}'.replace(b"a", b"n"),
    b'{"a": ' + b"[" * (DEPTH + 6) + b"]" * (DEPTH + 6) + b"}",
])
def test_a_body_that_is_no_json_object_is_none(body: bytes) -> None:
    assert read(body, KEYS, "prompt") is None


def test_a_key_written_twice_is_its_last_and_where_it_is_written() -> None:
    body = b'\xef\xbb\xbf {"n": 1, "stream_options": {"a": 1}, "n" : 3, ' \
           b'"stream_options" :{"b": 2} , "prompt": ["a"], "prompt": "b"}'
    found = read(body, KEYS, "prompt")
    assert found is not None
    assert found.values == {"n": 3, "stream_options": {"b": 2}} and found.counted is None
    start, end = found.spans["stream_options"]
    assert body[start:end] == b'"stream_options" :{"b": 2}'
    assert body[found.end:] == b"}"


def test_a_value_past_its_limit_stands_as_too_long() -> None:
    body = json.dumps({"stream_options": {"x": "y" * VALUE_BYTES}, "n": 2}).encode()
    found = read(body, KEYS)
    assert found is not None and found.values == {"stream_options": TOO_LONG, "n": 2}


def test_a_batchs_prompts_are_counted_without_being_made() -> None:
    """A million one-token prompts: counted in bytes a step's items take at most (the
    count's list), not the prompts' hundred MB of lists and ints."""
    import tracemalloc

    body = b'{"prompt": [' + b",".join([b"[1]", b'"a"'] * (1 << 19)) + b'], "n": 2}'
    tracemalloc.start()
    try:
        found = read(body, KEYS, "prompt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found is not None and (found.counted, found.values) == (1 << 20, {"n": 2})
    assert peak < 1 << 20
