"""Every error path answers OpenAI-shaped JSON with the right status."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.stalled_client import EngineFreeze
from tests.support.waits import HANG_GUARD_S, wait_for

SLO = SLOSpec.from_profile("standard")
P0_SLO = SLO.class_slo(Priority.P0)


def _post(srv: LiveServer, body: Any, path: str = "/v1/completions",
          **kw: Any) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        kw["content"] = body
        kw.setdefault("headers", {})["content-type"] = "application/json"
    else:
        kw["json"] = body
    return httpx.post(srv.url + path, timeout=HANG_GUARD_S, **kw)


def _error(res: httpx.Response, status: int) -> dict[str, Any]:
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    # pydantic's wording of a validator's refusal, never the client's to read.
    assert "Value error" not in err["message"]
    return err


# Every status the server or the meter answers with a code of its own choosing.
_STATUSES = (400, 401, 403, 404, 405, 408, 413, 429, 431, 500, 502, 503)


def test_error_codes_do_not_follow_pythons_status_phrases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A code left to the status was its phrase in Python's ``http.HTTPStatus``, which
    Python renames: 413 read ``request_entity_too_large`` on 3.11 and 3.12 and
    ``content_too_large`` on 3.13 (the meter says ``request_too_large``)."""
    from http import HTTPStatus

    from slopilot.engine.server.errors import error_body

    def codes() -> dict[int, object]:
        return {s: error_body(s, "m")["error"]["code"] for s in _STATUSES}

    before = codes()
    assert before[413] == "request_too_large"
    for status in _STATUSES:
        monkeypatch.setattr(HTTPStatus(status), "phrase", "Renamed In Another Python")
    assert codes() == before


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"prompt": "hi", "n": 17}, "n", "less than or equal to 16"),
    ({"prompt": ["a", "b", "c"], "n": 6}, "n", "at most 16 choices"),
    ({"prompt": "hi", "priority": "urgent"}, "priority", "not a class"),
    # JSON's booleans read as 1 and 0: false was served as P0, the most urgent class.
    ({"prompt": "hi", "priority": False}, "priority", "false is not a class"),
    ({"prompt": "hi", "priority": True}, "priority", "true is not a class"),
    ({"prompt": "hi", "temperature": -1}, "temperature", "greater than or equal"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens", "greater than or equal"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "greater than"),
    ({"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "max_tokens"),
    ({"prompt": "   "}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [[1], []]}, "prompt", "empty"),
    ({"prompt": [1, 10**9]}, "prompt", "outside the vocabulary"),
    ({"prompt": [-1]}, "prompt", "outside the vocabulary"),
    ({"prompt": "hi", "stop": ["ok", ""]}, "stop", "empty"),
    ({"prompt": "hi", "stop": [str(i) for i in range(17)]}, "stop",
     "stop: 17 stop strings: at most 16"),
    # Each stop string is searched for at every token of every choice, at a cost that
    # grows with its length: 16 of 16,000 characters and n=16 (a 256 KiB body) held the
    # event loop, every stream on the server, for seconds.
    ({"prompt": "hi", "stop": "x" * 1025}, "stop", "at most 1024 characters"),
    ({"prompt": "hi", "stop": ["ok", "x" * 16_000]}, "stop", "at most 1024 characters"),
    ({"prompt": "hi", "suffix": "x"}, "suffix", "suffix: suffix is not supported"),
    # vLLM and OpenAI ask best_of >= n: one candidate cannot make two choices.
    ({"prompt": "hi", "n": 2, "best_of": 1}, "best_of", "only best_of = n"),
    ({"prompt": "hi", "best_of": 3}, "best_of", "only best_of = n"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"prompt": "hi", "presence_penalty": 3}, "presence_penalty", "less than or equal"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "greater than"),
    ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias", "outside [-100, 100]"),
    ({"prompt": "hi", "logit_bias": {"999999999": 1}}, "logit_bias", "outside the vocabulary"),
    # Digits to str.isdigit() that int() refuses, or reads as another token.
    ({"prompt": "hi", "logit_bias": {"\u00b2": 1}}, "logit_bias", "ASCII digits"),
    ({"prompt": "hi", "logit_bias": {"\u0663": 1}}, "logit_bias", "ASCII digits"),
    ({"prompt": "hi", "logit_bias": {"1" * 5000: 1}}, "logit_bias", "ASCII digits"),
    ({"prompt": "hi", "logit_bias": {"-1": 1}}, "logit_bias", "ASCII digits"),
    ({"prompt": "hi", "stop_token_ids": [-5]}, "stop_token_ids", "outside the vocabulary"),
    ({"prompt": "hi", "stop_token_ids": [10**26]}, "stop_token_ids",
     "outside the vocabulary"),
    ({"prompt": "hi", "cache_salt": ""}, "cache_salt", "at least 1 character"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options",
     "stream=true"),
    ({"prompt": "hi", "max_tokens": 100000}, "max_tokens", "lower max_tokens"),
    ({}, "prompt", "Field required"),
])
def test_bad_completion_is_400(sim_server: LiveServer, body: dict[str, Any],
                               param: str | None, words: str) -> None:
    err = _error(_post(sim_server, body), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert words in err["message"]


_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": _HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    # Refused by the request's own checks, which named no field (the SDK's e.param read
    # None) and said "Value error, " before the reason.
    ({"messages": _HI, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": _HI, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": _HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}}, "response_format"),
    ({"messages": _HI, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": _HI, "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_bad_chat_is_400(sim_server: LiveServer, body: dict[str, Any],
                         param: str | None) -> None:
    err = _error(_post(sim_server, body, "/v1/chat/completions"), 400)
    assert err["param"] == param
    if param != "messages":
        assert err["message"].startswith(f"{param}: "), err


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_length_error_names_the_field_sent(sim_server: LiveServer, field: str) -> None:
    # The SDK's chat parameter is max_completion_tokens: the error must name it, not a
    # max_tokens the client never sent.
    err = _error(_post(sim_server, {"messages": [{"role": "user", "content": "hi"}],
                                    field: 10**6}, "/v1/chat/completions"), 400)
    assert err["param"] == field and err["code"] == "context_length_exceeded"
    assert f"lower {field} to at most" in err["message"]
    err = _error(_post(sim_server, {"messages": [{"role": "user", "content": "hi"}],
                                    field: 2, "min_tokens": 3}, "/v1/chat/completions"), 400)
    assert err["param"] == "min_tokens" and f"above {field}=2" in err["message"]


def test_malformed_json_and_bad_priority_header(sim_server: LiveServer) -> None:
    err = _error(_post(sim_server, b'{"prompt": "hi",,}'), 400)
    # No field to name (not the byte offset FastAPI puts in the location).
    assert err["param"] is None
    assert "not valid JSON" in err["message"] and "position 16" in err["message"]
    err = _error(_post(sim_server, {"prompt": "hi"},
                       headers={"x-slopilot-priority": "p9"}), 400)
    assert err["param"] == "x-slopilot-priority"


def test_a_body_cut_short_says_where_without_a_doubled_word(sim_server: LiveServer) -> None:
    # json's own words end in "at" ("Unterminated string starting at"): the message read
    # "... starting at at position 10".
    err = _error(_post(sim_server, b'{"prompt": "hi'), 400)
    assert err["message"] == ("the request body is not valid JSON: Unterminated string "
                              "starting at position 11")


def test_a_bad_logit_bias_key_keeps_the_connection(sim_server: LiveServer) -> None:
    # A 500 closed the keep-alive connection; a 400 leaves it for the next request.
    with httpx.Client(base_url=sim_server.url, timeout=HANG_GUARD_S) as client:
        for _ in range(2):
            res = client.post("/v1/completions",
                              json={"prompt": "hi", "logit_bias": {"\u00b2": 1}})
            assert _error(res, 400)["param"] == "logit_bias"
            assert res.headers.get("connection") != "close"


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/v1/completions", {"prompt": "hi", "stop": ["ok", 7]}, "stop.1", "valid string"),
    ("/v1/completions", {"prompt": "hi", "priority": 1.5}, "priority", "fractional part"),
    ("/v1/completions", {"prompt": ["a", [1, 2]]}, "prompt.1", "valid string"),
    ("/v1/completions", {"prompt": None}, "prompt", "valid"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0.type", "'text'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text", "Field required"),
])
def test_a_field_of_several_types_is_named_as_sent(sim_server: LiveServer, path: str,
                                                   body: dict[str, Any], param: str,
                                                   words: str) -> None:
    """pydantic puts the union member it tried in the error's path; param was
    "stop.str", "priority.int" or "messages.0.content.str": no such field, and the
    message named the first member tried, not the one the client's value came close to
    (an image part was told its content should be a string)."""
    err = _error(_post(sim_server, body, path), 400)
    assert err["param"] == param
    assert err["message"].startswith(f"{param}: ") and words in err["message"]


@pytest.mark.parametrize(("body", "headers", "status"), [
    ({"prompt": "hi", "priority": "x" * 100_000}, {}, 400),
    ({"prompt": "hi", "priority": 10**5000 // 10**4000}, {}, 400),
    ({"prompt": "hi"}, {"x-slopilot-priority": "x" * 8000}, 400),
    ({"prompt": "hi", "model": "m" * 100_000}, {}, 404),
])
def test_an_error_shows_a_long_value_cut_short(sim_server: LiveServer, body: dict[str, Any],
                                               headers: dict[str, str], status: int) -> None:
    """An error names the value it refuses, but a value of megabytes was written back
    whole (the body cap allows 16 MiB): bytes the client sent, echoed and encoded again
    for nothing."""
    err = _error(_post(sim_server, body, headers=headers), status)
    assert len(err["message"]) < 400, len(err["message"])
    assert "..." in err["message"]


def test_unknown_model_and_route(sim_server: LiveServer) -> None:
    err = _error(_post(sim_server, {"prompt": "hi", "model": "gpt-9"}), 404)
    assert err["code"] == "model_not_found"
    _error(httpx.get(sim_server.url + "/v1/nothing-here"), 404)


def test_openai_client_raises_bad_request(sim_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=sim_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=sim_server.backend.served_model_name, prompt="hi",
                                  logprobs=25)
    assert info.value.status_code == 400


@pytest.mark.parametrize("chat", [False, True])
def test_prompt_beyond_context_is_400_context_length_exceeded(sim_server: LiveServer,
                                                              chat: bool) -> None:
    # As OpenAI and vLLM answer (the SDK raises BadRequestError); not 413.
    limit = sim_server.backend.max_model_len
    client = openai.OpenAI(base_url=sim_server.url + "/v1", api_key="x", max_retries=0)
    name = sim_server.backend.served_model_name
    with pytest.raises(openai.BadRequestError) as info:
        if chat:
            client.chat.completions.create(
                model=name, max_tokens=1, messages=[{"role": "user", "content": "w " * limit}])
        else:
            client.completions.create(model=name, prompt="w " * limit, max_tokens=1)
    err = info.value.body
    assert isinstance(err, dict) and err["code"] == "context_length_exceeded"
    assert str(limit) in err["message"]
    assert err["param"] == ("messages" if chat else "prompt")


def test_prompt_beyond_kv_capacity_is_400() -> None:
    # 4 blocks of 16 tokens: a 100-token prompt can never be cached.
    with start_server(num_gpu_blocks=4) as srv:
        err = _error(_post(srv, {"prompt": "w " * 100, "max_tokens": 1}), 400)
        assert "KV cache" in err["message"] and err["code"] == "context_length_exceeded"


async def read_first_chunk(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                           started: asyncio.Event) -> None:
    """Stream ``body`` until cancelled, ``started`` set at its first line."""
    async with client.stream("POST", url, json=body) as res:
        assert res.status_code == 200
        async for _ in res.aiter_lines():
            started.set()
    raise AssertionError("the long request finished; the test meant to cancel it")


@contextlib.asynccontextmanager
async def _full_queue() -> AsyncIterator[tuple[LiveServer, httpx.AsyncClient]]:
    """A server judging by ``SLO`` whose one running and one waiting request fill it: the
    next request gets 429. Both are P0: none gives way to another class's newcomer
    (``queue_room.py``)."""
    backend = build_backend(knobs={"max_num_seqs": 1, "max_waiting": 1})
    backend.metrics.set_slo(SLO)
    srv = start_server(backend)
    try:
        url = srv.url + "/v1/completions"
        long = {"prompt": "a b c", "max_tokens": 5000, "stream": True, "ignore_eos": True,
                "priority": 0}
        async with httpx.AsyncClient(timeout=HANG_GUARD_S) as client:
            started = asyncio.Event()
            running = asyncio.create_task(read_first_chunk(client, url, long, started))
            await asyncio.wait_for(started.wait(), HANG_GUARD_S)
            queued = asyncio.create_task(read_first_chunk(client, url, long, asyncio.Event()))
            await asyncio.to_thread(wait_for, lambda: srv.call(
                lambda e: e.scheduler.num_waiting) == 1, what="a waiting request")
            try:
                yield srv, client
            finally:
                for task in (running, queued):
                    task.cancel()
                await asyncio.gather(running, queued, return_exceptions=True)
        await asyncio.to_thread(wait_for, lambda: srv.call(
            lambda e: not e.scheduler.requests), what="both requests aborted")
    finally:
        srv.stop()


def _refused_series(text: str, name: str) -> dict[str, float]:
    return {s.labels["priority_class"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


async def test_full_queue_is_429_with_retry_after() -> None:
    async with _full_queue() as (srv, client):
        res = await client.post(srv.url + "/v1/completions",
                                json={"prompt": "x", "max_tokens": 1, "priority": 0})
        err = _error(res, 429)
        assert err["type"] == "rate_limit_error"
        assert 1 <= int(res.headers["retry-after"]) <= 60  # the backlog over its rate
        # Its client was never served: counted by class, and judged a miss of its
        # class's SLO (with no tokens), where nothing else would have seen it.
        metrics = srv.backend.metrics
        assert metrics.refused() == {Priority.P0: 1, Priority.P1: 0, Priority.P2: 0}
        assert metrics.verdicts()[Priority.P0, P0_SLO.label, False] == (1, 0)
        text = (await client.get(srv.url + "/metrics")).text
        assert 'slopilot_requests_refused_total{model_name="' in text
        assert _refused_series(text, "slopilot_requests_refused_total")["p0"] == 1


async def test_a_clients_retries_of_a_refused_request_are_not_refusals_again() -> None:
    """The openai SDK retries a 429 twice by default, each retry saying which it is
    (``x-stainless-retry-count``: 1, 2). One call turned away counted three refusals and
    three misses of its class: the refused share, the TTFT P99 and the demand the twin
    plans for all read its retries as more clients. A retry refused again is counted
    apart (``slopilot_request_retries_total{outcome="refused"}``); a first try (0, no
    header, or a value that is no count) is a refusal as before."""
    async with _full_queue() as (srv, client):
        url = srv.url + "/v1/completions"
        for retry in (None, "1", "2", "0", "x", "-1", "00", "9" * 5000):
            headers = {} if retry is None else {"x-stainless-retry-count": retry}
            _error(await client.post(url, json={"prompt": "x", "max_tokens": 1,
                                                "priority": 0}, headers=headers), 429)
        metrics = srv.backend.metrics
        assert metrics.refused() == {Priority.P0: 5, Priority.P1: 0, Priority.P2: 0}
        assert metrics.verdicts()[Priority.P0, P0_SLO.label, False] == (5, 0)
        assert metrics.retries(refused=True) == {Priority.P0: 3, Priority.P1: 0,
                                                 Priority.P2: 0}
        text = (await client.get(srv.url + "/metrics")).text
        assert _refused_series(text, "slopilot_requests_refused_total")["p0"] == 5
        retries = {(s.labels["priority_class"], s.labels["outcome"]): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "slopilot_request_retries_total"}
        assert retries == {(c, o): 3 if (c, o) == ("p0", "refused") else 0
                           for c in ("p0", "p1", "p2") for o in ("refused", "admitted")}


def test_a_retry_let_in_is_served_and_counted_as_any_request_and_as_a_retry() -> None:
    with start_server(knobs={"max_waiting": 4}) as srv:
        res = _post(srv, {"prompt": "hi", "max_tokens": 2, "priority": 2},
                    headers={"x-stainless-retry-count": "1"})
        assert res.status_code == 200
        metrics = srv.backend.metrics
        assert metrics.retries(refused=False) == {Priority.P0: 0, Priority.P1: 0,
                                                  Priority.P2: 1}
        assert metrics.refused() == {p: 0 for p in Priority}


def test_more_choices_than_max_waiting_is_400_not_429() -> None:
    with start_server(knobs={"max_waiting": 4}) as srv:
        res = _post(srv, {"prompt": "hi", "n": 8, "max_tokens": 2})
        err = _error(res, 400)
        assert err["param"] == "n" and "retry-after" not in res.headers
        assert "max_waiting=4" in err["message"] and "n=8" in err["message"]
        assert _post(srv, {"prompt": "hi", "n": 4, "max_tokens": 2}).status_code == 200


def test_draining_is_503_and_running_requests_finish() -> None:
    srv = start_server(drain_timeout_s=HANG_GUARD_S)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    name = srv.backend.served_model_name
    stream = client.completions.create(model=name, prompt="a b", max_tokens=40, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    # The running request held until the late ones are answered: it ends the drain, and
    # the server exits, once its 40 tokens are out, which a busy machine's late requests
    # came after (nothing listening).
    freeze = EngineFreeze(srv)
    freeze.hold()
    try:
        srv.begin_drain()
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        err = _error(_post(srv, {"prompt": "late", "max_tokens": 1}), 503)
        assert err["code"] == "draining"
    finally:
        freeze.thaw()
    rest = list(chunks)
    text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
    assert rest[-1].choices[0].finish_reason == "length"
    assert text.split() == ["tok"] * 40
    # Drained: the server shuts itself down.
    wait_for(lambda: not srv.thread.is_alive(), what="the server to exit")


def test_drain_timeout_aborts_the_rest() -> None:
    srv = start_server(drain_timeout_s=0.2)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model=srv.backend.served_model_name, prompt="a",
                                       max_tokens=5000, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    srv.begin_drain()
    last = list(chunks)[-1]
    assert last.choices[0].finish_reason == "abort"
    wait_for(lambda: not srv.thread.is_alive(), what="the server to exit")


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded",
                                          "text/plain"])
def test_a_json_body_sent_without_the_json_content_type_is_told_the_header(
        content_type: str | None) -> None:
    """``curl -d '{...}'`` sends a form's content type; the body is JSON but is not read
    as such, and the answer was pydantic's "Input should be a valid dictionary or object
    to extract fields from", which names neither the header nor the fix."""
    headers = {} if content_type is None else {"content-type": content_type}
    with start_server() as srv:
        res = httpx.post(srv.url + "/v1/completions", content=b'{"prompt": "hi"}',
                         headers=headers, timeout=HANG_GUARD_S)
        err = _error(res, 400)
        assert "Content-Type: application/json" in err["message"]
        assert (content_type or "no Content-Type") in err["message"]
        assert "-H 'Content-Type: application/json'" in err["message"]
        # The JSON type itself, or one of its +json forms, is read as JSON.
        for json_type in ("application/json", "application/json; charset=utf-8"):
            res = httpx.post(srv.url + "/v1/completions",
                             content=b'{"prompt": "hi", "max_tokens": 1}',
                             headers={"content-type": json_type}, timeout=HANG_GUARD_S)
            assert res.status_code == 200, res.text


@pytest.mark.parametrize(("field", "literal"), [("temperature", "NaN"), ("top_p", "NaN"),
                                                ("presence_penalty", "Infinity"),
                                                ("frequency_penalty", "-Infinity")])
def test_a_number_that_is_not_finite_is_named_as_such(field: str, literal: str) -> None:
    """Python's JSON reader takes NaN and Infinity, which JSON has not: a NaN temperature
    was told "Input should be less than or equal to 2", as if it were too large."""
    with start_server() as srv:
        err = _error(_post(srv, f'{{"prompt": "hi", "{field}": {literal}}}'), 400)
        assert err["param"] == field and "finite number" in err["message"], err


def test_a_repeated_priority_header_is_a_400(sim_server: LiveServer) -> None:
    """``x-slopilot-priority: p0`` then ``p2`` was served as p0, the first: a gateway that
    appends its own header rather than replacing the client's was overridden by it. The
    two joined in one (``p0, p2``) are refused already; repeated, they are too."""
    res = httpx.post(sim_server.url + "/v1/completions", timeout=HANG_GUARD_S,
                     json={"prompt": "hi", "max_tokens": 1},
                     headers=[("x-slopilot-priority", "p0"), ("x-slopilot-priority", "p2")])
    err = _error(res, 400)
    assert err["param"] == "x-slopilot-priority" and "once" in err["message"]
