"""The engine loop: schedule, execute, update, observe. One iteration per ``step()``.

The same loop runs under a virtual clock (the discrete-event simulator advances time
by each iteration's modelled cost) and under the wall clock (the server, where the
executor really spends the time), so the simulator and the server report the same
series from the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from slopilot.engine.config import EngineConfig
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import Request, RequestStatus
from slopilot.engine.scheduler import Scheduler, StepOutput

# What an iteration with nothing to run (every running request stalled) "returns".
_NOTHING_RAN = ModelRunnerOutput(sampled={})


class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput: ...


class Clock(Protocol):
    def now(self) -> float: ...
    def advance(self, dt: float) -> None: ...


class WallClock:
    """Time passes by itself: the executor already spent the iteration's time."""

    def __init__(self, fn: Callable[[], float] = time.monotonic) -> None:
        self._fn = fn

    @property
    def source(self) -> Callable[[], float]:
        """What it reads: ``time.monotonic`` unless a test gave its own."""
        return self._fn

    def now(self) -> float:
        return self._fn()

    def advance(self, dt: float) -> None:
        return None


class VirtualClock:
    """Simulated time: advances only by what the cost model says an iteration took."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class StepObserver(Protocol):
    """Receives per-iteration and per-token events (metrics, simulator statistics)."""

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None: ...
    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None: ...
    def on_finished(self, req: Request, now: float) -> None: ...


class LLMEngine:
    def __init__(self, config: EngineConfig, executor: Executor, num_gpu_blocks: int,
                 num_cpu_blocks: int = 0, swap_s_per_block: float = 0.0,
                 clock: Clock | None = None,
                 observers: list[StepObserver] | None = None,
                 decode_knee: int | None = None, graph_batch: int | None = None,
                 max_model_len: int | None = None) -> None:
        # The model's context bounds what the scheduler ever serves (given, or the
        # executor's own): the server's limit, which the simulator judges requests by.
        self.scheduler = Scheduler(
            config, num_gpu_blocks, num_cpu_blocks, swap_s_per_block,
            max_model_len=(max_model_len if max_model_len is not None
                           else getattr(executor, "max_model_len", None)))
        self.executor = executor
        # The knee of the decode_spill shape feature (sim/shape.py), stamped on every
        # iteration for the cost model and the metrics: given, or the executor's own.
        self.decode_knee = (decode_knee if decode_knee is not None
                            else getattr(executor, "decode_knee_tokens", None))
        # Likewise the largest decode batch the executor replays from a CUDA graph.
        self.graph_batch = (graph_batch if graph_batch is not None
                            else getattr(executor, "graph_batch", None))
        self.clock: Clock = clock if clock is not None else WallClock()
        self.observers: list[StepObserver] = list(observers or [])
        self.num_steps = 0
        self.busy_s = 0.0
        # Seconds from the previous iteration's end (or, after idling, this step's start)
        # to this iteration's end: the token gap a request in both iterations sees, so
        # scheduling and bookkeeping count, not only the executor (the twin models both).
        self.last_step_s = 0.0
        self._last_end: float | None = None

    @property
    def config(self) -> EngineConfig:
        """The scheduler's: it owns the config, and a live change goes to it
        (``scheduler.update_config``), swapped in between iterations."""
        return self.scheduler.config

    def add_request(self, req: Request) -> list[Request]:
        """Queue ``req``; the requests displaced to make room for it (``add_requests``)."""
        return self.add_requests((req,))

    def add_requests(self, reqs: Sequence[Request]) -> list[Request]:
        """Queue ``reqs`` all or none (``Scheduler.add_requests``). Returns the requests a
        full queue displaced for them: refusals for load, for the caller to answer and
        count; no observer sees them finish, as none sees a request refused at the door."""
        now = self.clock.now()
        for req in reqs:
            if req.arrival_time == 0.0:
                req.arrival_time = now
        displaced = self.scheduler.add_requests(reqs)
        for req in reqs:
            req.queued_time = now
        return displaced

    def abort_request(self, request_id: str,
                      status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> Request | None:
        req = self.scheduler.abort_request(request_id, status)
        if req is not None:
            self._finished(req, self.clock.now())
        return req

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepOutput:
        """Run one iteration: who got a token, and who finished (with a token or not)."""
        sched = self.scheduler
        started = self.clock.now()
        out = sched.schedule(started)
        if out.is_empty:
            self._last_end = None  # the caller waits before it tries again
            result = _NOTHING_RAN
        else:
            result = self._execute(out, started)
        update = sched.update_from_output(out, result)
        now = self.clock.now()
        if not out.is_empty:
            for obs in self.observers:
                obs.on_step(self, out, result.elapsed_s, now)
        self._tokens(update.new_tokens, now)
        for req in update.finished:
            self._finished(req, now)
        if not sched.has_work():
            self._last_end = None  # idle next: the next step's time starts at its start
        return update

    def _execute(self, out: SchedulerOutput, started: float) -> ModelRunnerOutput:
        last_end = self._last_end
        out.after_idle = last_end is None
        out.decode_knee = self.decode_knee
        out.graph_batch = self.graph_batch
        result = self.executor.execute(out)
        self.clock.advance(result.elapsed_s)
        now = self.clock.now()
        self.last_step_s = now - (started if last_end is None else last_end)
        self._last_end = now
        self.num_steps += 1
        self.busy_s += result.elapsed_s
        return result

    def _tokens(self, reqs: list[Request], now: float) -> None:
        observers = self.observers
        for req in reqs:
            last = req.last_token_time
            req.last_token_time = now
            if last is None:
                req.first_token_time = now
                for obs in observers:
                    obs.on_first_token(req, now - req.arrival_time, now)
            else:
                for obs in observers:
                    obs.on_token_gap(req, now - last, now)

    def _finished(self, req: Request, now: float) -> None:
        req.finished_time = now
        for obs in self.observers:
            obs.on_finished(req, now)

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Step until nothing is left (tests and offline runs)."""
        for _ in range(max_steps):
            if not self.has_work():
                return
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")
