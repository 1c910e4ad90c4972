"""The operator's --metrics port bounds its connections: what each may hold, and for how long.

prometheus_client's own server gave each connection a thread and no read deadline: 300
idle connections took the operator to 199 threads, and under a pids limit of 200 its pod
syncs could start none ("can't start new thread" for every tenant). Here the page is
served on one event loop, each connection has a deadline for its request's head, and past
``MAX_CONNECTIONS`` a new one displaces the oldest that is not being answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from slopilot.engine.http_deadlines import CallLater, Deadlines
from slopilot.operator.daemon import operator_metrics
from slopilot.operator.metrics_endpoint import MAX_CONNECTIONS, MetricsServer, serve_metrics
from slopilot.tuner.loop.state import ControllerState
from tests.support.fired_timers import FiredTimers
from tests.support.waits import HANG_GUARD_S, wait_for

T = TypeVar("T")

IDLE = 200
"""Idle connections opened at once: well above the cap, and within a test's descriptors."""


@contextlib.contextmanager
def served(deadlines: Deadlines | None = None,
           call_later: CallLater | None = None) -> Iterator[MetricsServer]:
    server = serve_metrics(("127.0.0.1", 0), call_later=call_later) if deadlines is None \
        else serve_metrics(("127.0.0.1", 0), deadlines=deadlines, call_later=call_later)
    try:
        yield server
    finally:
        server.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (read without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_past_the_cap_hold_no_thread_and_a_scrape_still_gets_in() -> None:
    operator_metrics("team-idle").observe("served", ControllerState.STEADY, 2)
    with served() as server, contextlib.ExitStack() as stack:
        threads = threading.active_count()
        socks = []
        for _ in range(IDLE):
            sock = stack.enter_context(socket.create_connection(
                ("127.0.0.1", server.server_port), timeout=HANG_GUARD_S))
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a head, then nothing
            socks.append(sock)
        open_ = list(socks)

        def displaced() -> bool:
            open_[:] = [s for s in open_ if not closed_by_server(s)]
            return len(open_) <= MAX_CONNECTIONS

        wait_for(displaced, f"the server to close all but {MAX_CONNECTIONS} of {IDLE} "
                 "idle connections", diagnose=lambda: f"{len(open_)} still open, "
                 f"{threading.active_count()} threads")
        # No thread per connection: the page is served on one loop, started before.
        assert threading.active_count() <= threads
        # The cap is held by idle connections; a scrape displaces the oldest of them.
        page = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics",
                         timeout=HANG_GUARD_S)
    operator_metrics("team-idle").forget("served")
    assert page.status_code == 200
    assert 'slopilot_replicas{slopilot_deployment="served",slopilot_namespace="team-idle"} ' \
        '2.0' in page.text


def _on_loop(protocol: Any, fn: Callable[[], T]) -> T:
    """``fn()`` on the loop that serves ``protocol``, where its state changes."""
    async def run() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(run(), protocol.loop).result(HANG_GUARD_S)


@pytest.mark.parametrize(("sent", "answer"), [
    (b"", b""),  # nothing asked: closed without a word
    (b"GET /metrics HTTP/1.1\r\n", b"HTTP/1.1 408 ")])  # half a head: refused
def test_a_connection_that_does_not_send_its_head_is_closed(sent: bytes,
                                                            answer: bytes) -> None:
    """The head deadline runs out once the server holds all that was sent: on the wall
    clock (0.2 s) a client whose send came late, its thread off a busy CPU, read the
    close of "nothing asked" where half a head was refused 408."""
    timers = FiredTimers()
    with served(Deadlines(head_s=0.2), call_later=timers) as server, \
            socket.create_connection(("127.0.0.1", server.server_port),
                                     timeout=HANG_GUARD_S) as sock:
        sock.sendall(sent)
        port = sock.getsockname()[1]

        def holding() -> Any:
            protocol = next((c for c in list(server._server.server_state.connections)
                             if c.client is not None and c.client[1] == port), None)
            if protocol is None:
                return None
            held = _on_loop(protocol, lambda: protocol.conn.trailing_data[0] == sent)
            return protocol if held else None

        protocol = wait_for(holding, what="the server to hold what was sent")
        [deadline] = [t for t in timers.armed()
                      if getattr(t.callback, "__self__", None) is protocol]
        assert deadline.delay_s == 0.2
        _on_loop(protocol, deadline.fire)
        got = b""
        while chunk := sock.recv(4096):  # until the server closes it
            got += chunk
    assert got.startswith(answer) and (answer or got == b""), got[:200]


def test_close_ends_the_servers_thread_and_its_connections() -> None:
    with served() as server, socket.create_connection(
            ("127.0.0.1", server.server_port), timeout=HANG_GUARD_S) as sock:
        before = threading.active_count()
        server.close()
        # Closed, or reset where it still waited in the listening socket's backlog.
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(4096) == b""
        assert threading.active_count() <= before - 1  # the server's own thread ended
