"""``slopilot serve`` on a real socket ends a connection whose client stalls: half a head
is a 408, a body that stops short is dropped as a client that left, and a connection
that sends nothing is closed. Each within deadlines short enough to wait on; the waits
end on the connection's end (or the suite's hang guard), never on a measured time.

test_http_deadlines.py pins the rule itself, on timers the test fires.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from slopilot.engine.http_deadlines import Deadlines
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    # Short, so the test waits little; long enough for the well-behaved request below to
    # send its head and body however busy the machine.
    with start_server(deadlines=Deadlines(head_s=1.0, body_idle_s=1.0)) as server:
        yield server


def _until_closed(srv: LiveServer, sent: bytes) -> bytes:
    """What the server answers ``sent`` before it ends the connection."""
    address = urlsplit(srv.url)
    with socket.create_connection((address.hostname, address.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(sent)
        answer = b""
        while got := sock.recv(65536):
            answer += got
    return answer


def _connections(srv: LiveServer) -> int:
    return len(srv.server.server_state.connections)


@pytest.mark.parametrize(("sent", "answer"), [
    (b"", b""),  # nothing sent: nothing to answer
    (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n", b"HTTP/1.1 408 "),
    (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
     b"content-length: 100\r\n\r\n{\"prompt\": ", b""),  # the request ends unanswered
], ids=["nothing", "half a head", "a short body"])
def test_a_stalled_client_is_let_go(srv: LiveServer, sent: bytes, answer: bytes) -> None:
    got = _until_closed(srv, sent)
    assert got.startswith(answer) and (answer or got == b""), got[:200]
    wait_for(lambda: _connections(srv) == 0, what="the connection released")
    # The server serves on, with nothing of the stalled request left in the engine.
    ok = httpx.post(srv.url + "/v1/completions", timeout=HANG_GUARD_S,
                    json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    wait_for(lambda: srv.engine.num_active == 0, what="no request left running")
