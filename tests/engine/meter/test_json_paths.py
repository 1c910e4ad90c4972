"""``json_paths``: a JSON text's values at its paths, as ``json.loads`` has them, however
the text is split, in bounded memory, and None where the text is no JSON."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter.json_paths import DEPTH_KEPT, ITEMS, MEMBERS, PathScan, Read

WHOLE = Read(limit=1 << 20)
PATHS = Read(keys={
    "type": WHOLE, "status": Read(limit=16),
    "response": Read(keys={"status": WHOLE, "usage": Read(keys={"output_tokens": WHOLE})}),
    "choices": Read(items=Read(keys={"index": WHOLE, "delta": Read(keys={"content": WHOLE})})),
})


def project(value: Any, path: Read) -> Any:
    """``value`` (a whole one, ``json.loads``') at ``path``'s paths only."""
    if path.keys and isinstance(value, dict):
        return {k: project(v, path.keys[k]) for k, v in value.items() if k in path.keys}
    if path.items is not None and isinstance(value, list):
        return [project(v, path.items) for v in value]
    return value


def scanned(pieces: Iterable[bytes], path: Read = PATHS) -> Any:
    scan = PathScan(path)
    for piece in pieces:
        scan.feed(piece)
    scan.end()
    return scan.value()


def splits(data: bytes, most: int = 400) -> Iterable[list[bytes]]:
    """``data`` whole, in two at every offset (at ``most`` of them, evenly spread), and
    byte by byte."""
    yield [data]
    for cut in range(1, len(data), max(1, len(data) // most)):
        yield [data[:cut], data[cut:]]
    yield [data[i:i + 1] for i in range(len(data))]


scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=12)
keys = st.sampled_from(["type", "status", "response", "usage", "output_tokens",
                        "choices", "index", "delta", "content", 'st"atus', "a\\b",
                        "\u00e9t\u00e9", "x" * 70]) | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    keys, inner, max_size=5), max_leaves=25)


def with_keys(read: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of the keys ``read`` and others, in any order."""
    return st.tuples(st.dictionaries(keys, json_values, max_size=3),
                     st.fixed_dictionaries({}, optional=read)).flatmap(
        lambda both: st.permutations(list({**both[0], **both[1]}.items()))).map(dict)


choice = with_keys({"index": json_values,
                    "delta": with_keys({"content": json_values}) | json_values})
documents = with_keys({
    "type": json_values, "status": json_values, "x": st.dictionaries(keys, json_values),
    "response": with_keys({"status": json_values, "usage": with_keys(
        {"output_tokens": json_values}) | json_values}) | json_values,
    "choices": st.lists(choice | json_values, max_size=ITEMS + 1) | json_values})


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(documents, st.booleans(), st.booleans())
def test_the_values_at_the_paths_are_json_loads_ones_however_split(
        doc: dict[str, Any], ascii_only: bool, spaced: bool) -> None:
    """Any document (the paths' keys inside other values too, keys escaped or not,
    spaces or none): its values at the paths, whole or split at any byte."""
    separators = (", ", ": ") if spaced else (",", ":")
    data = json.dumps(doc, ensure_ascii=ascii_only, separators=separators).encode()
    choices = doc.get("choices")
    many = isinstance(choices, list) and len(choices) > ITEMS
    want = None if many else project(doc, PATHS)
    if "status" in doc and len(json.dumps(doc["status"], ensure_ascii=ascii_only,
                                          separators=separators).encode()) > 16:
        return  # past its limit: test_a_value_past_its_limit_stands_as_its_kind
    for pieces in splits(data):
        assert scanned(pieces) == want, pieces


def test_keys_inside_other_values_are_not_the_paths() -> None:
    """A JSON Schema echoed inside a value off the paths, before and after the real
    keys: the paths' values are the real ones, wherever the others are."""
    hostile = {"status": "cancelled", "type": "error", "response": {"status": "failed"},
               "usage": {"output_tokens": 1}, "output_tokens": 1}
    doc = {"tools": [{"parameters": {**hostile, "default": hostile}}],
           "type": "response.completed",
           "response": {"metadata": hostile, "status": "completed", "text": hostile,
                        "usage": {"output_tokens": 3, "details": hostile}, "x": [hostile]},
           "after": hostile}
    data = json.dumps(doc, separators=(",", ":")).encode()
    want = {"type": "response.completed",
            "response": {"status": "completed", "usage": {"output_tokens": 3}}}
    for pieces in splits(data):
        assert scanned(pieces) == want


@pytest.mark.parametrize(("value", "want"), [
    ("cancelled-and-more", "cancelled-and-m"),
    ("\u00e9" * 20, "\u00e9" * 7),
    ('\\"' * 20, '\\"' * 3 + "\\"),
    ({"a": 1, "b": 2, "c": 3}, {"...": None}),
    ([1, 2, 3, 4, 5, 6, 7, 8], [None]),
], ids=["string", "utf-8", "escapes", "object", "array"])
def test_a_value_past_its_limit_stands_as_its_kind(value: Any, want: Any) -> None:
    """Its first bytes of a string (a character or escape they cut left out); a
    non-empty one of an object or array: what its kind and its having any say."""
    data = json.dumps({"status": value}, ensure_ascii=False).encode()
    for pieces in splits(data):
        assert scanned(pieces) == {"status": want}


def test_a_number_past_its_limit_is_no_value_read() -> None:
    assert scanned([b'{"status": 12345678901234567890}']) is None


@pytest.mark.parametrize("data", [
    b"", b"   ", b'{"type": "a"', b'{"type": "a"}}', b'{"type": "a"} x', b'{"type" "a"}',
    b'{"type": "a" "b": 1}', b'{"type": "a",}', b'{"type": }', b'{"type": "a]',
    b'{"x": [1, 2}}', b'{"x": {"y": [}]}', b'{"type": tru}', b'{"type": "\\x"}',
    b'{"st\\x": 1}', b'{, "type": 1}', b'{"choices": [1,]}', b'{"choices": [,1]}',
    b'{"x": "unterminated}', b'{"x": [[[[[[[[[[[[1]]]]]]]]]]]}', b"]", b'{"type": :}',
    b'{"response": {"status": "a"]}', b'{"x": 1]',
], ids=lambda d: d.decode())
def test_text_that_is_no_json_has_no_value(data: bytes) -> None:
    """As ``json.loads`` has none: whole or split anywhere."""
    with pytest.raises(ValueError):
        json.loads(data)
    for pieces in splits(data):
        assert scanned(pieces) is None


@pytest.mark.parametrize("data", [
    b'{"choices": [' + b"1," * ITEMS + b"1]}",
    b"{" + b",".join(b'"k%d": 1' % i for i in range(MEMBERS + 1)) + b"}",
], ids=["items", "keys"])
def test_more_items_or_keys_along_the_paths_than_vllm_writes_are_no_value(
        data: bytes) -> None:
    """JSON, but not vLLM's: none of its objects or arrays along the paths is so long,
    and walked, each of their items takes steps in Python (below the paths, none)."""
    json.loads(data)
    assert scanned([data]) is None
    assert scanned([b'{"x": ' + data + b', "type": 1}']) == {"type": 1}


def test_brackets_are_matched_to_the_depth_kept_and_counted_below() -> None:
    """Mismatched within ``DEPTH_KEPT`` levels: no JSON. Deeper, only their count is
    kept (no value there is read), and a text that closes them all reads alike."""
    deep = b"[" * (DEPTH_KEPT + 5)
    closing = b"]" * (DEPTH_KEPT + 5)
    assert scanned([b'{"x": ' + deep + closing + b', "type": 1}']) == {"type": 1}
    assert scanned([b'{"x": ' + deep[:-1] + b"{" + closing + b', "type": 1}']) == {"type": 1}
    mismatched = b"[" * 10 + b"}" + b"]" * 9
    assert scanned([b'{"x": ' + mismatched + b', "type": 1}']) is None


def test_deep_nesting_needs_no_recursion_and_little_memory() -> None:
    """10,000 levels in a value off the paths and in one read whole (held to its limit,
    stood in for past it)."""
    deep = b"[" * 10_000 + b"]" * 10_000
    data = b'{"x": ' + deep + b', "status": ' + deep + b', "type": "t"}'
    tracemalloc.start()
    try:
        got = scanned(data[i:i + 997] for i in range(0, len(data), 997))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == {"type": "t", "status": [None]}
    assert peak < 64 << 10


@pytest.mark.parametrize("where", ["off-the-paths", "read", "a-key"])
def test_a_long_string_is_never_held(where: bytes) -> None:
    """16 MiB of one string, in 64 KiB reads: a value off the paths, one read (its
    limit kept), a key (none of the paths' once past 64 bytes)."""
    body = b"\\\"ab\\u00e9" * ((16 << 20) // 10)
    reads = [body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16)]
    head = {"off-the-paths": b'{"x": "', "read": b'{"status": "', "a-key": b'{"'}[where]
    tail = {"a-key": b'": 1, "type": "t"}'}.get(where, b'", "type": "t"}')
    scan = PathScan(PATHS)
    scan.feed(head)
    tracemalloc.start()
    try:
        for piece in reads:
            scan.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    scan.feed(tail)
    scan.end()
    want: dict[str, Any] = {"type": "t"}
    if where == "read":
        want["status"] = '"ab\u00e9"ab'  # its first 15 bytes but a cut escape
    assert scan.value() == want
    assert peak < 16 << 10


def test_a_key_written_twice_reads_its_last_value_as_json_loads_does() -> None:
    data = (b'{"type": "a", "response": {"status": "x", "usage": {"output_tokens": 1}},'
            b' "type": "b", "response": {"usage": {"output_tokens": 2}}}')
    want = json.loads(data)
    assert want == {"type": "b", "response": {"usage": {"output_tokens": 2}}}
    for pieces in splits(data):
        assert scanned(pieces) == want
