"""One lock per LLMDeployment, taken around every write of its objects and its status.

A drift repair, a spec reconcile, a pod sync's writes and the controller's (a scale, a
committed config) each hold the CR's lock, so they never interleave."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class LockTable:
    """One lock per deployment (namespace/name), created on first use and gone once no
    one holds or waits for it: kept for good, one per CR name ever seen, the table grew
    with every CR a tenant created and deleted."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        # Each holder and waiter keeps its lock alive; the table only finds it.
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = \
            weakref.WeakValueDictionary()

    def __len__(self) -> int:
        """How many deployments' locks are held or waited for now."""
        return len(self._locks)

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
        with lock:
            yield


def key_of(body: Mapping[str, Any]) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"
