"""The OpenAI features clients of vLLM use, read back by the official ``openai`` client:
n, logprobs / top_logprobs, echo, batched prompts, penalties and logit_bias, on both
executors (the simulated one answers with synthetic but well-formed logprobs)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest

from tests.support.live_server import LiveServer
from tests.support.waits import HANG_GUARD_S


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                         timeout=HANG_GUARD_S)


def _args(srv: LiveServer, **kw: Any) -> dict[str, Any]:
    return {"model": srv.backend.served_model_name, "extra_body": {"ignore_eos": True}, **kw}


def test_n_choices_streamed_and_not(any_server: LiveServer) -> None:
    client = _client(any_server)
    res = client.completions.create(**_args(any_server, prompt="Hello there", n=3,
                                            max_tokens=4, temperature=1.0, seed=5))
    assert [c.index for c in res.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in res.choices)
    assert res.usage is not None and res.usage.completion_tokens == 12
    chunks = list(client.completions.create(**_args(
        any_server, prompt="Hello there", n=2, max_tokens=4, temperature=1.0, seed=5,
        stream=True, stream_options={"include_usage": True})))
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert finishes == {0: "length", 1: "length"}
    # Seeded: choice i draws with seed + i, streamed or not.
    assert [texts[0], texts[1]] == [res.choices[0].text, res.choices[1].text]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_batched_prompts_give_one_choice_set_per_prompt(any_server: LiveServer) -> None:
    res = _client(any_server).completions.create(**_args(
        any_server, prompt=["The sky is", "One two three four"], n=2, max_tokens=3,
        temperature=0))
    assert [c.index for c in res.choices] == [0, 1, 2, 3]
    assert res.choices[0].text == res.choices[1].text  # greedy: the same per prompt
    single = [_client(any_server).completions.create(**_args(
        any_server, prompt=p, max_tokens=3, temperature=0)) for p in
        ("The sky is", "One two three four")]
    assert res.usage is not None
    assert res.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single if s.usage)
    assert [res.choices[0].text, res.choices[2].text] == [s.choices[0].text for s in single]


def _check_completion_logprobs(lp: Any, n_tokens: int, k: int) -> None:
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n_tokens
    assert lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and isinstance(token, str)
        # The top k plus the token itself, keyed by text (the simulated server's
        # placeholder tokenizer reads every id as "tok", so there they merge into one).
        assert 1 <= len(top) <= k + 1 and token in top
        assert max(top.values()) >= value and all(v <= 0 for v in top.values())


def test_completion_logprobs(any_server: LiveServer) -> None:
    client = _client(any_server)
    res = client.completions.create(**_args(any_server, prompt="Count: one two", max_tokens=5,
                                            logprobs=3, temperature=0))
    lp = res.choices[0].logprobs
    assert lp is not None
    _check_completion_logprobs(lp, 5, 3)
    # Greedy: the chosen token is the most likely one.
    assert all(math.isclose(v, max(t.values()), abs_tol=1e-6)
               for v, t in zip(lp.token_logprobs, lp.top_logprobs, strict=True))
    streamed = list(client.completions.create(**_args(
        any_server, prompt="Count: one two", max_tokens=5, logprobs=3, temperature=0,
        stream=True)))
    values = [v for c in streamed for ch in c.choices if ch.logprobs
              for v in ch.logprobs.token_logprobs]
    assert values == pytest.approx(lp.token_logprobs, abs=1e-6)


@pytest.mark.parametrize("stop", [None, ["no such stop string"]])
def test_streamed_text_offsets_match_the_whole_response(any_server: LiveServer,
                                                         stop: list[str] | None) -> None:
    """A token's text_offset is where it starts in the choice's text, streamed or not:
    a stop string holds text back while streaming, and offsets counted from the text
    sent so far came out too small (0, 0, 0, 1, ... against 0, 6, 7, 8, ...)."""
    client = _client(any_server)
    args = _args(any_server, prompt="Count: one two", max_tokens=6, logprobs=1,
                 temperature=0, stop=stop)
    choice = client.completions.create(**args).choices[0]
    whole = choice.logprobs
    assert whole is not None
    streamed = [o for c in client.completions.create(**args, stream=True)
                for ch in c.choices if ch.logprobs for o in ch.logprobs.text_offset]
    assert streamed == whole.text_offset
    # Within the text, in order (test_logprob_bytes.py: exactly where, for pieces of a
    # character too).
    assert whole.text_offset == sorted(whole.text_offset)
    assert whole.text_offset[0] == 0 and whole.text_offset[-1] < len(choice.text)


def test_echo_with_logprobs(any_server: LiveServer) -> None:
    client = _client(any_server)
    prompt = "Echo me back please"
    res = client.completions.create(**_args(any_server, prompt=prompt, max_tokens=3,
                                            echo=True, logprobs=1, temperature=0))
    choice = res.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    assert res.usage is not None
    lp = choice.logprobs
    assert lp is not None
    assert len(lp.tokens) == res.usage.prompt_tokens + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # no context
    _check_completion_logprobs(type(lp)(tokens=lp.tokens[1:], token_logprobs=lp.token_logprobs[1:],
                                        top_logprobs=lp.top_logprobs[1:],
                                        text_offset=lp.text_offset[1:]),
                               res.usage.prompt_tokens + 2, 1)
    plain = client.completions.create(**_args(any_server, prompt=prompt, max_tokens=3,
                                              echo=True, temperature=0))
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None
    streamed = list(client.completions.create(**_args(
        any_server, prompt=prompt, max_tokens=3, echo=True, temperature=0, stream=True)))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text


def test_chat_logprobs(any_server: LiveServer) -> None:
    client = _client(any_server)
    messages: list[Any] = [{"role": "user", "content": "Say something."}]
    # No special token, whose bytes (its text) the choice's text leaves out.
    res = client.chat.completions.create(**_args(any_server, messages=messages, max_tokens=4,
                                                 logprobs=True, top_logprobs=2, n=2,
                                                 logit_bias={"0": -100, "1": -100,
                                                             "2": -100}))
    assert [c.index for c in res.choices] == [0, 1]
    for choice in res.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        content = choice.logprobs.content
        assert len(content) == 4
        for item in content:
            assert item.logprob <= 0 and len(item.top_logprobs) == 2
            assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        # The tokens' raw bytes rebuild the text, as OpenAI's do.
        joined = b"".join(bytes(item.bytes or ()) for item in content)
        assert joined.decode("utf-8", "replace") == choice.message.content
    stream = list(client.chat.completions.create(**_args(
        any_server, messages=messages, max_tokens=4, logprobs=True, stream=True)))
    items = [i for c in stream for ch in c.choices if ch.logprobs and ch.logprobs.content
             for i in ch.logprobs.content]
    assert len(items) == 4 and all(i.top_logprobs == [] for i in items)


def test_penalties_and_logit_bias_are_accepted(any_server: LiveServer) -> None:
    res = _client(any_server).completions.create(**_args(
        any_server, prompt="a b c", max_tokens=4, presence_penalty=0.5,
        frequency_penalty=0.3, logit_bias={"7": 2.0},
        extra_body={"ignore_eos": True, "repetition_penalty": 1.2, "cache_salt": "t1"}))
    assert res.choices[0].finish_reason == "length" and res.usage is not None
    assert res.usage.completion_tokens == 4


def test_logit_bias_steers_the_model(torch_server: LiveServer) -> None:
    res = _client(torch_server).completions.create(**_args(
        torch_server, prompt="The weather today", max_tokens=5, temperature=0,
        logit_bias={"42": 100}, extra_body={"ignore_eos": True, "return_token_ids": True}))
    assert res.model_extra is not None or res.choices
    body = httpx.post(torch_server.url + "/v1/completions", timeout=HANG_GUARD_S, json={
        "prompt": "The weather today", "max_tokens": 5, "temperature": 0,
        "logit_bias": {"42": 100}, "ignore_eos": True, "return_token_ids": True}).json()
    assert body["choices"][0]["token_ids"] == [42] * 5
    unbiased = httpx.post(torch_server.url + "/v1/completions", timeout=HANG_GUARD_S, json={
        "prompt": "The weather today", "max_tokens": 5, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True}).json()
    assert unbiased["choices"][0]["token_ids"] != [42] * 5


def test_a_queue_refusal_admits_no_choice() -> None:
    from tests.support.live_server import start_server

    with start_server(knobs={"max_waiting": 2, "max_num_seqs": 1}) as srv:
        res = httpx.post(srv.url + "/v1/completions", timeout=HANG_GUARD_S,
                         json={"prompt": "a", "n": 4, "max_tokens": 2})
        # Four choices never fit a queue of two: bad input, not "retry later" (a full
        # queue's 429 admits none either: test_async_engine).
        assert res.status_code == 400 and res.json()["error"]["param"] == "n"
        assert srv.call(lambda e: len(e.scheduler.requests)) == 0
