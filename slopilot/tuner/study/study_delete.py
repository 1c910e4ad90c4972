"""A study deleted in short transactions, so a big one never locks a shared SQLite file.

Optuna's ``delete_study`` is one transaction: the ORM loads every row of the study and
deletes it row by row, and SQLite holds the file's write lock for the last flush (2 s at
2000 trials, 14 s at 10000; readers too, for most of it). Every tenant that names no
storage shares one file (``operator/default_storage.py``): another tenant's ``tell``
past the busy timeout failed ("database is locked"), and its loop reverted a measured
trial. So the trials go first, ``CHUNK_TRIALS`` at a time, each chunk's rows of every
table that names a trial in one short transaction of set-based deletes, and then the
study, now trial-less, by Optuna's own ``delete_study`` (its directions and attributes;
and any trial asked in it meanwhile, by Optuna's cascade). What is left is what Optuna's
leaves (tests/tuner/test_study_delete.py, on SQLite and PostgreSQL).

Optuna has no public call that deletes a trial, so the chunks are SQL on Optuna's
schema, the tables named by its models (``optuna.storages._rdb.models``; Optuna is
pinned). A deletion cut short (the database went away) leaves the study with fewer
trials, which the next try (the cleanup's retry, the reclaim at a start) deletes.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.storages._rdb import models

CHUNK_TRIALS = 200
"""Trials deleted per transaction: 0.04-0.16 s of write lock on SQLite for trials of the
controller's size, measured at 500 to 10000 trials (docs/benchmarks.md, "Deleting a big
study"), where the busy timeout (``sqlite_tuning.BUSY_TIMEOUT_S``) waits 30 s; and few
enough bound ids for any SQLite's 999-variable limit."""
PAUSE_S = 0.1
"""The SQLite file left unlocked between two chunks: SQLite's waiters poll, up to every
100 ms, with no queue, and a deleter that began its next chunk at once could hold the
lock each time a tenant's tell looked. PostgreSQL queues its waiters: no pause there."""


def _trials() -> sa.Table:
    return models.TrialModel.__table__


def trial_tables() -> list[sa.Table]:
    """Every table of Optuna's schema with a foreign key to a trial: its params, values,
    intermediate values, attributes and heartbeats."""
    trials = _trials()
    return [table for table in models.BaseModel.metadata.sorted_tables
            if any(fk.column.table is trials for fk in table.foreign_keys)]


def delete_trials(store: RDBStorage, study_id: int, chunk: int | None = None) -> int:
    """Delete every trial of study ``study_id``, with its rows, ``chunk`` trials a
    transaction; how many were deleted."""
    size = CHUNK_TRIALS if chunk is None else chunk
    if size < 1:
        raise ValueError(f"chunk={chunk!r}: expected at least 1 trial a transaction, "
                         f"e.g. {CHUNK_TRIALS}")
    trials, children = _trials(), trial_tables()
    pause = PAUSE_S if store.engine.dialect.name == "sqlite" else 0.0
    done = 0
    while True:
        if done and pause:
            time.sleep(pause)
        with store.engine.begin() as conn:
            ids = list(conn.execute(sa.select(trials.c.trial_id)
                                    .where(trials.c.study_id == study_id)
                                    .order_by(trials.c.trial_id).limit(size)).scalars())
            if not ids:
                return done
            for table in children:
                conn.execute(sa.delete(table).where(table.c.trial_id.in_(ids)))
            conn.execute(sa.delete(trials).where(trials.c.trial_id.in_(ids)))
        done += len(ids)


def delete_study(store: RDBStorage, name: str, chunk: int | None = None) -> bool:
    """Delete study ``name`` from ``store`` in short transactions; False where it is not
    there (or went meanwhile: another deleter's)."""
    try:
        study_id = store.get_study_id_from_name(name)
    except KeyError:
        return False
    delete_trials(store, study_id, chunk)
    try:
        store.delete_study(study_id)
    except KeyError:
        return False
    return True
