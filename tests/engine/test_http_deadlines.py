"""What a client owes a connection, bounded in time, in both HTTP protocols the servers
run (h11: ``slopilot serve``; httptools, under the head-size bound: the meter).

Without these deadlines a client that sent nothing, half a head, or a body shorter than
its Content-Length held its connection (and a file descriptor) for ever: uvicorn's
keep-alive timer starts only once a response is written. And one that never read its
answer held the connection, the answer's task and whatever it had not yet been sent: the
send deadline (asyncio pauses the protocol's writing; uvicorn's send then waits for it to
resume) lets it go.

The protocol is driven as asyncio drives it, read by read, and its deadlines on timers
the test fires (``ManualTimers``): nothing here waits on, or measures, wall-clock time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import termios
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from slopilot.engine.http_arrival import h11_protocol, httptools_protocol
from slopilot.engine.http_deadlines import (
    DISCONNECTED_KEY,
    DeadlineError,
    Deadlines,
    with_deadlines,
)
from slopilot.engine.http_head_limit import LINGER_S, bounded_head
from tests.support.manual_timers import ManualTimers
from tests.support.tcp_queues import unacked
from tests.support.waits import wait_for

HEAD_S, BODY_S, SEND_S = 10.0, 3.0, 60.0
# Keep-alive runs on the test's clock as well: longer than any idle in the scripts but
# its own test's, which give theirs.
DEADLINES = Deadlines(head_s=HEAD_S, body_idle_s=BODY_S, send_s=SEND_S,
                      keep_alive_s=1e6)
KEEP_S = 5.0


def _server(clock: Callable[[], float], call_later: Any, deadlines: Deadlines = DEADLINES,
            on_send_timeout: Callable[[], None] | None = None) -> type[asyncio.Protocol]:
    return with_deadlines(h11_protocol(clock), deadlines, call_later=call_later,
                          on_send_timeout=on_send_timeout)


def _meter(clock: Callable[[], float], call_later: Any, deadlines: Deadlines = DEADLINES,
           on_send_timeout: Callable[[], None] | None = None) -> type[asyncio.Protocol]:
    return with_deadlines(bounded_head(httptools_protocol(clock), max_head_bytes=1000),
                          deadlines, call_later=call_later, on_send_timeout=on_send_timeout)


PROTOCOLS = [pytest.param(_server, id="h11"), pytest.param(_meter, id="httptools")]
Factory = Callable[..., type[asyncio.Protocol]]


def _request(path: str, body: bytes = b"hello", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
            % (path.encode(), size) + body)


class _Transport(asyncio.Transport):
    """A socket's transport as far as the protocol can see it; closing it loses the
    connection on the next turn of the loop, as asyncio's own does."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = b""
        self.eof = False
        self.closing = False
        self.paused = False
        self.aborted = False
        self.buffered = 0
        """Bytes written that the client has not taken (``get_write_buffer_size``)."""
        self.socket: socket.socket | None = None
        """The kernel's side, where a test gives one (``get_extra_info("socket")``)."""

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def abort(self) -> None:
        # Unlike close, it drops what the client has not taken, and the connection goes
        # at once: a close waits for the buffer to drain, which a stalled client never does.
        self.aborted = True
        self.close()

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000),
                "socket": self.socket}.get(name, default)


class _App:
    """Records what each request's ``receive`` gave; reads each body only once told to
    (``read``), and answers it once told to (``answer``)."""

    def __init__(self) -> None:
        self.received: dict[str, list[MutableMapping[str, Any]]] = {}
        self.read: dict[str, asyncio.Event] = {}
        self.answer: dict[str, asyncio.Event] = {}
        self.finished: set[str] = set()
        """The paths whose answer's last send returned."""
        self.scopes: dict[str, MutableMapping[str, Any]] = {}
        self.eager = True
        """Whether each body is read as soon as the app is called."""

    def gate(self, gates: dict[str, asyncio.Event], path: str) -> asyncio.Event:
        return gates.setdefault(path, asyncio.Event())

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.scopes[path] = scope
        got = self.received.setdefault(path, [])
        if not self.eager:
            await self.gate(self.read, path).wait()
        while True:
            message = await receive()
            got.append(message)
            if message["type"] == "http.disconnect":
                return  # the client left: nothing to answer
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await self.gate(self.answer, path).wait()
        await send({"type": "http.response.body", "body": b"ok"})
        self.finished.add(path)

    def body(self, path: str) -> bytes:
        return b"".join(m.get("body", b"") for m in self.received.get(path, []))


class _Connection:
    def __init__(self, factory: Factory, deadlines: Deadlines = DEADLINES,
                 sock: socket.socket | None = None) -> None:
        self.timers = ManualTimers()
        self.app = _App()
        self.send_timeouts = 0
        config = uvicorn.Config(self.app, lifespan="off", log_config=None,
                                proxy_headers=False)
        config.load()
        cls: Any = factory(lambda: self.timers.now, self.timers.call_later, deadlines,
                           self._count_send_timeout)
        self.protocol = cls(config, ServerState(), {}, _loop=asyncio.get_running_loop())
        self.transport = _Transport(self.protocol)
        self.transport.socket = sock
        self.protocol.connection_made(self.transport)

    async def read(self, at: float, data: bytes) -> None:
        """The socket read ``data`` at ``at`` (the timers due before fire first)."""
        await self.at(at)
        self.protocol.data_received(data)
        await _turns()

    async def at(self, t: float) -> None:
        self.timers.advance(t)
        await _turns()

    async def answer(self, path: str) -> None:
        self.app.gate(self.app.answer, path).set()
        await _turns()

    async def stall(self, at: float, buffered: int = 70_000) -> None:
        """At ``at`` the client stops reading: the transport holds ``buffered`` bytes, past
        its high-water mark, and pauses the protocol's writing (as asyncio's does)."""
        await self.at(at)
        self.transport.buffered = buffered
        self.protocol.pause_writing()
        await _turns()

    async def take(self, at: float, size: int) -> None:
        """At ``at`` the client takes ``size`` bytes, not enough to resume writing."""
        await self.at(at)
        self.transport.buffered -= size

    async def resume(self, at: float) -> None:
        """At ``at`` the client has taken enough: the transport resumes writing."""
        await self.at(at)
        self.transport.buffered = 0
        self.protocol.resume_writing()
        await _turns()

    def _count_send_timeout(self) -> None:
        self.send_timeouts += 1

    @property
    def closed(self) -> bool:
        return self.transport.closing


async def _turns() -> None:
    """Enough turns of the loop for the app's task, and a lost connection, to run."""
    for _ in range(20):
        await asyncio.sleep(0)


def _run(factory: Factory, script: Callable[[_Connection], Any],
         deadlines: Deadlines = DEADLINES) -> None:
    async def main() -> None:
        conn = _Connection(factory, deadlines)
        try:
            await script(conn)
        finally:
            conn.transport.close()
            await _turns()

    asyncio.run(main())


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.at(HEAD_S - 0.1)
        assert not conn.closed
        await conn.at(HEAD_S)
        # No request to answer: a 408 here could be read as the answer to a request the
        # client was sending just then.
        assert conn.closed and conn.transport.written == b""

    _run(factory, script)


def _error(written: bytes) -> dict[str, Any]:
    """The error a refused head was answered with, in the shape of every other (it wrote
    no ``param``)."""
    head, _, body = written.partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(body) in head.lower(), written
    err: dict[str, Any] = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] is None
    assert err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_half_a_head_is_answered_408_and_the_connection_ends(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        await conn.at(HEAD_S - 0.1)  # from the connection's start, not the first byte
        assert conn.transport.written == b""
        await conn.at(HEAD_S)
        assert conn.transport.written.startswith(b"HTTP/1.1 408 "), conn.transport.written
        assert b"connection: close" in conn.transport.written.lower()
        assert _error(conn.transport.written)["code"] == "request_timeout"
        # The write side ends; what the client still sends is dropped unparsed, and the
        # connection closes after the lingering time (so the client reads the 408).
        assert conn.transport.eof and not conn.closed
        await conn.read(HEAD_S + 1, b"content-length: 5\r\n\r\nhello")
        assert conn.app.received == {}
        assert conn.transport.written.count(b"HTTP/1.1") == 1
        await conn.at(HEAD_S + LINGER_S)
        assert conn.closed

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_half_a_head_on_a_kept_alive_connection_has_the_deadline_from_its_first_byte(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.answer("/one")
        assert conn.app.body("/one") == b"hello"
        # Uvicorn's keep-alive bounds the idle time from here to the next byte; once the
        # next head has begun, only the head deadline bounds it.
        await conn.read(20.0, b"POST /two HTTP/1.1\r\n")
        await conn.at(20.0 + HEAD_S - 0.1)
        assert not conn.closed and conn.transport.written.count(b"HTTP/1.1 408") == 0
        await conn.at(20.0 + HEAD_S)
        assert conn.transport.written.count(b"HTTP/1.1 408 ") == 1

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_an_idle_connection_is_closed_at_its_keep_alive(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.answer("/one")
        await conn.at(1.0 + KEEP_S - 0.1)
        assert not conn.closed
        await conn.at(1.0 + KEEP_S)
        assert conn.closed and conn.transport.written.count(b"HTTP/1.1 ") == 1

    _run(factory, script, dataclasses.replace(DEADLINES, keep_alive_s=KEEP_S))


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_head_begun_within_the_keep_alive_is_given_the_head_deadline(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.answer("/one")
        await conn.read(1.0 + KEEP_S - 0.1, b"POST /two HTTP/1.1\r\n")
        await conn.at(1.0 + KEEP_S - 0.1 + HEAD_S - 0.1)
        assert not conn.closed
        await conn.at(1.0 + KEEP_S - 0.1 + HEAD_S)
        assert conn.transport.written.count(b"HTTP/1.1 408 ") == 1

    _run(factory, script, dataclasses.replace(DEADLINES, keep_alive_s=KEEP_S))


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_pipelined_head_waits_from_the_end_of_the_answer_before_it(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        # /one's answer takes long (a long generation): the head behind it, half sent,
        # is not the client's to finish before the connection is ready for it.
        await conn.read(1.0, _request("/one") + b"POST /two HTTP/1.1\r\n")
        await conn.at(50.0)
        assert not conn.closed
        await conn.answer("/one")
        await conn.at(50.0 + HEAD_S - 0.1)
        assert conn.transport.written.count(b"HTTP/1.1 408") == 0
        await conn.at(50.0 + HEAD_S)
        assert conn.transport.written.count(b"HTTP/1.1 408 ") == 1

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_body_that_stops_short_ends_the_request_as_a_client_that_left(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one", b"hel", length=10))
        await conn.at(1.0 + BODY_S - 0.1)
        assert not conn.closed
        await conn.at(1.0 + BODY_S)
        assert conn.closed
        # The app hears what it hears of any client that left: a disconnect.
        assert [m["type"] for m in conn.app.received["/one"]][-1] == "http.disconnect"
        assert conn.transport.written == b""

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_slow_but_progressing_body_is_served(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(0.0, _request("/one", b"", length=12))
        for i, byte in enumerate(b"hello, world"):  # a byte a second, 12 s: past both
            await conn.read(1.0 + i, bytes([byte]))
        await conn.answer("/one")
        assert conn.app.body("/one") == b"hello, world"
        assert conn.transport.written.startswith(b"HTTP/1.1 200 ")
        assert conn.transport.written.endswith(b"ok") and not conn.closed

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_no_deadline_while_the_answer_streams(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.at(1000.0)  # the body is whole; the answer takes its time
        assert not conn.closed
        await conn.answer("/one")
        assert conn.transport.written.endswith(b"ok")

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_no_body_deadline_while_the_app_is_not_reading(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        conn.app.eager = False
        # Over uvicorn's high-water mark: it pauses reading until the app reads.
        body = b"x" * 70_000
        await conn.read(1.0, _request("/one", body, length=len(body) + 5))
        assert conn.transport.paused
        await conn.at(1000.0)
        assert not conn.closed
        conn.app.gate(conn.app.read, "/one").set()
        await _turns()
        assert conn.app.body("/one") == body
        # Now it waits for the rest: from here the idle deadline runs.
        await conn.at(1000.0 + BODY_S - 0.1)
        assert not conn.closed
        await conn.at(1000.0 + BODY_S)
        assert conn.closed

    _run(factory, script)


def test_a_head_refused_for_its_size_is_not_answered_again_at_its_deadline() -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, b"GET / HTTP/1.1\r\nx-big: " + b"a" * 2000)
        assert conn.transport.written.startswith(b"HTTP/1.1 431 ")
        assert _error(conn.transport.written)["code"] == "request_header_too_large"
        await conn.at(HEAD_S)
        assert conn.transport.written.count(b"HTTP/1.1") == 1

    _run(_meter, script)


@pytest.mark.parametrize("bad", [dict(head_s=0.0), dict(body_idle_s=-1.0),
                                 dict(head_s=float("inf")), dict(body_idle_s=float("nan")),
                                 dict(send_s=-1.0), dict(send_s=float("inf")),
                                 dict(send_s=float("nan"))])
def test_a_deadline_must_be_a_positive_number_of_seconds(bad: dict[str, float]) -> None:
    ((name, value),) = bad.items()
    with pytest.raises(DeadlineError, match="seconds") as caught:
        Deadlines(**bad)
    # The field, the value and the fix, and what a caller maps to its own flag.
    assert str(caught.value).startswith(f"{name}={value}: ")
    assert "e.g." in str(caught.value)
    assert (caught.value.field, str(caught.value.value)) == (name, str(value))


def test_a_send_deadline_of_0_is_none() -> None:
    assert Deadlines(send_s=0.0).send_s == 0.0


# The send deadline.


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_uvicorn_holds_an_answer_while_the_transport_pauses_writing(factory: Factory) -> None:
    """What the send deadline leans on, in the uvicorn pinned: the transport's
    ``pause_writing`` stops the answer's next send until ``resume_writing``. A uvicorn that
    no longer waits there (or waits elsewhere) fails here first."""
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.stall(2.0)
        assert conn.protocol.flow.write_paused  # type: ignore[attr-defined]
        await conn.answer("/one")
        assert not conn.transport.written.endswith(b"ok")  # held in the send
        await conn.resume(3.0)
        assert conn.transport.written.endswith(b"ok")

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_an_answer_the_client_takes_nothing_of_is_cut_at_the_send_deadline(
        factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.stall(2.0)
        await conn.answer("/one")  # its send waits for the client
        await conn.at(2.0 + SEND_S - 0.1)
        assert not conn.closed and conn.send_timeouts == 0
        disconnected = conn.app.scopes["/one"][DISCONNECTED_KEY]
        assert not disconnected()
        await conn.at(2.0 + SEND_S)
        # Aborted, not closed: a close waits for the client to take what is buffered.
        assert conn.transport.aborted and conn.send_timeouts == 1
        assert not conn.transport.written.endswith(b"ok")
        # The app's send returns, as for any client that left: its task ends, and its
        # scope says the send went to no one (uvicorn's send does not).
        assert "/one" in conn.app.finished and disconnected()
        await conn.at(10_000.0)
        assert conn.send_timeouts == 1

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_slow_reader_is_cut_only_a_whole_period_after_it_last_took_a_byte(
        factory: Factory) -> None:
    """As nginx's ``send_timeout``: the deadline bounds the time between two bytes the
    client takes, not the whole answer; a client that keeps taking is served."""
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.stall(2.0)
        await conn.answer("/one")
        await conn.take(2.0 + SEND_S - 1, 1)  # a byte within the period
        await conn.at(2.0 + SEND_S)
        assert not conn.closed
        await conn.take(2.0 + 2 * SEND_S - 1, 1)
        await conn.at(2.0 + 2 * SEND_S)
        assert not conn.closed
        # Then nothing: the period after the last check that saw progress.
        await conn.at(2.0 + 3 * SEND_S)
        assert conn.transport.aborted and conn.send_timeouts == 1

    _run(factory, script)


def _read_all(sock: socket.socket) -> None:
    """The client's application reads whatever its kernel holds."""
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        pass


@pytest.mark.skipif(not hasattr(termios, "TIOCOUTQ"), reason="Linux's ioctl")
@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_reader_the_kernel_sees_take_bytes_is_not_cut(factory: Factory) -> None:
    """The transport's buffer drains only once the kernel's unsent bytes fall to half the
    send-ahead bound: a client reading a little at a time takes bytes from the kernel for
    many periods before it does. What the client's kernel acknowledged is progress too."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()

    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        # The kernel takes what fits (bounded by send_ahead) before the transport holds any.
        server.setblocking(False)
        try:
            while True:
                server.send(b"x" * 4096)
        except BlockingIOError:
            pass
        assert unacked(server.fileno()) > 0
        await conn.stall(2.0)
        await conn.answer("/one")
        client.setblocking(False)
        # The client reads: its kernel acknowledges what the server's held, none of which
        # leaves the transport's buffer (the test's transport never flushes).
        wait_for(lambda: _read_all(client) or unacked(server.fileno()) == 0,
                 what="the client's kernel to acknowledge all the server's held")
        await conn.at(2.0 + SEND_S)
        assert not conn.closed and conn.send_timeouts == 0
        # Then it reads no more: cut a period after the check that saw it take bytes.
        await conn.at(2.0 + 2 * SEND_S - 0.1)
        assert not conn.closed
        await conn.at(2.0 + 2 * SEND_S)
        assert conn.transport.aborted and conn.send_timeouts == 1

    async def main() -> None:
        conn = _Connection(factory, sock=server)
        try:
            await script(conn)
        finally:
            conn.transport.close()
            await _turns()

    try:
        asyncio.run(main())
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_writing_resumed_before_the_send_deadline_disarms_it(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.stall(2.0)
        await conn.answer("/one")
        await conn.resume(2.0 + SEND_S - 1)
        assert conn.transport.written.endswith(b"ok")
        await conn.at(10_000.0)
        assert not conn.closed and conn.send_timeouts == 0
        # A later stall has a period of its own.
        await conn.read(10_001.0, _request("/two"))
        await conn.stall(10_002.0)
        await conn.answer("/two")
        await conn.at(10_002.0 + SEND_S - 0.1)
        assert not conn.closed
        await conn.at(10_002.0 + SEND_S)
        assert conn.transport.aborted and conn.send_timeouts == 1

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_an_answer_written_whole_but_never_taken_is_cut_too(factory: Factory) -> None:
    """The answer's task is done; the connection still holds what the client has not
    taken, and uvicorn's keep-alive close would wait for it to drain for ever."""
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.answer("/one")
        assert conn.transport.written.endswith(b"ok")
        await conn.stall(2.0)
        await conn.at(2.0 + SEND_S)
        assert conn.transport.aborted and conn.send_timeouts == 1

    _run(factory, script)


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_send_deadline_of_0_lets_a_client_stall_for_ever(factory: Factory) -> None:
    async def script(conn: _Connection) -> None:
        await conn.read(1.0, _request("/one"))
        await conn.stall(2.0)
        await conn.answer("/one")
        await conn.at(1e9)
        assert not conn.closed and conn.send_timeouts == 0
        # Nothing was armed: a stall costs no timer.
        assert [t for t in conn.timers.pending if not t.cancelled] == []

    _run(factory, script, Deadlines(head_s=HEAD_S, body_idle_s=BODY_S, send_s=0.0))
