"""One RDB storage per database in the process: every study opened on a URL shares it.

Each ``RDBStorage`` owns a SQLAlchemy engine and its connection pool, and nothing
disposes of one that is dropped. The operator opens its study at every controller build
(each spec or twin change, each restarted daemon) for every LLMDeployment; with a storage
per open, a shared PostgreSQL held a connection per build until ``max_connections`` ran
out. Optuna's RDBStorage may be shared between threads (a session per call), so every
study on one URL uses one storage, built once, and its pool for the process's life.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from optuna.storages import RDBStorage

from slopilot.tuner.study.heartbeat import rdb_storage

StorageKey = tuple[str, int, int]
"""(URL, heartbeat_s, grace_s): the heartbeat settings belong to the storage too."""


MAX_OPEN = 64
"""Storages kept open at once. Past it the least recently used one's pool is closed: a
policy of ``sqlite:////dir/*`` lets a tenant name a database per CR, and kept for good
every name would hold its pool's files open in the operator."""


class SharedStorages:
    """The process's storages by URL and heartbeat settings, at most ``max_open``."""

    def __init__(self, make: Callable[[str, int, int], RDBStorage] = rdb_storage, *,
                 max_open: int = MAX_OPEN) -> None:
        if max_open < 1:
            raise ValueError(f"max_open={max_open!r}: expected at least 1 storage")
        self._make, self.max_open = make, max_open
        self._open: OrderedDict[StorageKey, RDBStorage] = OrderedDict()
        self._lock = threading.Lock()
        # One lock per key, held while its storage is built: a slow or unreachable
        # database delays only the studies on it, and no storage is built twice.
        self._building: dict[StorageKey, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def get(self, url: str, heartbeat_s: int, grace_s: int) -> RDBStorage:
        """The storage for ``url`` with these heartbeat settings, built on first use; a
        build that raises keeps nothing, so the next call tries again."""
        key = (url, heartbeat_s, grace_s)
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        try:
            return self._get(key, building)
        finally:
            with self._lock:  # waiters hold it already; a later caller finds the storage
                if self._building.get(key) is building:
                    del self._building[key]

    def _get(self, key: StorageKey, building: threading.Lock) -> RDBStorage:
        with building:
            with self._lock:
                found = self._open.get(key)
                if found is not None:
                    self._open.move_to_end(key)
                    return found
            found = self._make(*key)
            with self._lock:
                self._open[key] = found
                evicted = self._open.popitem(last=False)[1] \
                    if len(self._open) > self.max_open else None
            if evicted is not None:
                # A controller may still hold it: dispose() closes the pool's idle
                # connections, and the engine opens a new pool if it is used again.
                evicted.engine.dispose()
            return found


SHARED_STORAGES = SharedStorages()
