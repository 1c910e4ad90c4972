"""The demo's stops: a Ctrl-C Python swallowed is not lost.

Python runs a signal's handler between any two bytecodes of the main thread, also inside
a weakref callback or a ``__del__``, where the exception it raises is only printed
("Exception ignored in ...") and the code goes on. A fresh-clone CI run lost the Ctrl-C
that way (raised in a ``WeakSet``'s callback) and the demo ran on until its test's hang
guard; the loop now asks ``DemoStops.deliver`` at each turn."""

from __future__ import annotations

import signal
import sys
from typing import Any

import pytest

from slopilot.tuner.local.demo_stops import DemoStops, StopPhase
from slopilot.tuner.tune.stop import Terminated


class _SignalledWhileDying:
    """An object whose finalizer is where the signal's handler runs."""

    def __init__(self, stops: DemoStops, signum: int) -> None:
        self.stops, self.signum = stops, signum

    def __del__(self) -> None:
        self.stops._on_signal(self.signum, None)


def _swallowed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What Python's unraisable hook was given (kept from pytest's own warning)."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


@pytest.mark.parametrize(("signum", "kind"), [(signal.SIGINT, KeyboardInterrupt),
                                               (signal.SIGTERM, Terminated)])
def test_a_stop_python_swallowed_is_raised_at_the_loops_next_turn(
        monkeypatch: pytest.MonkeyPatch, signum: int, kind: type[BaseException]) -> None:
    seen = _swallowed(monkeypatch)
    with DemoStops() as stops:
        stops.phase = StopPhase.LOOP
        dying = _SignalledWhileDying(stops, signum)
        del dying  # the handler's raise is printed and dropped, as in a weakref callback
        assert [type(u.exc_value) for u in seen] == [kind]
        with pytest.raises(kind):
            stops.deliver()
        stops.deliver()  # raised once: the loop that caught it is over
    assert stops.first in ("Ctrl-C", "SIGTERM") and stops.first_in is StopPhase.LOOP


def test_a_stop_that_propagated_is_not_raised_again_once_finishing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finishing, a first stop is only recorded: nothing to deliver."""
    seen = _swallowed(monkeypatch)
    with DemoStops() as stops:
        stops.finishing()
        dying = _SignalledWhileDying(stops, signal.SIGINT)
        del dying
        assert seen == []
        stops.deliver()
    assert stops.first == "Ctrl-C" and stops.first_in is StopPhase.FINISHING

