"""A stream's usage, asked for with ``stream_options`` as vLLM reads them, written as
vLLM writes it.

vLLM's ``StreamOptions`` (``vllm/entrypoints/openai/protocol.py``): ``include_usage``
defaults to true once the options are given, and null is false; ``continuous_usage_stats``
(false unless set, and nothing without ``include_usage``) puts each chunk's usage on it:
its choice's prompt and completion tokens so far (``serving_chat.py``,
``serving_completion.py``). Non-empty options without ``stream=true`` are a 400.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pydantic
import pytest

from slopilot.engine.request import FinishReason
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.support.live_server import LiveServer, build_backend
from tests.support.scripted_stream import written
from tests.support.waits import HANG_GUARD_S

LENGTH = FinishReason.LENGTH
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 4,
                        "stream": True}
COMPLETION: dict[str, Any] = {"prompt": "a b", "max_tokens": 4, "stream": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def backend() -> Backend:
    return build_backend(realtime=False)


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    events = raw.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], raw
    return [json.loads(e.removeprefix("data: ")) for e in events[:-2]]


@pytest.mark.parametrize(("options", "include", "continuous"), [
    (None, False, False),
    ({}, True, False),  # given, include_usage is true unless it says otherwise
    ({"include_usage": None}, False, False),  # null is false, as vLLM's `or` reads it
    ({"include_usage": False}, False, False),
    ({"continuous_usage_stats": True}, True, True),
    ({"include_usage": False, "continuous_usage_stats": True}, False, False),
    ({"include_usage": True, "continuous_usage_stats": None}, True, False),
    ({"include_usage": "yes", "continuous_usage_stats": 1}, True, True),  # lax, as pydantic
    ({"include_usage": True, "unknown": 1}, True, False),
])
@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_stream_options_are_read_as_vllm_reads_them(
        model: type[CompletionRequest | ChatCompletionRequest],
        options: dict[str, Any] | None, include: bool, continuous: bool) -> None:
    body = {**(CHAT if model is ChatCompletionRequest else COMPLETION),
            "stream_options": options}
    request = model(**body)
    assert (request.include_usage, request.continuous_usage) == (include, continuous)


@pytest.mark.parametrize(("stream", "options", "refused"), [
    (False, {"include_usage": True}, True),
    (None, {"continuous_usage_stats": False}, True),
    (False, {"include_usage": None}, True),  # a key given: the options are not empty
    (False, {}, False),  # vLLM refuses only options that say something
    (False, None, False),
    (True, {"include_usage": "perhaps"}, True),  # not a flag
])
def test_stream_options_that_say_something_need_a_stream(
        stream: bool | None, options: dict[str, Any] | None, refused: bool) -> None:
    body = {**COMPLETION, "stream": stream, "stream_options": options}
    if refused:
        with pytest.raises(pydantic.ValidationError, match="stream"):
            CompletionRequest(**body)
    else:
        CompletionRequest(**body)


# A choice's tokens arrive merged: choice 0 one, two, one; choice 1 three, one.
MERGED = [[(0, 1), (1, 3)], [(0, 2)], [(0, 1, LENGTH), (1, 1, LENGTH)]]


@pytest.mark.parametrize("body", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_continuous_usage_counts_each_choices_tokens_so_far(
        backend: Backend, body: dict[str, Any]) -> None:
    """Every chunk of choice i says its prompt and the tokens choice i got so far
    (vLLM's ``previous_num_tokens[i]``): a merged chunk of three says three more. A chat
    stream's role chunks come before any token, and say none. The last chunk counts the
    prompt once and every choice's tokens."""
    raw = written(backend, {**body, "n": 2, "stream_options": CONTINUOUS}, MERGED)
    chunks = _chunks(raw)
    prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert prompt > 0
    seen = [(c["choices"][0]["index"], c["usage"]) for c in chunks[:-1]]
    counts = [(i, u["completion_tokens"]) for i, u in seen]
    role = [(0, 0), (1, 0)] if "messages" in body else []
    # A choice's last tokens' chunk carries its finish reason: no chunk after it.
    assert counts == [*role, (0, 1), (1, 3), (0, 3), (0, 4), (1, 4)]
    assert all(u == {"prompt_tokens": prompt, "total_tokens": prompt + u["completion_tokens"],
                     "completion_tokens": u["completion_tokens"],
                     **({} if "messages" in body else {"prompt_tokens_details": None})}
               for _, u in seen)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": prompt, "total_tokens": prompt + 8, "completion_tokens": 8}


def test_continuous_usage_of_a_batch_counts_each_choices_own_prompt(backend: Backend) -> None:
    """A list of prompts: choice i's usage counts its own prompt's tokens
    (``num_prompt_tokens[prompt_idx]``), the last chunk every prompt's once."""
    body = {**COMPLETION, "prompt": ["a", "a b c"], "n": 2, "stream_options": CONTINUOUS}
    raw = written(backend, body, [[(0, 1, LENGTH), (1, 1, LENGTH), (2, 2, LENGTH),
                                   (3, 1, LENGTH)]])
    chunks = _chunks(raw)
    prompts = {c["choices"][0]["index"]: c["usage"]["prompt_tokens"] for c in chunks[:-1]}
    assert prompts[0] == prompts[1] < prompts[2] == prompts[3]
    assert chunks[-1]["usage"]["prompt_tokens"] == prompts[0] + prompts[2]
    assert chunks[-1]["usage"]["completion_tokens"] == 5


_USAGE_TAIL = re.compile(
    rb'"choices":\[\{.*\}\],"usage":\{"prompt_tokens":\d+,"total_tokens":\d+,'
    rb'"completion_tokens":\d+(,"prompt_tokens_details":null)?\}\}')
_FINAL = re.compile(rb'^data: \{"id":"(cmpl|chatcmpl)-[0-9a-f]+","object":"[a-z_.]+",'
                    rb'"created":\d+,"model":"[^"]+","choices":\[\],"usage":\{'
                    rb'"prompt_tokens":\d+,"total_tokens":\d+,"completion_tokens":\d+\}\}$')


@pytest.mark.parametrize("body", [COMPLETION, CHAT], ids=["completions", "chat"])
@pytest.mark.parametrize("options", [None, {"include_usage": True}, CONTINUOUS],
                         ids=["none", "final", "continuous"])
def test_usage_is_written_in_vllms_bytes(backend: Backend, body: dict[str, Any],
                                         options: dict[str, Any] | None) -> None:
    """Where vLLM writes each chunk's usage, and in its field order (``UsageInfo``:
    prompt, total, completion; pydantic's compact JSON). A completions chunk has every
    field (``exclude_unset=False``): ``"usage":null`` without continuous stats, else
    the usage with ``"prompt_tokens_details":null``. A chat chunk has the fields set
    (``exclude_unset=True``): none without them. The last chunk has no choices, and no
    null (``exclude_none``)."""
    raw = written(backend, {**body, "stream_options": options},
                  [[(0, 2)], [(0, 1, LENGTH)]])
    events = raw.split(b"\n\n")[:-2]
    chat = "messages" in body
    final = options is not None
    if final:
        assert _FINAL.match(events.pop()), raw
    for event in events:
        if options == CONTINUOUS:
            assert _USAGE_TAIL.search(event), event
            assert event.endswith(b',"prompt_tokens_details":null}}') != chat, event
        elif chat:
            assert b'"usage"' not in event, event
        else:
            assert event.endswith(b'}],"usage":null}'), event
    assert b'"choices":[]' not in b"".join(events)


def test_a_live_stream_carries_its_choices_usage_on_every_chunk(
        sim_server: LiveServer) -> None:
    """Over HTTP, a simulated engine's chunks: each says its choice's tokens so far,
    never fewer than the chunk before, up to the choice's whole output."""
    body = {**CHAT, "max_tokens": 6, "n": 2, "ignore_eos": True, "stream_options": CONTINUOUS}
    with httpx.stream("POST", sim_server.url + "/v1/chat/completions", json=body,
                      timeout=HANG_GUARD_S) as res:
        assert res.status_code == 200, res.read()
        chunks = _chunks(res.read())
    so_far = {0: 0, 1: 0}
    for chunk in chunks[:-1]:
        index, count = chunk["choices"][0]["index"], chunk["usage"]["completion_tokens"]
        assert count >= so_far[index]
        so_far[index] = count
    assert so_far == {0: 6, 1: 6}
    assert chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("body", [COMPLETION, CHAT])
def test_the_last_tokens_chunk_carries_the_finish_reason(backend: Backend,
                                                         body: dict[str, Any]) -> None:
    """As vLLM writes it: the chunk of a choice's last tokens says how it finished, and
    no empty chunk follows it. A client timing each chunk it reads (vLLM's own
    ``vllm bench serve`` appends a gap for every chunk with choices) took that empty chunk
    for one more token, a gap of about nothing, and read the server's TBT low."""
    chunks = _chunks(written(backend, {**body, "max_tokens": 3},
                             [[(0, 1)], [(0, 1)], [(0, 1, LENGTH)]]))
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    said = [c.get("text") or c.get("delta", {}).get("content") for c in choices]
    if "messages" in body:
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        choices, said = choices[1:], said[1:]
    assert all(said), said  # every chunk brings text: no empty finish chunk
    assert len(choices) == 3
    assert [c["finish_reason"] for c in choices] == [None, None, "length"]
