"""A client that asks a live server for a long stream and never reads it, and the looks
and steps the send-deadline tests take on the server's loop (``LiveServer``)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from urllib.parse import urlsplit

from slopilot.engine.engine import LLMEngine
from slopilot.engine.request import Request
from tests.support.live_server import LiveServer
from tests.support.manual_timers import ManualTimers
from tests.support.waits import HANG_GUARD_S


def stalled_stream(srv: LiveServer, max_tokens: int, rcvbuf: int) -> socket.socket:
    """The client's socket (receive buffer ``rcvbuf``), its request sent: ``max_tokens``
    streamed with top-5 logprobs, some 500 bytes a token, so buffers fill within a few
    hundred."""
    address = urlsplit(srv.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((address.hostname, address.port))
    body = json.dumps({"prompt": "hello", "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "logprobs": 5}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    return sock


def paused(srv: LiveServer) -> bool:
    """Whether the server's writing to a connection is paused (its client not taking)."""
    return any(c.flow.write_paused  # type: ignore[attr-defined]
               for c in set(srv.server.server_state.connections))


def on_loop(srv: LiveServer, timers: ManualTimers, to: float) -> None:
    """Move the deadlines' time to ``to`` on the server's loop (where they are armed)."""
    async def advance() -> None:
        timers.advance(to)
    asyncio.run_coroutine_threadsafe(advance(), srv.loop).result(HANG_GUARD_S)


class EngineFreeze:
    """Holds a live server's engine between two iterations (``hold``: the requests it was
    running), so what runs, runs on only once ``thaw``ed."""

    def __init__(self, srv: LiveServer) -> None:
        self.srv = srv
        self.held: list[Request] = []
        self._frozen, self._thaw = threading.Event(), threading.Event()

    def _freeze(self, engine: LLMEngine) -> None:
        self.held.extend(engine.scheduler.running)
        self._frozen.set()
        self._thaw.wait(HANG_GUARD_S)

    def hold(self) -> list[Request]:
        asyncio.run_coroutine_threadsafe(self.srv.engine.call(self._freeze), self.srv.loop)
        self._frozen.wait(HANG_GUARD_S)
        return self.held

    def thaw(self) -> None:
        self._thaw.set()
