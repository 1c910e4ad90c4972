"""A PostgreSQL storage's query that the server never answers is cut by the server's
statement timeout, an error its caller reports, not a thread held for good.

A server that accepts the connection and then holds a query (a lock another session
keeps, a migration, a hung backend) held the operator's thread for as long as it did:
the connect timeout ends only a connection not made. The question whether a trial was
told failed (``failed_trials.py``) has 4 workers for every CR; a held read kept one each.
"""

from __future__ import annotations

import functools
import threading

import psycopg
import pytest

from slopilot.tuner.study import storage as storage_module
from slopilot.tuner.study.heartbeat import rdb_storage
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.shared_storage import SharedStorages
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import StudyStorageError, open_study
from slopilot.tuner.study.study_family import told_failed
from tests.support.postgres import PostgresServer, create_database, postgres  # noqa: F401
from tests.support.waits import HANG_GUARD_S

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


def test_a_read_held_by_a_lock_is_cut_by_the_statement_timeout(
        postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    create_database(postgres, "held")
    url = postgres.url("held")
    # The operator's storages, with a 1 s statement timeout: the lock below holds the
    # read until the server cuts it (or for good, with none).
    monkeypatch.setattr(storage_module, "SHARED_STORAGES", SharedStorages(
        functools.partial(rdb_storage, statement_timeout_s=1)))
    tuner = ResumableTuner(open_study(url, "ns/chat/u1"), SearchSpace.from_bounds({}))
    tuner.tell_failed(tuner.ask()[0], "done")
    tuner.close()
    outcome: list[BaseException | str | None] = []

    def ask() -> None:
        try:
            outcome.append(told_failed(url, "ns/chat/u1", 0))
        except Exception as exc:  # what the caller gets: an error it can report
            outcome.append(exc)

    with psycopg.connect(postgres.url("held")) as holder:  # a transaction left open
        holder.execute("LOCK TABLE trials IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        thread.join(HANG_GUARD_S)
        held = thread.is_alive()
        holder.rollback()  # let a read that waits go, whatever it is
    thread.join(HANG_GUARD_S)
    assert not held, "the read waited on the lock with no statement timeout"
    [error] = outcome
    assert isinstance(error, StudyStorageError), error
    assert "cannot read trial 0 of study 'ns/chat/u1'" in str(error)
    assert "statement timeout" in str(error), error
    # The lock gone, the same storage answers again.
    assert told_failed(url, "ns/chat/u1", 0) == "done"


def test_sqlite_takes_no_statement_timeout(tmp_path: object) -> None:
    store = rdb_storage(f"sqlite:///{tmp_path}/s.db", 30, 300, statement_timeout_s=1)
    assert store.get_all_studies() == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_statement_timeout_of_no_whole_seconds_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="statement_timeout_s"):
        rdb_storage("sqlite://", 30, 300, statement_timeout_s=bad)  # type: ignore[arg-type]


def test_the_urls_own_options_are_kept_and_its_statement_timeout_wins(
        postgres: PostgresServer) -> None:  # noqa: F811
    create_database(postgres, "options")
    url = postgres.url("options")

    def shown(store_url: str, setting: str) -> str:
        store = rdb_storage(store_url, 30, 300, statement_timeout_s=1)
        try:
            with store.engine.connect() as conn:
                return str(conn.exec_driver_sql(f"SHOW {setting}").scalar())
        finally:
            store.engine.dispose()

    assert shown(url, "statement_timeout") == "1s"
    own = f"{url}?options=-c%20statement_timeout%3D5000%20-c%20application_name%3Dteam"
    assert shown(own, "statement_timeout") == "5s"
    assert shown(own, "application_name") == "team"
