"""``slopilot serve`` on a real socket lets a streaming client that stops reading go.

The client asks for a stream and never reads it; the kernel's buffers fill (small ones on
both ends, so a few hundred tokens do it, where the defaults of a Linux loopback hold
megabytes) and uvicorn's send waits for the client. Before the send deadline the engine
ran the request on to ``max_tokens`` for nobody, its KV blocks and batch slot held all
the while; then freed them, but the connection, the answer's task and every token not
yet sent stayed until the client read or left, unseen by the metrics (no e2e latency, no
finish reason), and a shutdown waited ``--drain-timeout`` + 5 s for it and cancelled it
with a traceback.

The deadline is timed on ``ManualTimers`` the test fires on the server's loop: the
waits end on conditions (a paused transport, a released connection), never on a
measured time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from slopilot.engine.http_deadlines import Deadlines
from slopilot.engine.request import Priority, RequestStatus
from tests.support.live_server import LiveServer, start_server
from tests.support.manual_timers import ManualTimers
from tests.support.stalled_client import EngineFreeze, on_loop, paused, stalled_stream
from tests.support.tcp_queues import cut_at_send_deadline, settle_send_deadline
from tests.support.waits import HANG_GUARD_S, wait_for

SEND_S = 60.0
MAX_TOKENS = 8000  # the model's context is 8192: far more than the stall needs
SMALL_BUFFER = 4096  # the kernel doubles it, then keeps a floor of its own


@pytest.fixture(params=[True, False], ids=["generating", "generated"], scope="module")
def srv(request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, ManualTimers, bool]]:
    """Real time: the request is still generating when its client stalls; or as fast as
    the engine goes: it finished long before."""
    timers = ManualTimers()
    with start_server(realtime=request.param, deadlines=Deadlines(send_s=SEND_S),
                      call_later=timers.call_later) as server:
        # Accepted connections take the listening socket's send buffer.
        server.server.listen[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        yield server, timers, request.param




def _connections(srv: LiveServer) -> set[object]:
    return set(srv.server.server_state.connections)






def _take_what_came(sock: socket.socket) -> None:
    """Read all the client's kernel holds: its window opens, its kernel takes more."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        pass
    sock.setblocking(True)


def _took(srv: LiveServer, conn: Any, armed: object) -> bool:
    """Whether the client took bytes since the send deadline ``armed`` was: fewer bytes
    not taken, or so many that writing resumed (and paused again: another deadline)."""
    async def look() -> bool:
        return conn._send_timer is not armed or bool(conn._not_taken() < conn._send_left)
    return asyncio.run_coroutine_threadsafe(look(), srv.loop).result(HANG_GUARD_S)


def _aborts(srv: LiveServer) -> int:
    return srv.backend.metrics._success["abort"]


def test_a_client_that_stops_reading_is_let_go_at_the_send_deadline(
        srv: tuple[LiveServer, ManualTimers, bool]) -> None:
    server, timers, generating = srv
    metrics = server.backend.metrics
    aborts, timeouts = _aborts(server), metrics.send_timeouts
    e2e = metrics._e2e[Priority.P1].count
    freeze = EngineFreeze(server)
    held = freeze.held
    with stalled_stream(server, MAX_TOKENS, SMALL_BUFFER) as sock:
        wait_for(lambda: paused(server), what="the server's writing to pause")
        # The client's kernel may take what its buffer holds after the pause: progress.
        settle_send_deadline(next(iter(_connections(server))), timers, SEND_S)
        if generating:
            freeze.hold()
            # A few hundred of its 8000 tokens made: it runs, holding its KV blocks.
            assert [r.num_output_tokens < MAX_TOKENS for r in held] == [True]
        else:
            # The engine is done with it: it freed its blocks and its slot...
            wait_for(lambda: server.engine.num_active == 0, what="the request to finish")
            assert server.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
        # ... but the connection and the answer's task stay, the request unobserved.
        assert len(_connections(server)) == 1 and len(server.server.server_state.tasks) == 1
        assert (metrics._e2e[Priority.P1].count, _aborts(server)) == (e2e, aborts)

        conn = next(iter(_connections(server)))
        on_loop(server, timers, timers.now + SEND_S - 0.1)
        # Not cut before its time (writing may have resumed if its kernel took bytes).
        assert not conn.transport.is_closing() and metrics.send_timeouts == timeouts
        cut_at_send_deadline(conn, timers)
        wait_for(lambda: not _connections(server), what="the connection to be dropped")
        # Observed as an abort, once: its client never got the end of it.
        wait_for(lambda: metrics._e2e[Priority.P1].count == e2e + 1, what="the request observed")
        freeze.thaw()
        assert (_aborts(server), metrics.send_timeouts) == (aborts + 1, timeouts + 1)
        wait_for(lambda: server.engine.num_active == 0, what="no request left running")
        assert server.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
        wait_for(lambda: not server.server.server_state.tasks, what="the answer's task to end")
        if generating:
            # Ended by the abort, not by running out its tokens for nobody.
            assert held[0].status is RequestStatus.FINISHED_ABORTED
            assert held[0].num_output_tokens < MAX_TOKENS
        # The client reads what reached it, then the end: a stream cut short, no [DONE].
        sock.settimeout(HANG_GUARD_S)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        assert got.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" not in got


def test_a_client_whose_kernel_takes_bytes_late_is_given_another_period(
        srv: tuple[LiveServer, ManualTimers, bool]) -> None:
    """CI's failure: Linux may open a closed window again long after the buffer filled
    (it compacts the receive queue and answers a window probe), so the client's kernel
    takes bytes within the last period. That is progress: the deadline arms again, and
    cuts the connection at the end of the first period in which nothing was taken."""
    server, timers, _ = srv
    timeouts = server.backend.metrics.send_timeouts
    with stalled_stream(server, MAX_TOKENS, SMALL_BUFFER) as sock:
        wait_for(lambda: paused(server), what="the server's writing to pause")
        conn = next(iter(_connections(server)))
        settle_send_deadline(conn, timers, SEND_S)
        on_loop(server, timers, timers.now + SEND_S - 0.1)
        # What the window reopening does: the client's kernel takes more.
        armed = conn._send_timer
        _take_what_came(sock)
        wait_for(lambda: _took(server, conn, armed), what="the client's kernel to take more")
        on_loop(server, timers, timers.now + 0.1)
        assert not conn.transport.is_closing(), "cut though its kernel took bytes"
        assert server.backend.metrics.send_timeouts == timeouts
        cut_at_send_deadline(conn, timers)
        wait_for(lambda: not _connections(server), what="the connection to be dropped")
        assert server.backend.metrics.send_timeouts == timeouts + 1
