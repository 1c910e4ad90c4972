"""Simulator-worker calls that hold their process until the test lets them go.

A call runs ``until_released`` in a ``SimWorker`` process: it marks that it started (a
file) and blocks reading a FIFO until the test opens it for writing, so a test decides
when each call ends by a condition, never by a sleep.
"""

from __future__ import annotations

import errno
import os
import pathlib
import threading

from slopilot.tuner.sim.worker import SimWorker
from tests.support.waits import HANG_GUARD_S, wait_for


def until_released(started: str, release: str) -> str:
    """A call that holds its process until the test lets it go (a FIFO: the read
    blocks until the test opens it for writing)."""
    import pathlib
    pathlib.Path(started).touch()
    with open(release) as fifo:
        fifo.read()
    return "done"


class Held:
    """A call running in ``w`` (in a thread of this process) until ``finish``.

    ``tenant``: whose call it is (``SimWorker.call``'s; None: the default). ``queued``:
    the call is to wait for a process, the ``queued``-th caller waiting; the constructor
    returns once ``w`` counts that many (or raises what the call raised first)."""

    def __init__(self, w: SimWorker, tmp: pathlib.Path, name: str = "a", *,
                 tenant: str | None = None, queued: int | None = None) -> None:
        self.name = name
        self.started, self.release = tmp / f"{name}.started", tmp / f"{name}.release"
        os.mkfifo(self.release)
        self.outcome: list[object] = []
        by = {} if tenant is None else {"tenant": tenant}

        def run() -> None:
            try:
                self.outcome.append(w.call(until_released, str(self.started),
                                           str(self.release), **by))
            except BaseException as exc:  # the test reads it
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if queued is None:
            wait_for(lambda: self.started.exists() or self.outcome,
                     what=f"call {name} to run in the worker")
        else:
            wait_for(lambda: w.waiting == queued or self.outcome,
                     what=f"call {name} to wait as the {queued}th caller")
        if self.outcome and isinstance(self.outcome[0], BaseException):
            raise self.outcome[0]

    def finish(self) -> object:
        """Let the call end; what it returned or raised (raised at once if killed)."""
        def released() -> bool:
            try:  # non-blocking: ENXIO until the call has the FIFO open for reading
                os.close(os.open(self.release, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                return False
            return True

        wait_for(lambda: bool(self.outcome) or released(), what="the held call to end")
        self.thread.join(HANG_GUARD_S)
        return self.outcome[0]


def served_order(first: Held, queued: list[Held]) -> list[str]:
    """The names of ``queued`` in the order a one-process worker ran them, ``first``
    (running) let go first and each call let go once the next one runs."""
    order, running, left = [], first, list(queued)
    while left:
        assert running.finish() == "done"
        wait_for(lambda: any(h.started.exists() or h.outcome for h in left),
                 what=f"one of {[h.name for h in left]} to run")
        ran = [h for h in left if h.started.exists() or h.outcome]
        assert len(ran) == 1, f"{[h.name for h in ran]} ran at once in one process"
        running = ran[0]
        if running.outcome and isinstance(running.outcome[0], BaseException):
            raise running.outcome[0]
        order.append(running.name)
        left.remove(running)
    assert running.finish() == "done"
    return order
