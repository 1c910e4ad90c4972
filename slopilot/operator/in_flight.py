"""A blocking read (a LIST) whose caller the operator's stop frees at once.

A LIST blocks until the API server's first byte, which a busy cluster may hold back for
most of the request's timeout (its priority and fairness queue): its thread outlived the
operator's stop by as long. That wait cannot be cut from another thread (urllib3's
``HTTPResponse.shutdown`` needs the response, which does not exist before the answer's
first byte; ``PoolManager.clear`` closes only the pool's idle connections), and a timeout
short enough for the stop would fail a slow but sound LIST at every try. So each read
runs on a daemon thread of its own, and its caller waits for its answer or for
``abandon_all`` (the stop), whichever comes first. Abandoned, the read's thread ends on
its own (its answer or error dropped, the connection freed): only a read, whose late
answer changes nothing, is run so, never a write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Abandoned(Exception):
    """The stop came before the read's answer: its caller makes nothing of it."""


class _Pending(Generic[T]):
    """One read: its answer (or error) once it ends; ``done`` set then, or by the stop."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ended = False
        self.answer: T | None = None
        self.error: Exception | None = None


class InFlight:
    """Reads in flight, each waited for until ``abandon_all``; abandoned, none starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[threading.Event] = set()
        self.abandoned = False

    def read(self, call: Callable[[], T], name: str) -> T:
        """``call()``'s answer, or its error raised; Abandoned where ``abandon_all`` came
        first. ``name``: its thread's, as a stack dump shows it."""
        pending: _Pending[T] = _Pending()

        def run() -> None:
            try:
                pending.answer = call()
            except Exception as exc:  # raised in the caller's thread, if it still waits
                pending.error = exc
            pending.ended = True
            pending.done.set()

        with self._lock:
            if self.abandoned:
                raise Abandoned()
            self._waiting.add(pending.done)
        try:
            threading.Thread(target=run, name=name, daemon=True).start()
            pending.done.wait()
        finally:
            with self._lock:
                self._waiting.discard(pending.done)
        if not pending.ended:
            raise Abandoned()
        if pending.error is not None:
            raise pending.error
        return pending.answer  # type: ignore[return-value]  # ended without error: T

    def abandon_all(self) -> None:
        with self._lock:
            self.abandoned = True
            waiting, self._waiting = list(self._waiting), set()
        for done in waiting:
            done.set()
