"""The usage the meter asks vLLM for, and takes out of the bytes its client gets, read
from vLLM v0.11's own stream bytes (``vllm_wire``) split anywhere."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slopilot.engine.meter.long_event import REACH
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES
from slopilot.engine.meter.usage_stats import Asked, UsageStrip, ask, asked
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter_token_counts import chat, completion, echoed


def passed(strip: UsageStrip, pieces: list[bytes]) -> bytes:
    return b"".join(strip.feed(p) for p in pieces) + strip.flush()


def one_byte_at_a_time(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


@pytest.mark.parametrize("client", [Asked.NONE, Asked.FINAL])
@pytest.mark.parametrize(("render", "null_usage"), [
    (chat, False), (completion, True), (echoed, False)], ids=["chat", "completions", "echo"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("split", ["as-written", "byte-by-byte"])
def test_the_client_gets_the_stream_vllm_writes_for_its_own_request(
        client: Asked, render: Any, null_usage: bool, line_end: bytes, split: str) -> None:
    """vLLM asked for continuous usage, its chunks read without it as it writes them for
    the client's request, however the bytes were split and lines ended."""
    def framed(pieces: list[bytes]) -> list[bytes]:
        return [p.replace(b"\n", line_end) for p in pieces]

    given = framed(render(True, True))
    want = b"".join(framed(render(client is Asked.FINAL, False)))
    pieces = given if split == "as-written" else one_byte_at_a_time(b"".join(given))
    assert passed(UsageStrip(client, null_usage=null_usage), pieces) == want


def test_an_event_is_passed_on_once_it_ended() -> None:
    """A client's parser acts on an event at its empty line: nothing of it is held
    past the piece that ends it, nor sent before."""
    strip = UsageStrip(Asked.NONE, null_usage=False)
    delta = wire.chat_delta(content="a", usage=(5, 1))
    assert strip.feed(delta[:20]) == b""
    assert strip.feed(delta[20:-1]) == b""
    assert strip.feed(delta[-1:]) == wire.chat_delta(content="a")


def test_an_endless_event_and_an_unended_one_pass_as_they_came() -> None:
    """An event that never ends is not held: all but the window a usage is found in
    passes at once, the rest at the stream's end."""
    strip = UsageStrip(Asked.NONE, null_usage=False)
    endless = [b"data: " + b"x" * MAX_EVENT_BYTES, b"x" * MAX_EVENT_BYTES, b"y" * 100]
    got = b"".join(strip.feed(p) for p in endless)
    assert len(b"".join(endless)) - len(got) <= 3 * REACH
    assert got + strip.flush() == b"".join(endless)
    strip = UsageStrip(Asked.NONE, null_usage=False)
    assert passed(strip, [b'data: {"usage":{"completion_tokens":1}']) == \
        b'data: {"usage":{"completion_tokens":1}'


def test_a_null_usage_is_a_servers_that_writes_it_once_asked() -> None:
    """slopilot's server writes ``"usage":null`` on each chunk once usage is asked for:
    a chat client that asked for none would have had none; one that asked for the
    final usage has it where it was."""
    chunk = b'data: {"id":"x","choices":[],"usage":null}\n\n'
    assert UsageStrip(Asked.NONE, null_usage=False).feed(chunk) == \
        b'data: {"id":"x","choices":[]}\n\n'
    assert UsageStrip(Asked.FINAL, null_usage=False).feed(chunk) == chunk
    assert UsageStrip(Asked.NONE, null_usage=True).feed(chunk) == chunk


@pytest.mark.parametrize(("options", "want"), [
    ({}, Asked.NONE), ({"stream_options": None}, Asked.NONE),
    ({"stream_options": {}}, Asked.FINAL),  # vLLM's StreamOptions: include_usage=True
    ({"stream_options": {"include_usage": None}}, Asked.NONE),
    ({"stream_options": {"include_usage": "false", "continuous_usage_stats": True}},
     Asked.NONE),
    ({"stream_options": {"continuous_usage_stats": 1}}, Asked.CONTINUOUS),
    ({"stream_options": {"include_usage": True, "continuous_usage_stats": "yes"}},
     Asked.CONTINUOUS),
    ({"stream_options": {"include_usage": "perhaps"}}, None),
    ({"stream_options": "all"}, None),
])
def test_the_clients_stream_options_are_read_as_vllm_reads_them(
        options: dict[str, Any], want: Asked | None) -> None:
    assert asked(options) is want


def test_the_ask_keeps_the_clients_other_options() -> None:
    body = {"stream": True, "stream_options": {"include_usage": False, "extra": 1}}
    assert ask(body) == {"stream": True, "stream_options": {
        "include_usage": True, "extra": 1, "continuous_usage_stats": True}}
    assert asked(ask({"stream": True})) is Asked.CONTINUOUS


def pieces_of(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1 << 16, 4093], ids=["64k", "odd"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_an_event_past_the_bound_passes_as_it_came_and_the_rest_is_still_stripped(
        size: int, line_end: bytes) -> None:
    """A completions echo with logprobs puts the whole prompt's in its first chunk (MBs
    for a long prompt). Passed on as it comes, not held, it must not turn the strip off:
    the client that asked for no usage would get every chunk's and the last chunk of
    usage alone, whose empty ``choices`` breaks ``chunk.choices[0]`` in its loop. Its
    own usage is taken out as it passes: the client gets the chunk vLLM writes for it."""
    def framed(pieces: list[bytes]) -> bytes:
        return b"".join(p.replace(b"\n", line_end) for p in pieces)

    big = wire.completion(0, "x" * 2 * MAX_EVENT_BYTES, usage=(2, 1))
    given = framed([big, wire.completion(0, "a", usage=(2, 2)),
                    wire.completion(0, "b", finish="stop", usage=(2, 3)),
                    wire.completion_usage(2, 3), wire.DONE])
    want = framed([wire.completion(0, "x" * 2 * MAX_EVENT_BYTES), wire.completion(0, "a"),
                   wire.completion(0, "b", finish="stop"), wire.DONE])
    strip = UsageStrip(Asked.NONE, null_usage=True)
    assert passed(strip, pieces_of(given, size)) == want


def test_an_event_past_the_bound_ends_on_a_line_end_split_across_reads() -> None:
    big = wire.chat_delta(content="x" * 2 * MAX_EVENT_BYTES, usage=(5, 1))
    crlf = (big + wire.chat_usage(5, 1) + wire.DONE).replace(b"\n", b"\r\n")
    end = len(big.replace(b"\n", b"\r\n"))
    want = wire.chat_delta(content="x" * 2 * MAX_EVENT_BYTES) + wire.DONE
    for cut in range(end - 5, end - 1):  # one ended in the first piece is read whole
        strip = UsageStrip(Asked.NONE, null_usage=False)
        got = passed(strip, [crlf[:cut], crlf[cut:]])
        assert got == want.replace(b"\n", b"\r\n"), cut


@pytest.mark.parametrize("usage", [
    b'{"prompt_tokens":1,"note":"}"}', b'{"prompt_tokens":1,"a":{"b":{"c":1}}}',
    b'{"prompt_tokens":1,"note":"a\\"}"}'], ids=["brace-in-string", "deep", "escaped"])
def test_a_usage_the_strip_cannot_take_out_whole_is_left_in_not_cut(usage: bytes) -> None:
    """An upstream (the tenant's image) whose usage holds a string or nests deeper than
    vLLM's: its chunk passes as it came, never cut into JSON no client can read."""
    chunk = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}],"usage":' + \
        usage + b'}\n\n'
    got = UsageStrip(Asked.NONE, null_usage=False).feed(chunk)
    assert json.loads(got.removeprefix(b"data: ")) is not None
