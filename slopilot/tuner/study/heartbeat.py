"""Stale trials by Optuna's RDB heartbeat: a trial whose process stops beating is failed.

Optuna records a heartbeat per trial only inside ``Study.optimize``; the controller and
``slopilot tune`` ask and tell, so ``TrialHeartbeat`` records the same heartbeat
(``RDBStorage.record_heartbeat``) for every trial a tuner holds open, on one daemon thread
that runs while there is one. ``fail_stale`` is Optuna's ``fail_stale_trials``: every
RUNNING trial whose last heartbeat is older than the storage's grace period is failed
(its process died or hangs), stays in the history and keeps its number. A live process's
trials keep beating and are left alone, on this host or another.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Protocol, runtime_checkable

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url

from slopilot.tuner.study.sqlite_tuning import sqlite_engine_kwargs

log = logging.getLogger(__name__)
HEARTBEAT_S = 30
"""How often a process records a heartbeat for each trial it holds open."""
GRACE_S = 300
"""A RUNNING trial with no heartbeat for this long is failed as stale (ten missed beats:
a slow database or a busy host is not a dead process)."""
STALE_REASON = "the process running it stopped sending heartbeats before it was told"
CONNECT_TIMEOUT_S = 10
"""How long a connection to a PostgreSQL storage may take to be made. libpq waits for a
server that accepts and says nothing for as long as it stays so, and for an unreachable
one the kernel's SYN retries (about 2 minutes): the caller's thread was held that long,
one of kopf's handler threads for a study deleted with tuning off."""
STATEMENT_TIMEOUT_S = 60
"""How long the PostgreSQL server lets one statement of a storage run before it cancels
it (libpq's ``statement_timeout``, lock waits included). The connect timeout ends only
a connection not made: a server that accepts and then holds a query (a lock another
session keeps open, a hung backend) held the caller's thread for as long as it did, a
tuning daemon's step, one of kopf's handler threads, or one of the 4 workers every CR's
"was this trial told failed" shares (``failed_trials.py``). A study's statements take
milliseconds (its whole trials a second at most, a deleted study's cascade a few): a
minute is far past any that makes progress, and under the 2 minutes the deletion
handler waits for a daemon's end (``handlers.DAEMON_END_GIVE_UP_S``), so a daemon's
step held by a lock ends, with an error, before its study is deleted beside it."""
KEEPALIVE_IDLE_S = 30
"""A PostgreSQL storage's connection silent this long has the kernel probe its peer."""
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 4
DEAD_PEER_S = 75
"""A server gone (a network partition, its host down) answers nothing: no statement
timeout ends a read that waits on it (the server would have to send the error). libpq's
TCP keepalives (a probe after ``KEEPALIVE_IDLE_S`` of silence, one every
``KEEPALIVE_INTERVAL_S``, ``KEEPALIVE_COUNT`` unanswered) and ``tcp_user_timeout``
(data unacknowledged this long) close such a connection in about this long, a little
more than the statement timeout a live server cuts at. A long statement on a live server
is not cut: its kernel answers the probes. Nor is a backend process that hangs while its
host lives (its kernel still answers), which only the server's own timeouts end."""
KEEPALIVES: dict[str, int] = {
    "keepalives": 1, "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S, "keepalives_count": KEEPALIVE_COUNT,
    "tcp_user_timeout": DEAD_PEER_S * 1000}


def check_heartbeat(heartbeat_s: int, grace_s: int) -> None:
    """Raise ValueError, naming the argument, unless both are whole seconds and the grace
    period spans more than one beat."""
    for name, value in (("heartbeat_s", heartbeat_s), ("grace_s", grace_s)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected whole seconds >= 1 (Optuna "
                             "records heartbeats in whole seconds)")
    if grace_s <= heartbeat_s:
        raise ValueError(f"grace_s={grace_s}: expected more than heartbeat_s={heartbeat_s} "
                         "(a few missed beats), e.g. 10 x heartbeat_s")


def rdb_storage(url: str, heartbeat_s: int, grace_s: int, *,
                connect_timeout_s: int = CONNECT_TIMEOUT_S,
                statement_timeout_s: int = STATEMENT_TIMEOUT_S) -> RDBStorage:
    """An RDB storage with heartbeats every ``heartbeat_s``, stale after ``grace_s``; a
    PostgreSQL one gives up a connection not made within ``connect_timeout_s`` and has
    the server cancel a statement past ``statement_timeout_s`` (SQLite has neither: a
    local file, no server to hold a query)."""
    check_heartbeat(heartbeat_s, grace_s)
    if isinstance(connect_timeout_s, bool) or not isinstance(connect_timeout_s, int) \
            or connect_timeout_s < 2:
        raise ValueError(f"connect_timeout_s={connect_timeout_s!r}: expected whole seconds "
                         f">= 2 (libpq's least), e.g. {CONNECT_TIMEOUT_S}")
    if isinstance(statement_timeout_s, bool) or not isinstance(statement_timeout_s, int) \
            or statement_timeout_s < 1:
        raise ValueError(f"statement_timeout_s={statement_timeout_s!r}: expected whole "
                         f"seconds >= 1, e.g. {STATEMENT_TIMEOUT_S}")
    engine: dict[str, Any] = {}
    parsed = make_url(url)
    postgres = parsed.get_backend_name() == "postgresql"
    if postgres:
        # Connection parameters, not libpq ``options``: an ``options`` given here would
        # make libpq drop PGOPTIONS and a service file's options (an admin's search_path,
        # role), and Optuna would look for every study in ``public``. The URL's own
        # parameters win; libpq takes a URL's ``options`` once, so several are joined.
        args: dict[str, Any] = {"connect_timeout": connect_timeout_s, **KEEPALIVES}
        args = {key: value for key, value in args.items() if key not in parsed.query}
        own = parsed.query.get("options")
        if own is not None and not isinstance(own, str):
            args["options"] = " ".join(own)
        engine["connect_args"] = args
    engine.update(sqlite_engine_kwargs(parsed))  # the busy timeout: sqlite_tuning.py
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        storage = RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat_s,
                             grace_period=grace_s,
                             heartbeat_stale_trial_callback=_log_stale)
    if postgres:
        _set_statement_timeout(storage.engine, statement_timeout_s)
        # The connections Optuna opened to create its tables have not run the listener
        # (it needs the engine Optuna makes): made anew, they will.
        storage.engine.dispose()
    return storage


def _set_statement_timeout(engine: Engine, statement_timeout_s: int) -> None:
    """Every new connection of ``engine`` gets ``statement_timeout_s`` where nothing the
    administrator controls set one: PGOPTIONS, the URL's or a service file's options,
    ``ALTER ROLE/DATABASE ... SET``, postgresql.conf (each shows in ``pg_settings.source``
    as other than ``default``), so their value wins, 0 (none) included."""
    statement = ("SELECT set_config('statement_timeout', "
                 f"'{statement_timeout_s * 1000}', false) FROM pg_settings "
                 "WHERE name = 'statement_timeout' AND source = 'default'")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()
        # A session setting made in a transaction rolled back is undone: commit it.
        dbapi_connection.commit()


def _log_stale(study: optuna.Study, trial: FrozenTrial) -> None:
    log.warning("study %s: trial %d failed: %s", study.study_name, trial.number,
                STALE_REASON)


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's stale trials (nothing happens without heartbeats)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@runtime_checkable
class HeartbeatStorage(Protocol):
    """The storage calls a heartbeat makes: public methods of ``RDBStorage`` and of the
    cache Optuna wraps it in (``Trial.storage``)."""

    def get_heartbeat_interval(self) -> int | None: ...

    def record_heartbeat(self, trial_id: int) -> None: ...

    def get_study_id_from_name(self, study_name: str) -> int: ...

    def get_trial_id_from_study_id_trial_number(self, study_id: int,
                                                trial_number: int) -> int: ...

    def get_trial(self, trial_id: int) -> FrozenTrial: ...


def heartbeat_of(study: optuna.Study, trial: optuna.Trial) -> TrialHeartbeat | None:
    """A heartbeat for ``study``'s trials when its storage has them enabled."""
    storage = trial.storage
    if not isinstance(storage, HeartbeatStorage) or storage.get_heartbeat_interval() is None:
        return None
    return TrialHeartbeat(storage, storage.get_study_id_from_name(study.study_name))


class TrialHeartbeat:
    """Beats for the trials one tuner holds open, from ``hold`` until ``release``."""

    def __init__(self, storage: HeartbeatStorage, study_id: int) -> None:
        interval = storage.get_heartbeat_interval()
        if interval is None:
            raise ValueError("the study's storage has no heartbeat_interval")
        self.interval: float = interval
        self._storage, self._study_id = storage, study_id
        self._held: dict[int, int] = {}  # trial number -> trial id
        self._lock = threading.Lock()
        # The beating thread and the event that stops it; None while nothing is held.
        self._beater: tuple[threading.Thread, threading.Event] | None = None
        self._failing = False

    @property
    def beating(self) -> set[int]:
        """Numbers of the trials beaten for."""
        with self._lock:
            return set(self._held)

    @property
    def running(self) -> bool:
        with self._lock:
            return self._beater is not None

    def hold(self, number: int) -> None:
        trial_id = self._storage.get_trial_id_from_study_id_trial_number(self._study_id,
                                                                          number)
        # At once: a trial with no heartbeat yet is never taken for stale.
        self._storage.record_heartbeat(trial_id)
        with self._lock:
            self._held[number] = trial_id
            if self._beater is None:
                stop = threading.Event()
                thread = threading.Thread(target=self._run, args=(stop,), daemon=True,
                                          name="slopilot-trial-heartbeat")
                self._beater = (thread, stop)
                thread.start()

    def release(self, number: int) -> None:
        with self._lock:
            self._held.pop(number, None)

    def stop(self) -> None:
        """Stop beating now; trials still held go stale after the grace period."""
        with self._lock:
            self._held.clear()
            if self._beater is not None:
                self._beater[1].set()
                self._beater = None

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            with self._lock:
                if not self._held:  # ends here, so a later hold starts a fresh thread
                    if self._beater is not None and self._beater[1] is stop:
                        self._beater = None
                    return
                held = dict(self._held)
            for number, trial_id in held.items():
                self._beat(number, trial_id)

    def _beat(self, number: int, trial_id: int) -> None:
        try:
            if self._storage.get_trial(trial_id).state.is_finished():
                self.release(number)  # told elsewhere (a resumed tuner): nothing to keep
                return
            self._storage.record_heartbeat(trial_id)
        except Exception as exc:  # a missed beat; the grace period covers several
            if not self._failing:
                log.warning("trial %d: heartbeat not recorded (%s: %s); retrying every "
                            "%g s", number, type(exc).__name__, exc, self.interval)
            self._failing = True
            return
        if self._failing:
            log.info("trial %d: heartbeats recorded again", number)
        self._failing = False
