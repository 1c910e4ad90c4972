"""``study/held_stops``: a stop given inside ``whole()`` is raised at its (outermost) end,
once; outside it, or off the main thread, at once."""

from __future__ import annotations

import threading

import pytest

from slopilot.tuner.study.held_stops import raise_or_hold, whole


def test_a_stop_inside_whole_is_raised_when_the_outermost_block_ends() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), whole():
        with whole():
            raise_or_hold(KeyboardInterrupt())
            raise_or_hold(KeyboardInterrupt())  # a second Ctrl-C: the same stop
            done.append("inner")
        done.append("outer")  # still held: the writes around it finish
    assert done == ["inner", "outer"]
    with whole():  # nothing left held
        done.append("again")
    assert done[-1] == "again"


def test_outside_whole_or_off_the_main_thread_a_stop_is_raised_at_once() -> None:
    with pytest.raises(KeyboardInterrupt):
        raise_or_hold(KeyboardInterrupt())
    raised: list[BaseException] = []

    def other() -> None:
        with whole():
            try:
                raise_or_hold(KeyboardInterrupt())
            except KeyboardInterrupt as exc:
                raised.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(raised) == 1
