"""A SQLite study storage waits out another connection's write for ``BUSY_TIMEOUT_S``
(the driver's default, 5 s, failed a tenant's tell behind another's deletion), and a URL
that sets its own ``timeout`` keeps it."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from slopilot.tuner.study.heartbeat import rdb_storage
from slopilot.tuner.study.sqlite_tuning import BUSY_TIMEOUT_S, sqlite_engine_kwargs


def _busy_timeout_ms(url: str) -> int:
    store = rdb_storage(url, 30, 300)
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(sa.text("PRAGMA busy_timeout")).scalar_one())
    finally:
        store.engine.dispose()


def test_a_sqlite_storage_waits_the_busy_timeout(tmp_path: Path) -> None:
    assert BUSY_TIMEOUT_S > 5
    assert _busy_timeout_ms(f"sqlite:///{tmp_path / 's.db'}") == BUSY_TIMEOUT_S * 1000


def test_a_urls_own_timeout_is_kept(tmp_path: Path) -> None:
    assert _busy_timeout_ms(f"sqlite:///{tmp_path / 's.db'}?timeout=7") == 7000


def test_other_databases_get_nothing() -> None:
    assert sqlite_engine_kwargs(sa.make_url("postgresql://u@h/db")) == {}
