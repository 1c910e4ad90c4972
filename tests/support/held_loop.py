"""An event loop held up while a client's request waits in the server's kernel, for tests
of what a stamp counts: the loop is held by a callback gated on a ``threading.Event``,
and let go only once the kernel has acknowledged the client's bytes and its own clock
(``TCP_INFO``'s jiffies, read on the client's side) says ``ms`` have passed since."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.support.tcp_queues import unacked
from tests.support.waits import HANG_GUARD_S, wait_for

HAS_TCP_INFO = hasattr(socket, "TCP_INFO")
# The coarsest kernel tick (CONFIG_HZ=100): TCP_INFO's times count whole jiffies, so each
# reading is within a tick of the truth.
TICK_S = 0.010
_LAST_ACK_RECV = 56  # struct tcp_info's tcpi_last_ack_recv (linux/tcp.h), in ms


def _since_last_ack(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _LAST_ACK_RECV + 4)
    ms: int = struct.unpack_from("=I", info, _LAST_ACK_RECV)[0]
    return ms


@contextmanager
def held(loop: asyncio.AbstractEventLoop) -> Iterator[Callable[[], float]]:
    """``loop`` held in a callback until the block ends; yields the release, which lets
    it go and returns the monotonic time it did."""
    entered, go = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        go.wait(HANG_GUARD_S)

    loop.call_soon_threadsafe(hold)
    assert entered.wait(HANG_GUARD_S), "the loop never ran the hold"

    def release() -> float:
        at = time.monotonic()
        go.set()
        return at

    try:
        yield release
    finally:
        go.set()


def wait_in_the_kernel(sock: socket.socket, ms: int) -> None:
    """Returns once the peer's kernel has acknowledged every byte ``sock`` sent and, by
    the kernel's clock, ``ms`` have passed since it did."""
    wait_for(lambda: unacked(sock.fileno()) == 0 and _since_last_ack(sock) >= ms,
             what=f"the server's kernel to hold the request {ms} ms", interval_s=0.005)


def streamed_after_a_hold(loop: asyncio.AbstractEventLoop, port: int, request: bytes,
                          ms: int) -> bytes:
    """``request`` sent on a new connection to ``port`` on this host while ``loop`` is
    held, the loop let go once the kernel has held it ``ms``; the streamed answer, read
    to its ``data: [DONE]``."""
    with held(loop) as release:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(request)
        wait_in_the_kernel(sock, ms)
        release()
    with sock:
        sock.settimeout(HANG_GUARD_S)
        answer = b""
        while b"data: [DONE]" not in answer:
            got = sock.recv(65536)
            assert got, f"the connection closed after {answer!r}"
            answer += got
    return answer
