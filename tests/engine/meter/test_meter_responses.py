"""The meter in front of vLLM v0.11's Responses API streams (``POST /v1/responses``,
``vllm_wire.ResponsesStream``), judged as a chat stream is: its first output delta is the
first token, the later deltas' gaps its token gaps, ``max_output_tokens`` its limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_client_latency import exposition
from tests.engine.meter.test_meter import (
    HOLD,
    Client,
    Upstream,
    counted,
    give_up,
    meter_for,
    run,
)
from tests.engine.meter.test_meter_vllm_wire import MET, MISSED, judged
from tests.support.waits import HANG_GUARD_S

RESPONSES = "/v1/responses"
BODY = {"model": "llama", "input": "hi", "stream": True, "max_output_tokens": 8}


def _text(late: float) -> list[tuple[bytes, float]]:
    s = wire.ResponsesStream()
    return [(s.created(), 0.05), (s.message_added(), late), (s.text("a"), late),
            (s.text("bc"), late + 0.05), (s.text_done("abc"), late + 0.05),
            (s.completed(3), late + 0.05)]


def _reasoning(late: float) -> list[tuple[bytes, float]]:
    s = wire.ResponsesStream()
    return [(s.created(), 0.05), (s.message_added(reasoning=True), late),
            (s.reasoning("hm"), late), (s.text("a"), late + 0.05),
            (s.completed(2), late + 0.05)]


def _function_call(late: float) -> list[tuple[bytes, float]]:
    s = wire.ResponsesStream()
    return [(s.created(), 0.05), (s.function_call_added("weather"), late),
            (s.arguments('{"city":'), late + 0.05), (s.arguments('"Oslo"}'), late + 0.1),
            (s.completed(3), late + 0.1)]


@pytest.mark.parametrize(("body", "pieces", "want"), [
    (BODY, _text(0.7), {MISSED: (1, 3)}),
    (BODY, _text(0.1), {MET: (1, 3)}),
    (BODY, _reasoning(0.7), {MISSED: (1, 2)}),
    (BODY, _function_call(0.7), {MISSED: (1, 3)}),
    ({**BODY, "stream": "true"}, _text(0.7), {MISSED: (1, 3)}),
], ids=["text-late", "text-on-time", "reasoning", "function-call", "lax-stream"])
def test_a_responses_stream_is_judged_as_a_chat_stream(
        tmp_path: Path, body: dict[str, Any], pieces: list[tuple[bytes, float]],
        want: dict[Any, tuple[int, int]]) -> None:
    """vLLM v0.11 serves the Responses API, whose stream is named events and no
    ``[DONE]``: the meter passed it through unjudged, so on a deployment whose clients
    use it a first token 0.7 s late (its target 0.5 s) was in no histogram and no
    verdict. Its first output delta (text, reasoning, a function call's first arguments)
    is the first token, the events before it none; the final usage counts the tokens."""
    assert judged(tmp_path, RESPONSES, body, pieces) == want


def test_a_responses_streams_latency_is_observed_under_its_models_name(
        tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    pieces = _text(0.1)
    upstream.answer([p for p, _ in pieces], headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> None:
        await Client(meter, now).request("POST", RESPONSES, BODY,
                                         written_at=[t for _, t in pieces])

    run(go)
    assert (meter.latency.ttft.count, meter.latency.gaps.count) == (1, 1)
    assert meter.model_name == "llama"


def test_a_delta_that_says_how_many_tokens_it_brings_counts_them(tmp_path: Path) -> None:
    """With ``include: ["message.output_text.logprobs"]`` each text delta's logprobs
    have one entry a token (``_create_stream_response_logprobs``): a delta of three
    tokens counts three, as on a chat stream (5 tokens, not 3). The 0.25 s its client
    waited for them is one slow gap, whatever the delta brings (``ClientGaps``): 1 of 2
    over the 0.1 s target, a miss, as a client timing its deltas reads it."""
    s = wire.ResponsesStream()

    def lp(tokens: str) -> list[dict[str, Any]]:
        return [{"token": t, "logprob": -0.5, "top_logprobs": []} for t in tokens]

    pieces = [(s.created(), 0.05), (s.message_added(), 0.1), (s.text("a", logprobs=lp("a")), 0.1),
              (s.text("bcd", logprobs=lp("bcd")), 0.35), (s.text("e", logprobs=lp("e")), 0.4),
              (s.completed(5), 0.4)]
    body = {**BODY, "include": ["message.output_text.logprobs"]}
    assert judged(tmp_path, RESPONSES, body, pieces) == {MISSED: (1, 5)}


@pytest.mark.parametrize(("limit", "want"), [
    ({"max_output_tokens": 16}, {MISSED: (1, 3)}),  # 2 slow gaps of at most 15: missed
    ({"max_output_tokens": "16"}, {MISSED: (1, 3)}),  # as vLLM's pydantic reads it
    ({}, {}),  # the context: the rest could still have met it
], ids=["given", "lax", "left-out"])
def test_max_output_tokens_is_the_limit_of_a_stream_cut_short(
        tmp_path: Path, limit: dict[str, Any], want: dict[Any, tuple[int, int]]) -> None:
    """A client that left after two slow gaps had missed already where its answer could
    bring at most 16 tokens, as ``max_tokens`` rules a chat stream cut short."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    s = wire.ResponsesStream()
    upstream.answer([s.created() + s.message_added() + s.text("a"), s.text("b"), s.text("c"),
                     HOLD],
                    headers={"content-type": wire.CONTENT_TYPE})
    body = {k: v for k, v in BODY.items() if k != "max_output_tokens"} | limit

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", RESPONSES, body,
                                                    written_at=[0.1, 0.3, 0.5]))
        await give_up(client, upstream, now, after=3)  # the client gives up
        await asyncio.wait_for(task, HANG_GUARD_S)

    run(go)
    assert counted(meter) == want


@pytest.mark.parametrize("end", ["vllm", "incomplete-event", "content-filter"])
def test_a_response_that_ended_at_its_limit_is_judged(tmp_path: Path, end: str) -> None:
    """vLLM ends an answer that hit ``max_output_tokens`` with ``response.completed``
    whose status is ``incomplete``; the OpenAI API with ``response.incomplete``. Either
    is the engine's own end, as chat's finish reason ``length``: judged, not cut short."""
    s = wire.ResponsesStream(max_output_tokens=2)
    last = {"vllm": lambda: s.completed(2, status="incomplete"),
            "incomplete-event": lambda: s.incomplete(2),
            "content-filter": lambda: s.incomplete(2, reason="content_filter")}[end]
    pieces = [(s.created(), 0.05), (s.message_added(), 0.1), (s.text("a"), 0.1),
              (s.text("b"), 0.15), (last(), 0.15)]
    assert judged(tmp_path, RESPONSES, {**BODY, "max_output_tokens": 2}, pieces) == \
        {MET: (1, 2)}


def _failing(first: float | None, end: str) -> list[tuple[bytes, float]]:
    s = wire.ResponsesStream()
    pieces = [(s.created(), 0.05)]
    if first is not None:
        pieces += [(s.message_added(), first), (s.text("a"), first)]
    at = 0.9 if first is None else first + 0.05
    last = {"failed": s.failed, "error": lambda: s.error("EngineCore encountered an issue."),
            "cancelled": lambda: s.completed(1, status="cancelled"),
            "broken-off": lambda: b""}[end]()
    return pieces + ([(last, at)] if last else [])


@pytest.mark.parametrize(("pieces", "want"), [
    (_failing(0.7, "failed"), {MISSED: (1, 1)}),
    (_failing(0.7, "error"), {MISSED: (1, 1)}),
    (_failing(0.7, "cancelled"), {MISSED: (1, 1)}),
    (_failing(0.7, "broken-off"), {MISSED: (1, 1)}),
    (_failing(None, "failed"), {MISSED: (1, 0)}),
    (_failing(0.1, "failed"), {}),
    (_failing(0.1, "error"), {}),
], ids=["late-then-failed", "late-then-error", "late-then-cancelled", "late-then-broken-off",
        "failed-before-a-token", "failed-on-time", "error-on-time"])
def test_a_failed_response_is_judged_as_one_cut_short(
        tmp_path: Path, pieces: list[tuple[bytes, float]],
        want: dict[Any, tuple[int, int]]) -> None:
    """``response.failed``, an ``error`` event, a response ``cancelled`` (vLLM's status
    for an answer aborted in the engine) or a stream that broke off without its last
    event (vLLM's way when its generator raises) end the answer unfinished: a miss where
    it had missed already, judged neither way where the rest could still have met it."""
    assert judged(tmp_path, RESPONSES, BODY, pieces) == want


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", RESPONSES, {**BODY, "stream": False}),
    ("POST", RESPONSES, {k: v for k, v in BODY.items() if k != "stream"}),
    ("GET", RESPONSES + "/resp_7", None),
], ids=["not-streamed", "stream-left-out", "retrieve"])
def test_a_responses_request_not_streamed_is_not_judged(
        tmp_path: Path, method: str, path: str, body: Any) -> None:
    """A whole body shows its client no first token: passed on, judged neither way."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    whole = b'{"id":"resp_7","object":"response","status":"completed"}'
    upstream.answer([whole], headers={"content-type": "application/json"})

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request(method, path, body, written_at=[0.9])

    assert run(go)[2] == whole
    assert counted(meter) == {}
    assert meter.latency.ttft.count == 0


REPLAYS = "slopilot_meter_replayed_streams"


def test_a_response_streamed_again_is_passed_on_unjudged_and_counted_as_a_replay(
        tmp_path: Path) -> None:
    """``GET /v1/responses/{id}?stream=true`` streams a stored response's events again
    (vLLM replays what it had generated, then what it generates next): its arrival is
    not its request's, its first events come from a buffer, and its tokens were the
    first stream's. The meter passed it on as any GET, unjudged and uncounted, so no
    figure said how many streams it had left out; it is counted apart, once a replay."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    s = wire.ResponsesStream()
    pieces = [s.created(), s.message_added(), s.text("a"), s.text("bc"), s.completed(3)]
    upstream.answer(pieces, headers={"content-type": wire.CONTENT_TYPE})
    upstream.answer([b'{"error":{"message":"not found"}}'], status=404,
                    headers={"content-type": "application/json"})
    upstream.answer([b'{"id":"resp_7","status":"completed"}'],
                    headers={"content-type": "application/json"})

    async def go() -> bytes:
        client = Client(meter, now)
        got = await client.request("GET", "/v1/responses/resp_7", query=b"stream=true",
                                   written_at=[2.0, 2.0, 2.0, 2.1, 2.1])
        assert got[:1] == (200,) and got[2] == b"".join(pieces)
        await client.request("GET", "/v1/responses/resp_8", query=b"stream=true")
        await client.request("GET", "/v1/responses/resp_7")
        return (await client.request("GET", "/metrics"))[2]

    families = exposition(run(go))
    assert counted(meter) == {}
    assert {(s.name, tuple(sorted(s.labels.items())), s.value)
            for s in families[REPLAYS].samples if s.name.endswith("_total")} == {
        (REPLAYS + "_total", (("priority_class", "p0"),), 1.0)}
