"""Ctrl-C and SIGTERM during ``slopilot demo``: when a stop ends what.

Starting (replicas, Prometheus, the worker), a stop ends the run: there is nothing to
report, and the contexts stop what had started. During the loop it ends the loop, not
the run (``demo._control_loop`` catches it): the replicas stop and the report of the run
so far is written. Once the loop is over (stopped or run out), the first stop is only
recorded: tearing down and writing the report take seconds, and a stop there lost a
report that was all but written; a second stop ends the run then, without it. Either
signal is held while the controller's study is half written (``study/held_stops.py``),
as ``slopilot tune`` holds it.
"""

from __future__ import annotations

import enum
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from slopilot.tuner.study.held_stops import raise_or_hold
from slopilot.tuner.tune.stop import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated


class StopPhase(enum.Enum):
    STARTING = "starting"
    LOOP = "loop"
    FINISHING = "finishing"


def stop_name(stop: BaseException) -> str:
    return "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"


def exit_code(name: str) -> int:
    """The shell's code for a command the named stop ended (0 for none)."""
    return {"": 0, "Ctrl-C": EXIT_INTERRUPTED}.get(name, EXIT_TERMINATED)


class DemoStops:
    """The demo's SIGINT and SIGTERM handlers while in the block (the main thread only:
    Python runs handlers there), the previous ones put back after."""

    def __init__(self) -> None:
        self.phase = StopPhase.STARTING
        self.first: str = ""
        """The first stop's name (``Ctrl-C``, ``SIGTERM``); empty while none came."""
        self.first_in: StopPhase | None = None
        self._raised: BaseException | None = None
        self._previous: dict[int, Callable[..., Any] | int | None] = {}

    def __enter__(self) -> DemoStops:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal)
                              for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def finishing(self) -> None:
        """The loop is over: from now on a first stop is recorded, not raised."""
        self.phase = StopPhase.FINISHING

    def deliver(self) -> None:
        """Raise again a stop the handler raised where Python swallowed it, for a loop
        to call at each turn. Python runs a signal's handler between any two bytecodes of
        the main thread, also inside a weakref callback or a ``__del__``, where an
        exception is only printed ("Exception ignored in ...") and the code goes on: a
        Ctrl-C raised inside a ``WeakSet``'s callback was lost, and the demo ran on past
        it (its test waited 240 s for the end). A stop that did propagate ends the loop
        first, so this raises only a lost one."""
        stop, self._raised = self._raised, None
        if stop is not None:
            raise stop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        stop: BaseException = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        if not self.first:
            self.first, self.first_in = stop_name(stop), self.phase
            if self.phase is StopPhase.FINISHING:
                return
        self._raised = stop
        raise_or_hold(stop)
