"""``FairTurns``: items (the simulator's processes) handed to waiting threads in turn by
tenant, first come, first served within one.

``SimWorker``'s processes are shared by every deployment an operator runs. Handed out
first come, first served, a namespace with many CRs (or CRs whose searches run long)
queued ahead of another namespace's call, which waited for all of them and, past its
queue limit, went without the twin (``SimulatorBusy``). Here a freed item goes to the
waiting tenant served longest ago (never served first, then by who waited first): a
tenant's thousand waiting calls delay another tenant's call by at most one of its own
per freed item. ``per_tenant`` caps the items one tenant holds at once; a tenant at its
cap waits (in its place in the turn) while another takes a free item.

Threads, not asyncio: the callers are the tuning daemons' steps on their threads, and
the demo's and the tests' own. The operator's ``fair_slots.FairSlots`` turns the same
way for coroutines; the tuner cannot import it (imports flow operator -> tuner).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Waiter(Generic[T]):
    tenant: str
    seq: int
    ready: threading.Event = field(default_factory=threading.Event)
    item: T | None = None
    granted: bool = False


class FairTurns(Generic[T]):
    """``items`` handed out one per caller, in turn by tenant (module docstring)."""

    def __init__(self, items: Iterable[T], *, per_tenant: int | None = None) -> None:
        self._free: deque[T] = deque(items)
        if not self._free:
            raise ValueError("items: expected at least one item to hand out")
        if per_tenant is not None and (isinstance(per_tenant, bool) or per_tenant < 1):
            raise ValueError(f"per_tenant={per_tenant!r}: expected items one tenant may "
                             "hold at once >= 1 (or None for no cap)")
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._lines: dict[str, deque[_Waiter[T]]] = {}
        self._held: Counter[str] = Counter()
        # When each tenant was last handed an item (a count, not a clock). Kept for every
        # tenant seen, one int per namespace: a tenant whose line emptied for a moment
        # must not come back as never served, ahead of those it was just served before.
        self._served: dict[str, int] = {}
        self._ticks = itertools.count()
        self._arrivals = itertools.count()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Callers waiting for an item now."""
        return self._waiting

    def held(self, tenant: str) -> int:
        """Items ``tenant`` holds now."""
        return self._held.get(tenant, 0)

    def acquire(self, tenant: str, timeout_s: float | None) -> T | None:
        """An item for ``tenant``, waiting up to ``timeout_s`` (None: as long as it
        takes); None when none came in that time, the caller's place given up."""
        with self._lock:
            if self._free and tenant not in self._lines and self._may_hold(tenant):
                return self._hand(tenant)
            waiter: _Waiter[T] = _Waiter(tenant, next(self._arrivals))
            self._lines.setdefault(tenant, deque()).append(waiter)
            self._waiting += 1
        if waiter.ready.wait(timeout_s):
            return waiter.item
        with self._lock:
            if waiter.granted:  # handed an item between the timeout and this lock
                return waiter.item
            line = self._lines[tenant]
            line.remove(waiter)
            if not line:
                del self._lines[tenant]
            # No hand-out owed: the held counts did not change, so every tenant still
            # waiting is as eligible as at the last hand-out (where none was, or no
            # item was free).
            self._waiting -= 1
            return None

    def release(self, tenant: str, item: T) -> None:
        """Give back ``item``, which ``tenant`` was handed; it goes to the next in turn."""
        with self._lock:
            if self._held.get(tenant, 0) < 1:
                raise ValueError(f"tenant={tenant!r}: {tenant!r} holds no item to give "
                                 "back; release what acquire handed that tenant")
            self._held[tenant] -= 1
            if not self._held[tenant]:
                del self._held[tenant]
            self._free.append(item)
            self._dispatch()

    def _may_hold(self, tenant: str) -> bool:
        return self.per_tenant is None or self._held.get(tenant, 0) < self.per_tenant

    def _hand(self, tenant: str) -> T:
        self._held[tenant] += 1
        self._served[tenant] = next(self._ticks)
        return self._free.popleft()

    def _dispatch(self) -> None:
        while self._free:
            eligible = [t for t in self._lines if self._may_hold(t)]
            if not eligible:
                return
            tenant = min(eligible, key=lambda t: (self._served.get(t, -1),
                                                  self._lines[t][0].seq))
            line = self._lines[tenant]
            waiter = line.popleft()
            if not line:
                del self._lines[tenant]
            self._waiting -= 1
            waiter.item, waiter.granted = self._hand(tenant), True
            waiter.ready.set()
