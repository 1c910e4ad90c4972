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
from collections.abc import Callable

from optuna.storages import RDBStorage

from slopilot.tuner.study.heartbeat import rdb_storage

StorageKey = tuple[str, int, int]
"""(URL, heartbeat_s, grace_s): the heartbeat settings belong to the storage too."""


class SharedStorages:
    """The process's storages by URL and heartbeat settings."""

    def __init__(self, make: Callable[[str, int, int], RDBStorage] = rdb_storage) -> None:
        self._make = make
        self._open: dict[StorageKey, RDBStorage] = {}
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
        with building:
            with self._lock:
                found = self._open.get(key)
            if found is None:
                found = self._make(url, heartbeat_s, grace_s)
                with self._lock:
                    self._open[key] = found
            return found


SHARED_STORAGES = SharedStorages()
