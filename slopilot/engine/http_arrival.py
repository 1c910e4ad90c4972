"""Each HTTP request stamped, in its ASGI scope (``SCOPE_KEY``), with the moment its first
bytes reached the kernel: uvicorn's h11 protocol for ``slopilot serve``
(``h11_protocol``) and its httptools one for the meter (``httptools_protocol``).

The app's task starts later than that: milliseconds under load (the event loop busy
writing other streams), and a whole response later for a pipelined request (HTTP/1.1
answers a connection's requests in order, so uvicorn calls the app for the second only
once the first is answered). Both waits are the client's, and TTFT counts them.

The rule: a request's arrival is the time of the ``data_received`` call that delivered
its first byte, taken back (``backdate``) by how long ago the kernel got the newest of
that read's bytes (``tcp_received``: the wait in the socket, or in the accept queue, of a
loop busy elsewhere or a process stopped, which its client paid too). It is exact to what
the server can see (a byte's time is that of the read that brought it; several requests'
bytes held in the kernel while uvicorn paused reading, and read at once, take the newest's
time), whichever read the request's head completes in and whenever its app is called::

    reads:     t=1               t=2                       (answer to /one at t=5)
    bytes:     [/one's head, bo][dy | /two's head and body]
    stamps:    /one = 1                /two = 2            (its app called at 5)

- httptools (llhttp) keeps no bytes back: it calls ``on_message_begin`` on a request's
  first byte, inside the feed of the read that delivered it, and uvicorn builds the
  request's scope there, queueing a pipelined one in ``pipeline`` until its turn. The
  scope takes the time of the read being fed.
- h11 buffers: a head is parsed only once whole, and a pipelined request's bytes wait
  in h11's buffer until the request before is answered (uvicorn parses them then, from
  its response-complete callback, not from a read). So the connection remembers, for
  each read whose bytes are not all parsed yet, the offset past its last byte and its
  time; the first byte h11 has not parsed when it yields a request's head is that
  request's first byte, and the read holding it gives the stamp.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from slopilot.engine.tcp_received import Lag, connection_lag

SCOPE_KEY = "slopilot.arrival"
"""The scope key of a request's arrival, on the clock the protocol was given."""

Clock = Callable[[], float]


class _TimedConnection(h11.Connection):
    """h11's server side, knowing when the read that brought each request's head was."""

    def __init__(self, clock: Clock, max_incomplete_event_size: int | None) -> None:
        if max_incomplete_event_size is None:
            super().__init__(h11.SERVER)
        else:
            super().__init__(h11.SERVER, max_incomplete_event_size)
        self._clock = clock
        self._received = 0
        # (offset past its last byte, time) of each read not yet wholly parsed, in order.
        self._reads: deque[tuple[int, float]] = deque()
        self.request_arrival = 0.0
        """The stamp of the last request whose head was parsed."""

    def receive_data(self, data: bytes) -> None:
        if data:  # b"" is h11's end of input, which brings no byte
            self._received += len(data)
            self._reads.append((self._received, self._clock()))
        super().receive_data(data)

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        # Where the next event begins: h11 takes a head (or a body's piece) out of its
        # buffer only whole, so a head still incomplete waits there from its first byte.
        # The buffer is h11's private one, the only record of what it has parsed
        # (tests/engine/test_http_arrival.py pins the behaviour).
        start = self._received - len(self._receive_buffer)
        while self._reads and self._reads[0][0] <= start:
            self._reads.popleft()
        event = super().next_event()
        if isinstance(event, h11.Request):
            if _framed_twice(event.headers):
                # h11 reads such a body by its encoding and keeps the connection, so what
                # a proxy reading the length took for the body's tail is served as a
                # request of its own (smuggling). uvicorn answers this error 400 and closes.
                raise h11.RemoteProtocolError(
                    "both Content-Length and Transfer-Encoding (RFC 9112 6.1)")
            self.request_arrival = self._reads[0][1]
        return event


def _framed_twice(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's head gives both a length and a transfer coding."""
    names = {name for name, _ in headers}  # h11 lower-cases them
    return b"content-length" in names and b"transfer-encoding" in names


class _ReadTime:
    """A connection's read times: ``clock``'s now, less how long ago the kernel got the
    newest bytes read when ``backdate`` (``tcp_received``; ``clock`` must then count
    real seconds) and the connection's socket tells."""

    def __init__(self, clock: Clock, backdate: bool) -> None:
        self.clock, self.backdate = clock, backdate
        self.lag: Lag | None = None

    def connected(self, transport: asyncio.BaseTransport) -> None:
        if self.backdate:
            self.lag = connection_lag(transport)

    def __call__(self) -> float:
        if self.lag is None:
            return self.clock()
        # The lag first, then the clock: a delay between the two (a preemption, a slow
        # getsockopt) makes the stamp later, a TTFT too low, never one too high.
        lag = self.lag()
        return self.clock() - lag


def h11_protocol(clock: Clock, backdate: bool = False) -> type[H11Protocol]:
    """uvicorn's h11 protocol, each request's scope stamped with its arrival on
    ``clock`` (the module's rule): when its bytes reached the kernel where ``backdate``
    (``clock`` counting real seconds) and the kernel tells, else when they were read."""

    class StampingH11Protocol(H11Protocol):
        def __init__(self, config: Config, server_state: ServerState,
                     app_state: dict[str, Any], _loop: Any = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self.read_time = _ReadTime(clock, backdate)
            self.timed = _TimedConnection(self.read_time, config.h11_max_incomplete_event_size)
            self.conn = self.timed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.read_time.connected(transport)
            super().connection_made(transport)

        def handle_events(self) -> None:
            # Called from a read and, for a request pipelined behind another, from the
            # response-complete callback; a request's cycle is made in here, its task
            # created but not yet run, so the app finds the stamp.
            before = self.cycle
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and cycle is not before:
                scope = cast(dict[str, object], cycle.scope)
                scope[SCOPE_KEY] = self.timed.request_arrival

    return StampingH11Protocol


def httptools_protocol(clock: Clock, backdate: bool = False) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, each request's scope stamped with its arrival on
    ``clock`` (the module's rule): when its bytes reached the kernel where ``backdate``
    (``clock`` counting real seconds) and the kernel tells, else when they were read."""

    class StampingHttpToolsProtocol(HttpToolsProtocol):
        received_at = 0.0
        """The time of the read being parsed."""

        def __init__(self, config: Config, server_state: ServerState,
                     app_state: dict[str, Any], _loop: Any = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self.read_time = _ReadTime(clock, backdate)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.read_time.connected(transport)
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            self.received_at = self.read_time()
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            scope = cast(dict[str, object], self.scope)
            scope[SCOPE_KEY] = self.received_at

    return StampingHttpToolsProtocol
