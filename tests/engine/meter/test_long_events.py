"""SSE events past ``MAX_EVENT_BYTES``: still judged, and still stripped of the usage the
client did not ask for, with the meter's memory bounded.

vLLM writes one for any client that asks: a completions ``echo`` with ``logprobs`` puts
a long prompt's text and logprobs in its first chunk, and a Responses stream's
``response.completed`` the whole answer, its logprobs too where they are ``include``d.
The meter used to pass the stream on unjudged from that event on: any client could opt its
own streams out of the verdicts and the client-side histograms the SLO loop reads.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from slopilot.engine.meter.long_event import REACH
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES, StreamJudge, Verdict, Wire
from slopilot.engine.meter.usage_stats import Asked, UsageStrip
from slopilot.engine.slo import ClassSLO
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter import Client, Upstream, counted, meter_for, run
from tests.engine.meter.test_meter_token_counts import Render, Usage, asked
from tests.engine.meter.test_meter_vllm_wire import COMPLETION, MET, MISSED

SLO = ClassSLO(ttft_p99_ms=500, tbt_p99_ms=100)
PROMPT_TOKENS = 24_000
READ = 1 << 16
"""The most an upstream read brings (httpx's, from h11)."""
ECHO = {**COMPLETION, "echo": True, "logprobs": 1, "max_tokens": 3}


def prompt_logprobs(tokens: int = PROMPT_TOKENS) -> dict[str, Any]:
    """A completion's logprobs, as vLLM writes them for an echoed prompt and the first
    token (``_create_completion_logprobs``): the prompt's first token has none."""
    return {"text_offset": list(range(tokens)),
            "token_logprobs": [None, *[-1.25] * (tokens - 1)],
            "tokens": [f" w{i}" for i in range(tokens)],
            "top_logprobs": [None, *[{f" w{i}": -1.25, " the": -2.5}
                                     for i in range(1, tokens)]]}


def echo(prompt: str, logprobs: dict[str, Any]) -> Render:
    """A completions ``echo`` with ``logprobs`` of ``prompt``: its first chunk is the
    prompt, its logprobs and the first token ("a"); then "b" and "c"."""
    def render(include: bool, continuous: bool) -> list[bytes]:
        def u(n: int) -> Usage:
            return (PROMPT_TOKENS, n) if continuous else None
        return [wire.completion(0, prompt + "a", logprobs=logprobs, usage=u(1)),
                wire.completion(0, "b", usage=u(2)),
                wire.completion(0, "c", finish="length", usage=u(3)),
                *([wire.completion_usage(PROMPT_TOKENS, 3)] if include else []), wire.DONE]
    return render


echo_stream = echo(" ".join(f"w{i}" for i in range(PROMPT_TOKENS)), prompt_logprobs())
"""A long prompt's: its first chunk over 1 MiB."""
FORGED = ('"usage":{"prompt_tokens":1,"total_tokens":1,"completion_tokens":0},'
          '"choices":[],"finish_reason":"stop","error":{},"text":"","model":"forged"')
"""What a client may write in its prompt (or have as its tokens) to be read as the
chunk's: no token yet, no choice, finished, failed."""


def forged_stream() -> Render:
    """An echo whose prompt and tokens are the keys the meter reads, in every form a
    client can have vLLM write them: in the text (each quote escaped), and as
    ``top_logprobs``' keys, bare or ending in an escaped quote (its value a number)."""
    logprobs = prompt_logprobs()
    keys = ["usage", "choices", "finish_reason", "error", "text", "model", '"usage',
            '"finish_reason', FORGED]
    logprobs["top_logprobs"][1:1 + len(keys)] = [{k: -1.0} for k in keys]
    return echo(" ".join(f"w{i} {FORGED}" for i in range(PROMPT_TOKENS // 8)), logprobs)


def long_chat(include: bool, continuous: bool) -> list[bytes]:
    """A chat stream with ``top_logprobs`` whose busy server merged 1,200 tokens into
    one chunk, over 1 MiB, after its role's chunk (no token: its usage says 0)."""
    def u(n: int) -> Usage:
        return (5, n) if continuous else None
    top = [{"token": f" t{j}", "logprob": -2.5, "bytes": [32, 116]} for j in range(20)]
    logprobs = {"content": [{"token": " w", "logprob": -1.25, "bytes": [32, 119],
                             "top_logprobs": top} for _ in range(1200)]}
    return [wire.chat_role(usage=u(0)),
            wire.chat_delta(content=" w" * 1200, logprobs=logprobs, usage=u(1200)),
            wire.chat_delta(content=".", finish="stop", usage=u(1201)),
            *([wire.chat_usage(5, 1201)] if include else []), wire.DONE]


def test_the_streams_chunks_are_past_the_bound() -> None:
    assert len(echo_stream(False, True)[0]) > MAX_EVENT_BYTES
    assert len(forged_stream()(False, True)[0]) > MAX_EVENT_BYTES
    assert len(long_chat(False, True)[1]) > MAX_EVENT_BYTES


class TimedVLLM(Upstream):
    """A stand-in vLLM that writes its stream as the forwarded request asks, each event
    at its time on the meter's clock, in reads of at most ``READ`` bytes."""

    def __init__(self, render: Render, times: list[float], now: list[float]) -> None:
        super().__init__()
        self.render, self.times, self.now = render, times, now

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        events = self.render(*asked(json.loads(request.content)))

        async def body() -> AsyncIterator[bytes]:
            for event, at in zip(events, self.times, strict=True):
                self.now[0] = at
                for i in range(0, len(event), READ):
                    yield event[i:i + READ]

        return httpx.Response(200, headers={"content-type": wire.CONTENT_TYPE},
                              content=body())


@pytest.mark.parametrize(("first", "want"), [(0.9, MISSED), (0.2, MET)],
                         ids=["late", "on-time"])
@pytest.mark.parametrize("options", [None, {"include_usage": True}],
                         ids=["no-usage", "final-usage"])
def test_a_stream_whose_first_chunk_is_past_the_bound_is_judged_and_stripped(
        tmp_path: Path, first: float, want: Any, options: dict[str, Any] | None) -> None:
    """The echo's chunk reached the client 0.9 s after the request (its target 0.5 s):
    the stream was passed on unjudged, in no verdict and no histogram, and its client,
    who asked for no usage, got that chunk's usage all the same. Its first token is
    seen when the chunk ended, its tokens counted by its continuous usage, and the
    client gets what vLLM writes for its own request."""
    now = [0.0]
    upstream = TimedVLLM(echo_stream, [first, first + 0.05, first + 0.1, first + 0.1,
                                       first + 0.1], now)
    meter = meter_for(tmp_path, upstream, now)
    sent = {**ECHO} if options is None else {**ECHO, "stream_options": options}

    async def go() -> bytes:
        status, _, got = await Client(meter, now).request("POST", "/v1/completions", sent)
        assert status == 200
        return got

    got = run(go)
    assert counted(meter) == {want: (1, 3)}
    assert got == b"".join(echo_stream(*asked(sent)))
    assert meter.model_name == "llama"


def test_a_stream_that_never_ends_its_oversized_event_is_judged_cut_short(
        tmp_path: Path) -> None:
    """The upstream wrote 2 MiB of an event it never ended, then closed the stream 0.8 s
    after the request: its client saw no token, a miss against the 0.5 s target (the
    stream was passed on unjudged). Its bytes pass on as they came."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    pieces = [b"data: {" + b"x" * MAX_EVENT_BYTES, b"x" * MAX_EVENT_BYTES]
    upstream.answer(pieces)

    async def go() -> bytes:
        _, _, got = await Client(meter, now).request("POST", "/v1/completions", COMPLETION,
                                                     written_at=[0.3, 0.8, 0.8])
        return got

    assert run(go) == b"".join(pieces)
    assert counted(meter) == {MISSED: (1, 0)}


def judged(events: list[tuple[bytes, float]], *, wire_kind: Wire = Wire.CHOICES,
           now: float = 1.0, read: int = READ) -> list[Verdict]:
    """The verdicts of a stream of ``events``, each written at its time in reads of at
    most ``read`` bytes."""
    judge = StreamJudge(SLO, 0.0, wire=wire_kind)
    for event, at in events:
        for i in range(0, len(event), read):
            judge.written(event[i:i + read], at)
    return judge.verdicts(now)


def test_an_oversized_event_that_never_ends_is_a_stream_cut_short() -> None:
    """Its client saw no token: past the TTFT target that is a miss, as for any stream
    whose first token never came (it was judged neither way)."""
    endless = b"data: " + b"x" * (2 * MAX_EVENT_BYTES)
    assert judged([(endless, 0.1)], now=0.8) == [Verdict(False, 0)]


def test_an_oversized_responses_event_is_judged() -> None:
    """``response.completed`` carries the whole answer (with its logprobs, where the
    request ``include``s them): past the bound, the stream ended unjudged."""
    s = wire.ResponsesStream()
    logprobs = [{"token": f" w{i}", "logprob": -1.25, "bytes": [32, 119],
                 "top_logprobs": [{"token": " the", "logprob": -2.5, "bytes": [32]}]}
                for i in range(12_000)]
    completed = s.completed(3).replace(b'"output":[]', b'"output":[{"type":"message",'
                                       b'"status":"completed","content":[{"type":'
                                       b'"output_text","logprobs":' +
                                       json.dumps(logprobs).encode() + b'}]}]')
    assert len(completed) > MAX_EVENT_BYTES
    pieces = [(s.created(), 0.05), (s.message_added(), 0.2), (s.text("a"), 0.2),
              (s.text("bc"), 0.25), (completed, 0.3)]
    assert judged(pieces, wire_kind=Wire.RESPONSES) == [Verdict(True, 3)]


def sized(line_bytes: int, *, usage: Usage) -> bytes:
    """A completions chunk of three tokens (its ``token_ids``) whose line is
    ``line_bytes`` long, the bytes the judge counts against ``MAX_EVENT_BYTES``."""
    def chunk(text: str) -> bytes:
        return wire.completion(0, text, usage=usage).replace(
            b'"token_ids":null', b'"token_ids":[7,8,9]')
    line = len(chunk("")) - 2  # its "\n\n" ends it
    return chunk("x" * (line_bytes - line))


@pytest.mark.parametrize(("usage", "whole", "past"), [
    ((5, 3), Verdict(True, 4), Verdict(True, 4)),
    (None, Verdict(True, 4), Verdict(True, 2))], ids=["continuous-usage", "no-usage"])
def test_an_event_of_the_bound_is_read_whole_and_one_past_it_by_its_keys(
        usage: Usage, whole: Verdict, past: Verdict) -> None:
    """At ``MAX_EVENT_BYTES`` the chunk is parsed whole, one byte more it is read as it
    passes: judged alike by the continuous usage the meter asks vLLM for. Without it
    the ids past the bound are not counted and the chunk brings one token: the least a
    chunk with output brings. Its wait is one gap all the same, whatever it brings
    (``ClientGaps``); only the verdict's tokens are fewer (``long_event``)."""
    def stream(first: bytes) -> list[tuple[bytes, float]]:
        last = wire.completion(0, "d", finish="length",
                               usage=None if usage is None else (5, 4))
        # Its line in one read, its end in the next: the line is whole before it ends.
        return [(first[:-2], 0.2), (first[-2:], 0.2), (last, 0.25), (wire.DONE, 0.25)]

    at, over = sized(MAX_EVENT_BYTES, usage=usage), sized(MAX_EVENT_BYTES + 1, usage=usage)
    assert len(at) - 2 == MAX_EVENT_BYTES and len(over) - 2 == MAX_EVENT_BYTES + 1
    assert judged(stream(at), read=len(at)) == [whole]
    assert judged(stream(over), read=len(over)) == [past]


def framed(events: list[bytes], line_end: bytes) -> list[bytes]:
    return [e.replace(b"\n", line_end) for e in events]


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("read", [1021, 4093, READ], ids=["1k", "4k", "64k"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize(("ended", "met"), [(0.4, True), (0.7, False)],
                         ids=["on-time", "late"])
@pytest.mark.parametrize(("render", "tokens"), [(echo_stream, 3), (long_chat, 1201)],
                         ids=["completions-echo", "chat-merged"])
def test_an_oversized_event_in_many_reads_is_seen_when_it_ends(
        read: int, line_end: bytes, ended: float, met: bool, render: Render,
        tokens: int) -> None:
    """Its client's parser acts on it at its end, however the reads split it: its first
    token came at its last read (0.7 s, its target 0.5 s), not at its first (0.2 s).
    The chat's 1,200 merged tokens, its continuous usage says, came in that one chunk:
    no gap of theirs, counted by the usage: it met its SLO where it came on time."""
    events = framed(render(False, True), line_end)
    small = 1 if render is long_chat else 0  # the chat's role chunk: no token
    pieces = reads(events[small], read)
    timed = [*((e, 0.1) for e in events[:small]), *((p, 0.2) for p in pieces[:-1]),
             (pieces[-1], ended), *((e, ended + 0.05) for e in events[small + 1:])]
    assert judged(timed, read=read) == [Verdict(met, tokens)]


@pytest.mark.parametrize("usage", [(5, 0), None], ids=["continuous-usage", "no-usage"])
def test_an_oversized_chunk_without_output_brings_no_first_token(usage: Usage) -> None:
    """A chat role chunk with a long prompt's ids (``return_token_ids``) carries no
    token, by its usage and by its delta: the first token is the next chunk's, 0.7 s
    after the request, a miss (read as one, the role chunk's 0.1 s met the target)."""
    ids = b",".join(str(100_000 + i).encode() for i in range(MAX_EVENT_BYTES // 6))
    role = wire.chat_role(usage=usage).replace(b'"prompt_token_ids":null',
                                               b'"prompt_token_ids":[' + ids + b"]")
    assert len(role) > MAX_EVENT_BYTES
    first = wire.chat_delta(content="a", finish="stop", usage=usage and (5, 1))
    events = [(role, 0.1), (first, 0.7), (wire.DONE, 0.7)]
    assert judged(events) == [Verdict(False, 1)]


@pytest.mark.parametrize("cut", range(-6, 0))
def test_an_oversized_events_end_split_between_reads_is_read_at_its_end(cut: int) -> None:
    big, *rest = framed(echo_stream(False, True), b"\r\n")
    events = [(big[:cut], 0.2), (big[cut:], 0.7), *((e, 0.75) for e in rest)]
    assert judged(events) == [Verdict(False, 3)]


@pytest.mark.parametrize("client", [Asked.NONE, Asked.FINAL])
@pytest.mark.parametrize("read", [1021, 4093, READ], ids=["1k", "4k", "64k"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize(("render", "null_usage"), [(echo_stream, True), (long_chat, False)],
                         ids=["completions", "chat"])
def test_the_client_gets_vllms_bytes_for_its_request_however_the_reads_split_them(
        client: Asked, read: int, line_end: bytes, render: Render, null_usage: bool) -> None:
    """An event past the bound is passed on as it comes, not held, but for the window
    its usage is found in: the client that asked for none got that chunk's all the
    same."""
    given = b"".join(framed(render(True, True), line_end))
    want = b"".join(framed(render(client is Asked.FINAL, False), line_end))
    strip = UsageStrip(client, null_usage=null_usage)
    got = b"".join(strip.feed(p) for p in reads(given, read)) + strip.flush()
    assert got == want



@pytest.mark.parametrize("client", [Asked.NONE, Asked.FINAL])
def test_what_a_client_writes_is_never_read_as_the_chunks_keys(client: Asked) -> None:
    """A prompt echoed, and its tokens as ``top_logprobs``' keys, that say no token
    came yet, no choice, finished, failed: read so, the echo's chunk would be no first
    token or a failed stream (judged only where it missed), and its usage left in for a
    client that asked for none. vLLM's own keys say one token, unfinished."""
    render = forged_stream()
    events = render(True, True)
    for ended, want in ((0.4, Verdict(True, 3)), (0.7, Verdict(False, 3))):
        times = [ended, ended + 0.05, ended + 0.1, ended + 0.1, ended + 0.1]
        judge = StreamJudge(SLO, 0.0)
        for event, at in zip(events, times, strict=True):
            for piece in reads(event, 4093):
                judge.written(piece, at)
        assert judge.verdicts(1.0) == [want]
        assert judge.model == "llama"
    strip = UsageStrip(client, null_usage=True)
    got = b"".join(strip.feed(p) for p in reads(b"".join(events), 4093)) + strip.flush()
    assert got == b"".join(render(client is Asked.FINAL, False))


def test_an_event_that_never_ends_holds_no_more_than_its_window() -> None:
    """16 MiB of one event, from an upstream that never ends it: past the bound the judge
    and the strip keep a few KiB of it, whatever more comes, and the event is a stream
    cut short (its client saw no token: past the TTFT target, a miss)."""
    judge = StreamJudge(SLO, 0.0)
    strip = UsageStrip(Asked.NONE, null_usage=True)
    piece = b'"usage":{"completion_tokens":0}, ' * (READ // 32)
    passed, fed = len(strip.feed(b"data: {")), 7
    judge.written(b"data: {", 0.1)
    tracemalloc.start()
    try:
        for _ in range((16 << 20) // len(piece)):
            if fed <= 2 * MAX_EVENT_BYTES < fed + len(piece):
                tracemalloc.reset_peak()  # both past the bound: from here, a window
            passed += len(strip.feed(piece))
            judge.written(piece, 0.1)
            fed += len(piece)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 8 * REACH and peak < 2 * len(piece) + 8 * REACH
    assert passed > fed - 3 * REACH
    assert judge.verdicts(0.8) == [Verdict(False, 0)]


@pytest.mark.parametrize(("event", "want"), [
    (b"data: " + b"x" * (2 * MAX_EVENT_BYTES) + b"\n\n", []),
    (b"data: [" + b"1," * MAX_EVENT_BYTES + b"1]\n\n", []),
    (b": " + b"x" * (2 * MAX_EVENT_BYTES) + b"\n\n", [Verdict(True, 2)]),
    (b"data: " + b"x" * MAX_EVENT_BYTES + b"\n: " + b"x" * MAX_EVENT_BYTES + b"\n\n", []),
], ids=["not-json", "not-an-object", "comment", "not-json-and-comment"])
def test_an_oversized_event_is_readable_as_a_whole_one_would_be(
        event: bytes, want: list[Verdict]) -> None:
    """Data no client can have vLLM write (not JSON, not an object) is no stream the
    meter can read, as a short event of it; a long comment carries nothing, and the
    stream goes on being read."""
    events = [(wire.completion(0, "a"), 0.1), (event, 0.12),
              (wire.completion(0, "b", finish="stop"), 0.15), (wire.DONE, 0.15)]
    assert judged(events) == want
