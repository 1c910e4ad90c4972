"""How a SQLite study storage's connections wait for one another.

Every tenant that names no storage shares one SQLite file (``operator/default_storage``),
and SQLite lets one connection write at a time: a writer that finds the file locked
waits up to its busy timeout, then fails "database is locked" (Optuna does not retry;
the loop reverts the trial it could not tell). The driver's default is 5 s. A study is
now deleted a few hundred trials a transaction (``study_delete.py``: 0.04-0.16 s of lock
each, where Optuna's one transaction held it 14 s at 10000 trials), so no single write
holds the file for long; but SQLite's waiters poll (up to every 100 ms) with no queue,
so a tell behind a deletion's chunks and several tenants' tells can wait seconds on a
loaded node. ``BUSY_TIMEOUT_S`` gives them 30 s: far past any write of a study, and
within what a caller waits for a storage anyway (PostgreSQL's statement timeout, 60 s,
``heartbeat.STATEMENT_TIMEOUT_S``; the 2 minutes a CR's deletion waits for its daemon).

The journal stays SQLite's default (``delete``), not WAL: WAL lets readers go on beside
the writer, but needs shared memory beside the file, which a network filesystem (a PVC
of NFS, EFS, Filestore) does not give, and its ``-wal`` file holds commits a copy of the
``.db`` alone misses; with the short deletes a reader waits a chunk at most.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

BUSY_TIMEOUT_S = 30
"""How long a SQLite connection waits for another's lock before it fails."""


def sqlite_engine_kwargs(url: URL) -> dict[str, Any]:
    """SQLAlchemy engine arguments for a SQLite ``url`` (nothing for another database,
    nor the timeout where the URL sets its own ``?timeout=``)."""
    if url.get_backend_name() != "sqlite" or "timeout" in url.query:
        return {}
    return {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
