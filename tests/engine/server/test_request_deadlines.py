"""``slopilot serve`` on a real socket ends a connection whose client stalls: half a head
is a 408, a body that stops short is dropped as a client that left, and a connection
that sends nothing is closed.

The deadlines run out on the test's word (``FiredTimers``, fired on the server's loop)
once the server holds what the client sent. On the loop's own timers (1 s here until
then) a machine busy enough to keep the loop off the CPU past a deadline had the timer
run before the read of bytes sent in time (uvloop runs due timers before it polls): a
well-behaved request was cut, and a half head was closed on as if nothing had come.
test_http_deadlines.py pins the rule itself; nothing here waits on wall-clock time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.fired_timers import FiredTimers
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

T = TypeVar("T")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[LiveServer, FiredTimers]]:
    timers = FiredTimers()
    with start_server(call_later=timers) as server:
        yield server, timers


def _on_loop(srv: LiveServer, fn: Callable[[], T]) -> T:
    """``fn()`` on the server's event loop, where its connections live."""
    async def run() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(run(), srv.loop).result(HANG_GUARD_S)


def _connection(srv: LiveServer, port: int) -> Any:
    """The server's protocol for the client connection from local ``port``, if open."""
    for protocol in list(srv.server.server_state.connections):
        if protocol.client is not None and protocol.client[1] == port:
            return protocol
    return None


# When the server holds all that was sent (the deadline would otherwise run out on
# bytes not yet read): h11 buffers a head until it is whole, and the app waits for
# the rest of a body with the body's deadline armed.
HOLDS: dict[str, Callable[[Any, bytes], bool]] = {
    "nothing": lambda protocol, sent: True,
    "half a head": lambda protocol, sent: protocol.conn.trailing_data[0] == sent,
    "a short body": lambda protocol, sent: protocol._body_timer is not None,
}


def _until_closed(srv: LiveServer, timers: FiredTimers, case: str, sent: bytes) -> bytes:
    """What the server answers ``sent`` before it ends the connection, once the
    connection's deadlines run out with all of ``sent`` in the server's hands."""
    address = urlsplit(srv.url)
    with socket.create_connection((address.hostname, address.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(sent)
        port = sock.getsockname()[1]

        def holds() -> Any:
            protocol = _connection(srv, port)
            return protocol if protocol is not None and HOLDS[case](protocol, sent) else None

        protocol = wait_for(lambda: _on_loop(srv, holds), what=f"the server to hold {case}")

        def run_out() -> None:
            for timer in timers.armed():
                if getattr(timer.callback, "__self__", None) is protocol:
                    timer.fire()

        _on_loop(srv, run_out)
        answer = b""
        while got := sock.recv(65536):
            answer += got
    return answer


@pytest.mark.parametrize(("sent", "answer"), [
    (b"", b""),  # nothing sent: nothing to answer
    (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n", b"HTTP/1.1 408 "),
    (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
     b"content-length: 100\r\n\r\n{\"prompt\": ", b""),  # the request ends unanswered
], ids=list(HOLDS))
def test_a_stalled_client_is_let_go(served: tuple[LiveServer, FiredTimers],
                                    request: pytest.FixtureRequest, sent: bytes,
                                    answer: bytes) -> None:
    srv, timers = served
    case = request.node.callspec.id
    got = _until_closed(srv, timers, case, sent)
    assert got.startswith(answer) and (answer or got == b""), got[:200]
    wait_for(lambda: _on_loop(srv, lambda: not srv.server.server_state.connections),
             what="the connection released")
    # The server serves on, with nothing of the stalled request left in the engine.
    ok = httpx.post(srv.url + "/v1/completions", timeout=HANG_GUARD_S,
                    json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    wait_for(lambda: srv.engine.num_active == 0, what="no request left running")


def test_an_idle_connection_is_kept_for_the_keep_alive_given() -> None:
    """``--keep-alive-timeout``: behind a proxy that keeps idle upstream connections
    longer than the server (Envoy's 1 h, an ALB's 60 s), the server closing first races
    the proxy's next request on that connection, which the proxy answers 502/503; the
    openai SDK (httpx's 5 s) raced uvicorn's fixed 5 s in benchmarks/client_truth.py."""
    from slopilot.engine.http_deadlines import Deadlines

    timers = FiredTimers()
    with start_server(deadlines=Deadlines(keep_alive_s=75.0), call_later=timers) as srv:
        address = urlsplit(srv.url)
        body = b'{"prompt": "hi", "max_tokens": 1}'
        with socket.create_connection((address.hostname, address.port)) as sock:
            sock.settimeout(HANG_GUARD_S)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
            port = sock.getsockname()[1]

            def keep_alive() -> Any:
                protocol = _connection(srv, port)
                return next((t for t in timers.armed()
                             if getattr(t.callback, "__self__", None) is protocol
                             and t.callback.__name__ == "timeout_keep_alive_handler"), None)

            timer = wait_for(lambda: _on_loop(srv, keep_alive), what="keep-alive armed")
            assert timer.delay_s == 75.0
            _on_loop(srv, timer.fire)
            assert sock.recv(65536) == b""  # closed by the server, nothing more said
