"""The official openai client against live servers: completions and chat, streamed or not."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from slopilot.engine.server.app import create_app
from tests.support.live_server import LiveServer, build_backend
from tests.support.waits import HANG_GUARD_S


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                         timeout=HANG_GUARD_S)


def test_completion(any_server: LiveServer) -> None:
    client = _client(any_server)
    name = any_server.backend.served_model_name
    res = client.completions.create(model=name, prompt="The quick brown fox", max_tokens=6,
                                    temperature=0, extra_body={"ignore_eos": True})
    choice = res.choices[0]
    assert res.model == name and res.object == "text_completion"
    assert choice.finish_reason == "length" and choice.text
    assert res.usage is not None
    assert res.usage.completion_tokens == 6
    assert res.usage.prompt_tokens > 0
    assert res.usage.total_tokens == res.usage.prompt_tokens + 6


def test_completion_stream_matches_non_streamed(any_server: LiveServer) -> None:
    client = _client(any_server)
    name = any_server.backend.served_model_name
    args: dict[str, Any] = {"model": name, "prompt": "Hello, world! Tell me", "max_tokens": 8,
            "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == whole.choices[0].text
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert whole.usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat(any_server: LiveServer) -> None:
    client = _client(any_server)
    name = any_server.backend.served_model_name
    messages: list[Any] = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the weather like today?"}]
    res = client.chat.completions.create(model=name, messages=messages,
                                         max_completion_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert res.object == "chat.completion"
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].finish_reason == "length"
    assert res.usage is not None and res.usage.completion_tokens == 5

    stream = client.chat.completions.create(
        model=name, messages=messages, max_tokens=5, temperature=0, stream=True,
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == res.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # not asked for


def test_text_parts_of_a_message_are_joined_by_newlines(sim_server: LiveServer) -> None:
    """A message sent as text parts is read as vLLM (and SGLang, TensorRT-LLM) read it:
    the parts joined by a newline, not glued into one word ("hello" + "world")."""
    client = _client(sim_server)
    name = sim_server.backend.served_model_name

    def prompt_tokens(content: Any) -> int:
        res = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": content}], max_tokens=1)
        assert res.usage is not None
        return res.usage.prompt_tokens

    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    # One token a word on the simulated model: glued, the two parts were one word.
    assert prompt_tokens(parts) == prompt_tokens("hello\nworld") \
        == prompt_tokens("hello") + 1


def test_token_id_prompt_and_priority_header(any_server: LiveServer) -> None:
    res = httpx.post(any_server.url + "/v1/completions", json={
        "prompt": [5, 6, 7, 8], "max_tokens": 3, "ignore_eos": True, "return_token_ids": True},
        headers={"x-slopilot-priority": "p0"}, timeout=HANG_GUARD_S)
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["prompt_token_ids"] == [5, 6, 7, 8]
    assert len(body["choices"][0]["token_ids"]) == 3
    assert body["usage"]["prompt_tokens"] == 4


def test_models(any_server: LiveServer) -> None:
    models = _client(any_server).models.list()
    assert [m.id for m in models.data] == [any_server.backend.served_model_name]


# Any fixed instant: the server's start, as its clock tells it.
STARTED_AT = 1_767_225_600.75


@pytest.mark.parametrize("name", ["tiny", "org/tiny-model"])
async def test_models_retrieve_the_served_card_stamped_with_the_start(name: str) -> None:
    """``client.models.retrieve`` asks GET /v1/models/{id}, which was a 404 for every
    id; and every card said ``created: 0`` (read as 1970). A name with a slash (a Hub
    name, as vLLM serves it by default) is one id."""
    app = create_app(build_backend(realtime=False, served_model_name=name),
                     wall_clock=lambda: STARTED_AT)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://engine") as http:
        client = openai.AsyncOpenAI(base_url="http://engine/v1", api_key="unused",
                                    max_retries=0, http_client=http)
        listed = (await client.models.list()).data
        card = await client.models.retrieve(name)
        assert [m.model_dump() for m in listed] == [card.model_dump()]
        assert card.id == name and card.object == "model"
        assert card.created == int(STARTED_AT)
        with pytest.raises(openai.NotFoundError) as refused:
            await client.models.retrieve("no-such-model")
    # The completions route's answer for a model not served here.
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "model_not_found"
    assert refused.value.body["param"] == "model"
    assert "is not served here" in refused.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_trims_and_finishes(sim_server: LiveServer, stream: bool) -> None:
    # Simulated output is " tok tok tok ...": stop at the third word.
    client = _client(sim_server)
    args: dict[str, Any] = {"model": sim_server.backend.served_model_name, "prompt": "a b c",
            "max_tokens": 20, "stop": ["tok tok tok"]}
    if stream:
        chunks = list(client.completions.create(**args, stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        res = client.completions.create(**args)
        text, finish = res.choices[0].text, res.choices[0].finish_reason
    assert text == " "
    assert finish == "stop"
    sim_server.call(lambda e: e.scheduler.check_integrity())


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_off_stop_strings(sim_server: LiveServer, stream: bool) -> None:
    """vLLM searches no stop string in the first min_tokens tokens: a client asking for
    at least 4 gets them, not a reply cut at the first match."""
    client = _client(sim_server)
    args: dict[str, Any] = {"model": sim_server.backend.served_model_name, "prompt": "a b c",
                            "max_tokens": 20, "stop": ["tok"],
                            "extra_body": {"min_tokens": 4, "ignore_eos": True}}
    if stream:
        chunks = list(client.completions.create(**args, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        res = client.completions.create(**args)
        text, finish, usage = res.choices[0].text, res.choices[0].finish_reason, res.usage
    # Five tokens: the fifth's "tok" is the first match past the four.
    assert text == " tok tok tok tok "
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 5


def test_the_sdk_names_each_retry_of_a_429_as_the_server_reads_it() -> None:
    """The pinned openai SDK retries a 429 (twice by default) and says which try each
    request is in ``x-stainless-retry-count``, the header the server reads to count a
    call turned away once (``serving.RETRY_COUNT_HEADER``). If a new SDK renamed it, the
    server would count each retry as a new refusal again: this says so first."""
    from slopilot.engine.server.serving import RETRY_COUNT_HEADER

    seen: list[str | None] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(RETRY_COUNT_HEADER))
        return httpx.Response(429, headers={"retry-after-ms": "1"},  # no wait between tries
                              json={"error": {"message": "queue full", "type":
                                              "rate_limit_error", "code": "queue_full"}})

    client = openai.OpenAI(base_url="http://engine.invalid/v1", api_key="x",
                           http_client=httpx.Client(transport=httpx.MockTransport(refuse)))
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="m", prompt="x", max_tokens=1)
    assert seen == ["0", "1", "2"]
