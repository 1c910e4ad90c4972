"""A PostgreSQL storage's query that the server never answers is cut by the server's
statement timeout, an error its caller reports, not a thread held for good.

A server that accepts the connection and then holds a query (a lock another session
keeps, a migration, a hung backend) held the operator's thread for as long as it did:
the connect timeout ends only a connection not made. The question whether a trial was
told failed (``failed_trials.py``) has 4 workers for every CR, one read a storage at a time;
a held read kept its worker and its storage's slot until the server let it go.
"""

from __future__ import annotations

import functools
import threading

import psycopg
import pytest

from slopilot.tuner.study import heartbeat
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


def _shown(store_url: str, *settings: str) -> list[str]:
    store = rdb_storage(store_url, 30, 300, statement_timeout_s=1)
    try:
        with store.engine.connect() as conn:
            return [str(conn.exec_driver_sql(f"SHOW {setting}").scalar())
                    for setting in settings]
    finally:
        store.engine.dispose()


def test_pgoptions_of_the_environment_are_kept_beside_the_statement_timeout(
        postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # An administrator who puts Optuna's tables in a schema of their own through libpq's
    # environment: an ``options`` given to libpq would drop it, and every study would be
    # looked for (and created anew) in ``public``.
    create_database(postgres, "pgoptions")
    url = postgres.url("pgoptions")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA optuna_ns")
    monkeypatch.setenv("PGOPTIONS", "-c search_path=optuna_ns -c application_name=admin")
    assert _shown(url, "search_path", "application_name", "statement_timeout") == [
        "optuna_ns", "admin", "1s"]
    store = rdb_storage(url, 30, 300, statement_timeout_s=1)
    try:
        store.get_all_studies()  # creates Optuna's tables, in the schema the admin chose
    finally:
        store.engine.dispose()
    monkeypatch.delenv("PGOPTIONS")
    with psycopg.connect(url) as conn:
        schemas = {row[0] for row in conn.execute(
            "SELECT table_schema FROM information_schema.tables "
            "WHERE table_name = 'studies'")}
    assert schemas == {"optuna_ns"}


def test_a_statement_timeout_the_environment_or_the_role_sets_wins(
        postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    create_database(postgres, "admin_timeout")
    url = postgres.url("admin_timeout")
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=7000")
    assert _shown(url, "statement_timeout") == ["7s"]
    monkeypatch.delenv("PGOPTIONS")
    with psycopg.connect(postgres.url("postgres"), autocommit=True) as conn:
        conn.execute('ALTER DATABASE "admin_timeout" SET statement_timeout = 0')
    assert _shown(url, "statement_timeout") == ["0"]


def test_the_urls_several_options_are_all_kept(
        postgres: PostgresServer) -> None:  # noqa: F811
    create_database(postgres, "several")
    url = postgres.url("several")
    own = f"{url}?options=-c%20application_name%3Dteam&options=-c%20statement_timeout%3D0"
    assert _shown(own, "application_name", "statement_timeout") == ["team", "0"]


def _parameters(store_url: str) -> dict[str, str]:
    store = rdb_storage(store_url, 30, 300, statement_timeout_s=1)
    try:
        with store.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert isinstance(dbapi, psycopg.Connection), dbapi
            return dbapi.info.get_parameters()
    finally:
        store.engine.dispose()


def test_tcp_keepalives_bound_a_silent_peer_and_the_url_may_set_its_own(
        postgres: PostgresServer) -> None:  # noqa: F811
    # A server gone (a partition, a host down) answers nothing: no statement timeout
    # cuts a read that waits on it; the kernel's keepalives and user timeout end it.
    create_database(postgres, "keepalive")
    url = postgres.url("keepalive")
    dead = heartbeat.DEAD_PEER_S
    got = _parameters(url)
    assert {k: got.get(k) for k in ("keepalives", "keepalives_idle", "keepalives_interval",
                                    "keepalives_count", "tcp_user_timeout")} == {
        "keepalives": "1",
        "keepalives_idle": str(heartbeat.KEEPALIVE_IDLE_S),
        "keepalives_interval": str(heartbeat.KEEPALIVE_INTERVAL_S),
        "keepalives_count": str(heartbeat.KEEPALIVE_COUNT),
        "tcp_user_timeout": str(dead * 1000)}
    assert dead >= heartbeat.KEEPALIVE_IDLE_S + heartbeat.KEEPALIVE_INTERVAL_S \
        * heartbeat.KEEPALIVE_COUNT
    own = _parameters(f"{url}?keepalives_idle=5&tcp_user_timeout=20000")
    assert (own.get("keepalives_idle"), own.get("tcp_user_timeout"),
            own.get("keepalives_count")) == ("5", "20000", str(heartbeat.KEEPALIVE_COUNT))
