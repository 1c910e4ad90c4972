"""The meter on a real socket, served as ``slopilot meter`` serves it (``uvicorn_config``:
httptools), in front of a stand-in vLLM whose streams speak only when the test says.

- HTTP/1.1 pipelining: two streamed completions sent back to back on one connection are
  answered one after the other, so the second's client waits for the whole first answer
  before its first token. The meter judges that wait: a request is stamped when its
  bytes came in, not when uvicorn got round to calling the app for it.
- The headers: the engine's ``date`` and ``server`` reach the client once (uvicorn's own
  would make each twice); the meter's own answers carry a ``date`` of their own.

No speed in the assertions: the meter's clock is the test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from slopilot.engine.http_deadlines import CallLater, Deadlines
from slopilot.engine.meter.commands import uvicorn_config
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.verdicts import Verdicts
from tests.engine.meter.test_meter import DONE, SLO, event
from tests.support.fired_timers import FiredTimers
from tests.support.read_counting import counting
from tests.support.waits import HANG_GUARD_S, wait_for

LABEL = SLOSpec.from_dict(SLO).p0.label  # a first token within 500 ms
ENGINE_DATE = "Tue, 05 May 2026 10:00:00 GMT"


class _Upstream:
    """A stand-in vLLM: the n-th stream's one token comes once ``release[n]`` is set."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.release = [threading.Event() for _ in range(2)]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, content=b"vllm:num_requests_running 0\n", headers={
                "content-type": "text/plain; version=0.0.4; charset=utf-8"})
        if request.url.path == "/v1/models":  # asked at the meter's startup
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "llama", "object": "model", "max_model_len": 4096}]})
        gate = self.release[len(self.requests)]
        self.requests.append(request)

        async def body() -> object:
            await asyncio.to_thread(gate.wait, HANG_GUARD_S)
            yield event(text="a", finish="stop")
            yield DONE

        return httpx.Response(200, content=body(), headers={  # type: ignore[arg-type]
            "content-type": "text/event-stream", "date": ENGINE_DATE, "server": "vllm"})



@dataclass
class _Served:
    app: Meter
    upstream: _Upstream
    port: int
    now: list[float]
    read: list[int]
    server: uvicorn.Server


@contextlib.contextmanager
def _serve(tmp_path: Path, deadlines: Deadlines | None = None,
           max_connections: int | None = None,
           call_later: CallLater | None = None,
           clock: Callable[[], float] | None = None) -> Iterator[_Served]:
    """The meter served on a port of its own, on ``now`` unless given its ``clock``."""
    slo_file = tmp_path / "slo.json"
    slo_file.write_text(json.dumps(SLO))
    upstream, now = _Upstream(), [100.0]
    read: list[int] = []
    app = Meter("http://127.0.0.1:8001", SLOWatch(slo_file, Verdicts()), Priority.P0,
                client=httpx.AsyncClient(transport=httpx.MockTransport(upstream.handle)),
                clock=clock or (lambda: now[0]))
    config = uvicorn_config(app, host="127.0.0.1", port=0, log_level="warning",
                            deadlines=deadlines, max_connections=max_connections,
                            call_later=call_later)
    config.load()
    config.http_protocol_class = counting(config.http_protocol_class, read)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), what="the meter to listen")
    assert server.started, "the meter did not start"
    try:
        yield _Served(app, upstream, server.servers[0].sockets[0].getsockname()[1], now, read,
                      server)
    finally:
        for gate in upstream.release:
            gate.set()
        server.should_exit = True
        thread.join(HANG_GUARD_S)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    with _serve(tmp_path) as meter:
        yield meter


def _completion() -> bytes:
    body = json.dumps({"model": "llama", "prompt": "hi", "max_tokens": 1,
                       "stream": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body)


def counted(meter: Meter) -> dict[tuple[Priority, str, bool], tuple[int, int]]:
    return {k: v for k, v in meter.verdicts.counts().items() if v != (0, 0)}


def test_a_pipelined_streams_wait_behind_the_one_before_is_judged(served: _Served) -> None:
    sent = _completion() + _completion()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(sent)  # both at 100
        wait_for(lambda: sum(served.read) == len(sent) and len(served.upstream.requests) == 1,
                 what="the meter to read both requests and forward the first")
        served.now[0] = 100.4  # the first's first token: 400 ms, met
        served.upstream.release[0].set()
        # The second is forwarded only once the first is answered.
        wait_for(lambda: len(served.upstream.requests) == 2, what="the second forwarded")
        served.now[0] = 100.8  # its first token: 800 ms after its bytes came, missed
        served.upstream.release[1].set()
        answers = b""
        while answers.count(b"data: [DONE]") < 2:
            got = sock.recv(65536)
            assert got, f"the connection closed after {answers!r}"
            answers += got
    wait_for(lambda: sum(n for n, _ in counted(served.app).values()) == 2,
             what="both streams judged")
    assert counted(served.app) == {(Priority.P0, LABEL, True): (1, 1),
                                   (Priority.P0, LABEL, False): (1, 1)}


def test_a_stream_whose_body_trickles_in_is_judged_from_its_last_byte(
        served: _Served) -> None:
    """The reviewer's slow client: the head and 10 bytes of the body, 3 s of its upload
    paused, then the rest; its first token 80 ms after. The 3 s were its link's, which no
    replica could shorten: its TTFT is 80 ms, met, not 3.08 s."""
    request = _completion()
    cut = request.index(b"\r\n\r\n") + 4 + 10
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(request[:cut])  # at 100
        wait_for(lambda: sum(served.read) == cut, what="the meter to read the first part")
        served.now[0] = 103.0
        sock.sendall(request[cut:])
        wait_for(lambda: len(served.upstream.requests) == 1, what="the request forwarded")
        served.now[0] = 103.08
        served.upstream.release[0].set()
        answer = b""
        while b"data: [DONE]" not in answer:
            got = sock.recv(65536)
            assert got, f"the connection closed after {answer!r}"
            answer += got
    wait_for(lambda: counted(served.app) != {}, what="the stream judged")
    assert counted(served.app) == {(Priority.P0, LABEL, True): (1, 1)}
    assert (served.app.latency.ttft.count, served.app.latency.ttft.total) == \
        (1, pytest.approx(0.08))


def test_the_engines_date_and_server_reach_the_client_once(served: _Served) -> None:
    served.upstream.release[0].set()
    url = f"http://127.0.0.1:{served.port}"
    with httpx.Client(timeout=HANG_GUARD_S) as client:
        streamed = client.post(url + "/v1/completions", json={
            "model": "llama", "prompt": "hi", "max_tokens": 1, "stream": True})
        own = client.get(url + "/metrics")
    assert streamed.status_code == 200
    assert streamed.headers.get_list("date") == [ENGINE_DATE]
    assert streamed.headers.get_list("server") == ["vllm"]
    # The meter's own answer (verdicts after the engine's exposition): a date, no server.
    assert own.status_code == 200 and len(own.headers.get_list("date")) == 1
    assert email.utils.parsedate_to_datetime(own.headers["date"]).tzinfo is not None
    assert own.headers.get_list("server") == []


@pytest.mark.parametrize("path", ["/v1/./completions", "/v1/x/../completions"])
def test_a_stream_whose_path_has_dot_segments_is_judged_as_the_engine_serves_it(
        served: _Served, path: str) -> None:
    # httpx removes dot segments from the URL it sends, so the engine serves this as
    # /v1/completions: judged by the client's spelling, the stream went unjudged (a way
    # to opt out of the verdicts).
    served.upstream.release[0].set()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(_completion().replace(b"/v1/completions", path.encode(), 1))
        answer = b""
        while b"data: [DONE]" not in answer:
            got = sock.recv(65536)
            assert got, f"the connection closed after {answer!r}"
            answer += got
    assert [r.url.path for r in served.upstream.requests] == ["/v1/completions"]
    wait_for(lambda: counted(served.app) != {}, what="the stream judged")
    assert counted(served.app) == {(Priority.P0, LABEL, True): (1, 1)}


@pytest.mark.parametrize("where", ["one header", "many headers", "target"])
def test_a_head_past_the_bound_is_a_431_and_the_connection_ends(
        served: _Served, where: str) -> None:
    # Unbounded, the meter held every byte of an endless head (llhttp sets no limit).
    flood = {"one header": b"x-big: " + b"a" * (1 << 20) + b"\r\n",
             "many headers": b"".join(b"x-h%d: v\r\n" % i for i in range(100_000)),
             "target": b""}[where]
    target = b"/v1/models" + (b"?q=" + b"a" * (1 << 20) if where == "target" else b"")
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        # All of it is taken (and dropped) after the refusal, so the client reads the 431
        # rather than a reset.
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n" + flood + b"\r\n")
        answer = b""
        while got := sock.recv(65536):
            answer += got
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert served.upstream.requests == []


def _on_loop(protocol: Any, fn: Callable[[], None]) -> None:
    """``fn()`` on the loop that serves ``protocol``, where its timers are armed."""
    async def run() -> None:
        fn()
    asyncio.run_coroutine_threadsafe(run(), protocol.loop).result(HANG_GUARD_S)


# When the meter holds all that was sent (a deadline would otherwise run out on bytes
# not yet read): the head's deadline is armed as the connection is made, and the app
# waits for the rest of a body with the body's deadline armed.
HOLDS: dict[str, Callable[[Any], bool]] = {
    "nothing": lambda protocol: True,
    "half a head": lambda protocol: True,
    "a short body": lambda protocol: protocol._body_timer is not None,
}


@pytest.mark.parametrize(("sent", "answer"), [
    (b"", b""),  # nothing sent: nothing to answer
    (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n", b"HTTP/1.1 408 "),
    (_completion()[:-5], b""),  # a body that stops short: nothing forwarded, unanswered
], ids=list(HOLDS))
def test_a_stalled_client_is_let_go(tmp_path: Path, request: pytest.FixtureRequest,
                                    sent: bytes, answer: bytes) -> None:
    """Held for ever before: uvicorn's keep-alive timer starts only after an answer. The
    deadlines run out once the meter holds all that was sent: on the wall clock (1 s) a
    client whose send came late, its thread off a busy CPU, read the close of "nothing
    sent" where half a head is refused 408."""
    timers = FiredTimers()
    case = request.node.callspec.id
    with _serve(tmp_path, Deadlines(head_s=1.0, body_idle_s=1.0), call_later=timers) \
            as meter:
        with socket.create_connection(("127.0.0.1", meter.port)) as sock:
            sock.settimeout(HANG_GUARD_S)
            sock.sendall(sent)
            port = sock.getsockname()[1]

            def holds() -> Any:
                protocol = next((c for c in list(meter.server.server_state.connections)
                                 if c.client is not None and c.client[1] == port), None)
                return protocol if (protocol is not None and sum(meter.read) == len(sent)
                                    and HOLDS[case](protocol)) else None

            protocol = wait_for(holds, what=f"the meter to hold {case}")

            def run_out() -> None:
                for timer in timers.armed():
                    if getattr(timer.callback, "__self__", None) is protocol:
                        timer.fire()

            _on_loop(protocol, run_out)
            got = b""
            while more := sock.recv(65536):
                got += more
        assert got.startswith(answer) and (answer or got == b""), got[:200]
        wait_for(lambda: not meter.server.server_state.connections,
                 what="the connection released")
        assert meter.upstream.requests == []
        assert counted(meter.app) == {}
        ok = httpx.get(f"http://127.0.0.1:{meter.port}/metrics", timeout=HANG_GUARD_S)
        assert ok.status_code == 200


def test_past_the_cap_a_request_is_refused_and_the_scrape_still_answers(
        tmp_path: Path) -> None:
    """``--max-connections 2``: two streams held open by vLLM take both slots; a third
    client's request is a 503 the meter answers itself, never forwarded, and Prometheus'
    scrape is answered on a connection then closed, with the refusal counted."""
    with _serve(tmp_path, max_connections=2) as meter, contextlib.ExitStack() as stack:
        for _ in range(2):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", meter.port)))
            sock.sendall(_completion())
        wait_for(lambda: len(meter.upstream.requests) == 2, what="both streams forwarded")
        assert meter.app.connection_cap is not None
        assert meter.app.connection_cap.held == 2
        with socket.create_connection(("127.0.0.1", meter.port)) as sock:
            sock.settimeout(HANG_GUARD_S)
            sock.sendall(_completion())
            answer = b""
            while got := sock.recv(65536):  # answered, then closed
                answer += got
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:300]
        assert b"retry-after: 1" in head.lower()
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        assert len(meter.upstream.requests) == 2  # never reached vLLM
        answer = _answer_to_close(meter.port, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert b"vllm:num_requests_running 0" in answer
        assert b"slopilot_connections_refused_total 1.0" in answer
        assert b"slopilot_connections_held 2.0" in answer


def _answer_to_close(port: int, request: bytes) -> bytes:
    """``request`` on a connection of its own, the answer read to the close (a reset may
    take the 503's place: the body is unread at the cap)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(request)
        with contextlib.suppress(ConnectionResetError):
            while got := sock.recv(65536):
                answer += got
    return answer


def test_a_generation_refused_at_the_cap_counts_in_the_meters_class(
        tmp_path: Path) -> None:
    """A request for generation the meter refuses at its cap is counted where the SLO is
    judged: an arrival of the meter's class (``--priority-class``; the meter serves one,
    whatever the request's header says), a miss of its objectives, and a first token
    never given (``slopilot_meter_refused_total``, which the rules read in +Inf beside
    both TTFT histograms). A GET to /v1/models refused at the cap counts in none."""
    from slopilot.engine.meter.exposition import METER_REFUSED
    from slopilot.tuner.prometheus.latency_sources import VLLM_LATENCY

    with _serve(tmp_path, max_connections=2) as meter, contextlib.ExitStack() as stack:
        for _ in range(2):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", meter.port)))
            sock.sendall(_completion())
        wait_for(lambda: len(meter.upstream.requests) == 2, what="both streams forwarded")
        cap = meter.app.connection_cap
        assert cap is not None
        before = meter.app.arrivals
        chat = _completion().replace(b"/v1/completions", b"/v1/chat/completions")
        for request in (_completion(), chat,
                        _completion().replace(b"host: x\r\n",
                                              b"host: x\r\nx-slopilot-priority: p2\r\n")):
            answer = _answer_to_close(meter.port, request)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 503 "), answer[:300]
        answer = _answer_to_close(meter.port, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
        wait_for(lambda: cap.refused == 4, what="four refusals at the cap")
        assert len(meter.upstream.requests) == 2  # none reached vLLM

        assert meter.app.arrivals - before == 3
        assert meter.app.refused == 3
        assert counted(meter.app)[Priority.P0, LABEL, False] == (3, 0)
        assert METER_REFUSED in VLLM_LATENCY.ttft.engine.never
        assert VLLM_LATENCY.ttft.client is not None
        assert METER_REFUSED in VLLM_LATENCY.ttft.client.never
        scraped = _answer_to_close(meter.port, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        text = scraped.decode()
        assert f'{METER_REFUSED}{{model_name="",priority_class="p0"}} 3.0' in text, \
            [ln for ln in text.splitlines() if "refused" in ln]
        assert "slopilot_connections_refused_total 4.0" in text
