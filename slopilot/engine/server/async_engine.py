"""The engine loop on its own thread, and the asyncio side that talks to it.

``LLMEngine.step()`` may block for a whole iteration (a torch forward pass, or the
simulated executor sleeping the modelled time), so it runs on one dedicated thread that
owns the engine: only that thread touches the scheduler. Everything else reaches it
through an inbox of commands, run between iterations, never mid-step::

    asyncio loop (HTTP handlers)             engine thread
    ----------------------------             -------------
    add_request / abort / update_config ──► inbox (deque + condition)
                                               run commands
                                               step()  (blocks: forward / sleep)
    RequestStream.__anext__  ◄── call_soon_threadsafe(deliver, token events)

Admission runs there too, between iterations: a full queue may displace a request that
has not started for a more urgent newcomer (``queue_room.py``) inside the newcomer's own
command, so no iteration can start the victim meanwhile; its stream is told on the loop,
as tokens are (``DisplacedError``).

When there is no work the thread waits on the condition (no busy spin); on entering an
idle period it refreshes the metric gauges (and, with ``check_integrity`` - tests and
``slopilot serve --check-integrity`` - runs the scheduler's O(blocks) self-check, which
on a big KV pool takes seconds: never on by default, so going idle costs nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.queue_room import displaced_message
from slopilot.engine.request import FinishReason, Priority, Request, RequestStatus
from slopilot.engine.scheduler import DisplacedError, DuplicateRequestError, StepOutput
from slopilot.engine.server.request_stream import RequestStream, StreamDelta
from slopilot.engine.server.retry_after import RetryAfter

__all__ = ["AsyncEngine", "DrainedError", "EngineDeadError", "EngineDrainingError",
           "RequestStream", "StreamDelta", "TooManyChoicesError"]

log = logging.getLogger(__name__)
T = TypeVar("T")
# One request's news from an iteration: its stream, the token (None: it ended without
# one), how it finished, and when the engine made the token (its clock).
_Event = tuple[RequestStream, int | None, FinishReason | None, float]
# After an iteration in which nothing could run (every running request stalled on KV),
# wait this long for a command before trying again, instead of spinning.
_STALL_WAIT_S = 0.005


class EngineDrainingError(RuntimeError):
    """The engine is draining or stopped and admits no new request (HTTP 503)."""


class DrainedError(EngineDrainingError):
    """A drain past its timeout ended a request none of whose choices had a token: its
    client is answered as one refused while draining (503), so it retries on another
    replica; a 200 with no text reads to an OpenAI SDK as a success it does not retry."""


_DRAINING = "the server is draining; retry on another replica"


class EngineDeadError(RuntimeError):
    """The engine loop crashed; no request can be served (HTTP 500)."""


class TooManyChoicesError(ValueError):
    """More choices than the waiting queue holds at all: admitted all or none, they
    never fit however empty the queue, so this is bad input (HTTP 400), not a full
    queue to retry later (429)."""


def _resolve(fut: asyncio.Future[Any], result: Any = None,
             error: BaseException | None = None) -> None:
    if fut.done():  # the awaiting handler was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class AsyncEngine:
    """Runs one ``LLMEngine`` on a dedicated thread; the asyncio API is below.

    Call ``start()`` from the running event loop; ``shutdown()`` drains and joins.
    Every request must come through ``add_request`` (the thread tracks its streams).
    """

    def __init__(self, engine: LLMEngine, metrics: MetricsObserver | None = None, *,
                 check_integrity: bool = False) -> None:
        self.engine = engine
        self.metrics = metrics
        self.check_integrity = check_integrity
        self._cond = threading.Condition()
        self._inbox: deque[Callable[[], None]] = deque()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Engine-thread state: the streams of requests the scheduler still holds, each
        # with the requests admitted with it (the choices of its HTTP request).
        self._live: dict[str, tuple[Request, RequestStream, tuple[Request, ...]]] = {}
        # Loop-side state.
        self._active: dict[str, RequestStream] = {}
        self._all_done = asyncio.Event()
        self._all_done.set()
        # Replies the engine thread owes; failed together if the thread dies first.
        self._pending: set[asyncio.Future[Any]] = set()
        self._config_lock = threading.Lock()
        self._target_config = engine.config
        self.draining = False
        self.error: BaseException | None = None
        self.num_idle_checks = 0
        self.retry_after = RetryAfter()
        engine.observers.append(self.retry_after)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine.start() was already called")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="slopilot-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_active(self) -> int:
        """Requests admitted and not yet finished, as the asyncio side sees them."""
        return len(self._active)

    def retry_after_s(self) -> int:
        """The 429's Retry-After: time for the waiting queue to get through (an estimate)."""
        # num_waiting is read off the engine thread: one int, at worst an iteration stale.
        return self.retry_after.seconds(self.engine.scheduler.num_waiting,
                                        self.engine.clock.now())

    @property
    def config(self) -> EngineConfig:
        """The newest accepted config: live now, or from the next iteration."""
        return self._target_config

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting; let running requests finish up to ``timeout_s``; end the rest:
        those of an HTTP request none of whose choices had a token are refused
        (``DrainedError``), the others aborted, as cut short.

        Returns how many requests were ended.
        """
        self.draining = True
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout=max(timeout_s, 0.0))
            return 0
        except TimeoutError:
            pass
        left = list(self._active)
        # One command: no iteration between two of them can start a queued choice whose
        # sibling was already refused, and their ends reach the loop together.
        self._submit(lambda: self._end_drained(left))
        await self._all_done.wait()
        return len(left)

    async def shutdown(self, drain_timeout_s: float = 0.0) -> int:
        """Drain, then stop and join the engine thread; returns the aborted count."""
        aborted = await self.drain(drain_timeout_s) if self.is_running else 0
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        return aborted

    # ------------------------------------------------------------------ asyncio API
    async def add_request(self, req: Request) -> RequestStream:
        """Queue ``req``; returns its stream once the engine thread has admitted it.

        Raises what ``Scheduler.add_request`` raises (QueueFullError, PromptTooLongError,
        DuplicateRequestError), EngineDrainingError, or EngineDeadError. Admitted, it may
        still give way to a more urgent request in a full queue while it has not started:
        its stream then raises DisplacedError (a QueueFullError) before any token.
        """
        return (await self.add_requests([req]))[0]

    async def add_requests(self, reqs: list[Request]) -> list[RequestStream]:
        """Queue several requests (the choices of one HTTP request) all or none: in one
        step of the engine thread, so no iteration runs between them, and if one is
        refused the others are taken back before any runs."""
        self._check_accepting()
        ids = [r.request_id for r in reqs]
        if len(set(ids)) != len(ids) or any(rid in self._active for rid in ids):
            # Refused before anything is touched: a live request's stream stays its own.
            raise DuplicateRequestError(f"request ids {ids} repeat one or are already in use")
        now = self.engine.clock.now()
        for req in reqs:
            if req.arrival_time == 0.0:
                # Stamped here, not on the engine thread: waiting for the iteration in
                # flight to end is part of the client's time to first token.
                req.arrival_time = now
        streams = [RequestStream(req, self) for req in reqs]
        fut = self._future()

        def add() -> None:
            try:
                if self.draining:
                    raise EngineDrainingError(_DRAINING)
                # Checked here, against the live config (max_waiting is a live knob).
                limit = self.engine.config.max_waiting
                if len(reqs) > limit:
                    raise TooManyChoicesError(
                        f"{len(reqs)} choices can never be admitted together: the waiting "
                        f"queue holds at most max_waiting={limit}")
                displaced = self.engine.add_requests(reqs)  # all or none
            except Exception as exc:
                self._post(_resolve, fut, None, exc)
                return
            group = tuple(reqs)
            for req, stream in zip(reqs, streams, strict=True):
                self._live[req.request_id] = (req, stream, group)
            self._post(_resolve, fut, None, None)
            if displaced:
                self._refuse_displaced(displaced, max(r.priority for r in reqs), limit)

        # Active before the engine sees them: tokens may arrive before ``fut`` wakes us.
        for rid, stream in zip(ids, streams, strict=True):
            self._active[rid] = stream
        self._all_done.clear()
        self._submit(add)
        try:
            await fut
        except BaseException as exc:
            for rid in ids:
                self._active.pop(rid, None)
            if not self._active:
                self._all_done.set()
            if isinstance(exc, asyncio.CancelledError):
                for rid in ids:
                    self.abort(rid)
            raise
        return streams

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """End a request and free its blocks at the next gap between iterations.

        ``stopped`` says the server matched a stop string in its text: it finished
        normally (counted as ``stop``), not aborted. Thread-safe and idempotent;
        unknown or finished ids are ignored.
        """
        status = RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_ABORTED

        def abort() -> None:
            entry = self._live.pop(request_id, None)
            self.engine.abort_request(request_id, status)
            if entry is not None:
                reason = FinishReason.STOP if stopped else FinishReason.ABORT
                self._post(self._deliver, [(entry[1], None, reason, 0.0)])
        self._submit(abort)

    async def update_config(self, overrides: Mapping[str, Any]) -> EngineConfig:
        """Validate ``overrides`` whole against the newest config and stage the result.

        Raises ConfigError (nothing changes) on any bad, unknown or non-live knob. The
        scheduler swaps the new config in at the start of its next iteration.
        """
        self._check_alive()
        with self._config_lock:
            new = self._target_config.with_overrides(overrides, live_only=True)
            fut = self._future()

            def stage() -> None:
                try:
                    self.engine.scheduler.update_config(new)
                except Exception as exc:
                    self._post(_resolve, fut, None, exc)
                    return
                if self.metrics is not None and not self.engine.has_work():
                    # Live at once on an idle engine: the gauges say so before any step.
                    self.metrics.refresh(self.engine, self.engine.clock.now())
                self._post(_resolve, fut, None, None)

            self._submit(stage)
            self._target_config = new
        await fut
        return new

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between iterations; return its result.

        The safe way to read scheduler state while the loop runs (tests, admin views).
        """
        self._check_alive()
        fut: asyncio.Future[T] = self._future()

        def run() -> None:
            try:
                result = fn(self.engine)
            except Exception as exc:
                self._post(_resolve, fut, None, exc)
            else:
                self._post(_resolve, fut, result, None)

        self._submit(run)
        return await fut

    # ------------------------------------------------------------------ helpers
    def _loop_ref(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AsyncEngine.start() has not been called")
        return self._loop

    def _future(self) -> asyncio.Future[Any]:
        fut = self._loop_ref().create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    def _check_alive(self) -> None:
        if self.error is not None:
            raise EngineDeadError(f"the engine loop failed ({type(self.error).__name__}); "
                                  "the server log has the details; restart the server")
        if not self.is_running:
            raise EngineDrainingError("the engine is stopped")

    def _check_accepting(self) -> None:
        self._check_alive()
        if self.draining:
            raise EngineDrainingError(_DRAINING)

    def _submit(self, cmd: Callable[[], None]) -> None:
        with self._cond:
            self._inbox.append(cmd)
            self._cond.notify()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the asyncio loop (from the engine thread)."""
        # A closed loop raises RuntimeError: nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop_ref().call_soon_threadsafe(fn, *args)

    def _deliver(self, events: list[_Event]) -> None:
        active = self._active
        for stream, token, finish, made_at in events:
            stream._push(token, finish, made_at=made_at)
            if finish is not None:
                active.pop(stream.request_id, None)
        if not active:
            self._all_done.set()

    def _refuse_displaced(self, displaced: list[Request], by: Priority,
                          max_waiting: int) -> None:
        """Engine thread: tell the streams of requests a full queue displaced for a more
        urgent one (already finished by the scheduler) that they were refused. None of
        them has started, so none has a token: its handler still owes its client the
        status, and answers the 429 (``openai_routes``)."""
        refused: list[tuple[RequestStream, BaseException]] = []
        for req in displaced:
            entry = self._live.pop(req.request_id, None)
            if entry is not None:
                refused.append((entry[1], DisplacedError(
                    displaced_message(req.priority, by, max_waiting))))
        if refused:
            self._post(self._deliver_refusals, refused)

    def _end_drained(self, ids: list[str]) -> None:
        """Engine thread: end the requests a drain past its timeout left. Those of an HTTP
        request none of whose choices made a token (all still held, none with output) are
        refused, so their handler can still answer 503 (``openai_routes``): none had a
        token to send, so none can have had its status sent either. The others are
        aborted as ``abort`` would, their streams ended as cut short."""
        live = self._live
        unstarted = {rid for rid in ids if rid in live and all(
            r.request_id in live and not r.output_token_ids for r in live[rid][2])}
        events: list[_Event] = []
        refused: list[tuple[RequestStream, BaseException]] = []
        for rid in ids:
            entry = live.pop(rid, None)
            self.engine.abort_request(rid, RequestStatus.FINISHED_ABORTED)
            if entry is None:
                continue
            if rid in unstarted:
                refused.append((entry[1], DrainedError(_DRAINING)))
            else:
                events.append((entry[1], None, FinishReason.ABORT, 0.0))
        self._post(self._deliver_drained, events, refused)

    def _deliver_drained(self, events: list[_Event],
                         refused: list[tuple[RequestStream, BaseException]]) -> None:
        self._deliver(events)
        self._deliver_refusals(refused)

    def _deliver_refusals(self, refused: list[tuple[RequestStream, BaseException]]) -> None:
        for stream, error in refused:
            stream._push(None, None, error)
            self._active.pop(stream.request_id, None)
        if not self._active:
            self._all_done.set()

    def _fail_all(self, error: BaseException) -> None:
        def fail(streams: list[RequestStream]) -> None:
            for stream in streams:
                stream._push(None, None, error)
            for fut in list(self._pending):
                _resolve(fut, None, error)
            self._active.clear()
            self._all_done.set()
        streams = [s for _, s, _ in self._live.values()]
        self._live.clear()
        self._post(fail, streams)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._loop_body()
        except BaseException as exc:
            log.exception("the engine loop failed; failing every request")
            self.error = exc
            self._fail_all(exc)
        finally:
            for rid in list(self._live):
                self.engine.abort_request(rid)
            self._fail_all(EngineDrainingError("the engine stopped"))

    def _loop_body(self) -> None:
        engine, cond, inbox = self.engine, self._cond, self._inbox
        idle_done = False
        while True:
            busy = engine.has_work()
            if not busy and not idle_done:
                self._on_idle()
                idle_done = True
            with cond:
                while not busy and not inbox and not self._stop:
                    cond.wait()
                if self._stop:
                    return
                cmds = list(inbox)
                inbox.clear()
            for cmd in cmds:
                cmd()
            if not engine.has_work():
                continue
            idle_done = False
            steps = engine.num_steps
            self._after_step(engine.step())
            if engine.num_steps == steps:
                with cond:
                    if not inbox and not self._stop:
                        cond.wait(_STALL_WAIT_S)

    def _after_step(self, step: StepOutput) -> None:
        live = self._live
        events: list[_Event] = []
        for req in step.new_tokens:
            entry = live.get(req.request_id)
            if entry is None:
                continue
            finish = req.finish_reason if req.is_finished else None
            events.append((entry[1], req.output_token_ids[-1], finish,
                           req.last_token_time or 0.0))
            if finish is not None:
                del live[req.request_id]
        for req in step.finished:
            # Those that finished on a token left ``live`` above; these ended without one.
            entry = live.pop(req.request_id, None)
            if entry is not None:
                events.append((entry[1], None, req.finish_reason, 0.0))
        if events:
            self._post(self._deliver, events)

    def _on_idle(self) -> None:
        if self.metrics is not None:
            self.metrics.refresh(self.engine, self.engine.clock.now())
        if self.check_integrity:
            self.engine.scheduler.check_integrity()
            self.num_idle_checks += 1
