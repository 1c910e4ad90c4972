"""``FairSlots``: slots shared by every namespace, each namespace's capped, handed out in
turn.

At most ``total`` slots are held at once, at most ``per_namespace`` of them by one
namespace. A caller past either waits for a slot in asyncio, holding no thread. A freed
slot goes round the namespaces that wait, in turn (within a namespace, first come, first
served): a namespace with a thousand callers waiting delays another namespace's caller
by one of its own per freed slot, not by a thousand. A stop (``until``) ends a wait with
no slot taken (``NotRun``), as does a cancelled wait.

The operator's pools of threads hand their slots out this way: the tuning daemons'
steps (tuning_pool.py), the pod syncs (pod_sync_pool.py) and the drift repairs, on
kopf's own threads (drift_repairs.py).

Used from one event loop (kopf's): the slots are counted on it, without a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable

from slopilot.operator.daemon_pause import STOP_CHECK_S


class NotRun(Exception):
    """The caller's ``until`` held before a slot was free: nothing was run."""


class FairSlots:
    """``total`` slots, ``per_namespace`` of one namespace's at once (module docstring)."""

    def __init__(self, total: int, per_namespace: int) -> None:
        if per_namespace < 1 or total < per_namespace:
            raise ValueError(f"total={total!r}, per_namespace={per_namespace!r}: "
                             "expected 1 <= per_namespace <= total")
        self.total, self.per_namespace = total, per_namespace
        self._busy = 0
        self._running: Counter[str] = Counter()
        # Insertion order is the turn: a namespace served goes to the back.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def running(self) -> int:
        """Slots held now."""
        return self._busy

    def waiting(self) -> int:
        """Callers waiting for a slot."""
        return sum(len(queue) for queue in self._waiting.values())

    def held(self, namespace: str) -> int:
        """Slots ``namespace`` holds now."""
        return self._running.get(namespace, 0)

    def namespaces_waiting(self) -> int:
        """Namespaces with a caller waiting for a slot."""
        return len(self._waiting)

    async def take(self, namespace: str, until: Callable[[], bool] | None) -> None:
        """A slot of ``namespace``'s held for the caller, or ``NotRun`` once ``until``."""
        if until is not None and until():
            raise NotRun
        if namespace not in self._waiting and self._free(namespace):
            self._hold(namespace)
            return
        grant: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append(grant)
        try:
            while not grant.done():
                # Polled as the daemon's pause polls its stop (daemon_pause.py): kopf's
                # ``stopped.wait()`` runs a task of its own per call.
                await asyncio.wait((grant,), timeout=None if until is None else STOP_CHECK_S)
                if not grant.done() and until is not None and until():
                    raise NotRun
            if until is not None and until():  # stopped as the slot came: not taken
                raise NotRun
        except BaseException:
            if grant.done() and not grant.cancelled():
                self.release(namespace)  # given to this caller already: passed on
            else:
                grant.cancel()
                self._forget(namespace, grant)
            raise

    def release(self, namespace: str) -> None:
        """Give back a slot of ``namespace``'s: to the next waiting namespace in turn."""
        self._busy -= 1
        self._running[namespace] -= 1
        if self._running[namespace] <= 0:
            del self._running[namespace]  # no count kept per namespace ever seen
        self._hand_out()

    def _free(self, namespace: str) -> bool:
        return self._busy < self.total and self._running[namespace] < self.per_namespace

    def _hold(self, namespace: str) -> None:
        self._busy += 1
        self._running[namespace] += 1

    def _forget(self, namespace: str, grant: asyncio.Future[None]) -> None:
        queue = self._waiting.get(namespace)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(grant)
        if not queue:
            del self._waiting[namespace]

    def _hand_out(self) -> None:
        """Free slots to the waiting namespaces, in turn, each its first waiter."""
        while self._busy < self.total:
            turn = next((ns for ns in self._waiting if self._free(ns)), None)
            if turn is None:
                return  # nobody waits, or only namespaces at their share
            queue = self._waiting.pop(turn)
            grant = queue.popleft()
            if queue:
                self._waiting[turn] = queue  # to the back of the turn
            grant.set_result(None)
            self._hold(turn)
