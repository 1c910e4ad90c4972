"""The controller's simulator work in a worker process, so its host stays responsive.

The warm-start study (``SimOffline``) and the capacity search (``CapacityPlanner``) run
the simulator for seconds of pure-Python CPU. In the process that hosts the controller
they hold the GIL that long: kopf's event loop (peering keep-alives, watch events) and
the demo's load generator stall, and a stalled load generator sends less, which then
reads as a load shift and voids the trial windows that follow. Here the caller blocks on
a future (GIL released) while one worker process simulates.

The worker is spawned, not forked: the host has threads (kopf, uvicorn, the load
generator) and a forked child can inherit a lock held by one of them. It starts in the
background at construction, so its imports are paid before the first alert; a worker
that dies is replaced at the next call and the call's error reaches the controller,
which rolls back as for any error.

Bounded, because one deployment's search must not take the operator down with it: each
call has a time limit (``timeout_s``, counted from when it starts to run; past it the
worker is killed and the call raises ``SimTimeout``), and the worker's address space is
capped (``memory_limit_mb``: an allocation past it is a MemoryError in that call alone).
"""

from __future__ import annotations

import copyreg
import logging
import multiprocessing
import resource
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from types import MappingProxyType
from typing import Any, TypeVar

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityAnswer, CapacityPlanner
from slopilot.tuner.sim.adapters import SimOffline

T = TypeVar("T")

# Scenario and SearchSpace keep their maps read-only as mappingproxy, which pickle cannot
# take by default; the worker receives them as the same read-only maps.
def _read_only(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


copyreg.pickle(MappingProxyType, lambda m: (_read_only, (dict(m),)))


def _ready() -> bool:
    return True


DEFAULT_MEMORY_LIMIT_MB = 1536
MIN_MEMORY_LIMIT_MB = 256  # the interpreter and the simulator's imports take ~170 MB
POLL_S = 0.5


class SimTimeout(TimeoutError):
    """A simulator call ran past its time limit; its worker was killed."""


def _init_worker(level: int, memory_limit_mb: int | None) -> None:
    # A spawned process starts with logging unconfigured: the offline study's findings
    # would be lost and Optuna's per-study INFO lines would reach the user's terminal.
    logging.basicConfig(level=level, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("optuna").setLevel(max(level, logging.WARNING))
    if memory_limit_mb is not None:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class SimWorker:
    """Spawned processes (``workers``, one by default) that run simulator calls."""

    def __init__(self, workers: int = 1, *,
                 memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r}: expected a process count >= 1")
        if memory_limit_mb is not None and memory_limit_mb < MIN_MEMORY_LIMIT_MB:
            raise ValueError(f"memory_limit_mb={memory_limit_mb!r}: expected at least "
                             f"{MIN_MEMORY_LIMIT_MB} (or None for no limit)")
        self.workers = workers
        self.memory_limit_mb = memory_limit_mb
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._start()

    def _start(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=(logging.getLogger("slopilot").getEffectiveLevel(),
                              self.memory_limit_mb))
                self._pool.submit(_ready)  # spawns the process now, not at the first call
            return self._pool

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """``fn(*args)`` in the worker; past ``timeout_s`` of running, SimTimeout."""
        pool = self._start()
        future = pool.submit(fn, *args)
        try:
            return self._wait(future, timeout_s)
        except SimTimeout:
            self._discard(pool, kill=True)
            raise
        except BrokenProcessPool:
            self._discard(pool, kill=False)  # the next call gets a fresh worker
            raise

    @staticmethod
    def _wait(future: Future[T], timeout_s: float | None) -> T:
        if timeout_s is None:
            return future.result()
        deadline: float | None = None
        while True:
            left = POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return future.result(timeout=left)
            except FutureTimeout:
                # The clock starts once the call runs, not while it queues behind another
                # deployment's call.
                if deadline is None:
                    if future.running():
                        deadline = time.monotonic() + timeout_s
                elif time.monotonic() >= deadline:
                    raise SimTimeout(f"the simulator call ran past its {timeout_s:g} s "
                                     "limit; its worker was stopped") from None

    def _discard(self, pool: ProcessPoolExecutor, *, kill: bool) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        if kill:
            # concurrent.futures cannot cancel a running call (Python 3.14 adds
            # kill_workers); ending the processes is the only way to stop it.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SimWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _best_configs(search: SimOffline, scenario: Scenario, replicas: int,
                  start: Mapping[str, Any], k: int) -> Sequence[tuple[dict[str, Any], bool]]:
    return search.best_configs(scenario, replicas, start, k)


def _capacity(duration_s: float | None, seed: int | None, scenario: Scenario,
              config: Mapping[str, Any], lo: int, hi: int, margin: float) -> CapacityAnswer:
    return CapacityPlanner(duration_s=duration_s, seed=seed).search(
        scenario, config, lo, hi, margin=margin)


def _positive(timeout_s: float) -> float:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: expected seconds above 0")
    return float(timeout_s)


class WorkerOffline:
    """OfflineSearch: ``SimOffline`` run in the worker, within ``timeout_s``."""

    def __init__(self, worker: SimWorker, search: SimOffline, *,
                 timeout_s: float = 600.0) -> None:
        self.worker, self.search, self.timeout_s = worker, search, _positive(timeout_s)

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> Sequence[tuple[dict[str, Any], bool]]:
        return self.worker.call(_best_configs, self.search, scenario, replicas, dict(start), k,
                                timeout_s=self.timeout_s)


class WorkerPlanner:
    """The controller's Planner: ``CapacityPlanner``'s search run in the worker, within
    ``timeout_s``."""

    def __init__(self, worker: SimWorker, *, duration_s: float | None = 120.0,
                 seed: int | None = 0, timeout_s: float = 300.0) -> None:
        CapacityPlanner(duration_s=duration_s, seed=seed)  # the same checks, here and now
        self.worker, self.duration_s, self.seed = worker, duration_s, seed
        self.timeout_s = _positive(timeout_s)

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        return self.worker.call(_capacity, self.duration_s, self.seed, scenario,
                                dict(config), lo, hi, margin, timeout_s=self.timeout_s)
