"""How far ahead of its client a connection's answer may be written: what uvicorn's send
returning means.

An app's ``await send(chunk)`` returns once the chunk is in the transport; asyncio hands
it straight to the kernel, which takes whatever fits its send buffer (``tcp_wmem``'s
maximum, 4 MiB on a stock Linux, most of it on loopback), and pauses the app only past
64 KiB more of its own. So a stream's chunks were "written", stamped and counted as
delivered, megabytes before its client took them: a client that stopped reading had its
3000 tokens counted delivered, its gaps the engine's, its request met, while it waited
40 s for the next byte; the transport never paused, so the send deadline was never armed
and the engine generated for nobody.

Two bounds on every accepted connection, the server's and the meter's:

- ``TCP_NOTSENT_LOWAT``: the kernel takes a write only while it holds less than
  ``SEND_AHEAD_BYTES`` not yet sent on the wire (bytes in flight, sent and not acked,
  are not counted: a long fat link keeps its whole window busy).
- The transport's own buffer holds nothing before it pauses the app (high-water mark 0):
  a chunk the kernel refused waits there alone, and the app's next send waits for it to
  reach the kernel. Its chunks were the stamps' largest error: anything held in user
  space has not even reached the kernel, and a 64 KiB (or 16 KiB) mark let the app
  write on while it drained, then merged the tokens made meanwhile into one write whose
  gap read as one long wait, where the client saw them come steadily.

So a chunk's write returns at most ``SEND_AHEAD_BYTES`` (plus one chunk) before its
bytes leave on the wire, and the send deadline (``http_deadlines``) cuts a client whose
kernel takes none of them for its period: one whose receive buffer is full. What that
buffer holds, and when the client's application reads it, the server cannot see: a
client that never reads counts as taking bytes until its buffer fills, which, where it
left its receive buffer to Linux's kernel (grown towards ``tcp_rmem``'s maximum, 6 MiB
on a stock one), is a whole answer of hundreds of KB, or a megabyte and more
(``docs/operations.md``).

Where the platform has no ``TCP_NOTSENT_LOWAT`` (Windows; Linux and macOS have it, and
CPython exposes it on both, defining macOS's value where its SDK does not) only the
transport's bound applies, said once in the log: the kernel's send buffer then still
counts as delivered. Where the kernel cannot say what the client has not acknowledged
(``unacked_bytes`` asks Linux's ``SIOCOUTQ``; other kernels may refuse it), the send deadline sees
progress only as the transport drains, said once in the log too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

try:  # Unix's
    import fcntl
    import termios
except ImportError:  # Windows: no ioctl; unacked_bytes says None
    fcntl = termios = None  # type: ignore[assignment]

SEND_AHEAD_BYTES = 16 * 1024
"""What the kernel may hold unsent for a connection: nginx's and h2o's guidance for
HTTP/2 (``tcp_notsent_lowat`` 16 KiB, Cloudflare's too). About 70 streamed tokens of
~220 bytes, or 30 with top-5 logprobs: a token stream (tens of KB/s) never waits on it
on a fast link, and a bulk body still fills a fast link's window (bytes in flight are
not counted), refilled each time 8 KiB of it leaves (the kernel wakes a writer at half
the mark). Smaller does not tighten a slow reader's stamps: its kernel takes bytes as the
client's window opens, half its receive buffer at a time, so each wait is a window's
step however small the mark (4 KiB read more long gaps than 16: docs/benchmarks.md);
larger lets a slow link's client fall seconds behind what counts as delivered."""

TRANSPORT_HIGH_WATER = 0
"""The transport's own buffer before it pauses the app (the module's rule)."""

log = logging.getLogger(__name__)

_fallback_said = False
_unacked_said = False


def bound_send_ahead(transport: asyncio.BaseTransport) -> None:
    """Bound what ``transport``'s writes may run ahead of its client (the module's rule)."""
    global _fallback_said
    # uvloop's transports (uvicorn's default loop) are not asyncio's classes: by their method.
    set_limits = getattr(transport, "set_write_buffer_limits", None)
    if set_limits is not None:
        with contextlib.suppress(NotImplementedError):  # asyncio.Transport's own stub
            set_limits(high=TRANSPORT_HIGH_WATER)
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket's buffers are the peer's own: nothing on a wire to wait
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    try:
        if option is None:
            raise OSError("socket.TCP_NOTSENT_LOWAT is not defined on this platform")
        sock.setsockopt(socket.IPPROTO_TCP, option, SEND_AHEAD_BYTES)
    except OSError as exc:
        if not _fallback_said:
            _fallback_said = True
            log.warning("TCP_NOTSENT_LOWAT cannot be set (%s): a streamed chunk counts as "
                        "delivered once the kernel's send buffer takes it, up to its size "
                        "ahead of the client; the send deadline fires only once it is full",
                        exc)


def unacked_bytes(transport: asyncio.BaseTransport) -> int | None:
    """The bytes ``transport``'s kernel holds that the client's kernel has not yet
    acknowledged, sent or not (Linux's ``SIOCOUTQ``, spelled ``TIOCOUTQ``); None where the
    transport has no socket or the platform cannot say (said once in the log).

    While writing is paused the app adds nothing, so this count plus the transport's
    buffer falls only as the client's kernel takes bytes, one at a time if the client
    reads so: the send deadline's progress, seen long before the transport drains (which
    waits for ``SEND_AHEAD_BYTES / 2`` to leave the kernel)."""
    global _unacked_said
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return None  # none, or closed already: nothing left to be acknowledged
    request = getattr(termios, "TIOCOUTQ", None)
    try:
        if fcntl is None or request is None:
            raise OSError("no TIOCOUTQ ioctl on this platform")
        return int.from_bytes(fcntl.ioctl(sock.fileno(), request, bytes(4)), "little",
                              signed=True)
    except OSError as exc:
        if not _unacked_said:
            _unacked_said = True
            log.warning("what the client's kernel acknowledged cannot be read (%s): the send "
                        "deadline sees a client take bytes only once the transport's buffer "
                        "drains, so a slow reader may be cut", exc)
        return None
