"""An event past ``MAX_EVENT_BYTES`` is read by the keys vLLM writes, where it writes them:
what a client's request has vLLM echo is never read as the event's own.

vLLM's ``response.completed`` embeds the whole response, and the response echoes JSON
the client wrote as JSON, keys and all: its ``metadata``, its ``tools`` (JSON Schemas,
any keys, any ``default``), and its ``text.format.schema``, which vLLM writes after the
response's own ``status``. Read by the last ``status``, ``reason`` and ``output_tokens``
found anywhere in the bytes, a client that asked for logprobs (the event past 1 MiB)
chose how its own answer ended (judged, or cut short: judged only where it missed) and
its token count: the SLO loop's verdicts and histograms were the client's to bias.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from slopilot.engine.meter.long_event import REACH
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES, StreamJudge, Verdict, Wire
from slopilot.engine.slo import ClassSLO
from tests.engine.meter import vllm_wire as wire

SLO = ClassSLO(ttft_p99_ms=500, tbt_p99_ms=100)
HOSTILE: dict[str, Any] = {
    "type": "error", "status": "cancelled", "reason": "client",
    "incomplete_details": {"reason": "client"}, "output_tokens": 1,
    "usage": {"output_tokens": 1, "completion_tokens": 1}, "model": "forged",
    "response": {"status": "failed", "usage": {"output_tokens": 1}}}
"""Keys the judge reads, with values that say the answer failed, with one token."""
SCHEMA: dict[str, Any] = {
    "type": "object", **{k: v for k, v in HOSTILE.items() if k != "type"},
    "properties": {"x": {"type": "string", "default": HOSTILE, "enum": [HOSTILE]}},
    "$defs": {"status": {"const": HOSTILE}}}
"""A JSON Schema a client may send (as a tool's parameters or a response format):
vLLM echoes it as it came, JSON in JSON."""


def logprobs(entries: int = 9_000) -> list[dict[str, Any]]:
    return [{"token": f" w{i}", "logprob": -1.25, "bytes": [32, 119],
             "top_logprobs": [{"token": ' "status":"cancelled"', "logprob": -2.5,
                               "bytes": [34]}]} for i in range(entries)]


def completed(status: str, carrier: str) -> bytes:
    """vLLM's last event of an answer of 3 tokens (``status``, ``incomplete`` at its
    ``max_output_tokens``), with its logprobs (past the bound, before the fields after
    ``output``), its client's ``SCHEMA`` echoed in ``carrier``."""
    s = wire.ResponsesStream()
    event = json.loads(s.completed(3, status=status).split(b"data: ", 1)[1])
    response = event["response"]
    response["output"] = [{"type": "message", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": "abc",
                                        "logprobs": logprobs()}]}]
    if carrier == "tools":
        response["tools"] = [{"type": "function", "name": "f", "parameters": SCHEMA,
                              "strict": False, "description": None}]
    elif carrier == "metadata":
        response["metadata"] = {k: json.dumps(v) if not isinstance(v, str) else v
                                for k, v in HOSTILE.items()}
    elif carrier == "text.format.schema":
        response["text"] = {"format": {"type": "json_schema", "name": "s",
                                       "schema": SCHEMA, "strict": True}}
    else:  # after every key of vLLM's own: the response's last field
        response["input_messages"] = [SCHEMA]
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    return b"event: response.completed\ndata: " + data + b"\n\n"


CARRIERS = ["tools", "metadata", "text.format.schema", "after-usage"]


def stream(last: bytes) -> list[bytes]:
    s = wire.ResponsesStream()
    s.seq = 0
    return [s.created(), s.message_added(), s.text("a"), s.text("bc"), last]


def judged(pieces: list[bytes], at: list[float], *, wire_kind: Wire = Wire.RESPONSES,
           now: float = 1.0) -> list[Verdict]:
    judge = StreamJudge(SLO, 0.0, wire=wire_kind)
    for piece, t in zip(pieces, at, strict=True):
        judge.written(piece, t)
    return judge.verdicts(now)


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("status", ["completed", "incomplete"])
def test_a_clients_schema_echoed_in_the_response_is_not_read_as_the_response(
        carrier: str, status: str) -> None:
    """The answer finished (complete, or at its ``max_output_tokens``) on time with 3
    tokens, the client's schema saying ``cancelled``, reason ``client``, 1 token. Read
    by the last of each key anywhere, a schema after the response's status made it cut
    short (an on-time stream cut short is not judged: no verdict), and any schema after
    its ``incomplete_details`` did; one after its usage made it 1 token."""
    last = completed(status, carrier)
    assert len(last) > MAX_EVENT_BYTES
    events = stream(last)
    assert judged(events, [0.05, 0.2, 0.2, 0.25, 0.3]) == [Verdict(True, 3)]


def test_the_forged_keys_come_after_vllms_own() -> None:
    """The case the test above is about: in each carrier, the client's keys follow the
    real ones they would override, and the whole event parses to vLLM's answer."""
    for carrier in CARRIERS:
        data = completed("incomplete", carrier)
        event = json.loads(data.split(b"data: ", 1)[1])
        assert event["response"]["status"] == "incomplete"
        assert event["response"]["usage"]["output_tokens"] == 3
        text = data.decode()
        assert text.rindex('"reason"') > text.index('"incomplete_details"')
        if carrier == "text.format.schema":
            assert text.rindex('"status"') > text.index('"status":"incomplete"')
        if carrier == "after-usage":
            assert text.rindex('"output_tokens"') > text.index('"output_tokens":3')


def awkward_offsets(data: bytes, start: int) -> list[int]:
    """Where a read may split ``data`` past ``start``: around each key the judge reads,
    inside its name and its value, and at every escape of the client's strings."""
    offsets: set[int] = set()
    for key in (b'"status"', b'"reason"', b'"output_tokens"', b'"type"', b'"usage"',
                b'\\"', b'"incomplete_details"'):
        at = data.find(key, start)
        while at != -1:
            offsets.update(range(at - 1, at + len(key) + 12))
            at = data.find(key, at + 1)
    return sorted(o for o in offsets if start < o < len(data))


@pytest.mark.parametrize("carrier", ["tools", "text.format.schema", "after-usage"])
def test_a_long_event_reads_alike_however_a_read_splits_it(carrier: str) -> None:
    """Split in two at each awkward place past the bound (where the judge reads as it
    passes): inside a key, inside its value, between an escape's backslash and its
    quote. Every split reads the answer vLLM wrote."""
    last = completed("incomplete", carrier)
    events = stream(last)
    head, at = events[:-1], [0.05, 0.2, 0.2, 0.25]
    offsets = awkward_offsets(last, MAX_EVENT_BYTES + 64)
    # A sample (every offset would read the 1 MiB event thousands of times): the scan
    # itself is split at every offset in test_json_paths.
    sample = offsets[::max(1, len(offsets) // 60)]
    assert len(sample) >= 50
    for cut in sample:
        got = judged([*head, last[:cut], last[cut:]], [*at, 0.28, 0.3])
        assert got == [Verdict(True, 3)], cut


def test_a_chunks_keys_are_read_where_they_are_in_any_order() -> None:
    """A choice past the bound whose index is not its first key, and a chunk whose usage
    comes before its choices: read by where each key is, not by the order vLLM happens
    to write them (read so, the chunk was unreadable and its stream judged by none)."""
    top = [{"token": f" t{j}", "logprob": -2.5, "bytes": [32, 116]} for j in range(20)]
    entries = {"content": [{"token": " w", "logprob": -1.25, "bytes": [32, 119],
                            "top_logprobs": top} for _ in range(1200)]}
    chunk = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1,
             "usage": {"prompt_tokens": 5, "total_tokens": 1205, "completion_tokens": 1200},
             "model": "llama",
             "choices": [{"logprobs": entries, "delta": {"content": " w" * 1200},
                          "finish_reason": None, "index": 0}]}
    big = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    assert len(big) > MAX_EVENT_BYTES
    events = [wire.chat_role(usage=(5, 0)), big,
              wire.chat_delta(content=".", finish="stop", usage=(5, 1201)), wire.DONE]
    assert judged(events, [0.1, 0.4, 0.45, 0.45], wire_kind=Wire.CHOICES) == [
        Verdict(True, 1201)]


def test_deep_nesting_in_a_clients_schema_is_read_in_bounded_memory() -> None:
    """10,000 nested lists in a tool's schema (vLLM echoes it as it came): read with no
    recursion and a few KiB held, the answer still vLLM's."""
    deep = b"[" * 10_000 + b"]" * 10_000
    last = completed("completed", "tools").replace(b'"default":', b'"deep":' + deep +
                                                   b',"default":', 1)
    events = stream(last)
    judge = StreamJudge(SLO, 0.0, wire=Wire.RESPONSES)
    for piece, t in zip(events[:-1], [0.05, 0.2, 0.2, 0.25], strict=True):
        judge.written(piece, t)
    past = MAX_EVENT_BYTES + 4096  # the judge reads it as it passes from here
    assert last.index(deep) > past
    judge.written(last[:past], 0.3)
    tracemalloc.start()
    try:
        for i in range(past, len(last), 4093):
            judge.written(last[i:i + 4093], 0.3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * REACH
    assert judge.verdicts(1.0) == [Verdict(True, 3)]


@pytest.mark.parametrize("tail", [
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}}',
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"]}',
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"}],"x":"unterminated}',
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"}],"x":[1,2}]}',
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"}] "x":1}',
    b'{"choices":[{"index":0,"text":"a","finish_reason":"stop"}],"x" 1}',
], ids=["closed-twice", "mismatched", "unterminated", "mismatched-deep", "no-comma",
        "no-colon"])
@pytest.mark.parametrize("long", [False, True], ids=["whole", "past-the-bound"])
def test_malformed_json_is_unreadable_whatever_its_length(tail: bytes, long: bool) -> None:
    """JSON vLLM never writes: a whole event of it makes the stream one the meter cannot
    read (no verdict), and so does one past the bound, read as it passes (it was judged
    by the keys found in it). The meter goes on passing it through."""
    pad = b" " * (MAX_EVENT_BYTES if long else 0)
    event = b"data: " + tail[:1] + pad + tail[1:] + b"\n\n"
    events = [wire.completion(0, "a"), event, wire.DONE]
    assert judged(events, [0.1, 0.12, 0.15], wire_kind=Wire.CHOICES) == []
