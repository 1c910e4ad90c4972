"""A body's values bounded before it is parsed: one that holds more JSON items than any
servable request needs is refused 413 unparsed (its shape, not its size, would hold the
event loop: ``json.loads`` and pydantic are single GIL-holding calls); every legitimate
request at the deployment's limits is still served, and its strings are not walked one
by one in Python where its bytes show no surrogate escape."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import starlette.requests

from slopilot.engine.body_items import body_items_bound
from slopilot.engine.json_items import JsonItems
from slopilot.engine.server import protocol, serving, stepped_json
from slopilot.engine.server.protocol import MAX_CHOICES
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S


def _items(value: Any) -> int:
    """What a parse makes: each container's items (one for an empty one), nested."""
    if isinstance(value, list):
        return max(len(value), 1) + sum(_items(v) for v in value)
    if isinstance(value, dict):
        return max(len(value), 1) + sum(_items(v) for v in value.values())
    return 0


def _value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.random()
    if depth > 3 or pick < 0.4:
        return rng.choice([1, -2.5e3, None, True, "", "a,b[c{:", 'q"\\"x\\\\', "\\",
                           "\\u005c", "\U0001F600", "é" * rng.randint(0, 3)])
    if pick < 0.7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(["k", 'a,"', "[{", "\\"]) + str(i): _value(rng, depth + 1)
            for i in range(rng.randint(0, 5))}


def test_the_count_is_the_items_a_parse_makes_wherever_chunks_cut() -> None:
    rng = random.Random(11)
    for _ in range(1500):
        value = {"a": _value(rng)}
        body = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        whole, pieces = JsonItems(), JsonItems()
        whole.feed(body)
        pos = 0
        while pos < len(body):  # cut anywhere: inside strings, escapes, UTF-8 sequences
            size = rng.randint(1, 9)
            pieces.feed(body[pos:pos + size])
            pos += size
        assert whole.items == pieces.items == _items(value), body
        assert not pieces.in_string


def test_a_surrogate_escape_is_noticed_across_a_chunk_cut() -> None:
    body = b'{"prompt": "ab\\ud800"}'
    for cut in range(1, len(body)):
        scan = JsonItems()
        scan.feed(body[:cut])
        scan.feed(body[cut:])
        assert scan.may_hold_surrogate, cut
    plain = JsonItems()
    plain.feed('{"prompt": "ab\\u00e9 café"}'.encode())
    assert not plain.may_hold_surrogate


@pytest.mark.parametrize("mark", [b"\\ud800", b"\\uDBFF", b"\xed\xa0\x80", b"\x00"])
def test_a_surrogate_mark_is_noticed_however_the_chunks_cut_it(mark: bytes) -> None:
    """Cut in two it was found; cut in three with a middle chunk of one byte (``\\``,
    ``u``, ``d800``) the seam kept only that byte's chunk, missed the mark, and the walk
    was skipped: a lone surrogate reached the tokenizer (a 500 where the body sent whole
    got its 400). Every cut into pieces of 1-3 bytes, and into three anywhere."""
    body = b'{"prompt": "ab' + mark + b'cd"}'
    cuttings = [[body[i:i + size] for i in range(0, len(body), size)] for size in (1, 2, 3)]
    cuttings += [[body[:a], body[a:b], body[b:]]
                 for a in range(1, len(body)) for b in range(a + 1, len(body))]
    for pieces in cuttings:
        scan = JsonItems()
        for piece in pieces:
            scan.feed(piece)
        assert scan.may_hold_surrogate, pieces


class _CountedLoads:
    """``starlette.requests.json``: records the size of each body parsed."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def loads(self, data: bytes | str) -> Any:
        self.sizes.append(len(data))
        return json.loads(data)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with start_server() as srv:
        yield srv


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> _CountedLoads:
    counted = _CountedLoads()
    monkeypatch.setattr(starlette.requests, "json", counted)
    return counted


def _post(srv: LiveServer, body: bytes, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(srv.url + path, content=body, timeout=HANG_GUARD_S,
                      headers={"content-type": "application/json"})


def test_a_body_of_more_items_than_a_request_needs_is_413_unparsed(
        server: LiveServer, loads: _CountedLoads) -> None:
    backend = server.backend
    bound = body_items_bound(backend.max_model_len, backend.vocab_size)
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "x": [1] * (bound + 10)}).encode()
    res = _post(server, body)
    assert res.status_code == 413, res.text
    err = res.json()["error"]
    assert err["code"] == "request_too_large"
    # The limit and what it is made of, and the fix.
    assert f"at most {bound:,} JSON values" in err["message"]
    assert f"{backend.max_model_len:,}-token context" in err["message"]
    assert "leave out" in err["message"]
    assert len(body) not in loads.sizes  # never parsed


def test_many_unknown_keys_are_413_unparsed(server: LiveServer, loads: _CountedLoads) -> None:
    backend = server.backend
    bound = body_items_bound(backend.max_model_len, backend.vocab_size)
    fields = {f"k{i}": 0 for i in range(bound + 1)}
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       **fields}).encode()
    res = _post(server, body, "/v1/chat/completions")
    assert res.status_code == 413, res.text
    assert len(body) not in loads.sizes


def test_requests_at_the_deployments_limits_are_served(server: LiveServer,
                                                       loads: _CountedLoads) -> None:
    backend = server.backend
    context, vocab = backend.max_model_len, backend.vocab_size
    # A batch of MAX_CHOICES prompts of token ids, each a whole context but its one
    # output token, with a full-vocabulary logit_bias and as many stop token ids.
    body = {"prompt": [[1] * (context - 1)] * MAX_CHOICES, "max_tokens": 1,
            "logit_bias": {str(t): 0.0 for t in range(vocab)},
            "stop_token_ids": list(range(vocab))}
    raw = json.dumps(body).encode()
    res = _post(server, raw)
    assert res.status_code == 200, res.text[:300]
    assert len(res.json()["choices"]) == MAX_CHOICES
    assert len(raw) not in loads.sizes  # parsed in steps, never by one json.loads
    # A chat history of one-word messages filling the context.
    chat = {"messages": [{"role": "user", "content": "w"}] * (context // 8),
            "max_tokens": 1}
    res = _post(server, json.dumps(chat).encode(), "/v1/chat/completions")
    assert res.status_code == 200, res.text[:300]


def test_strings_are_not_walked_where_the_bytes_hold_no_surrogate(
        server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[str] = []
    first_unencodable = protocol._first_unencodable

    def counted(value: Any, path: str) -> str | None:
        walked.append(path)
        return first_unencodable(value, path)

    monkeypatch.setattr(protocol, "_first_unencodable", counted)
    context = server.backend.max_model_len
    res = _post(server, json.dumps({"prompt": [1] * (context - 1), "max_tokens": 1,
                                    "stop": ["é"]}).encode())
    assert res.status_code == 200, res.text[:300]
    assert walked == []
    # Where the bytes may hold one, the walk still finds and names it.
    res = _post(server, b'{"prompt": "ok", "max_tokens": 1, "stop": ["a\\ud800"]}')
    assert res.status_code == 400, res.text
    assert res.json()["error"]["param"] == "stop.0"
    assert walked


def test_a_large_logit_bias_is_prepared_off_the_loop_and_read_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # prepare() checks each choice's bias in Python: a full vocabulary's for 16 choices
    # held the loop 1.26 s when a short prompt sent it inline.
    body = protocol.CompletionRequest(prompt="hi", max_tokens=1, n=MAX_CHOICES,
                                      logit_bias={str(t): 1.0 for t in range(4096)})
    assert serving.text_size(body) >= serving.INLINE_PREPARE_CHARS
    assert serving.text_size(protocol.CompletionRequest(
        prompt="hi", logit_bias={"1": 1.0}, stop_token_ids=[2])) < serving.INLINE_PREPARE_CHARS
    reads: list[int] = []
    bias = protocol.CompletionRequest.bias

    def counted(self: protocol.CompletionRequest) -> tuple[tuple[int, float], ...]:
        reads.append(1)
        return bias.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(protocol.CompletionRequest, "bias", property(counted))
    prep = serving.prepare(build_backend(), body, {}, 0.0)
    assert len(prep.choices) == MAX_CHOICES and len(reads) == 1
    assert all(len(c.request.sampling.logit_bias) == 4096 for c in prep.choices)


def test_a_body_is_parsed_in_steps_the_loop_runs_between() -> None:
    value = {"prompt": [[1, 22, 333] * 5000] * 16, "logit_bias": {str(t): -1.5 for t in
                                                                 range(20_000)}}
    body = json.dumps(value).encode()
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def parse() -> Any:
        ticker = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        start = turns
        try:
            parsed = await stepped_json.loads(body)
        finally:
            ticker.cancel()
        assert turns - start >= len(body) // stepped_json.STEP_BYTES
        return parsed

    assert asyncio.run(parse()) == value
    # Its errors are json.loads' own, where it says them.
    with pytest.raises(json.JSONDecodeError) as caught:
        asyncio.run(stepped_json.loads(body[:-1]))
    with pytest.raises(json.JSONDecodeError) as whole:
        json.loads(body[:-1])
    assert (caught.value.msg, caught.value.pos) == (whole.value.msg, whole.value.pos)


def test_a_lone_surrogate_in_a_utf16_body_is_still_named(server: LiveServer) -> None:
    # Python's JSON reader takes UTF-16 and reads a lone surrogate's code unit as it is:
    # no escape, no ED byte, and the walk must still run.
    body = '{"prompt": "ok", "max_tokens": 1, "stop": ["a\ud800"]}'.encode(
        "utf-16-le", "surrogatepass")
    res = _post(server, body)
    assert res.status_code == 400, res.text
    assert res.json()["error"]["param"] == "stop.0"


def test_the_bound_has_room_for_the_largest_batch_of_prompts() -> None:
    """The engine package's bound (which the meter imports, and so may not import the
    server) names a token of context as many times as a completions batch may."""
    from slopilot.engine.body_items import ITEMS_PER_CONTEXT_TOKEN

    assert ITEMS_PER_CONTEXT_TOKEN >= MAX_CHOICES
