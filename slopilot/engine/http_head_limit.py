"""A bound on a request's head for uvicorn's httptools protocol (the meter's).

llhttp parses a head as it streams in and sets no limit of its own: httptools gathers
each header's name and value, and uvicorn the target, however long they grow. One client
sending an endless header grew the meter by its every byte (200 MiB sent: 264 MiB of
resident memory, past the meter container's 256 MiB limit, so the kubelet kills it and
every stream through the pod with it). h11, ``slopilot serve``'s parser, refuses a head
over 16 KiB itself.

The bytes are counted per read, from the read where a head began until the read where
it ended, so a read that also held the tail of the request before counts whole: the
bound is loose by at most one read, never more.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slopilot.engine.openai_errors import error_body

MAX_HEAD_BYTES = 64 << 10
"""The most bytes of one request's head: 4x h11's default, far above any OpenAI client's
(a few hundred bytes, a long API key included)."""

LINGER_S = 5.0
"""How long a refused connection's further bytes are read and dropped, so the client reads
the 431 (nginx's ``lingering_timeout``)."""

log = logging.getLogger(__name__)


def bounded_head(base: type[HttpToolsProtocol],
                 max_head_bytes: int = MAX_HEAD_BYTES) -> type[HttpToolsProtocol]:
    """``base``, answering 431 and closing once a head passes ``max_head_bytes``."""

    class BoundedHead(base):  # type: ignore[misc, valid-type]
        _in_head = False
        _head_bytes = 0
        refused = False
        """Whether the connection answered a refusal and lingers until it closes: nothing
        more is parsed or answered on it (http_deadlines reads it too)."""

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return  # the lingering close: dropped, unparsed
            super().data_received(data)
            if not self._in_head or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > max_head_bytes:
                self._refuse()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def _refuse(self) -> None:
            log.warning("a request head over %d bytes: refused (431)", max_head_bytes)
            self.refused = True
            if self.cycle is None or self.cycle.response_complete:
                refuse_and_linger(self.transport, self.loop.call_later,
                                  b"431 Request Header Fields Too Large",
                                  b"request head over %d bytes" % max_head_bytes,
                                  b"request_header_too_large")
                return
            # Else an answer is being written on this connection: no room for another.
            self.transport.close()

    return BoundedHead


def refuse_and_linger(transport: asyncio.Transport,
                      call_later: Callable[[float, Callable[[], None]], object],
                      status: bytes, message: bytes, code: bytes) -> None:
    """Answer ``status`` (``b"431 Request Header Fields Too Large"``) with an
    OpenAI-shaped error, then close lingering: for a connection whose head is refused,
    with nothing else being answered on it."""
    body = json.dumps(error_body(int(status.split()[0]), message.decode(),
                                 code=code.decode())).encode()
    transport.write(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"date: %s\r\nconnection: close\r\n\r\n"
        % (status, len(body), email.utils.formatdate(usegmt=True).encode()) + body)
    # Closed at once with the client's bytes unread, the socket would send a reset, which
    # discards the answer on the client's side before it is read. So the answer ends the
    # write side, what still comes is dropped unread (the caller's part), and the
    # connection closes when the client does, or after LINGER_S.
    transport.write_eof()
    call_later(LINGER_S, transport.close)
