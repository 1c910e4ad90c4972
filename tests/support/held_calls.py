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
    """A call running in ``w`` (in a thread of this process) until ``finish``."""

    def __init__(self, w: SimWorker, tmp: pathlib.Path, name: str = "a") -> None:
        self.started, self.release = tmp / f"{name}.started", tmp / f"{name}.release"
        os.mkfifo(self.release)
        self.outcome: list[object] = []

        def run() -> None:
            try:
                self.outcome.append(w.call(until_released, str(self.started),
                                           str(self.release)))
            except BaseException as exc:  # the test reads it
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        wait_for(self.started.exists, what=f"call {name} to run in the worker")

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
