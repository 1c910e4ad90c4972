"""A read whose caller the operator's stop frees at once (a LIST the API server holds).

Driven by events the test sets: no sleep, no timing.
"""

from __future__ import annotations

import threading

import pytest

from slopilot.operator.in_flight import Abandoned, InFlight

GUARD_S = 20.0  # a hang turned into a failure; each wait here ends on a condition


def test_a_read_answers_or_raises_in_its_callers_thread() -> None:
    lists = InFlight()
    assert lists.read(lambda: {"items": []}, "t-list") == {"items": []}
    with pytest.raises(KeyError, match="items"):
        lists.read(lambda: {}["items"], "t-list")


def test_the_stop_frees_a_caller_whose_read_has_no_answer_and_drops_it_later() -> None:
    lists, answer, called = InFlight(), threading.Event(), threading.Event()

    def held() -> str:
        called.set()
        answer.wait(GUARD_S)
        return "late"

    told: list[object] = []

    def caller() -> None:
        try:
            told.append(lists.read(held, "t-list"))
        except Abandoned as exc:
            told.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert called.wait(GUARD_S)
    lists.abandon_all()
    thread.join(GUARD_S)
    assert not thread.is_alive() and isinstance(told[0], Abandoned)
    answer.set()  # the read ends on its own: its answer reaches no one
    for left in [t for t in threading.enumerate() if t.name == "t-list"]:
        left.join(GUARD_S)
        assert not left.is_alive()
    assert len(told) == 1


def test_no_read_starts_once_abandoned() -> None:
    lists = InFlight()
    lists.abandon_all()
    calls: list[int] = []
    with pytest.raises(Abandoned):
        lists.read(lambda: calls.append(1), "t-list")
    assert calls == []
