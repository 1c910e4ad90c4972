"""How many tokens a chunk brings, where the client did not ask vLLM to say.

vLLM merges the outputs its API server had not yet written into one chunk, and says how
many tokens a chunk brings only where asked (``stream_options.continuous_usage_stats``).
The meter asks for it on every chat and completions stream it judges, and takes out of
what it passes on the usage the client did not ask for: the client gets the bytes vLLM
would have sent it. The stand-in vLLM here answers as vLLM v0.11 does for the request it
is sent (``vllm_wire``), so the test sees what the meter asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter import Client, Upstream, counted, meter_for, run
from tests.engine.meter.test_meter_vllm_wire import (
    CHAT,
    COMPLETION,
    CONTINUE,
    MET,
    MISSED,
)

Usage = tuple[int, int] | None
Render = Callable[[bool, bool], list[bytes]]
"""A stream's pieces as vLLM writes them, given the request's ``include_usage`` and
``continuous_usage_stats`` as vLLM reads them."""


class VLLM(Upstream):
    """A stand-in vLLM that writes its stream as the forwarded request's stream_options
    ask (``StreamOptions``: ``include_usage`` defaults to true once the options are given,
    continuous stats only with it)."""

    def __init__(self, render: Render) -> None:
        super().__init__()
        self.render = render

    async def handle(self, request: httpx.Request) -> httpx.Response:
        include, continuous = asked(json.loads(request.content))
        self.answer(self.render(include, continuous),
                    headers={"content-type": wire.CONTENT_TYPE})
        return await super().handle(request)


def asked(body: dict[str, Any]) -> tuple[bool, bool]:
    options = body.get("stream_options")
    if options is None:
        return False, False
    include = bool(options.get("include_usage", True))
    return include, include and bool(options.get("continuous_usage_stats", False))


def chat(include: bool, continuous: bool) -> list[bytes]:
    """"a" at once, then "bcd" merged into one chunk, then "e" and the finish."""
    def u(n: int) -> Usage:
        return (5, n) if continuous else None
    return [wire.chat_role(usage=u(0)), wire.chat_delta(content="a", usage=u(1)),
            wire.chat_delta(content="bcd", usage=u(4)),
            wire.chat_delta(content="e", finish="stop", usage=u(5)),
            *([wire.chat_usage(5, 5)] if include else []), wire.DONE]


def completion(include: bool, continuous: bool) -> list[bytes]:
    def u(n: int) -> Usage:
        return (2, n) if continuous else None
    return [wire.completion(0, "a", usage=u(1)), wire.completion(0, "bcd", usage=u(4)),
            wire.completion(0, "e", finish="stop", usage=u(5)),
            *([wire.completion_usage(2, 5)] if include else []), wire.DONE]


def echoed(include: bool, continuous: bool) -> list[bytes]:
    """A chat echo, then the first generated token at 0.3 s."""
    def u(n: int) -> Usage:
        return (5, n) if continuous else None
    return [wire.chat_role(usage=u(0)), wire.chat_echo("Once upon", usage=u(0)),
            wire.chat_delta(content=" a", usage=u(1)),
            wire.chat_delta(content=" time", usage=u(2)),
            wire.chat_delta(content=",", finish="length", usage=u(3)),
            *([wire.chat_usage(5, 3)] if include else []), wire.DONE]


# The times each piece the client gets is written: the usage chunk, where it gets one,
# with the [DONE] after it.
MERGED = [0.1, 0.1, 0.35, 0.4, 0.4, 0.4]
ECHOED = [0.1, 0.1, 0.3, 0.35, 0.4, 0.4, 0.4]


@pytest.mark.parametrize("options", [
    None, {"include_usage": True}, {"include_usage": False},
    {"include_usage": True, "continuous_usage_stats": True}],
    ids=["none", "final-usage", "no-usage", "continuous"])
@pytest.mark.parametrize(("path", "body", "render", "times"), [
    ("/v1/chat/completions", CHAT, chat, MERGED),
    ("/v1/completions", COMPLETION, completion, MERGED[1:]),
    ("/v1/chat/completions", CONTINUE, echoed, ECHOED),
], ids=["chat", "completions", "chat-echo"])
def test_a_chunk_of_several_tokens_is_counted_so_whatever_the_client_asked(
        tmp_path: Path, options: dict[str, Any] | None, path: str, body: dict[str, Any],
        render: Render, times: list[float]) -> None:
    """A client that did not ask for continuous usage (the SDKs' default) left the meter
    nothing but chunks: it counted "bcd", merged by vLLM, one token (3 of the 5 the
    client got); and a chat echo, with no usage to say it was none, the first token. The
    meter now asks vLLM for continuous usage and hands the client the stream vLLM
    would have written for its own request, byte for byte. The 0.25 s wait for "bcd" is
    one slow gap over the 0.1 s target whatever the count (``ClientGaps``): a miss, as
    the client timing its chunks reads it; the echo's stream met its SLO."""
    upstream, now = VLLM(render), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    sent = {**body} if options is None else {**body, "stream_options": options}
    mine = render(*asked(sent))

    async def go() -> bytes:
        status, _, got = await Client(meter, now).request("POST", path, sent,
                                                          written_at=times)
        assert status == 200
        return got

    assert run(go) == b"".join(mine)
    forwarded = json.loads(upstream.requests[0].content)
    assert asked(forwarded) == (True, True)
    assert {k: v for k, v in forwarded.items() if k != "stream_options"} == \
        {k: v for k, v in sent.items() if k != "stream_options"}
    assert counted(meter) == ({MET: (1, 3)} if render is echoed else {MISSED: (1, 5)})


def test_a_body_the_meter_does_not_change_goes_as_the_client_wrote_it(tmp_path: Path) -> None:
    """Stream options vLLM refuses (it answers 400), and a client that asked for the
    continuous usage itself: the engine gets the client's bytes."""
    upstream, now = VLLM(chat), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    bodies = [json.dumps({**CHAT, "stream_options": {"include_usage": "perhaps"}}).encode(),
              json.dumps({**CHAT, "stream_options": {"continuous_usage_stats": True}},
                         indent=1).encode()]

    async def go() -> None:
        upstream.render = lambda include, continuous: [wire.DONE]
        for raw in bodies:
            await Client(meter, now).request("POST", "/v1/chat/completions", raw=raw)

    run(go)
    assert [r.content for r in upstream.requests] == bodies


def test_an_answer_with_usage_taken_out_has_no_length_of_the_engines(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    pieces = chat(True, True)
    upstream.answer(pieces, headers={"content-type": wire.CONTENT_TYPE,
                                     "content-length": str(len(b"".join(pieces)))})

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request("POST", "/v1/chat/completions", CHAT)

    _, headers, got = run(go)
    assert got == b"".join(chat(False, False)) and "content-length" not in headers


@pytest.mark.parametrize("options", [
    None, {"include_usage": True}, {"include_usage": False},
    {"include_usage": True, "continuous_usage_stats": True}],
    ids=["none", "final-usage", "no-usage", "continuous"])
@pytest.mark.parametrize("unstreamed", [
    {"use_beam_search": True}, {"use_beam_search": "true"}, {"best_of": 0}],
    ids=["beam", "beam-lax", "best-of-0"])
def test_a_completion_vllm_answers_whole_keeps_the_usage_vllm_gave(
        tmp_path: Path, options: dict[str, Any] | None, unstreamed: dict[str, Any]) -> None:
    """vLLM does not stream a completions request with ``use_beam_search``, or with a
    ``best_of`` other than its ``n`` (here 0: vLLM's V1 engine refuses one above 1, and
    one below ``n``): ``"stream": true`` gets the whole response as one event, its usage
    filled whatever ``stream_options`` said. The meter took it for a stream of chunks
    and wrote that usage ``null`` for a client that asked for none: the client got less
    than vLLM gives. It goes now as vLLM wrote it, and the engine gets the client's
    bytes."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    pieces = [wire.completion_whole(" a b", 3, 2), wire.DONE]
    upstream.answer(pieces, headers={"content-type": wire.CONTENT_TYPE})
    sent = {**COMPLETION, **unstreamed}
    if options is not None:
        sent["stream_options"] = options
    raw = json.dumps(sent).encode()

    async def go() -> bytes:
        status, _, got = await Client(meter, now).request("POST", "/v1/completions",
                                                          raw=raw, written_at=[0.2, 0.2])
        assert status == 200
        return got

    assert run(go) == b"".join(pieces)
    assert upstream.requests[0].content == raw
