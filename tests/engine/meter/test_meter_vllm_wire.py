"""The meter in front of vLLM v0.11's own stream bytes (``vllm_wire``), judged as the
client sees them, on the test's clock (``test_meter``'s ``Client``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slopilot.engine.request import Priority
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter import (
    HOLD,
    LABEL,
    Client,
    Upstream,
    counted,
    give_up,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 8}
COMPLETION = {"model": "llama", "prompt": "hi", "stream": True, "max_tokens": 8}


def judged(tmp_path: Path, path: str, body: dict[str, Any],
           pieces: list[tuple[bytes, float]]) -> dict[Any, tuple[int, int]]:
    """The verdicts of one request answered with ``pieces``, each written at its time
    (the request arrives at 0)."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([p for p, _ in pieces], headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> bytes:
        status, headers, got = await Client(meter, now).request(
            "POST", path, body, written_at=[t for _, t in pieces])
        assert status == 200 and headers["content-type"] == wire.CONTENT_TYPE
        return got

    assert run(go) == b"".join(p for p, _ in pieces)  # passed on byte for byte
    return counted(meter)


MET, MISSED = (Priority.P0, LABEL, True), (Priority.P0, LABEL, False)


@pytest.mark.parametrize(("path", "body", "pieces", "want"), [
    # The first token came 0.7 s after the request (its target 0.5 s), then the engine
    # failed: the client saw a late first token and an error.
    ("/v1/chat/completions", CHAT,
     [(wire.chat_role(), 0.7), (wire.chat_delta(content="a"), 0.7),
      (wire.error("EngineCore encountered an issue."), 0.75), (wire.DONE, 0.75)],
     {MISSED: (1, 1)}),
    # A request the engine aborted: vLLM's completions raise on finish_reason "abort".
    ("/v1/completions", COMPLETION,
     [(wire.completion(0, "a"), 0.6), (wire.error("aborted"), 0.65), (wire.DONE, 0.65)],
     {MISSED: (1, 1)}),
    # No first token at all: the error came 0.9 s after the request.
    ("/v1/chat/completions", CHAT,
     [(wire.error("reasoning parser failed"), 0.9), (wire.DONE, 0.9)], {MISSED: (1, 0)}),
    # On time so far: the rest could still have met the SLO, so it is judged neither way
    # (as a stream cut short is).
    ("/v1/chat/completions", CHAT,
     [(wire.chat_role(), 0.1), (wire.chat_delta(content="a"), 0.1),
      (wire.error("boom"), 0.12), (wire.DONE, 0.12)], {}),
], ids=["late-then-failed", "aborted", "failed-before-a-token", "failed-on-time"])
def test_an_error_event_mid_stream_is_judged_as_an_answer_broken_off(
        tmp_path: Path, path: str, body: dict[str, Any],
        pieces: list[tuple[bytes, float]], want: dict[Any, tuple[int, int]]) -> None:
    """vLLM reports a failure inside a stream already answered 200 as one
    ``data: {"error": ...}`` event: the meter read the stream as unreadable and judged
    it neither way, so a stream that had missed its first token and then failed vanished
    from the goodput share, where one whose connection broke counted a miss. Judged as
    the engine's server judges a failed one: a miss where it had missed already."""
    assert judged(tmp_path, path, body, pieces) == want


@pytest.mark.parametrize(("prompt", "want"), [
    (["a", "b", "c"], 3), ([[1, 2], [3]], 2), ([1, 2, 3], 1), ("abc", 1)],
    ids=["texts", "token-lists", "one-token-list", "one-text"])
def test_a_completions_list_of_prompts_is_judged_choice_by_choice_when_cut_short(
        tmp_path: Path, prompt: Any, want: int) -> None:
    """vLLM runs each prompt of a list as its own request, streamed as choice
    ``prompt_idx * n + i`` (``completion_stream_generator``): a client that gave up
    after 0.8 s with no first token (due in 0.5) had missed it on every one of them, and
    was counted one miss, as if it had asked for a single prompt."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([HOLD], headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/completions", {**COMPLETION, "prompt": prompt, "n": 1}))
        await give_up(client, upstream, now, after=0)  # the client gives up
        await asyncio.wait_for(task, HANG_GUARD_S)

    run(go)
    assert counted(meter) == {MISSED: (want, 0)}


@pytest.mark.parametrize(("limit", "want"), [
    ({}, {MISSED: (1, 3)}),  # vLLM's default: 16 tokens, 15 gaps, none of them slow
    ({"max_tokens": None}, {}),  # the model's context: the rest could still have met it
], ids=["left-out", "null"])
def test_a_completions_token_limit_left_out_is_vllms_default(
        tmp_path: Path, limit: dict[str, Any], want: dict[Any, tuple[int, int]]) -> None:
    """vLLM's CompletionRequest has ``max_tokens = 16`` when the field is left out (the
    chat API's is the context). A stream cut short after two slow gaps of at most 15 had
    missed already; the meter read a limit left out as the context's, and judged it
    neither way."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([wire.completion(0, t) for t in "abc"] + [HOLD],
                    headers={"content-type": wire.CONTENT_TYPE})
    body = {k: v for k, v in COMPLETION.items() if k != "max_tokens"} | limit

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", body,
                                                    written_at=[0.1, 0.3, 0.5]))
        await give_up(client, upstream, now, after=3)  # the client gives up
        await asyncio.wait_for(task, HANG_GUARD_S)

    run(go)
    assert counted(meter) == want


def _chat_logprobs(tokens: str) -> dict[str, Any]:
    # ChatCompletionLogProbs: one entry per token the chunk brings.
    return {"content": [{"token": t, "logprob": -0.5, "bytes": list(t.encode()),
                         "top_logprobs": []} for t in tokens]}


def _completion_logprobs(tokens: str, offset: int) -> dict[str, Any]:
    # CompletionLogProbs: parallel lists, one entry per token.
    return {"text_offset": list(range(offset, offset + len(tokens))),
            "token_logprobs": [-0.5] * len(tokens), "tokens": list(tokens),
            "top_logprobs": None}


@pytest.mark.parametrize(("path", "body", "pieces"), [
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True,
                                                        "continuous_usage_stats": True}},
     [(wire.chat_role(usage=(5, 0)), 0.1),
      (wire.chat_delta(content="a", usage=(5, 1)), 0.1),
      (wire.chat_delta(content="bcd", usage=(5, 4)), 0.35),
      (wire.chat_delta(content="e", finish="stop", usage=(5, 5)), 0.4),
      (wire.chat_usage(5, 5), 0.4), (wire.DONE, 0.4)]),
    ("/v1/chat/completions", {**CHAT, "logprobs": True},
     [(wire.chat_role(), 0.1), (wire.chat_delta(content="a", logprobs=_chat_logprobs("a")), 0.1),
      (wire.chat_delta(content="bcd", logprobs=_chat_logprobs("bcd")), 0.35),
      (wire.chat_delta(content="e", finish="stop", logprobs=_chat_logprobs("e")), 0.4),
      (wire.DONE, 0.4)]),
    ("/v1/completions", {**COMPLETION, "logprobs": 0},
     [(wire.completion(0, "a", logprobs=_completion_logprobs("a", 0)), 0.1),
      (wire.completion(0, "bcd", logprobs=_completion_logprobs("bcd", 1)), 0.35),
      (wire.completion(0, "e", finish="stop", logprobs=_completion_logprobs("e", 4)), 0.4),
      (wire.DONE, 0.4)]),
], ids=["continuous-usage", "chat-logprobs", "completions-logprobs"])
def test_a_chunk_that_says_how_many_tokens_it_brings_counts_them(
        tmp_path: Path, path: str, body: dict[str, Any],
        pieces: list[tuple[bytes, float]]) -> None:
    """vLLM merges the outputs its API server had not yet written into one chunk (its
    output collector), so a busy server streams chunks of several tokens. Where the
    chunk says how many (continuous usage, logprobs), the meter counts them: 5 tokens,
    in 3 chunks, 2 gaps. The client waited 0.25 s for "bcd": one gap over the 0.1 s
    target, whatever the chunk brings (``ClientGaps``, as on the built-in engine): 1 of
    2, a miss, as a client timing chunks (one ITL a chunk) reads it. Shared, it read
    as three 0.083 s gaps, a stream met that its client saw stall."""
    assert judged(tmp_path, path, body, pieces) == {MISSED: (1, 5)}


CONTINUE = {**CHAT, "messages": [{"role": "user", "content": "a story"},
                                 {"role": "assistant", "content": "Once upon"}],
            "echo": True, "add_generation_prompt": False}
"""A chat request continuing an assistant message, with vLLM's ``echo``."""


def test_a_chat_echo_is_not_the_first_token(tmp_path: Path) -> None:
    """With ``"echo": true`` vLLM sends the last message's content back in the chunk after
    the role's, before the engine generated anything (its continuous usage says 0
    tokens). The meter took it for the first token: its TTFT read 0.1 s where the first
    generated token came at 0.3 s, and the wait for that token read as a slow gap (0.2 s
    over the 0.1 s target, 1 of 2), a miss where the stream met the SLO."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    body = {**CONTINUE, "stream_options": {"include_usage": True,
                                           "continuous_usage_stats": True}}
    pieces = [(wire.chat_role(usage=(5, 0)), 0.1),
              (wire.chat_echo("Once upon", usage=(5, 0)), 0.1),
              (wire.chat_delta(content=" a", usage=(5, 1)), 0.3),
              (wire.chat_delta(content=" time", usage=(5, 2)), 0.35),
              (wire.chat_delta(content=",", finish="length", usage=(5, 3)), 0.4),
              (wire.chat_usage(5, 3), 0.4), (wire.DONE, 0.4)]
    upstream.answer([p for p, _ in pieces], headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/chat/completions", body,
                                         written_at=[t for _, t in pieces])

    run(go)
    assert counted(meter) == {MET: (1, 3)}
    assert (meter.latency.ttft.count, meter.latency.ttft.total) == (1, 0.3)


@pytest.mark.parametrize("retry_header", [{"x-stainless-retry-count": "1"}, {}],
                         ids=["numbered", "unnumbered"])
def test_a_retry_counts_as_any_request_with_or_without_its_number(
        tmp_path: Path, retry_header: dict[str, str]) -> None:
    """vLLM turns nothing away for load (it queues), so a client's retry follows a try
    that failed: an error answer, passed on unjudged, or a wait it gave up on, judged
    cut short (a miss: it waited past the TTFT target). The meter reads no retry
    number: a retry is judged as any request, numbered by the openai SDKs or not, and
    the call counts its failed wait once and its retry once either way."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([wire.error("EngineCore encountered an issue.")[6:-2]], status=500,
                    headers={"content-type": "application/json"})
    upstream.answer([HOLD], headers={"content-type": wire.CONTENT_TYPE})
    upstream.answer([wire.chat_role(), wire.chat_delta(content="a"),
                     wire.chat_delta(content="b", finish="stop"), wire.DONE],
                    headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> None:
        client = Client(meter, now)
        assert (await client.request("POST", "/v1/chat/completions", CHAT))[0] == 500
        client = Client(meter, now)
        waiting = asyncio.ensure_future(client.request(
            "POST", "/v1/chat/completions", CHAT, headers=retry_header))
        await give_up(client, upstream, now, after=0)  # the SDK's timeout, at 0.8 s
        await asyncio.wait_for(waiting, HANG_GUARD_S)
        now[0] = 1.0
        await Client(meter, now).request("POST", "/v1/chat/completions", CHAT,
                                         headers=retry_header | {
                                             "x-stainless-retry-count": "2"}
                                         if retry_header else {},
                                         written_at=[1.1, 1.1, 1.15, 1.15])

    run(go)
    assert counted(meter) == {MISSED: (1, 0), MET: (1, 2)}
