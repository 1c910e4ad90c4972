"""A study in its storage: opened (or created) with its sampler, found again, deleted.

Every study on one database URL shares one storage and its connection pool
(``shared_storage.py``). A study in a database has heartbeats (``heartbeat.py``): a
trial a dead process left RUNNING is failed when the study is opened.
"""

from __future__ import annotations

import os
import weakref

import optuna
from optuna.trial import TrialState

from slopilot.tuner.study import study_delete
from slopilot.tuner.study.heartbeat import (
    GRACE_S,
    HEARTBEAT_S,
    check_heartbeat,
    fail_stale,
)
from slopilot.tuner.study.shared_storage import SHARED_STORAGES
from slopilot.tuner.study.sqlite_check import foreign_sqlite
from slopilot.tuner.study.storage_url import redacted, shown, sqlite_file

SAMPLERS = ("tpe", "random")
SEED_MAX = 2**32 - 1
"""The largest sampler seed: Optuna seeds numpy's legacy RandomState, which takes 32 bits."""
_LEGACY_WORKER = "slopilot_worker"  # "host:pid:token": the previous version's liveness mark
_LEGACY_BEATEN = "slopilot_legacy_heartbeat"


class StudyStorageError(ValueError):
    """The storage URL is malformed or the database cannot be opened; the message says why."""


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # Multivariate TPE models knob interactions (budget with chunk). Five random
        # trials to start: a live study has ~30 trials of minutes each, and on the
        # efficiency benchmark 5 beat 8 and 10. Constraints reach it through
        # Trial.set_constraint (Optuna 5; constraints_func is deprecated): infeasible
        # trials are ranked by their violation, below every feasible one.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler={name!r}: use one of: {', '.join(SAMPLERS)}")


def _storage(url: str | None, heartbeat_s: int, grace_s: int) -> optuna.storages.BaseStorage:
    if url is None:
        return optuna.storages.InMemoryStorage()  # one process: nothing goes stale
    if not isinstance(url, str) or "://" not in url:
        raise StudyStorageError(
            f"storage={shown(url) if isinstance(url, str) else url!r} is not a database "
            "URL; use sqlite:///path/to/study.db (a local file) or "
            "postgresql://user:pass@host/db (shared)")
    foreign = foreign_sqlite(url)
    if foreign is not None:  # Optuna would add its tables to another application's file
        raise StudyStorageError(f"cannot open study storage {shown(url)!r}: {foreign}")
    try:
        return SHARED_STORAGES.get(url, heartbeat_s, grace_s)
    except Exception as exc:  # SQLAlchemy raises many kinds; all mean the same to a user
        raise StudyStorageError(
            f"cannot open study storage {shown(url)!r}: {type(exc).__name__}: "
            f"{redacted(str(exc), url)}; check the URL, that the directory exists and the "
            "database is reachable") from None


def open_study(storage: str | None, name: str, *, sampler: str = "tpe",
               seed: int | None = 0, heartbeat_s: int = HEARTBEAT_S,
               grace_s: int = GRACE_S) -> optuna.Study:
    """Create or load the study ``name`` (maximize goodput) and fail its stale trials.

    ``storage``: None for in memory, ``sqlite:///file.db``, or a PostgreSQL URL when
    several workers share the study. In a database, each open trial's heartbeat is
    recorded every ``heartbeat_s`` seconds, and a RUNNING trial silent for ``grace_s``
    is failed as stale. A resumed study's sampler seed is offset by the number of trials
    so that a seeded random sampler does not repeat the first configs.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("study name is empty; pass --study-name or a deployment name")
    first_sampler = make_sampler(sampler, seed)  # a bad name fails before any I/O
    check_heartbeat(heartbeat_s, grace_s)
    store = _storage(storage, heartbeat_s, grace_s)
    try:
        study = optuna.create_study(storage=store, study_name=name, direction="maximize",
                                    load_if_exists=True, sampler=first_sampler)
        _STORAGE_OF[study] = store
        if isinstance(store, optuna.storages.RDBStorage):
            _beat_legacy_trials(store, study)
        fail_stale(study)
        trials = study.get_trials(deepcopy=False)
    except Exception as exc:  # e.g. a database that went away after the engine opened,
        # or tables of the same names as Optuna's that another application made
        where = shown(storage) if isinstance(storage, str) else repr(storage)
        text = str(exc).strip()
        if exc.__cause__ is not None:  # Optuna's StorageInternalError hides the driver's
            text += f" ({str(exc.__cause__).splitlines()[0]})"
        detail = redacted(text, storage) if isinstance(storage, str) else text
        raise StudyStorageError(
            f"cannot open study {name!r} in {where}: {type(exc).__name__}: {detail}") from None
    if trials and seed is not None:  # wrapped: the offset may pass the 32-bit seed limit
        study.sampler = make_sampler(sampler, (seed + len(trials)) % (SEED_MAX + 1))
    return study


def _absent_sqlite(storage: str) -> bool:
    """Whether ``storage`` is a SQLite file that does not exist (it holds no study, and is
    not created for the question)."""
    db = sqlite_file(storage)
    return db is not None and not os.path.exists(db)


def study_names(storage: str) -> list[str]:
    """The names of every study in ``storage`` (a database URL). StudyStorageError where
    the storage cannot be reached."""
    if _absent_sqlite(storage):
        return []
    try:
        return optuna.get_all_study_names(storage=_storage(storage, HEARTBEAT_S, GRACE_S))
    except Exception as exc:  # SQLAlchemy's many kinds: the database went away
        raise StudyStorageError(f"cannot list the studies in {shown(storage)}: "
                                f"{type(exc).__name__}: {redacted(str(exc), storage)}"
                                ) from None


def stored_trial(storage: str, name: str, number: int) -> optuna.trial.FrozenTrial | None:
    """Trial ``number`` of study ``name`` in ``storage`` (a database URL), as stored; None
    where either is not there. Three lookups of the one trial, whatever the study holds:
    the study is not opened, so none of its trials is loaded and none failed as stale
    (an open's side effect, its opener's to have). A SQLite file that does not exist is
    not created for the question. StudyStorageError where the storage cannot be read."""
    if _absent_sqlite(storage):
        return None
    store = _storage(storage, HEARTBEAT_S, GRACE_S)
    try:
        try:
            study_id = store.get_study_id_from_name(name)
            trial_id = store.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:  # Optuna's "no such study" and "no such trial"
            return None
        return store.get_trial(trial_id)
    except Exception as exc:  # SQLAlchemy's many kinds: the database went away, or
        # the server cut a read held past its statement timeout (heartbeat.py)
        text = str(exc).strip()
        if exc.__cause__ is not None:  # Optuna's StorageInternalError hides the driver's
            text += f" ({str(exc.__cause__).splitlines()[0]})"
        raise StudyStorageError(f"cannot read trial {number} of study {name!r} in "
                                f"{shown(storage)}: {type(exc).__name__}: "
                                f"{redacted(text, storage)}") from None


def delete_named_study(storage: str, name: str) -> bool:
    """Delete the study ``name``, with every trial, from ``storage`` (a database URL);
    False where it is not there. A SQLite file that does not exist holds no study: it is
    not created for the question. Deleted a few hundred trials a transaction
    (``study_delete.py``). StudyStorageError where the storage cannot be reached."""
    if _absent_sqlite(storage):
        return False
    store = _storage(storage, HEARTBEAT_S, GRACE_S)
    try:
        if isinstance(store, optuna.storages.RDBStorage):
            # In short transactions: Optuna's one held a shared SQLite file's write
            # lock past the busy timeout of other tenants' tells (study_delete.py).
            return study_delete.delete_study(store, name)
        optuna.delete_study(study_name=name, storage=store)
    except KeyError:
        return False
    except Exception as exc:  # SQLAlchemy's many kinds: the database went away
        raise StudyStorageError(f"cannot delete study {name!r} from {shown(storage)}: "
                                f"{type(exc).__name__}: {redacted(str(exc), storage)}"
                                ) from None
    return True


# The storage each study of ``open_study`` was opened on: Optuna keeps it private
# (``Study._storage``), and a resumed trial is reopened through its public methods.
_STORAGE_OF: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage] = \
    weakref.WeakKeyDictionary()


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage | None:
    """The storage ``open_study`` opened ``study`` on; None for a study from elsewhere."""
    return _STORAGE_OF.get(study)


def _beat_legacy_trials(store: optuna.storages.RDBStorage, study: optuna.Study) -> None:
    """One heartbeat for each RUNNING trial the previous version asked (it marked them
    ``slopilot_worker`` and sent no heartbeats), so they too go stale unless told."""
    study_id = store.get_study_id_from_name(study.study_name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _LEGACY_WORKER in t.user_attrs and not t.user_attrs.get(_LEGACY_BEATEN):
            trial_id = store.get_trial_id_from_study_id_trial_number(study_id, t.number)
            store.record_heartbeat(trial_id)
            store.set_trial_user_attr(trial_id, _LEGACY_BEATEN, True)
