"""Each HTTP request stamped, in its ASGI scope (``SCOPE_KEY``), with the moment its last
byte (the end of its head and whole body) reached the kernel: the moment the server could
start on it. uvicorn's h11 protocol for ``slopilot serve`` (``h11_protocol``) and its
httptools one for the meter (``httptools_protocol``).

Why the last byte, not the first: a client's upload is its own link's time. One that
sends its head and a little of its body, then the rest seconds later (the body's idle
timeout allows a byte every 30 s), would count seconds of TTFT no replica could shorten,
and push the TTFT P99 past the SLO, its alert firing and the operator scaling to the
maximum for nothing (vLLM, too, stamps a request once it is whole). A client timing TTFT
from the start of its send reads higher by its upload.

The app's task starts later than that last byte's arrival: milliseconds under load (the
event loop busy writing other streams), and a whole response later for a pipelined
request (HTTP/1.1 answers a connection's requests in order, so uvicorn calls the app for
the second only once the first is answered). Both are waits on the server's side, which
its client pays, and TTFT counts them.

The rule: a request's arrival is the time of the ``data_received`` call that delivered
its last byte, taken back (``backdate``) by how long ago the kernel got the newest of
that read's bytes (``tcp_received``: the wait in the socket, or in the accept queue, of a
loop busy elsewhere or a process stopped, which its client paid too). It is exact to what
the server can see (a byte's time is that of the read that brought it; several requests'
bytes held in the kernel while uvicorn paused reading, and read at once, take the newest's
time), whichever read the request completes in and whenever its app is called::

    reads:     t=1               t=2                       t=3     (answer to /one at t=5)
    bytes:     [/one's head, bo][dy | /two's head and bo][dy]
    stamps:                     /one = 2                   /two = 3 (its app called at 5)

The stamp is the head's last byte's once the head is parsed (the app is called then),
and moves to the body's last byte once that is parsed: an app reads it once it has read
the body whole, as the server's routes (FastAPI parses the body first) and the meter
(which forwards the body only whole) do.

- httptools (llhttp) keeps no bytes back: it calls ``on_headers_complete`` and
  ``on_message_complete`` inside the feed of the read that delivered the head's, and the
  body's, last byte, and uvicorn builds the request's scope there (queueing a pipelined
  one in ``pipeline`` until its turn). The scope takes the time of the read being fed.
- h11 buffers: a head is parsed only once whole, and a pipelined request's bytes wait
  in h11's buffer until the request before is answered (uvicorn parses them then, from
  its response-complete callback, not from a read). So the connection remembers, for
  each read whose bytes are not all parsed yet, the offset past its last byte and its
  time; the last byte h11 has parsed when it yields a request's head, or its
  ``EndOfMessage``, is that head's, or that request's, last byte, and the read holding
  it gives the stamp.
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
"""The scope key of a request's arrival, on the clock the protocol was given: final once
the app has read the body whole."""

Clock = Callable[[], float]


class _TimedConnection(h11.Connection):
    """h11's server side, knowing when the read that brought each request's last byte
    was (its head's, until its body's end is parsed)."""

    def __init__(self, clock: Clock, max_incomplete_event_size: int | None) -> None:
        if max_incomplete_event_size is None:
            super().__init__(h11.SERVER)
        else:
            super().__init__(h11.SERVER, max_incomplete_event_size)
        self._clock = clock
        self._received = 0
        # (offset past its last byte, time) of each read not yet wholly parsed, in order,
        # and of the one holding the last byte parsed (the end of a body whose
        # EndOfMessage h11 gives after the Data that took its bytes).
        self._reads: deque[tuple[int, float]] = deque()
        self.request_arrival = 0.0
        """The stamp of the last request parsed: the read of its head's last byte, then,
        once its EndOfMessage is parsed, that of its body's last byte."""
        self.ends = 0
        """Requests whose EndOfMessage was parsed, so far."""

    def receive_data(self, data: bytes) -> None:
        if data:  # b"" is h11's end of input, which brings no byte
            self._received += len(data)
            self._reads.append((self._received, self._clock()))
        super().receive_data(data)

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        # Where the next event begins: h11 takes a head (or a body's piece) out of its
        # buffer only whole, so what it has not given as events is all still there.
        # The buffer is h11's private one, the only record of what it has parsed
        # (tests/engine/test_http_arrival.py pins the behaviour).
        start = self._parsed()
        while self._reads and self._reads[0][0] < start:
            self._reads.popleft()
        event = super().next_event()
        if isinstance(event, h11.Request):
            if _framed_twice(event.headers):
                # h11 reads such a body by its encoding and keeps the connection, so what
                # a proxy reading the length took for the body's tail is served as a
                # request of its own (smuggling). uvicorn answers this error 400 and closes.
                raise h11.RemoteProtocolError(
                    "both Content-Length and Transfer-Encoding (RFC 9112 6.1)")
            self.request_arrival = self._time_of(self._parsed() - 1)
        elif isinstance(event, h11.EndOfMessage):
            self.request_arrival = self._time_of(self._parsed() - 1)
            self.ends += 1
        return event

    def _parsed(self) -> int:
        """The offset past the last byte h11 has given as events."""
        return self._received - len(self._receive_buffer)

    def _time_of(self, offset: int) -> float:
        """The time of the read that brought the byte at ``offset``."""
        for end, at in self._reads:
            if end > offset:
                return at
        raise AssertionError(f"no read holds byte {offset} (received {self._received})")


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
    ``clock`` (the module's rule): when its last byte reached the kernel where ``backdate``
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
            # created but not yet run, and its body's end handed over in here too, before
            # the task can run to read it, so the app finds the stamp once the body is
            # read. Events of two requests in one call only where the first was answered
            # before its body ended: the stamp then is the second's, whose cycle it is.
            before, ends = self.cycle, self.timed.ends
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and (cycle is not before or self.timed.ends != ends):
                scope = cast(dict[str, object], cycle.scope)
                scope[SCOPE_KEY] = self.timed.request_arrival

    return StampingH11Protocol


def httptools_protocol(clock: Clock, backdate: bool = False) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, each request's scope stamped with its arrival on
    ``clock`` (the module's rule): when its last byte reached the kernel where ``backdate``
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

        def on_headers_complete(self) -> None:
            # The head's last byte: the stamp until the body's end (a request that has
            # no body ends here). Set before uvicorn makes the cycle and its task.
            scope = cast(dict[str, object], self.scope)
            scope[SCOPE_KEY] = self.received_at
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            # Called inside the feed of the read that brought the body's last byte,
            # before the app's task can read the body's end.
            scope = cast(dict[str, object], self.scope)
            scope[SCOPE_KEY] = self.received_at
            super().on_message_complete()

    return StampingHttpToolsProtocol
