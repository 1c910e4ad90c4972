"""The meter beside vLLM: streams judged as written to the client, everything else passed.

The meter's ASGI app is driven directly: a stand-in upstream (an httpx transport) answers
with pieces the test lays out, and the test's ``send`` sets the meter's clock to the
moment each piece is written, so every TTFT and gap is the test's, whatever this
machine's speed.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.http_arrival import SCOPE_KEY
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES
from slopilot.engine.request import Priority
from slopilot.engine.server.errors import error_body
from slopilot.engine.slo import SLOError, SLOSpec
from slopilot.engine.verdicts import Verdicts
from tests.support.waits import HANG_GUARD_S

# P0: a first token within 500 ms, at most 1 % of a request's gaps over 100 ms.
SLO = {"classes": {"p0": {"ttftP99Ms": 500, "tbtP99Ms": 100}}}
LABEL = SLOSpec.from_dict(SLO).p0.label
VLLM_METRICS = (b'# HELP vllm:generation_tokens_total Tokens.\n'
                b'# TYPE vllm:generation_tokens_total counter\n'
                b'vllm:generation_tokens_total{model_name="m"} 7.0\n')


def event(*, text: str | None = None, finish: str | None = None, index: int = 0,
          chat: bool = False, usage: int | None = None) -> bytes:
    if chat:
        choice: dict[str, Any] = {"index": index, "delta": {} if text is None else
                                  {"content": text}, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish}
    chunk: dict[str, Any] = {"id": "x", "model": "llama", "choices": [choice]}
    if usage is not None:
        chunk = {"id": "x", "model": "llama", "choices": [],
                 "usage": {"completion_tokens": usage}}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Upstream:
    """A stand-in vLLM: each request's answer is the next of ``answers``."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], list[bytes]]] = []
        self.requests: list[httpx.Request] = []
        self.closed = asyncio.Event()
        self.hold = asyncio.Event()  # a stream waits on it after its pieces (a client leaves)

    def answer(self, pieces: list[bytes], status: int = 200,
               headers: dict[str, str] | None = None) -> None:
        self.answers.append((status, headers or {"content-type": "text/event-stream"},
                             pieces))

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/metrics":
            return httpx.Response(200, content=VLLM_METRICS, headers={
                "content-type": "text/plain; version=0.0.4; charset=utf-8"})
        status, headers, pieces = self.answers.pop(0)

        async def body() -> AsyncIterator[bytes]:
            try:
                for piece in pieces:
                    yield piece
                if pieces and pieces[-1] is HOLD:
                    await self.hold.wait()
            finally:
                await asyncio.sleep(0)  # a connection's close takes a turn of the loop
                self.closed.set()

        return httpx.Response(status, headers=headers,
                              content=body() if pieces[-1:] != [HOLD] else _held(body()))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


HOLD = b""  # laid last: the stream stays open until the test lets it go


async def _held(inner: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for piece in inner:
        if piece:
            yield piece


class Client:
    """The ASGI server's side: the request, then each message the meter sends, each body
    piece written at the time ``written_at`` gives for it (in order)."""

    def __init__(self, meter: Meter, now: list[float]) -> None:
        self.meter, self.now = meter, now
        self.sent: list[MutableMapping[str, Any]] = []
        self.leave = asyncio.Event()

    async def request(self, method: str, path: str, body: Any = None, *,
                      written_at: Sequence[float] = (), headers: dict[str, str] | None = None,
                      raw: bytes | None = None, query: bytes = b"",
                      arrival: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """``arrival``: the server's stamp of the request (none: the meter stamps it)."""
        self.sent = []
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        times = iter(written_at)
        delivered = [False]

        async def receive() -> MutableMapping[str, Any]:
            if not delivered[0]:
                delivered[0] = True
                return {"type": "http.request", "body": data, "more_body": False}
            await self.leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            self.sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                self.now[0] = next(times, self.now[0])
            if message["type"] == "http.response.body" and not message.get("more_body"):
                # As uvicorn: once the response is complete, receive() says the client
                # is gone, and the write yields to the loop.
                self.leave.set()
                await asyncio.sleep(0)

        scope: dict[str, Any] = {
            "type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": query, "headers": [(k.encode(), v.encode()) for k, v in
                                             (headers or {}).items()]}
        if arrival is not None:
            scope[SCOPE_KEY] = arrival
        await self.meter(scope, receive, send)
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
                b"".join(m.get("body", b"") for m in self.sent
                         if m["type"] == "http.response.body"))


def meter_for(tmp_path: Path, upstream: Upstream, now: list[float],
              **kw: Any) -> Meter:
    slo_file = tmp_path / "slo.json"
    if not slo_file.exists():
        slo_file.write_text(json.dumps(SLO))
    return Meter("http://127.0.0.1:8001", SLOWatch(slo_file, Verdicts()), Priority.P0,
                 client=upstream.client(), clock=lambda: now[0], **kw)


def run(fn: Callable[[], Any]) -> Any:
    return asyncio.run(fn())


async def give_up(client: Client, upstream: Upstream, now: list[float], *, after: int,
                  at: float = 0.8) -> None:
    """The client leaves at ``at`` on the meter's clock, once ``after`` pieces of the
    answer reached it and the upstream has the request."""
    while sum(1 for m in client.sent if m.get("body")) < after or not upstream.requests:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    now[0] = at
    client.leave.set()


def counted(meter: Meter) -> dict[tuple[Priority, str, bool], tuple[int, int]]:
    return {k: v for k, v in meter.verdicts.counts().items() if v != (0, 0)}


STREAM = {"model": "llama", "prompt": "hi", "max_tokens": 4, "stream": True}


def test_each_stream_is_judged_by_its_first_token_and_gaps_as_written(tmp_path: Path) -> None:
    """vLLM's histograms cannot say which requests met the SLO; the meter judges each
    stream by ``ClassSLO.met`` on the times its pieces reached the client: one whose
    first token came in 200 ms and gaps of 50 ms met it; one with a 300 ms stall (1 of 3
    gaps over 100 ms) and one whose first token took 600 ms missed it."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    laid = [
        ([event(text="a"), event(text="b"), event(text="c"), event(text="d", finish="length"),
          DONE], [10.2, 10.25, 10.3, 10.35, 10.36]),
        ([event(text="a"), event(text="b"), event(text="c"), event(text="d", finish="length"),
          DONE], [10.2, 10.5, 10.55, 10.6, 10.61]),
        ([event(text="a"), event(text="b", finish="length"), DONE], [10.6, 10.65, 10.66]),
    ]

    async def go() -> list[bytes]:
        bodies = []
        for pieces, times in laid:
            upstream.answer(pieces)
            now[0] = 10.0  # the request arrives
            status, headers, body = await Client(meter, now).request(
                "POST", "/v1/completions", STREAM, written_at=times)
            assert status == 200 and headers["content-type"] == "text/event-stream"
            bodies.append(body)
        return bodies

    bodies = run(go)
    assert bodies == [b"".join(pieces) for pieces, _ in laid]  # passed on as it came
    assert counted(meter) == {(Priority.P0, LABEL, True): (1, 4),
                              (Priority.P0, LABEL, False): (2, 6)}
    assert meter.model_name == "llama"


def test_the_streams_usage_counts_its_tokens_and_chat_deltas_are_read(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text=None, chat=True), event(text="hi", chat=True),
                     event(text=" there", chat=True, finish="stop"), event(usage=3), DONE])

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/chat/completions",
                                         {"messages": [], "stream": True},
                                         written_at=[0.01, 0.1, 0.15, 0.16, 0.17])

    run(go)
    assert counted(meter) == {(Priority.P0, LABEL, True): (1, 3)}


@pytest.mark.parametrize(("path", "body", "status", "pieces"), [
    ("/v1/completions", {**STREAM, "stream": False}, 200, [b'{"choices":[]}']),
    ("/v1/completions", STREAM, 400, [b'{"error":{"message":"bad"}}']),
    ("/v1/models", None, 200, [b'{"data":[]}']),
    ("/v1/completions", STREAM, 200, [b"data: {not json\n\n", DONE]),
    ("/v1/completions", STREAM, 200, [event(text="a"), b'data: {"error": {"message": '
                                      b'"engine died"}}\n\n', DONE]),
    ("/v1/completions", STREAM, 200, [b"data: " + b"x" * (MAX_EVENT_BYTES + 1), DONE]),
    ("/v1/completions", STREAM, 200, [event(text="a")]),  # ended without [DONE]
], ids=["not-streamed", "refused", "other-path", "not-json", "error-event",
        "long-not-json", "cut-short"])
def test_what_the_meter_cannot_judge_passes_through_unjudged(
        tmp_path: Path, path: str, body: Any, status: int, pieces: list[bytes]) -> None:
    """A non-streamed body (no first token a client could see), an error, another path,
    and a stream the meter cannot read (not JSON, short or past ``MAX_EVENT_BYTES``: the
    upstream is the tenant's image) are passed on byte for byte and judged neither met
    nor missed. An event past the bound that vLLM writes is judged: test_long_events."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer(pieces, status=status, headers={"content-type": "application/json"})

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request("POST" if body is not None else "GET",
                                                path, body)

    got = run(go)
    assert got[0] == status and got[2] == b"".join(pieces)
    assert counted(meter) == {}


def test_request_and_headers_reach_the_engine_as_the_client_sent_them(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([b"{}"], headers={"content-type": "application/json", "x-request-id": "7",
                                      "connection": "close"})

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request(
            "POST", "/v1/completions", raw=b'{"prompt": "hi"}',
            headers={"authorization": "Bearer k", "x-slopilot-priority": "p1",
                     "connection": "keep-alive", "content-type": "application/json"})

    _, headers, _ = run(go)
    sent = upstream.requests[0]
    assert sent.content == b'{"prompt": "hi"}' and sent.url.path == "/v1/completions"
    assert sent.headers["authorization"] == "Bearer k"
    assert sent.headers["x-slopilot-priority"] == "p1"
    assert "keep-alive" not in sent.headers and "te" not in sent.headers  # hop-by-hop
    assert headers["x-request-id"] == "7" and "connection" not in headers


def test_a_client_that_leaves_closes_the_engines_request(tmp_path: Path) -> None:
    """vLLM aborts a request whose connection closes and frees its cache; behind a
    proxy that kept reading, a client gone mid-stream left vLLM generating for nobody."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a"), HOLD])

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", STREAM,
                                                    written_at=[0.1]))
        while not any(m.get("body") for m in client.sent):
            await asyncio.sleep(0)
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        # The stream was never ended for the client: it had gone.
        assert not any(m.get("more_body") is False for m in client.sent)

    run(go)
    assert upstream.closed.is_set() and counted(meter) == {}


def test_metrics_are_the_engines_then_the_verdicts(tmp_path: Path) -> None:
    """One answer on one port: Prometheus's ``instance`` is the same for vLLM's tokens
    and the verdicts, which the goodput rule joins replica by replica."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])

    async def go() -> tuple[int, dict[str, str], bytes]:
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=[10.1, 10.1])
        return await Client(meter, now).request("GET", "/metrics")

    status, headers, body = run(go)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert upstream.requests[-1].headers["accept"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert "vllm:generation_tokens" in families
    samples = {(s.labels["priority_class"], s.labels["met"]): (s.labels, s.value)
               for s in families["slopilot_slo_requests"].samples}
    labels, value = samples["p0", "true"]
    assert value == 1 and labels["slo"] == LABEL and labels["model_name"] == "llama"
    assert samples["p0", "false"][1] == 0


def test_an_slo_edited_on_disk_is_judged_by_from_the_next_request(tmp_path: Path) -> None:
    """The kubelet swaps a ConfigMap volume's file in place: an edit of spec.slo reaches
    the meter without restarting the pod (and reloading the model). A file that cannot
    be read keeps the objectives before it."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    slo_file = tmp_path / "slo.json"
    strict = {"classes": {"p0": {"ttftP99Ms": 100, "tbtP99Ms": 100}}}

    async def one() -> None:
        upstream.answer([event(text="a", finish="stop"), DONE])
        now[0] = 10.0
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=[10.2, 10.2])

    async def go() -> None:
        await one()  # 200 ms: met under 500 ms
        slo_file.write_text(json.dumps(strict) + " ")  # a new size: seen as changed
        await one()  # 200 ms: missed under 100 ms
        slo_file.write_text("{half written")
        await one()  # still judged by the strict one

    run(go)
    strict_label = SLOSpec.from_dict(strict).p0.label
    assert counted(meter) == {(Priority.P0, strict_label, False): (2, 2)}  # old label gone


def test_an_unusable_slo_file_at_the_start_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "slo.json"
    bad.write_text('{"classes": {"p9": {}}}')
    with pytest.raises(SLOError, match=r"slo\.json"):
        SLOWatch(bad, Verdicts())
    with pytest.raises(SLOError, match="no such file"):
        SLOWatch(tmp_path / "missing.json", Verdicts())


def test_a_body_past_the_limit_is_413_and_an_engine_that_does_not_answer_502(
        tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=10)

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request("POST", "/v1/completions", raw=b"x" * 11)

    status, _, body = run(go)
    served = error_body(413, "")["error"]
    assert status == 413 and _error(body, 413)["code"] == served["code"] == "request_too_large"
    assert upstream.requests == []

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    down = Meter("http://127.0.0.1:8001", SLOWatch(tmp_path / "slo.json", Verdicts()),
                 Priority.P0, client=httpx.AsyncClient(transport=httpx.MockTransport(refuse)))

    async def go_down() -> tuple[int, dict[str, str], bytes]:
        return await Client(down, now).request("POST", "/v1/completions", STREAM)

    status, _, body = run(go_down)
    assert status == 502 and _error(body, 502)["code"] == "upstream_unavailable"


def _error(body: bytes, status: int) -> dict[str, Any]:
    """The meter's own error, in the shape and of the type ``slopilot serve`` gives for
    the same status (its 413 was ``request_too_large`` here and ``request_entity_too_large``
    there, and the meter wrote no ``param``)."""
    err: dict[str, Any] = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] is None
    assert err["type"] == error_body(status, "")["error"]["type"]
    return err


def test_a_long_prompts_stream_is_judged_too(tmp_path: Path) -> None:
    """A body read in several steps (``request_fields``) is judged all the same."""
    from slopilot.engine.meter.request_fields import STEP_BYTES

    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])
    long = {**STREAM, "prompt": "w " * STEP_BYTES}

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions", long,
                                         written_at=[10.1, 10.1])

    run(go)
    assert counted(meter) == {(Priority.P0, LABEL, True): (1, 1)}


@pytest.mark.parametrize("target", [b"@evil.example/v1/models", b"http://evil.example/x",
                                    b"*"])
def test_a_request_target_that_is_no_path_goes_nowhere(tmp_path: Path, target: bytes) -> None:
    """The request target is the client's to write (h11 takes any non-blank bytes): glued
    to the upstream's URL, ``@evil.example/...`` made ``http://127.0.0.1:8001@evil.example``
    and sent the client's request, headers and all, to a host of its choosing from the
    pod's network. Only an origin-form path is forwarded."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([b"{}"])

    async def go() -> tuple[int, dict[str, str], bytes]:
        client = Client(meter, now)
        return await client.request("GET", target.decode(), None)

    status, _, body = run(go)
    assert status == 400 and _error(body, 400)["code"] == "invalid_request_target"
    assert upstream.requests == []


@pytest.mark.parametrize(("case", "pieces", "written_at", "max_tokens", "want"), [
    ("waited-past-target", [HOLD], [], 4, (1, 0)),     # no first token in 800 ms
    ("late-first-token", [event(text="a"), HOLD], [0.7], 4, (1, 1)),
    ("slow-gaps-past-any-end", [event(text="a"), event(text="b"), event(text="c"), HOLD],
     [0.1, 0.3, 0.5], 10, (1, 3)),                      # 2 gaps over 100 ms: > 1 % of 9
    ("could-still-have-met", [event(text="a"), HOLD], [0.1], 4, None),
    ("engine-failed-late", [event(text="a")], [0.7], 4, (1, 1)),  # ended, no [DONE]
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_stream_cut_short_counts_only_where_it_had_missed_already(
        tmp_path: Path, case: str, pieces: list[bytes], written_at: list[float],
        max_tokens: int, want: tuple[int, int] | None) -> None:
    """As the engine's server judges one (responses.ChoiceState.verdict): a client that
    gave up after 800 ms without a first token due in 500 missed it, whatever would have
    followed; one whose first token came late, or with more slow gaps than 1 % of all its
    max_tokens allow, too. Unjudged, the impatient clients of an overloaded vLLM
    deployment vanished from its goodput share. One that could still have met it is
    judged neither way."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer(pieces)

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/completions", {**STREAM, "max_tokens": max_tokens},
            written_at=written_at))
        if pieces[-1:] == [HOLD]:
            await give_up(client, upstream, now, after=len(pieces) - 1)
        await asyncio.wait_for(task, HANG_GUARD_S)

    run(go)
    assert counted(meter) == ({} if want is None else {(Priority.P0, LABEL, False): want})


@pytest.mark.parametrize("stream", [True, 1, "true", "1", "on"])
def test_a_stream_asked_for_as_vllm_reads_the_flag_is_judged(tmp_path: Path,
                                                              stream: Any) -> None:
    """vLLM's request model reads ``stream`` as pydantic's lax bool: ``1`` or ``"true"``
    is streamed, and was not judged, so any client could opt out of its verdicts."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions",
                                         {**STREAM, "stream": stream}, written_at=[0.1, 0.1])

    run(go)
    assert counted(meter) == {(Priority.P0, LABEL, True): (1, 1)}


@pytest.mark.parametrize("stream", [False, 0, "false", "no", None, "maybe", [1]])
def test_a_body_asked_for_or_refused_is_not_judged(tmp_path: Path, stream: Any) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([b'{"choices": []}'], headers={"content-type": "application/json"})

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions",
                                         {**STREAM, "stream": stream}, written_at=[0.9])

    run(go)
    assert counted(meter) == {}


def test_a_stream_answered_with_no_event_stream_is_not_judged(tmp_path: Path) -> None:
    """An answer of 200 that is not SSE (an image that ignores ``stream``) cannot be read
    as one: it was judged a stream cut short, a miss with no tokens."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    body = json.dumps({"id": "x", "model": "llama", "choices": [
        {"index": 0, "text": "hello", "finish_reason": "stop"}]}).encode()
    upstream.answer([body], headers={"content-type": "application/json"})

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                                written_at=[0.8])

    status, _, got = run(go)
    assert status == 200 and got == body
    assert counted(meter) == {}


@pytest.mark.parametrize("limit", ["max_completion_tokens", "max_tokens"])
def test_a_chat_streams_token_limit_is_read_in_either_spelling(tmp_path: Path,
                                                                limit: str) -> None:
    """The openai SDK's chat clients send ``max_completion_tokens``: a stream cut short
    after 2 slow gaps of at most 9 had missed already, and was judged only where the
    limit was spelt ``max_tokens``."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text=t, chat=True) for t in "abc"] + [HOLD])

    async def go() -> None:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/chat/completions",
            {"model": "llama", "messages": [{"role": "user", "content": "hi"}],
             "stream": True, limit: 10}, written_at=[0.1, 0.3, 0.5]))
        await give_up(client, upstream, now, after=3)
        await asyncio.wait_for(task, HANG_GUARD_S)

    run(go)
    assert counted(meter) == {(Priority.P0, LABEL, False): (1, 3)}


def test_a_request_is_judged_from_the_servers_stamp_of_its_arrival(tmp_path: Path) -> None:
    """The server stamps a request when its last byte came in (``http_arrival``); the app is
    called later, a whole answer later for a request pipelined behind another. Its
    client's wait counts from the stamp: a first token 200 ms after the app was called
    but 1.2 s after the bytes came missed the 500 ms target."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=[10.2, 10.2], arrival=9.0)

    run(go)
    assert counted(meter) == {(Priority.P0, LABEL, False): (1, 1)}


def _dates(client: Client) -> list[str]:
    start = next(m for m in client.sent if m["type"] == "http.response.start")
    return [v.decode() for k, v in start["headers"] if k.lower() == b"date"]


def test_every_answer_carries_one_date(tmp_path: Path) -> None:
    """The meter's server adds no date (the engine's passes through, and would be there
    twice), so the meter's own answers carry their own, as an origin's must (RFC 9110
    6.6.1), and so does an engine's answer that came without one."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=100)
    engine_date = "Tue, 05 May 2026 10:00:00 GMT"
    upstream.answer([b"{}"], headers={"content-type": "application/json", "date": engine_date})
    upstream.answer([b"{}"], headers={"content-type": "application/json"})

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    down = meter_for(tmp_path, upstream, now)
    down.client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))

    async def go() -> list[tuple[int, list[str]]]:
        answers = []
        for app, method, path, raw in [(meter, "GET", "/v1/models", None),   # the engine's
                                       (meter, "GET", "/v1/models", None),   # no date of its own
                                       (meter, "POST", "/v1/completions", b"x" * 101),  # 413
                                       (meter, "GET", "*", None),            # 400
                                       (meter, "GET", "/metrics", None),     # the meter's
                                       (down, "GET", "/v1/models", None),    # 502
                                       (down, "GET", "/metrics", None)]:     # 502
            client = Client(app, now)
            status, _, _ = await client.request(method, path, raw=raw)
            answers.append((status, _dates(client)))
        return answers

    answers = run(go)
    assert [status for status, _ in answers] == [200, 200, 413, 400, 200, 502, 502]
    assert answers[0][1] == [engine_date]
    for status, dates in answers[1:]:
        assert len(dates) == 1, (status, dates)
        assert email.utils.parsedate_to_datetime(dates[0]).tzinfo is not None, dates


def test_an_answer_the_engine_breaks_off_is_cut_short_with_one_line_of_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An engine that dies mid-answer (a pod killed, OOM) breaks every stream it was
    writing: each was raised to the server, which logged a traceback of some forty lines a
    stream. It is an engine's failure, not the meter's: one warning line each, the
    client's connection closed unfinished (no end written, as the engine wrote none), the
    stream judged as cut short (its first token 800 ms late: missed)."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)

    async def broken_body() -> AsyncIterator[bytes]:
        yield event(text="a")
        raise httpx.ReadError("connection reset by peer")

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=broken_body())
    meter.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    client = Client(meter, now)

    async def go() -> None:
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", STREAM,
                                                    written_at=[0.8]))
        await asyncio.wait_for(asyncio.shield(task), HANG_GUARD_S)

    with caplog.at_level(logging.WARNING):
        run(go)
    bodies = [m for m in client.sent if m["type"] == "http.response.body"]
    assert [m["body"] for m in bodies] == [event(text="a")]
    assert all(m["more_body"] for m in bodies)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.WARNING, None)]
    assert "ReadError" in records[0].getMessage()
    assert counted(meter) == {(Priority.P0, LABEL, False): (1, 1)}
