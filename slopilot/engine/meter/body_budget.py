"""The request bodies the meter may hold: one at most ``--max-body-mb``, all of them at
once at most ``--body-budget-mb`` (and one body more), both sized within the memory the
operator gives the meter's container (``METER_MEMORY_MIB``, its limit: past it the
kernel kills the meter, and every stream of the pod with it).

The meter holds a body from its first byte until it has sent it on to vLLM (it reads the
few fields it needs on the way: ``request_fields``), as a ``bytearray`` about an eighth
over its bytes. Each piece of a body is taken once the bodies held leave it room
(``Hold.grow``): till then the body is not read on, its bytes waiting in its client's
socket. Counted as they come, not as a Content-Length declares them: a client that
declares 16 MiB and sends a byte a minute holds a byte. The body that came first of
those held is always read on, even past the budget (by one body at most): bodies that
came together cannot each wait for the other's room, and a large one is not passed over
for ever by small ones. So bodies within the cap cannot add up past the budget and one
body, and the rest of the limit is left to the interpreter and its server stack (about
65 MiB) and to the streams in flight (a few tens of KiB each).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import itertools

METER_MEMORY_MIB = 256
"""The meter container's memory request and limit, in MiB (``operator.meter_container``)."""


def limits_within(memory_mib: int) -> tuple[int, int]:
    """The largest body and the bodies held at once, in MiB, for a meter given
    ``memory_mib``: a quarter of it for bodies (a bit more as held, above), and a
    quarter of that for one, so four of the largest are read at once."""
    budget = memory_mib // 4
    return budget // 4, budget


MAX_BODY_MIB, BODY_BUDGET_MIB = limits_within(METER_MEMORY_MIB)
"""16 and 64: ``--max-body-mb`` is ``slopilot serve``'s default too (a 128k-token context
as token ids in a batch of prompts, or as text; a chat's images inline)."""


MAPPED_BYTES = 256 << 10
"""Blocks of this size and more are each mapped apart, and given back to the kernel when
freed (``map_large_blocks``): a body's buffer, uvicorn's read-ahead of a body."""
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter (malloc.h)."""


def map_large_blocks() -> bool:
    """Has glibc's malloc map each block of ``MAPPED_BYTES`` or more apart for good.

    Left to itself, glibc raises that threshold to the size of each mapped block freed
    (up to 32 MiB), and the bodies allocated after one was freed come from its heap,
    whose freed space it mostly keeps: under 32 clients sending 15 MiB at once the
    meter's RSS crept to 209 MB with never more than 74 MiB of bodies held (158 MB with
    the threshold fixed). False where the C library has no ``mallopt`` (not glibc)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MAPPED_BYTES))
    except (OSError, AttributeError):
        return False


class BodyBudget:
    """The bytes of the request bodies held at once: at most ``limit``, but for the body
    that came first of those held, always read on. A body's room is taken piece by
    piece as it is read (``Hold.grow``) and given back once it was sent on
    (``Hold.release``). A body waiting for room is not read on: its bytes wait in its
    client's socket (uvicorn stops reading a connection past 64 KiB unread), and no
    deadline runs against a client the server is not reading (``http_deadlines``)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"body_budget_bytes={limit}: expected a size of at least 1 "
                             "byte, e.g. 64 MiB")
        self.limit = limit
        self.held = 0
        """The bytes of the bodies read and not given back."""
        self._holds: dict[int, Hold] = {}
        """The bodies held, in the order they came (the first always read on)."""
        self._waiting: collections.deque[tuple[Hold, int, asyncio.Future[None]]] = \
            collections.deque()
        self._count = itertools.count()

    def hold(self) -> Hold:
        """A body's room, none yet: taken as it is read."""
        hold = Hold(self, next(self._count))
        self._holds[hold.number] = hold
        return hold

    def _first(self, hold: Hold) -> bool:
        return next(iter(self._holds)) == hold.number

    def _grant(self) -> None:
        """Room to the waiting pieces it fits, in the order they asked, and to the first
        body's whatever the room."""
        for entry in list(self._waiting):
            hold, size, waiter = entry
            if waiter.done():
                self._waiting.remove(entry)
            elif self._first(hold) or self.held + size <= self.limit:
                self._waiting.remove(entry)
                self.held += size
                hold.size += size
                waiter.set_result(None)


class Hold:
    """One body's room in a ``BodyBudget``, ``size`` bytes so far, until ``release``."""

    def __init__(self, budget: BodyBudget, number: int) -> None:
        self._budget, self.number = budget, number
        self.size = 0
        self._released = False

    async def grow(self, size: int) -> None:
        """Room for ``size`` bytes more of the body, once the bodies held leave it (at
        once for the body that came first of them). A piece that fits is taken past
        bodies waiting for more room: none waits for ever, being at the latest the
        first one day; and a request with no body waits for none."""
        budget = self._budget
        if not size or budget._first(self) or budget.held + size <= budget.limit:
            budget.held += size
            self.size += size
            return
        waiter = asyncio.get_running_loop().create_future()
        budget._waiting.append((self, size, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.cancel()  # left in the queue: ``_grant`` drops it
            raise

    def release(self) -> None:
        """Its room given back (once; again, nothing): the body was sent on, or dropped."""
        if self._released:
            return
        self._released = True
        budget = self._budget
        budget.held -= self.size
        self.size = 0
        del budget._holds[self.number]
        budget._grant()
