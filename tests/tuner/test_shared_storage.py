"""One storage, one engine and one connection pool per database URL in the process.

Every controller build used to open an RDBStorage of its own, never disposed: on a shared
PostgreSQL, a connection held per build.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from optuna.storages import RDBStorage

from slopilot.tuner.study.heartbeat import rdb_storage
from slopilot.tuner.study.shared_storage import SharedStorages
from slopilot.tuner.study.storage import StudyStorageError, open_study, storage_of


def _rdb(study_storage: object) -> RDBStorage:
    assert isinstance(study_storage, RDBStorage)
    return study_storage


def test_studies_on_one_url_share_one_storage_and_engine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    opened = [open_study(url, f"team/chat/u{i % 3}") for i in range(10)]
    storages = {id(_rdb(storage_of(s))) for s in opened}
    engines = {id(_rdb(storage_of(s)).engine) for s in opened}
    assert len(storages) == len(engines) == 1
    other = open_study(f"sqlite:///{tmp_path / 'other.db'}", "team/chat/u0")
    assert _rdb(storage_of(other)) is not _rdb(storage_of(opened[0]))
    # The heartbeat settings are the storage's: other settings, another storage.
    beating = open_study(url, "team/chat/u0", heartbeat_s=1, grace_s=15)
    assert _rdb(storage_of(beating)).heartbeat_interval == 1
    assert _rdb(storage_of(beating)) is not _rdb(storage_of(opened[0]))


def test_threads_opening_one_url_at_once_build_it_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    built: list[str] = []

    def make(u: str, heartbeat_s: int, grace_s: int) -> RDBStorage:
        built.append(u)
        return rdb_storage(u, heartbeat_s, grace_s)

    shared = SharedStorages(make)
    start = threading.Barrier(8)
    got: list[RDBStorage] = []

    def open_one() -> None:
        start.wait()
        got.append(shared.get(url, 30, 300))

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built == [url] and len(shared) == 1
    assert len(got) == 8 and all(s is got[0] for s in got)


def test_a_storage_that_failed_to_open_is_tried_again(tmp_path: Path) -> None:
    directory = tmp_path / "later"
    url = f"sqlite:///{directory / 'study.db'}"
    with pytest.raises(StudyStorageError, match="cannot open study storage"):
        open_study(url, "team/chat/u1")
    directory.mkdir()  # the administrator fixes it: the next build opens it
    assert _rdb(storage_of(open_study(url, "team/chat/u1"))).engine is not None


def test_many_studies_on_a_shared_postgresql_hold_one_pools_connections() -> None:
    from tests.tuner.postgres import find_postgres, postgres_server

    bindir = find_postgres()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    psycopg2 = pytest.importorskip("psycopg2")
    with postgres_server(bindir) as url:
        opened = [open_study(url, f"team-{i}/chat/u{i}") for i in range(12)]
        assert len({id(storage_of(s)) for s in opened}) == 1
        watcher = psycopg2.connect(url.replace("postgresql+psycopg2", "postgresql", 1))
        try:
            with watcher.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                            "'client backend' AND pid <> pg_backend_pid()")
                (held,) = cur.fetchone()
        finally:
            watcher.close()
        assert 1 <= held <= 2, held  # one pool's (Optuna nests a session in a connection)


class _Engine:
    def __init__(self) -> None:
        self.disposed = 0

    def dispose(self) -> None:
        self.disposed += 1


class _Storage:
    def __init__(self, url: str) -> None:
        self.url, self.engine = url, _Engine()


def test_the_least_recently_used_pool_is_closed_past_the_cap() -> None:
    """A storage policy of ``sqlite:////dir/*`` lets a tenant name a database per CR:
    kept for good, every name would keep its pool's files open in the operator. Past
    ``max_open`` the least recently used storage's pool is closed (an engine still in use
    opens a new one on its next query)."""
    made: list[_Storage] = []

    def make(url: str, heartbeat_s: int, grace_s: int) -> RDBStorage:
        made.append(_Storage(url))
        return made[-1]  # type: ignore[return-value]

    shared = SharedStorages(make, max_open=3)
    for name in ("a", "b", "c"):
        shared.get(f"sqlite:////s/{name}.db", 60, 300)
    shared.get("sqlite:////s/a.db", 60, 300)  # a is used again: b is now the oldest
    shared.get("sqlite:////s/d.db", 60, 300)
    assert len(shared) == 3 and len(made) == 4
    assert [s.engine.disposed for s in made] == [0, 1, 0, 0]  # b's pool closed
    again = shared.get("sqlite:////s/b.db", 60, 300)
    assert again is not made[1] and made[0].engine.disposed == 0  # b reopened; c goes
    assert made[2].engine.disposed == 1
    with pytest.raises(ValueError, match="max_open"):
        SharedStorages(make, max_open=0)
