"""What a TCP socket's kernel holds for its peer (Linux's ioctls), for tests that wait on
the kernel rather than on time: the bytes the peer has not acknowledged, and of those the
ones not yet sent; and a live server's send deadline brought to where its client's
kernel takes no more."""

from __future__ import annotations

import asyncio
import fcntl
import termios
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.manual_timers import ManualTimers
from tests.support.waits import HANG_GUARD_S, wait_for

SIOCOUTQNSD = 0x894B
"""Linux's ioctl for the bytes not yet sent (``linux/sockios.h``); Python names none."""


def _ioctl(fd: int, request: int) -> int:
    return int.from_bytes(fcntl.ioctl(fd, request, bytes(4)), "little", signed=True)


def unacked(fd: int) -> int:
    """The bytes the peer's kernel has not acknowledged, sent or not (``SIOCOUTQ``)."""
    return _ioctl(fd, termios.TIOCOUTQ)


def unsent(fd: int) -> int:
    """The bytes not yet sent (``SIOCOUTQNSD``)."""
    return _ioctl(fd, SIOCOUTQNSD)


def peer_full(fd: int) -> bool:
    """Whether the peer's kernel takes no more: bytes wait unsent while none is in flight,
    which only a closed window (a full receive buffer) does."""
    held = unsent(fd)
    return held > 0 and unacked(fd) == held


def settle_send_deadline(protocol: Any, timers: ManualTimers, send_s: float) -> None:
    """Wait until the client of ``protocol`` (a connection whose writing paused, served on
    another thread's loop) takes no more; if its kernel took bytes since the send deadline
    was armed, fire the deadline, which sees that progress and arms again from there. A
    period from ``timers.now`` then ends with the client having taken nothing."""
    fd = protocol.transport.get_extra_info("socket").fileno()
    wait_for(lambda: peer_full(fd), what="the client's receive buffer to fill")

    async def progressed() -> bool:
        return bool(protocol._not_taken() < protocol._send_left)

    def on_loop(step: Callable[[], Awaitable[bool]]) -> bool:
        return asyncio.run_coroutine_threadsafe(step(), protocol.loop).result(HANG_GUARD_S)

    if on_loop(progressed):
        async def fire() -> bool:
            timers.advance(timers.now + send_s)
            return bool(protocol.transport.is_closing())
        assert not on_loop(fire), "cut though its kernel took bytes in the period"


CUT_PERIODS = 50
"""A client that never reads has a bounded buffer: its kernel stops taking long before."""


def cut_at_send_deadline(protocol: Any, timers: ManualTimers) -> int:
    """Fire the send deadline of ``protocol`` (served on another thread's loop) at each
    due time until it cuts the connection, and return how many it took.

    One period is not always enough for a client that never reads: Linux may open its
    closed window again well after the buffer filled (it compacts the receive queue and
    answers a window probe), and bytes taken in a period are progress that arms another.
    Each firing waits until the client's kernel takes no more, as ``settle_send_deadline``.
    """
    fd = protocol.transport.get_extra_info("socket").fileno()

    def ready() -> bool:
        if protocol.transport.is_closing():
            return True
        # Writing resumed (the client took enough): the next pause arms the deadline again.
        return protocol._send_timer is not None and peer_full(fd)

    async def fire() -> bool:
        if not protocol.transport.is_closing() and (timer := protocol._send_timer):
            timers.advance(timer.due)
        return bool(protocol.transport.is_closing())

    for period in range(1, CUT_PERIODS + 1):
        wait_for(ready, what="the send deadline armed and the client's kernel full")
        if asyncio.run_coroutine_threadsafe(fire(), protocol.loop).result(HANG_GUARD_S):
            return period
    raise AssertionError(f"not cut after {CUT_PERIODS} send deadlines")
