"""The controller's simulator work in worker processes, so its host stays responsive.

The warm-start study (``SimOffline``), the capacity search (``CapacityPlanner``) and the
twin check's window (``WorkerTwin``) run the simulator for seconds of pure-Python CPU. In
the process that hosts the controller they share the GIL with kopf's event loop
(peering keep-alives, watch events) and the demo's load generator, which then run at a
sixth of their pace for as long (``benchmarks/twin_check_stall.py``); a slowed load
generator sends less, which then reads as a load shift and voids the trial windows that
follow. Here the caller blocks (GIL released) while a worker process simulates.

Workers are spawned, not forked: the host has threads (kopf, uvicorn, the load
generator) and a forked child can inherit a lock held by one of them. They start in the
background at construction, so their imports are paid before the first alert. A worker
whose process dies during a call, or is killed past the call's time limit, starts a new
one in the background at once (that call failing with ``SimulatorFailed`` or
``SimTimeout``: the loop goes on without the twin's answer), so the next caller's time
limit is not spent on the spawn and imports; one that died while idle is replaced
before the call runs.

Shared by every deployment an operator runs, so bounded and kept apart:

- Each worker is a pool of its own with one process, and a call has a worker to itself.
  A call waits for a free worker, untimed; its time limit
  (``timeout_s``) counts from when it runs, and past it only its own process is killed
  (``SimTimeout``; the loop then goes on without the twin's answer, as past the memory
  cap: ``ports.NO_ANSWER``). A single pool would mark a call running as soon as it
  joined the worker's queue, so it timed out behind another deployment's call and killed
  that one.
- Waiting calls are served in turn by tenant (``tenant``: the operator passes the CR's
  namespace; the demo and ``slopilot tune`` one ``DEFAULT_TENANT``), first come, first
  served within one (``fair_turns.FairTurns``): a namespace's thousand waiting calls
  delay another namespace's call by at most one of its own per freed worker, not by a
  thousand. ``per_tenant`` caps the workers one tenant holds at once (None: no cap).
- ``queue_timeout_s``: how long a call may wait for a worker; past it ``SimulatorBusy``,
  and the loop goes on without the twin's answer (``advice.py``).
- Each worker's address space is capped (``memory_limit_mb``: an allocation past it is
  a MemoryError in that call alone).
"""

from __future__ import annotations

import copyreg
import logging
import multiprocessing
import os
import resource
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from types import MappingProxyType
from typing import Any, TypeVar

from slopilot.engine.alert_factors import AlertFactors
from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityAnswer, CapacityPlanner
from slopilot.tuner.loop.ports import SimulatorBusy, SimulatorFailed
from slopilot.tuner.loop.twin_predict import ClassP99, predicted_p99s
from slopilot.tuner.sim.adapters import SimOffline
from slopilot.tuner.sim.fair_turns import FairTurns
from slopilot.tuner.study.sample_floor import SIM_MIN_CLASS_REQUESTS

T = TypeVar("T")

# Scenario and SearchSpace keep their maps read-only as mappingproxy, which pickle cannot
# take by default; the worker receives them as the same read-only maps.
def _read_only(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


copyreg.pickle(MappingProxyType, lambda m: (_read_only, (dict(m),)))


def _ready() -> bool:
    return True


DEFAULT_TENANT = "default"
"""Whose calls they are where one tenant makes them all (the demo, ``slopilot tune``):
first come, first served, as among one tenant's calls anywhere."""
DEFAULT_MEMORY_LIMIT_MB = 1536
MIN_MEMORY_LIMIT_MB = 256  # the interpreter and the simulator's imports take ~170 MB


class SimTimeout(TimeoutError):
    """A simulator call ran past its time limit; its worker was killed."""


def _init_worker(level: int, memory_limit_mb: int | None) -> None:
    _exit_with_parent()
    # A terminal's Ctrl-C reaches the whole process group: the worker died of it mid-call
    # with a traceback, while its parent meant to finish (the demo writes its report).
    # Its parent stops it, or the parent's death does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A spawned process starts with logging unconfigured: the offline study's findings
    # would be lost and Optuna's per-study INFO lines would reach the user's terminal.
    logging.basicConfig(level=level, format="%(levelname)s:%(name)s:%(message)s")
    logging.getLogger("optuna").setLevel(max(level, logging.WARNING))
    if memory_limit_mb is not None:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _exit_with_parent() -> None:
    """End this worker when the process that spawned it dies, SIGKILL included.

    A pool's worker blocks on its call queue, which a dead parent never closes: after a
    ``kill -9`` of the demo (or the operator) it ran on under init, and kept
    multiprocessing's resource tracker alive with it. The spawn's sentinel pipe ends when
    the parent's process does (not one of its threads, as prctl's parent-death signal
    would: the operator starts workers from threads that come and go)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent's end of the pipe closes: it died
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class _Process:
    """One worker: a single-process pool, replaced when it dies or is killed."""

    def __init__(self, memory_limit_mb: int | None) -> None:
        self.memory_limit_mb = memory_limit_mb
        self._pool: ProcessPoolExecutor | None = None
        self._start()

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(logging.getLogger("slopilot").getEffectiveLevel(),
                          self.memory_limit_mb))
            self._pool.submit(_ready)  # spawns the process now, not at the first call
        return self._pool

    def call(self, fn: Callable[..., T], args: tuple[Any, ...], timeout_s: float | None
             ) -> T:
        # Called by the one caller holding this worker: its process is idle (or warming
        # up), so the call runs at once and the limit is the call's own.
        try:
            future = self._start().submit(fn, *args)
        except BrokenProcessPool:
            # The process died between calls (an OOM kill picks an idle worker too):
            # nothing of this call ran, so it runs on a fresh one.
            self._discard(kill=False)
            future = self._start().submit(fn, *args)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            self._discard(kill=True)
            self._start()  # its replacement spawns and imports before the next call
            raise SimTimeout(f"the simulator call ran past its {timeout_s:g} s limit; "
                             "its worker was stopped") from None
        except BrokenProcessPool as exc:
            self._discard(kill=False)
            self._start()  # as past the time limit: the next call finds it started
            raise SimulatorFailed(
                "the simulator process died during the call (killed, by the kernel for "
                "memory say, or it could not start); the next call gets a new one") from exc

    def _discard(self, *, kill: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:
            # concurrent.futures cannot cancel a running call (Python 3.14 adds
            # kill_workers); ending the process is the only way to stop it.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class SimWorker:
    """``workers`` spawned processes (one by default) that run simulator calls, one call
    per process at a time; see the module docstring."""

    def __init__(self, workers: int = 1, *,
                 memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
                 per_tenant: int | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r}: expected a process count >= 1")
        if memory_limit_mb is not None and memory_limit_mb < MIN_MEMORY_LIMIT_MB:
            raise ValueError(f"memory_limit_mb={memory_limit_mb!r}: expected at least "
                             f"{MIN_MEMORY_LIMIT_MB} (or None for no limit)")
        if per_tenant is not None and (isinstance(per_tenant, bool) or per_tenant < 1):
            raise ValueError(f"per_tenant={per_tenant!r}: expected processes one tenant "
                             "may hold at once >= 1 (or None for no cap)")
        self.workers = workers
        self.memory_limit_mb = memory_limit_mb
        self.per_tenant = per_tenant
        self._all = [_Process(memory_limit_mb) for _ in range(workers)]
        # A worker whose process was killed goes back too: it starts a new one.
        self._turns = FairTurns(self._all, per_tenant=per_tenant)

    @property
    def waiting(self) -> int:
        """Calls waiting for a free worker now."""
        return self._turns.waiting

    def held(self, tenant: str) -> int:
        """Workers running ``tenant``'s calls now."""
        return self._turns.held(tenant)

    def call(self, fn: Callable[..., T], *args: Any, tenant: str = DEFAULT_TENANT,
             timeout_s: float | None = None, queue_timeout_s: float | None = None) -> T:
        """``fn(*args)`` in a free worker, waiting in ``tenant``'s turn: SimulatorBusy
        when none is free within ``queue_timeout_s`` (None: wait as long as it takes);
        SimTimeout past ``timeout_s`` of running."""
        if queue_timeout_s is not None and not queue_timeout_s >= 0:
            raise ValueError(f"queue_timeout_s={queue_timeout_s!r}: expected seconds >= 0 "
                             "(or None to wait as long as it takes)")
        worker = self._turns.acquire(tenant, queue_timeout_s)
        if worker is None:
            assert queue_timeout_s is not None  # an untimed wait ends with a worker
            cap = "" if self.per_tenant is None else f" (at most {self.per_tenant} at once)"
            raise SimulatorBusy(
                f"no free simulator process within {queue_timeout_s:g} s: all "
                f"{self.workers} simulator process(es) serve other calls, {tenant!r} "
                f"holds {self.held(tenant)}{cap}")
        try:
            return worker.call(fn, args, timeout_s)
        finally:
            self._turns.release(tenant, worker)

    def close(self) -> None:
        for worker in self._all:
            worker.close()

    def __enter__(self) -> SimWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _best_configs(search: SimOffline, scenario: Scenario, replicas: int,
                  start: Mapping[str, Any], k: int) -> Sequence[tuple[dict[str, Any], bool]]:
    return search.best_configs(scenario, replicas, start, k)


def _capacity(duration_s: float | None, seed: int | None, min_class_requests: int,
              scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
              margin: float) -> CapacityAnswer:
    return CapacityPlanner(duration_s=duration_s, seed=seed,
                           min_class_requests=min_class_requests).search(
        scenario, config, lo, hi, margin=margin)


def _p99s(twin: Scenario, config: Mapping[str, Any], replicas: int, window_s: float,
          seed: int, bucketed: bool, factors: AlertFactors) -> tuple[ClassP99, ...]:
    return predicted_p99s(twin, config, replicas, window_s, seed=seed, bucketed=bucketed,
                          factors=factors)


def _positive(timeout_s: float) -> float:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: expected seconds above 0")
    return float(timeout_s)


def _queue_limit(queue_timeout_s: float) -> float:
    if not queue_timeout_s >= 0:
        raise ValueError(f"queue_timeout_s={queue_timeout_s!r}: expected seconds >= 0")
    return float(queue_timeout_s)


QUEUE_TIMEOUT_S = 120.0
"""How long a deployment's warm start or capacity plan waits for a free simulator
process before its loop goes on without the answer (live trials, live evidence)."""


class WorkerOffline:
    """OfflineSearch: ``SimOffline`` run in a worker, within ``timeout_s`` once it runs
    and ``queue_timeout_s`` waiting for a free one."""

    def __init__(self, worker: SimWorker, search: SimOffline, *,
                 timeout_s: float = 600.0, queue_timeout_s: float = QUEUE_TIMEOUT_S,
                 tenant: str = DEFAULT_TENANT) -> None:
        self.worker, self.search, self.timeout_s = worker, search, _positive(timeout_s)
        self.queue_timeout_s = _queue_limit(queue_timeout_s)
        self.tenant = tenant

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> Sequence[tuple[dict[str, Any], bool]]:
        return self.worker.call(_best_configs, self.search, scenario, replicas, dict(start), k,
                                tenant=self.tenant, timeout_s=self.timeout_s,
                                queue_timeout_s=self.queue_timeout_s)


class WorkerPlanner:
    """The controller's Planner: ``CapacityPlanner``'s search run in a worker, within
    ``timeout_s`` once it runs and ``queue_timeout_s`` waiting for a free one."""

    def __init__(self, worker: SimWorker, *, duration_s: float | None = 120.0,
                 seed: int | None = 0, timeout_s: float = 300.0,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S,
                 tenant: str = DEFAULT_TENANT,
                 min_class_requests: int = SIM_MIN_CLASS_REQUESTS) -> None:
        # The same checks, here and now.
        CapacityPlanner(duration_s=duration_s, seed=seed, min_class_requests=min_class_requests)
        self.worker, self.duration_s, self.seed = worker, duration_s, seed
        self.min_class_requests = min_class_requests
        self.timeout_s = _positive(timeout_s)
        self.queue_timeout_s = _queue_limit(queue_timeout_s)
        self.tenant = tenant

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        return self.worker.call(_capacity, self.duration_s, self.seed,
                                self.min_class_requests, scenario,
                                dict(config), lo, hi, margin, tenant=self.tenant,
                                timeout_s=self.timeout_s,
                                queue_timeout_s=self.queue_timeout_s)


CHECK_QUEUE_TIMEOUT_S = 5.0
"""How long the twin check's window waits for a free simulator process. Its P99s are a
report unless ``twin_max_latency_error`` is set, and the warm start or capacity plan
after it in the same tick waits ``QUEUE_TIMEOUT_S`` too: behind another deployment's
study, the check waiting as long doubled the tick's wait before the loop acts."""


class WorkerTwin:
    """The controller's TwinSimulator: the twin check's window simulated in a worker,
    within ``timeout_s`` once it runs and ``queue_timeout_s`` waiting for a free one."""

    def __init__(self, worker: SimWorker, *, timeout_s: float = 300.0,
                 queue_timeout_s: float = CHECK_QUEUE_TIMEOUT_S,
                 tenant: str = DEFAULT_TENANT) -> None:
        self.worker, self.timeout_s = worker, _positive(timeout_s)
        self.queue_timeout_s = _queue_limit(queue_timeout_s)
        self.tenant = tenant

    def p99s(self, twin: Scenario, config: Mapping[str, Any], replicas: int,
             window_s: float, *, seed: int, bucketed: bool,
             factors: AlertFactors) -> tuple[ClassP99, ...]:
        return self.worker.call(_p99s, twin, dict(config), replicas, window_s, seed,
                                bucketed, factors, tenant=self.tenant,
                                timeout_s=self.timeout_s,
                                queue_timeout_s=self.queue_timeout_s)
