"""Deadlines on what a client owes a connection: its request's head, the next bytes of a
body the app waits for, and taking the answer it asked for. For uvicorn's h11 protocol
(``slopilot serve``) and its httptools one (the meter), under the arrival stamp and the
head-size bound.

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

- The answer: ``send_s`` without the client taking a byte while the transport holds what
  the kernel refused (asyncio's ``pause_writing``: the kernel takes no more while
  ``SEND_AHEAD_BYTES`` wait unsent for the wire, and the transport keeps none before it
  pauses, ``send_ahead``; uvicorn's next send then waits for ``resume_writing``). Before
  that bound the kernel took megabytes (``tcp_wmem``) before the transport paused: a
  client that stopped reading never armed the deadline. Past it the
  connection is aborted, what it held unsent dropped (a close would wait for the client
  to take it), and the app hears a disconnect: the server aborts the request in the
  engine, as for any client that left. As nginx's ``send_timeout``, it bounds the time
  between two bytes the client takes, not the answer: the timer is armed only when
  writing pauses, and at its end looks whether the client's kernel acknowledged bytes
  since (the transport's buffer plus what the kernel holds unacknowledged, Linux's
  ``SIOCOUTQ``, fell: another period), so a client whose kernel keeps taking bytes,
  however slowly, is served, and a stream that never fills the buffers costs nothing.
  Where the kernel cannot say, only the transport's draining counts, which waits for
  half of ``SEND_AHEAD_BYTES`` to leave: a slow reader may be cut. The client's kernel
  takes bytes into its receive buffer, not its application's hands: a client that
  stopped reading is cut only once that buffer is full (``send_ahead``), and one whose
  reads do not open its TCP window (less than half its buffer, or a segment) within a
  period is cut though it reads. 0 turns it off. Before it, a client
  that never read its stream left the engine generating for nobody up to ``max_tokens``,
  and then the connection, the answer's task and every token not sent, for ever.

Each request's scope tells the app whether its connection is lost (``DISCONNECTED_KEY``):
uvicorn's send (ASGI 2.3) then drops what it is given without a word, and a stream
parked on a paused transport, woken by the loss, would count every token it still had as
sent before it heard of the disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slopilot.engine.http_head_limit import refuse_and_linger
from slopilot.engine.send_ahead import bound_send_ahead, unacked_bytes

HEAD_TIMEOUT_S = 30.0
"""The most a request's head may take: nginx's ``client_header_timeout`` is 60 s, but an
OpenAI client's head is a few hundred bytes, sent in one write."""

BODY_IDLE_TIMEOUT_S = 30.0
"""The longest silence inside a request's body: a 16 MiB body on a slow link still sends
a packet every few milliseconds (nginx's ``client_body_timeout`` is 60 s)."""

SEND_TIMEOUT_S = 60.0
"""The longest a client may take no byte of an answer the server holds for it: nginx's
``send_timeout``. A client pausing its stream (a debugger, a UI thread busy) is well
within it; one that stopped reading holds the answer's memory and task no longer."""

KEEP_ALIVE_S = 5.0
"""How long an idle connection is kept for its next request: uvicorn's and vLLM's
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) 5 s, which clients written for vLLM expect. Whoever
keeps idle connections to the server longer (a proxy, a mesh's sidecar, a client pool)
races its close: a request sent as the server closes is lost, so the server's must be
the longer, and this is where it is set."""

log = logging.getLogger(__name__)


class Timer(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Timer]
"""``loop.call_later``'s shape: how the deadlines are timed (a test drives its own)."""

DISCONNECTED_KEY = "slopilot.disconnected"
"""The scope key of a callable: whether the request's connection is lost (what uvicorn
sends from then on reaches no one)."""

OnSendTimeout = Callable[[], None]
"""Told of each connection the send deadline dropped (``slopilot serve`` counts them)."""

P = TypeVar("P", H11Protocol, HttpToolsProtocol)


class DeadlineError(ValueError):
    """A deadline out of its bounds: names the field and the value (a caller maps the
    field to its own flag), and what would do."""

    def __init__(self, field: str, value: float, expected: str) -> None:
        super().__init__(f"{field}={value}: {expected}")
        self.field, self.value, self.expected = field, value, expected


@dataclass(frozen=True)
class Deadlines:
    """How long a client may keep a connection waiting, in seconds (finite; above 0, or
    0 for none where a field says so). The one place their bounds are checked."""

    head_s: float = HEAD_TIMEOUT_S
    """How long a request's head may take (the module's rule)."""
    body_idle_s: float = BODY_IDLE_TIMEOUT_S
    """How long the app may wait for a body's next byte."""
    send_s: float = SEND_TIMEOUT_S
    """How long a client may take no byte of an answer waiting for it; 0: no deadline."""
    keep_alive_s: float = KEEP_ALIVE_S
    """How long an idle connection is kept for its next request (uvicorn's rule)."""

    def __post_init__(self) -> None:
        for name in ("head_s", "body_idle_s", "keep_alive_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise DeadlineError(name, value, "expected a positive number of seconds, "
                                    f"e.g. {getattr(Deadlines, name)}")
        if not (math.isfinite(self.send_s) and self.send_s >= 0):
            raise DeadlineError("send_s", self.send_s, "expected a number of seconds, e.g. "
                                f"{SEND_TIMEOUT_S}, or 0 for no send deadline")


DEFAULT_DEADLINES = Deadlines()


def with_deadlines(base: type[P], deadlines: Deadlines = DEFAULT_DEADLINES,
                   call_later: CallLater | None = None,
                   on_send_timeout: OnSendTimeout | None = None) -> type[P]:
    """``base`` with ``deadlines`` (the module's rule), timed on ``call_later`` (the event
    loop's unless given); ``on_send_timeout`` is told of each connection the send
    deadline drops."""
    mixin: type = _H11Deadlines if issubclass(base, H11Protocol) else _HttpToolsDeadlines

    class WithDeadlines(mixin, base):  # type: ignore[misc, valid-type]
        pass

    WithDeadlines.deadlines = deadlines
    WithDeadlines.call_later = staticmethod(call_later) if call_later is not None else None
    WithDeadlines.on_send_timeout = staticmethod(on_send_timeout) \
        if on_send_timeout is not None else None
    return WithDeadlines


class _Deadlines:
    """What both protocols share; the subclasses say when a head begins and ends."""

    deadlines: Deadlines
    call_later: CallLater | None
    on_send_timeout: OnSendTimeout | None
    refused = False
    """Whether a refusal was answered and the connection lingers until it closes (the
    head-size bound's 431 sets it too): nothing more is parsed or answered."""
    _head_timer: Timer | None = None
    _body_timer: Timer | None = None
    _head_begun = False
    """Whether a byte of the head the connection waits for has come."""
    _send_timer: Timer | None = None
    _send_left = 0
    """The bytes the client had not taken when the send timer was armed (``_not_taken``)."""

    # The protocol's own, for mypy (uvicorn's classes give them).
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: Any
    timeout_keep_alive: float
    timeout_keep_alive_task: asyncio.TimerHandle | None
    timeout_keep_alive_handler: Callable[[], None]
    _unset_keepalive_if_required: Callable[[], None]

    def _later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return (self.call_later or self.loop.call_later)(delay, callback)

    def connection_made(self, transport: asyncio.Transport) -> None:
        # uvicorn's Config keeps whole seconds, and one value per server: read here, the
        # deadlines are the one place a connection's waits are set.
        self.timeout_keep_alive = self.deadlines.keep_alive_s
        # Before uvicorn's own: its first write may be this connection's 408.
        bound_send_ahead(transport)
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head()  # a connection that sends nothing: from its start

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        # uvicorn arms keep-alive on the loop's own clock; on a test's, it runs out on the
        # test's word as the other deadlines do. None: a pipelined request began, or the
        # connection closes.
        if self.call_later is not None and self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = self.call_later(  # type: ignore[assignment]
                self.deadlines.keep_alive_s, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        self._cancel_send()
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

    def _watch_cycle(self, cycle: Any) -> None:
        """Time the waits of ``cycle``'s app for its body's next bytes; tell it, in its
        scope, whether its connection is lost."""
        cast(dict[str, object], cycle.scope)[DISCONNECTED_KEY] = lambda: cycle.disconnected
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

    # The answer. The transport calls these; nothing runs on a send that does not pause.

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self.deadlines.send_s:
            self._arm_send()

    def resume_writing(self) -> None:
        self._cancel_send()
        super().resume_writing()  # type: ignore[misc]

    def _not_taken(self) -> int:
        """The bytes written that the client's kernel has not acknowledged: the
        transport's buffer and what the kernel holds unacknowledged (where it can say)."""
        return self.transport.get_write_buffer_size() + (unacked_bytes(self.transport) or 0)

    def _arm_send(self) -> None:
        self._cancel_send()
        self._send_left = self._not_taken()
        self._send_timer = self._later(self.deadlines.send_s, self._send_expired)

    def _cancel_send(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_expired(self) -> None:
        self._send_timer = None
        # Paused, the app wrote nothing since: fewer bytes not taken is the client taking.
        if self._not_taken() < self._send_left:
            self._arm_send()  # progress, slow as it is
            return
        log.info("a client took no byte of its answer for %g s: connection dropped",
                 self.deadlines.send_s)
        if self.on_send_timeout is not None:
            self.on_send_timeout()
        # Not close(), which waits for the client to take what is buffered; even on a
        # transport already closing (keep-alive's close of an answer sent whole). The
        # app's send returns and its receive answers http.disconnect (connection_lost).
        self.transport.abort()


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
            self._watch_cycle(self.cycle)
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
            self._watch_cycle(self.cycle)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._head_begun and not self.transport.is_closing():
            self._unset_keepalive_if_required()  # the head's deadline now, not keep-alive's
            self._arm_head()
