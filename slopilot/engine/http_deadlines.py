"""Deadlines on what a client owes a connection: its request's head, and the next bytes
of a body the app waits for. For uvicorn's h11 protocol (``slopilot serve``) and its
httptools one (the meter), under the arrival stamp and the head-size bound.

uvicorn bounds only the wait between requests (``timeout_keep_alive``, armed when a
response ends, disarmed by the next byte). A client that sent nothing, half a head, or a
body shorter than its Content-Length held its connection, and a file descriptor, for
ever: 300 of them under ``ulimit -n 128`` and no new request got an answer.

- The head: ``head_s`` from the connection's start for its first request, else from the
  first byte of the head (keep-alive bounds the silence before it); a head pipelined
  behind a request still being answered waits from that answer's end, since the client
  is not the one keeping it waiting. Past it: a 408 and a lingering close, or a bare
  close when the client sent nothing (no request to answer; a 408 there could be taken
  for the answer to a request the client was sending just then).
- The body: ``body_idle_s`` without a byte while the app waits in ``receive`` for more
  of it. Past it the connection closes, and the app hears a disconnect, as of any client
  that left. It never runs while the app is not asking for the body (uvicorn pauses
  reading past 64 KiB unread: the wait is the server's) nor once the body is whole.

Either deadline firing while uvicorn has paused reading is put off by another period:
the client cannot send what the server does not read.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slopilot.engine.http_head_limit import refuse_and_linger

HEAD_TIMEOUT_S = 30.0
"""The most a request's head may take: nginx's ``client_header_timeout`` is 60 s, but an
OpenAI client's head is a few hundred bytes, sent in one write."""

BODY_IDLE_TIMEOUT_S = 30.0
"""The longest silence inside a request's body: a 16 MiB body on a slow link still sends
a packet every few milliseconds (nginx's ``client_body_timeout`` is 60 s)."""

log = logging.getLogger(__name__)


class Timer(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Timer]
"""``loop.call_later``'s shape: how the deadlines are timed (a test drives its own)."""

P = TypeVar("P", H11Protocol, HttpToolsProtocol)


@dataclass(frozen=True)
class Deadlines:
    """How long a client may keep a connection waiting, in seconds (finite, above 0)."""

    head_s: float = HEAD_TIMEOUT_S
    """How long a request's head may take (the module's rule)."""
    body_idle_s: float = BODY_IDLE_TIMEOUT_S
    """How long the app may wait for a body's next byte."""

    def __post_init__(self) -> None:
        for name in ("head_s", "body_idle_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}: expected a positive number of seconds, "
                                 f"e.g. {getattr(Deadlines, name)}")


DEFAULT_DEADLINES = Deadlines()


def with_deadlines(base: type[P], deadlines: Deadlines = DEFAULT_DEADLINES,
                   call_later: CallLater | None = None) -> type[P]:
    """``base`` with ``deadlines`` (the module's rule), timed on ``call_later`` (the event
    loop's unless given)."""
    mixin: type = _H11Deadlines if issubclass(base, H11Protocol) else _HttpToolsDeadlines

    class WithDeadlines(mixin, base):  # type: ignore[misc, valid-type]
        pass

    WithDeadlines.deadlines = deadlines
    WithDeadlines.call_later = staticmethod(call_later) if call_later is not None else None
    return WithDeadlines


class _Deadlines:
    """What both protocols share; the subclasses say when a head begins and ends."""

    deadlines: Deadlines
    call_later: CallLater | None
    refused = False
    """Whether a refusal was answered and the connection lingers until it closes (the
    head-size bound's 431 sets it too): nothing more is parsed or answered."""
    _head_timer: Timer | None = None
    _body_timer: Timer | None = None
    _head_begun = False
    """Whether a byte of the head the connection waits for has come."""

    # The protocol's own, for mypy (uvicorn's classes give them).
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: Any
    _unset_keepalive_if_required: Callable[[], None]

    def _later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return (self.call_later or self.loop.call_later)(delay, callback)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head()  # a connection that sends nothing: from its start

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # the lingering close: dropped, unparsed
        if self._body_timer is not None:
            self._arm_body()  # a byte: the silence starts over
        super().data_received(data)  # type: ignore[misc]

    # The head.

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self._later(self.deadlines.head_s, self._head_expired)

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.refused:
            return
        if self.flow.read_paused:
            self._arm_head()  # the server's wait, not the client's
            return
        if not self._head_begun:
            self.transport.close()
            return
        log.info("a request head not whole within %g s: refused (408)", self.deadlines.head_s)
        self.refused = True
        refuse_and_linger(self.transport, self._later, b"408 Request Timeout",
                          b"request head not received within %g s" % self.deadlines.head_s,
                          b"request_timeout")

    # The body.

    def _watch_body(self, cycle: Any) -> None:
        """Time the waits of ``cycle``'s app for its body's next bytes."""
        receive = cycle.receive

        async def watched() -> Any:
            if cycle.more_body and not cycle.body and not cycle.disconnected \
                    and not cycle.response_complete:
                self._arm_body()
            try:
                return await receive()
            finally:
                self._cancel_body()

        # Read by the cycle's task, which is created with the cycle but starts later.
        cycle.receive = watched

    def _arm_body(self) -> None:
        self._cancel_body()
        self._body_timer = self._later(self.deadlines.body_idle_s, self._body_expired)

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_expired(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            self._arm_body()
            return
        log.info("no byte of a request body for %g s: closed as a client that left",
                 self.deadlines.body_idle_s)
        # The app's receive then answers http.disconnect (connection_lost).
        self.transport.close()


class _H11Deadlines(_Deadlines):
    """h11 parses a head only once whole: a head has begun when the connection awaits
    one (``their_state`` IDLE) and h11 holds bytes not yet parsed."""

    conn: h11.Connection
    cycle: Any

    def handle_events(self) -> None:
        # Called from a read and, for a pipelined request, at the answer's end.
        before = self.cycle
        super().handle_events()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is not before and self.cycle is not None:
            self._watch_body(self.cycle)
        if self.conn.their_state is not h11.IDLE:
            self._head_begun = False  # a request in progress, or h11 waiting on ours
            self._cancel_head()
        elif self.conn.trailing_data[0]:
            self._head_begun = True
            self._unset_keepalive_if_required()  # the head's deadline now, not keep-alive's
            self._arm_head()


class _HttpToolsDeadlines(_Deadlines):
    """llhttp parses as bytes come: ``on_message_begin`` is a head's first byte."""

    cycle: Any

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._head_begun = True
        if self.cycle is None or self.cycle.response_complete:
            self._arm_head()
        # Else pipelined behind an answer still being written: from that answer's end.

    def on_headers_complete(self) -> None:
        self._head_begun = False
        self._cancel_head()
        before = self.cycle
        super().on_headers_complete()  # type: ignore[misc]
        if self.cycle is not before:
            self._watch_body(self.cycle)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._head_begun and not self.transport.is_closing():
            self._unset_keepalive_if_required()  # the head's deadline now, not keep-alive's
            self._arm_head()
