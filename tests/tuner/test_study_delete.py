"""A study deleted in short transactions: another study's tell in the same SQLite file
commits while a big study is being deleted, and what is left is what Optuna's own
``delete_study`` leaves.

Optuna deletes a study in one transaction, loading then deleting each row, and holds
the write lock for its last flush: 5 s at 2000 trials, 11 s at 15000, past SQLite's busy
timeout, so another tenant's ``tell`` in the shared file failed ("database is locked")
and the loop reverted its measured trial (docs/benchmarks.md, "Deleting a big study").
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.trial import TrialState, create_trial

from slopilot.tuner.study import study_delete
from slopilot.tuner.study.storage import (
    delete_named_study,
    open_study,
    storage_of,
    study_names,
)
from tests.support.postgres import PostgresServer, create_database, postgres  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")

_DIST = {"token_budget": IntDistribution(128, 8192, step=128),
         "temperature": FloatDistribution(0.0, 1.0)}


def _fill(url: str, name: str, n: int) -> None:
    """``name`` with ``n`` finished trials and one running, each kind of row Optuna keeps
    for a trial or a study among them."""
    study = open_study(url, name)
    study.set_user_attr("target", {"backend": "vllm"})
    study.add_trials([create_trial(params={"token_budget": 128 * (i + 1), "temperature": 0.5},
                                   distributions=_DIST, value=float(i),
                                   user_attrs={"config": {"i": i}},
                                   intermediate_values={0: 1.0, 1: 2.0})
                      for i in range(n)])
    running = study.ask(_DIST)
    running.set_user_attr("config", {"running": True})
    store = storage_of(study)
    assert isinstance(store, RDBStorage)
    study_id = store.get_study_id_from_name(name)
    trial_id = store.get_trial_id_from_study_id_trial_number(study_id, running.number)
    store.set_study_system_attr(study_id, "slopilot", "x")
    store.set_trial_system_attr(trial_id, "constraints", [0.1])
    store.record_heartbeat(trial_id)


def _rows(url: str) -> dict[str, set[tuple[Any, ...]]]:
    """Every row of every table of Optuna's schema."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {table.name: {tuple(row) for row in conn.execute(sa.select(table))}
                    for table in models.BaseModel.metadata.sorted_tables}
    finally:
        engine.dispose()


def _without(rows: dict[str, set[tuple[Any, ...]]], study_id: int
             ) -> dict[str, set[tuple[Any, ...]]]:
    """``rows`` less those of study ``study_id`` and of its trials."""
    tables = models.BaseModel.metadata.tables
    trials = tables[models.TrialModel.__tablename__]
    sid = list(trials.c).index(trials.c.study_id)
    tid = list(trials.c).index(trials.c.trial_id)
    gone = {row[tid] for row in rows[trials.name] if row[sid] == study_id}
    out = {}
    for name, table_rows in rows.items():
        cols = [c.name for c in tables[name].c]
        out[name] = {row for row in table_rows
                     if not ("study_id" in cols and row[cols.index("study_id")] == study_id)
                     and not ("trial_id" in cols and row[cols.index("trial_id")] in gone)}
    return out


def _deleted_in_chunks_leaves_the_rest(url: str) -> None:
    _fill(url, "ns-b/big/u1", 25)
    _fill(url, "ns-a/kept/u1", 3)
    store = storage_of(open_study(url, "ns-b/big/u1"))
    assert store is not None
    big_id = store.get_study_id_from_name("ns-b/big/u1")
    before = _rows(url)
    assert delete_named_study(url, "ns-b/big/u1") is True
    after = _rows(url)
    assert after == _without(before, big_id)
    assert after[models.TrialModel.__tablename__] and all(
        after[t] for t in ("trial_params", "trial_values", "trial_user_attributes",
                           "trial_intermediate_values", "trial_system_attributes",
                           "trial_heartbeats", "study_directions", "study_user_attributes",
                           "study_system_attributes"))  # the kept study's: the test saw each
    assert study_names(url) == ["ns-a/kept/u1"]
    assert delete_named_study(url, "ns-b/big/u1") is False


def test_a_study_deleted_in_chunks_leaves_what_optunas_delete_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study_delete, "CHUNK_TRIALS", 4)  # 26 trials: 7 transactions
    url = f"sqlite:///{tmp_path / 'chunks.db'}"
    _fill(url, "ns-b/big/u1", 25)
    _fill(url, "ns-a/kept/u1", 3)
    shutil.copy(tmp_path / "chunks.db", tmp_path / "optuna.db")
    optuna_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.delete_study(study_name="ns-b/big/u1", storage=optuna_url)
    assert delete_named_study(url, "ns-b/big/u1") is True
    assert _rows(url) == _rows(optuna_url)


def test_sqlite_deletion_leaves_no_orphan_rows(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study_delete, "CHUNK_TRIALS", 4)
    _deleted_in_chunks_leaves_the_rest(f"sqlite:///{tmp_path / 'studies.db'}")


def test_postgresql_deletion_leaves_no_orphan_rows(
        postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(study_delete, "CHUNK_TRIALS", 4)
    create_database(postgres, "studies_chunked_delete")
    _deleted_in_chunks_leaves_the_rest(postgres.url("studies_chunked_delete"))


def test_every_table_that_names_a_trial_is_deleted_from() -> None:
    # A later Optuna's new trial table would otherwise be left to the study's cascade,
    # in one transaction again (or, were it no cascade, orphaned).
    trials = models.BaseModel.metadata.tables[models.TrialModel.__tablename__]
    naming = {t.name for t in models.BaseModel.metadata.sorted_tables
              if any(fk.column.table is trials for fk in t.foreign_keys)}
    assert naming == {t.name for t in study_delete.trial_tables()}
    assert len(naming) >= 6


def test_another_studys_tell_commits_while_a_big_study_is_being_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The deleter is paused at its first statement after it has committed some deletes
    # (never, for a deletion in one transaction: the test fails), and the victim's tell
    # runs to its end there, from another thread, on the same file.
    monkeypatch.setattr(study_delete, "CHUNK_TRIALS", 10)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _fill(url, "ns-b/big/u1", 34)
    victim = open_study(url, "ns-a/victim/u1")
    trial = victim.ask(_DIST)
    store = storage_of(victim)
    assert isinstance(store, RDBStorage)
    deleter = threading.get_ident()
    seen: dict[str, Any] = {}
    deleted_then_committed = [False, False]

    def tell() -> None:
        try:
            seen["big listed"] = "ns-b/big/u1" in study_names(url)
            victim.tell(trial, 1234.5)
            seen["tell"] = "ok"
        except Exception as exc:  # the failure the test is for: say what it was
            seen["tell"] = f"{type(exc).__name__}: {exc} ({exc.__cause__})"

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() != deleter or "tell" in seen:
            return
        if statement.lstrip().upper().startswith("DELETE"):
            deleted_then_committed[0] = True
        elif all(deleted_then_committed):  # a later transaction: none held now
            other = threading.Thread(target=tell)
            other.start()
            other.join()

    def on_commit(conn: Any) -> None:
        if threading.get_ident() == deleter and deleted_then_committed[0]:
            deleted_then_committed[1] = True

    sa.event.listen(store.engine, "before_cursor_execute", on_execute)
    sa.event.listen(store.engine, "commit", on_commit)
    try:
        assert delete_named_study(url, "ns-b/big/u1") is True
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", on_execute)
        sa.event.remove(store.engine, "commit", on_commit)
    assert seen == {"big listed": True, "tell": "ok"}
    [told] = optuna.load_study(study_name="ns-a/victim/u1", storage=url).get_trials()
    assert told.state is TrialState.COMPLETE and told.value == 1234.5
    assert study_names(url) == ["ns-a/victim/u1"]
