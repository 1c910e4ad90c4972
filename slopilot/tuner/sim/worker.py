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
"""

from __future__ import annotations

import copyreg
import logging
import multiprocessing
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
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


def _init_worker(level: int) -> None:
    # A spawned process starts with logging unconfigured: the offline study's findings
    # would be lost and Optuna's per-study INFO lines would reach the user's terminal.
    logging.basicConfig(level=level, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("optuna").setLevel(max(level, logging.WARNING))


class SimWorker:
    """Spawned processes (``workers``, one by default) that run simulator calls."""

    def __init__(self, workers: int = 1) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r}: expected a process count >= 1")
        self.workers = workers
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._start()

    def _start(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=(logging.getLogger("slopilot").getEffectiveLevel(),))
                self._pool.submit(_ready)  # spawns the process now, not at the first call
            return self._pool

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self._start()
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            with self._lock:  # the next call gets a fresh worker
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise

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


class WorkerOffline:
    """OfflineSearch: ``SimOffline`` run in the worker."""

    def __init__(self, worker: SimWorker, search: SimOffline) -> None:
        self.worker, self.search = worker, search

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> Sequence[tuple[dict[str, Any], bool]]:
        return self.worker.call(_best_configs, self.search, scenario, replicas, dict(start), k)


class WorkerPlanner:
    """The controller's Planner: ``CapacityPlanner``'s search run in the worker."""

    def __init__(self, worker: SimWorker, *, duration_s: float | None = 120.0,
                 seed: int | None = 0) -> None:
        CapacityPlanner(duration_s=duration_s, seed=seed)  # the same checks, here and now
        self.worker, self.duration_s, self.seed = worker, duration_s, seed

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        return self.worker.call(_capacity, self.duration_s, self.seed, scenario,
                                dict(config), lo, hi, margin)
