"""``slopilot serve --max-connections``: past the cap a request is refused at once (503,
OpenAI-shaped, Retry-After) and its connection closed, while /health and /metrics still
answer (the kubelet's probes, Prometheus' scrapes); a slot is freed when its client goes.

Connections are held open deterministically (a keep-alive far longer than the test, on
timers only the test fires; a stream whose client reads nothing) and every wait is on a
condition the server's own state shows, never on the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TypeVar
from urllib.parse import urlsplit

import pytest

from slopilot.engine.http_deadlines import Deadlines
from tests.support.fired_timers import FiredTimers
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

T = TypeVar("T")
CAP = 3
# No deadline of the server's runs out under the test: its timers fire on the test's
# word alone, and it never gives that word.
HELD = Deadlines(keep_alive_s=3600.0)


@pytest.fixture
def served() -> Iterator[LiveServer]:
    with start_server(deadlines=HELD, call_later=FiredTimers(),
                      max_connections=CAP) as srv:
        yield srv


def _on_loop(srv: LiveServer, fn: Callable[[], T]) -> T:
    async def run() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(run(), srv.loop).result(HANG_GUARD_S)


def _connect(srv: LiveServer) -> socket.socket:
    address = urlsplit(srv.url)
    sock = socket.create_connection((address.hostname, address.port))
    sock.settimeout(HANG_GUARD_S)
    return sock


def _answer(sock: socket.socket) -> tuple[bytes, dict[str, str], bytes]:
    """One whole answer with a Content-Length: its status line, headers and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"closed before an answer: {data!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    while len(body) < int(headers["content-length"]):
        got = sock.recv(65536)
        assert got, f"closed mid-body: {body!r}"
        body += got
    return status.encode(), headers, body


def _get(sock: socket.socket, path: str) -> tuple[bytes, dict[str, str], bytes]:
    sock.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
    return _answer(sock)


def _held(srv: LiveServer) -> int:
    return _on_loop(srv, lambda: srv.server.connection_cap.held)


def test_past_the_cap_a_request_is_refused_and_probes_still_answer(
        served: LiveServer) -> None:
    with ExitStack() as stack:
        for _ in range(CAP):  # CAP clients, each keeping its connection
            sock = stack.enter_context(_connect(served))
            status, _, _ = _get(sock, "/v1/models")
            assert status.startswith(b"HTTP/1.1 200 "), status
        wait_for(lambda: _held(served) == CAP, what="the cap's slots all held")

        one_more = stack.enter_context(_connect(served))
        status, headers, body = _get(one_more, "/v1/models")
        assert status.startswith(b"HTTP/1.1 503 "), status
        assert int(headers["retry-after"]) >= 1
        assert headers["connection"] == "close"
        error = json.loads(body)["error"]
        assert error["type"] == "service_unavailable"
        assert error["code"] == "too_many_connections"
        assert "--max-connections 3" in error["message"]
        assert one_more.recv(1) == b""  # closed: its descriptor is the server's again

        for path in ("/health", "/metrics"):  # the kubelet's and Prometheus' way in
            with _connect(served) as probe:
                status, headers, body = _get(probe, path)
                assert status.startswith(b"HTTP/1.1 200 "), (path, status, body[:200])
                assert headers["connection"] == "close"  # a connection over the cap
                assert probe.recv(1) == b""
        with _connect(served) as probe:
            _, _, exposition = _get(probe, "/metrics")
        assert b"slopilot_connections_refused_total" in exposition
        assert b"slopilot_connections_refused_total 1.0" in exposition


def test_a_slot_freed_by_a_client_going_lets_the_next_in(served: LiveServer) -> None:
    """Slow readers: streams whose clients read nothing hold every slot; one leaves."""
    body = json.dumps({"prompt": "hi", "max_tokens": 4096, "stream": True,
                       "ignore_eos": True}).encode()
    post = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    slow = [_connect(served) for _ in range(CAP)]
    try:
        for sock in slow:
            sock.sendall(post)  # and never read
        wait_for(lambda: _held(served) == CAP, what="the slow readers holding the cap")
        with _connect(served) as fresh:
            status, _, _ = _get(fresh, "/v1/models")
            assert status.startswith(b"HTTP/1.1 503 "), status
        with _connect(served) as probe:
            status, _, _ = _get(probe, "/health")
            assert status.startswith(b"HTTP/1.1 200 "), status

        slow.pop().close()  # a client goes away
        wait_for(lambda: _held(served) == CAP - 1, what="its slot freed")
        with _connect(served) as fresh:
            status, _, _ = _get(fresh, "/v1/models")
            assert status.startswith(b"HTTP/1.1 200 "), status
    finally:
        for sock in slow:
            sock.close()
    wait_for(lambda: _held(served) == 0, what="every slot freed")
    wait_for(lambda: served.engine.num_active == 0, what="the streams aborted")


def test_the_admin_port_is_not_behind_the_cap() -> None:
    """The operator applies a trial's knobs through the admin port: a pod whose slots
    are all held still takes them (the admin's own token guards that port)."""
    with start_server(deadlines=HELD, call_later=FiredTimers(), max_connections=1,
                      admin_port=0, admin_token="t") as srv, ExitStack() as stack:
        keeper = stack.enter_context(_connect(srv))
        assert _get(keeper, "/v1/models")[0].startswith(b"HTTP/1.1 200 ")
        wait_for(lambda: _held(srv) == 1, what="the only slot held")
        address = urlsplit(srv.admin_url)
        for _ in range(2):  # more admin connections than the cap, each answered
            admin = stack.enter_context(socket.create_connection(
                (address.hostname, address.port)))
            admin.settimeout(HANG_GUARD_S)
            admin.sendall(b"GET /admin/config HTTP/1.1\r\nhost: x\r\n"
                          b"authorization: Bearer t\r\n\r\n")
            status, _, body = _answer(admin)
            assert status.startswith(b"HTTP/1.1 200 "), (status, body[:200])
        assert _held(srv) == 1


def _post(srv: LiveServer, path: str, headers: dict[str, str]) -> bytes:
    """A request for generation on a connection of its own; the answer's first bytes
    (a reset may take the 503's place: its body is unread at the cap, as documented)."""
    body = json.dumps({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1}).encode()
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
    with _connect(srv) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"%scontent-length: %d\r\n\r\n%s" % (path.encode(), extra, len(body),
                                                          body))
        answer = b""
        try:
            while got := sock.recv(65536):
                answer += got
        except ConnectionResetError:
            pass
    return answer


def _refused_at_cap(srv: LiveServer) -> int:
    return _on_loop(srv, lambda: srv.server.connection_cap.refused)


def test_a_generation_refused_at_the_cap_counts_in_its_class_as_a_429_does(
        served: LiveServer) -> None:
    """The reviewer's case: idle keep-alive clients polling /v1/models hold every slot,
    and the P0 requests refused at the cap showed in no class: p0 arrived nothing,
    refused nothing, and its TTFT P99 read as met. Each is counted where a 429 is: an
    arrival and a refusal of its class (the priority header's; none given: P1, the class
    a request naming none is served in), a miss of its class's objectives, and, through
    ``slopilot_requests_refused_total``, a first token never given in the TTFT the rules
    judge. /v1/models refused at the cap is in no class."""
    from slopilot.engine.metric_names import REFUSED
    from slopilot.engine.request import Priority
    from slopilot.engine.slo import SLOSpec
    from slopilot.tuner.prometheus.latency_sources import BUILTIN_LATENCY

    metrics = served.backend.metrics
    slo = SLOSpec.from_profile("standard")
    _on_loop(served, lambda: metrics.set_slo(slo))
    with ExitStack() as stack:
        for _ in range(CAP):  # idle keep-alive clients, each holding a slot
            sock = stack.enter_context(_connect(served))
            assert _get(sock, "/v1/models")[0].startswith(b"HTTP/1.1 200 ")
        wait_for(lambda: _held(served) == CAP, what="the cap's slots all held")

        answers = [_post(served, "/v1/completions", {"x-slopilot-priority": "p0"}),
                   _post(served, "/v1/chat/completions", {"x-slopilot-priority": "P0"}),
                   _post(served, "/v1/completions", {}),  # no class named: P1's
                   # A retry of a call turned away: counted apart, not a second arrival.
                   _post(served, "/v1/completions", {"x-slopilot-priority": "p2",
                                                     "x-stainless-retry-count": "1"})]
        for answer in answers:
            assert answer == b"" or answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        with _connect(served) as sock:
            assert _get(sock, "/v1/models")[0].startswith(b"HTTP/1.1 503 ")
        wait_for(lambda: _refused_at_cap(served) == 5, what="five refusals at the cap")

    refused = _on_loop(served, metrics.refused)
    arrived = _on_loop(served, metrics.arrived)
    assert refused == {Priority.P0: 2, Priority.P1: 1, Priority.P2: 0}
    assert arrived == {Priority.P0: 2, Priority.P1: 1, Priority.P2: 0}
    assert _on_loop(served, lambda: metrics.retries(refused=True))[Priority.P2] == 1
    verdicts = _on_loop(served, metrics.verdicts)
    assert verdicts[Priority.P0, slo.p0.label, False] == (2, 0)
    assert verdicts[Priority.P1, slo.p1.label, False] == (1, 0)

    # As Prometheus scrapes it: the refusals the TTFT rules read as first tokens never
    # given, per class.
    assert REFUSED in BUILTIN_LATENCY.ttft.engine.never
    with _connect(served) as probe:
        _, _, exposition = _get(probe, "/metrics")
    text, model = exposition.decode(), metrics.model_name
    assert f'{REFUSED}{{model_name="{model}",priority_class="p0"}} 2.0' in text, \
        [ln for ln in text.splitlines() if REFUSED in ln]
    assert f'{REFUSED}{{model_name="{model}",priority_class="p1"}} 1.0' in text
    assert "slopilot_connections_refused_total 5.0" in text
