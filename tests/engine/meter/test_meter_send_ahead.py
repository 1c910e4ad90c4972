"""The meter, served as ``slopilot meter`` serves it, lets a client that stops reading go
at the send deadline, and closes its upstream request so vLLM stops generating.

The kernel's send buffer is left as Linux sizes it; only the client's receive buffer is
small, as a stalled reader's window is. Before, uvicorn's send returned once the kernel
took a piece, so a stream of a few hundred KB went whole into the kernel: each piece
stamped "written", the stream judged met, the upstream read to its end (vLLM generating
all of it for nobody), and the send deadline never armed (the transport never paused).

The deadline is timed on ``ManualTimers``, moved on the server's loop; the waits end on
conditions (a paused transport, the client's buffer full, a closed upstream), never on a
measured time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from slopilot.engine.http_deadlines import Deadlines
from slopilot.engine.meter.commands import uvicorn_config
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.verdicts import Verdicts
from tests.engine.meter.test_meter import DONE, SLO, event
from tests.support.manual_timers import ManualTimers
from tests.support.tcp_queues import cut_at_send_deadline, settle_send_deadline
from tests.support.waits import HANG_GUARD_S, wait_for

SEND_S = 60.0
EVENTS = 3000  # some 300 KB: within what the kernel took before
SMALL_BUFFER = 4096  # the client's receive buffer (the kernel doubles it)


class _LongStream(httpx.AsyncByteStream):
    """A stand-in vLLM streaming ``EVENTS`` tokens as fast as it is read; it says how
    many it gave, and whether its request was closed before its end (``aclose``: a real
    transport's connection to vLLM closed, which aborts the request there)."""

    def __init__(self) -> None:
        self.given = 0
        self.finished = False
        self.closed = threading.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":  # asked at the meter's startup: no context
            return httpx.Response(404)
        return httpx.Response(200, stream=self, headers={"content-type": "text/event-stream"})

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(EVENTS):
            self.given += 1
            yield event(text="token ")
        yield event(text="end", finish="length")
        yield DONE
        self.finished = True

    async def aclose(self) -> None:
        self.closed.set()


@dataclass
class _Served:
    app: Meter
    upstream: _LongStream
    port: int
    server: uvicorn.Server


@contextlib.contextmanager
def _serve(tmp_path: Path, timers: ManualTimers) -> Iterator[_Served]:
    slo_file = tmp_path / "slo.json"
    slo_file.write_text(json.dumps(SLO))
    upstream = _LongStream()
    app = Meter("http://127.0.0.1:8001", SLOWatch(slo_file, Verdicts()), Priority.P0,
                client=httpx.AsyncClient(transport=httpx.MockTransport(upstream.handle)),
                clock=lambda: 100.0)
    config = uvicorn_config(app, host="127.0.0.1", port=0, log_level="warning",
                            deadlines=Deadlines(send_s=SEND_S), call_later=timers.call_later)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), what="the meter to listen")
    assert server.started, "the meter did not start"
    try:
        yield _Served(app, upstream, server.servers[0].sockets[0].getsockname()[1], server)
    finally:
        server.should_exit = True
        thread.join(HANG_GUARD_S)


def _paused(meter: _Served) -> bool:
    return any(c.flow.write_paused  # type: ignore[union-attr]
               for c in meter.server.server_state.connections)


def test_a_stalled_reader_is_let_go_and_its_upstream_closed(tmp_path: Path) -> None:
    timers = ManualTimers()
    with _serve(tmp_path, timers) as meter, socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
        sock.connect(("127.0.0.1", meter.port))
        body = json.dumps({"model": "llama", "prompt": "hi", "max_tokens": EVENTS + 1,
                           "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        # Never read. The meter's writing pauses (what the kernel holds unsent is
        # bounded), or, before, the whole stream went into the kernel.
        wait_for(lambda: _paused(meter) or meter.upstream.closed.is_set(),
                 what="the meter's writing to pause, or the stream to end")
        assert _paused(meter), "the whole stream counted as written to a stalled reader"
        assert meter.upstream.given < EVENTS

        conn: Any = next(iter(meter.server.server_state.connections))
        # The client's kernel may take what its buffer holds after the pause: progress.
        settle_send_deadline(conn, timers, SEND_S)
        cut_at_send_deadline(conn, timers)
        # The upstream request closed mid-stream: vLLM aborts it and frees its cache.
        assert meter.upstream.closed.wait(HANG_GUARD_S)
        assert not meter.upstream.finished
        wait_for(lambda: not meter.server.server_state.connections,
                 what="the connection to be dropped")
        # Cut short with its first token in time and no slow gap: not judged (neither
        # met nor missed), as the server judges one.
        assert [k for k, (n, _) in meter.app.verdicts.counts().items() if n and k[2]] == []
