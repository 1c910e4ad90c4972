"""A request's arrival is when its bytes reached the kernel, not when the event loop got
round to reading them: a loop held up (overload, a GC pause, a stopped process) while a
client's request waits in the socket, or its connection in the listen socket's accept
queue, is TTFT the client pays.

A real TCP server in-process, both HTTP protocols, on the real monotonic clock. The
server's loop is held while the client sends, and let go only once the kernel has the
bytes and its own clock says 50 ms have passed since (``tests.support.held_loop``). The
stamp must then precede the release by that much, less the kernel's tick twice, and not
precede the send. No speed in the assertions: the waits are on conditions the kernel reports.

A request whose body comes in pieces (a slow upload) is stamped by its last byte: the
client's upload is its own link's time, and the server could start only once it had it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from slopilot.engine.http_arrival import SCOPE_KEY, h11_protocol, httptools_protocol
from slopilot.engine.tcp_received import since_last_data
from tests.support.held_loop import HAS_TCP_INFO, TICK_S, held, wait_in_the_kernel
from tests.support.waits import HANG_GUARD_S

Factory = Callable[..., type[asyncio.Protocol]]
PROTOCOLS = [pytest.param(h11_protocol, id="h11"),
             pytest.param(httptools_protocol, id="httptools")]

HELD_MS = 50  # how long, on the kernel's clock, the bytes wait while the loop is held

pytestmark = pytest.mark.skipif(not HAS_TCP_INFO, reason="TCP_INFO is Linux's")


def _request(path: str) -> bytes:
    body = b'{"prompt": "hi"}'
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (path.encode(), len(body)) + body)


def _answer(sock: socket.socket, answers: int = 1) -> None:
    got = b""
    while got.count(b"\r\n\r\nok") < answers:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {got!r}"
        got += chunk


@dataclass
class _Server:
    loop: asyncio.AbstractEventLoop
    port: int
    stamps: dict[str, float] = field(default_factory=dict)
    called: threading.Condition = field(default_factory=threading.Condition)

    def stamp(self, path: str) -> float:
        with self.called:
            assert self.called.wait_for(lambda: path in self.stamps, HANG_GUARD_S), \
                f"the app was never called for {path}"
            return self.stamps[path]


@contextmanager
def _serve(factory: Factory) -> Iterator[_Server]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: list[_Server] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        server = box[0]
        while (await receive()).get("more_body"):
            pass
        with server.called:  # read once the body is whole, as the apps read it
            server.stamps[scope["path"]] = scope[SCOPE_KEY]
            server.called.notify_all()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, lifespan="off", log_config=None, proxy_headers=False)
    config.load()
    cls: Any = factory(time.monotonic, backdate=True)

    def run() -> None:
        asyncio.set_event_loop(loop)
        listener = loop.run_until_complete(loop.create_server(
            lambda: cls(config, ServerState(), {}, _loop=loop), "127.0.0.1", 0))
        box.append(_Server(loop, listener.sockets[0].getsockname()[1]))
        ready.set()
        loop.run_forever()
        listener.close()
        loop.run_until_complete(listener.wait_closed())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(HANG_GUARD_S), "the server never listened"
    try:
        yield box[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(HANG_GUARD_S)


def _assert_stamped_by_the_kernel(stamp: float, sent: float, released: float) -> None:
    # The bytes reached the kernel after the send and HELD_MS before the release: each
    # kernel reading (the client's here, the server's at its read) is within a tick.
    assert sent - TICK_S <= stamp <= released - HELD_MS / 1000 + 2 * TICK_S, \
        (f"stamped {stamp - sent:+.4f} s after the send, {stamp - released:+.4f} s after "
         f"the loop was let go")


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_connection_waiting_in_the_accept_queue_is_stamped_when_its_bytes_came(
        factory: Factory) -> None:
    with _serve(factory) as server:
        with held(server.loop) as release:
            # The handshake completes in the kernel; the loop accepts it only once let go.
            sock = socket.create_connection(("127.0.0.1", server.port))
            sent = time.monotonic()
            sock.sendall(_request("/one"))
            wait_in_the_kernel(sock, HELD_MS)
            released = release()
        with sock:
            sock.settimeout(HANG_GUARD_S)
            _answer(sock)
        _assert_stamped_by_the_kernel(server.stamp("/one"), sent, released)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_kept_alive_connections_next_request_is_stamped_when_its_bytes_came(
        factory: Factory) -> None:
    with _serve(factory) as server, \
            socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(_request("/one"))
        _answer(sock)
        with held(server.loop) as release:
            sent = time.monotonic()
            sock.sendall(_request("/two"))
            wait_in_the_kernel(sock, HELD_MS)
            released = release()
        _answer(sock)
        _assert_stamped_by_the_kernel(server.stamp("/two"), sent, released)


def _chunked(path: str, chunks: list[bytes]) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % path.encode()
            + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n")


def _content_length_split(path: str) -> tuple[bytes, bytes]:
    """A request cut 10 bytes into its body, as the reviewer's slow client sent it."""
    request = _request(path)
    cut = request.index(b"\r\n\r\n") + 4 + 10
    return request[:cut], request[cut:]


def _chunked_split(path: str) -> tuple[bytes, bytes]:
    """A chunked request cut after its first chunk: the rest, and its last chunk, later."""
    request = _chunked(path, [b'{"prompt": ', b'"hi"}'])
    cut = request.index(b"\r\n\r\n") + 4 + len(b"b\r\n{\"prompt\": \r\n")
    return request[:cut], request[cut:]


def _pipelined_split(path: str) -> tuple[bytes, bytes]:
    """``/first``, whole, with ``path``'s head and part of its body behind it."""
    head, rest = _content_length_split(path)
    return _request("/first") + head, rest


SPLITS = [pytest.param(_content_length_split, id="content-length"),
          pytest.param(_chunked_split, id="chunked"),
          pytest.param(_pipelined_split, id="pipelined")]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_request_whose_body_trickles_in_is_stamped_by_its_last_byte(
        factory: Factory, split: Callable[[str], tuple[bytes, bytes]]) -> None:
    """The head and a part of the body, then (HELD_MS later by the kernel's clock) the
    rest, which waits HELD_MS more in the kernel while the loop is held: the stamp is
    when the rest came, still backdated by the loop's hold."""
    first, rest = split("/one")
    with _serve(factory) as server, \
            socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(first)
        wait_in_the_kernel(sock, HELD_MS)  # the client's upload, paused
        with held(server.loop) as release:
            sent = time.monotonic()
            sock.sendall(rest)
            wait_in_the_kernel(sock, HELD_MS)
            released = release()
        _answer(sock, 2 if split is _pipelined_split else 1)
        _assert_stamped_by_the_kernel(server.stamp("/one"), sent, released)


def test_only_a_tcp_socket_tells_when_its_bytes_came() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert since_last_data(right) is None
