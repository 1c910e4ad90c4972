"""One collection listed, then watched, again and again until the operator's stop.

Driven by a scripted API (each LIST and each watch answers as the test says, at once), a
clock the test moves and a stop whose waits return at once, recorded: no thread, no
sleep, nothing read from the wall clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.kubeapi import ApiError
from slopilot.operator.reflector import RELIST_CAP_S, RELIST_FIRST_S, Reflector
from tests.operator.test_peering_keeper import Stop

GONE = ApiError(410, "Gone", "too old resource version")
FORBIDDEN = ApiError(403, "Forbidden", "namespaces is forbidden")


class Api:
    """A collection's LISTs and watches, each answered as the next of its script says
    (the last repeats). A LIST: a dict (the listing; its version the count of LISTs so
    far) or an exception. A watch: a list of events, ``"long"`` (no event, ends
    ``RELIST_CAP_S`` later on the clock), ``"stop"`` (the stop comes while it is open) or
    an exception."""

    def __init__(self, stop: threading.Event, lists: list[Any] | None = None,
                 watches: list[Any] | None = None) -> None:
        self.stop = stop
        self.lists, self.watches = lists or [{}], watches or [[]]
        self.now = 0.0
        self.listed: list[str] = []
        self.watched: list[str] = []
        self.seen: list[dict[str, Any]] = []
        self.refusals: list[bool] = []
        self.forbidden_wait_s = 7.0

    @staticmethod
    def _next(script: list[Any]) -> Any:
        return script.pop(0) if len(script) > 1 else script[0]

    def list_all(self) -> dict[str, Any]:
        answer = self._next(self.lists)
        if isinstance(answer, Exception):
            raise answer
        version = str(len(self.listed) + 1)
        return {"metadata": {"resourceVersion": version}, **answer}

    def on_listed(self, listing: dict[str, Any]) -> None:
        self.listed.append(listing["metadata"]["resourceVersion"])

    def watch_from(self, version: str) -> Iterator[dict[str, Any]]:
        self.watched.append(version)
        answer = self._next(self.watches)
        if isinstance(answer, Exception):
            raise answer
        if answer == "long":
            self.now += RELIST_CAP_S
        elif answer == "stop":
            yield {"type": "ADDED", "object": {"n": version}}
            self.stop.set()  # the stop closes the open watch: it ends, told no more
        else:
            yield from answer

    def forbidden(self, exc: ApiError, first: bool) -> float:
        assert exc is FORBIDDEN
        self.refusals.append(first)
        return self.forbidden_wait_s

    def reflector(self) -> Reflector:
        return Reflector("things", list_all=self.list_all, watch_from=self.watch_from,
                         listed=self.on_listed, seen=self.seen.append,
                         forbidden=self.forbidden, stop=self.stop, clock=lambda: self.now)


def event(name: str) -> dict[str, Any]:
    return {"type": "MODIFIED", "object": {"n": name}}


def test_a_watch_whose_version_expired_is_listed_again_from_a_new_version() -> None:
    stop = Stop(limit=3)
    api = Api(stop, watches=[[event("a")], GONE, GONE, [event("b")], []])
    api.reflector().run()
    assert api.listed == ["1", "2", "3", "4", "5"]
    assert api.watched == ["1", "2", "3", "4", "5"]  # each from its own listing's version
    # A 410 at once waits before the next LIST, the second twice as long; a watch that
    # told an event resets the backoff.
    assert stop.waits == [RELIST_FIRST_S, 2 * RELIST_FIRST_S, RELIST_FIRST_S]
    assert api.seen == [event("a"), event("b")]


def test_watches_ending_at_once_back_off_the_lists_until_one_tells_or_lives() -> None:
    """An API server (or a proxy) ending each watch at once, told nothing: each LIST
    waits twice as long as the one before, up to the cap, as client-go's reflector."""
    stop = Stop(limit=10)
    api = Api(stop, watches=[*[[]] * 7, [event("a")], [], "long", []])
    api.reflector().run()
    assert stop.waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 1.0, 1.0, 2.0]
    assert len(api.listed) == 12  # 7 at once, one told, one at once, one long, two more
    assert api.seen == [event("a")]


def test_a_stop_while_a_watch_is_open_ends_it_with_no_list_after() -> None:
    stop = Stop(limit=100)
    api = Api(stop, watches=["stop"])
    api.reflector().run()
    assert api.listed == ["1"] and api.watched == ["1"]
    assert api.seen == [{"type": "ADDED", "object": {"n": "1"}}]
    assert stop.waits == []  # it told an event: no backoff to wait out either


def test_a_listing_answered_after_the_stop_is_not_acted_on() -> None:
    """A LIST in flight is not cut by the stop: its answer, once come, is dropped."""
    stop = Stop(limit=100)
    api = Api(stop)

    def list_all() -> dict[str, Any]:
        stop.set()  # the stop while the LIST is in flight
        return {"metadata": {"resourceVersion": "1"}}

    reflector = api.reflector()
    reflector.list_all = list_all
    reflector.run()
    assert api.listed == [] and api.watched == [] and stop.waits == []


def test_a_refusal_calls_the_403_policy_first_once_until_a_listing() -> None:
    """The 403 policy is told whether it is the first refusal since the last listing
    (the one to warn of, where it warns once), and its answer is the wait before the
    next LIST."""
    stop = Stop(limit=5)
    api = Api(stop, lists=[FORBIDDEN, FORBIDDEN, {}, FORBIDDEN, FORBIDDEN])
    api.watches = [FORBIDDEN, []]  # a watch refused counts too
    api.reflector().run()
    assert api.refusals == [True, False, True, False, False]
    assert api.listed == ["1"]
    assert stop.waits == [api.forbidden_wait_s] * 5


@pytest.mark.parametrize("error", [ApiError(500, "Internal", "etcd"), KeyError("items")])
def test_any_other_error_is_warned_of_and_listed_again_later(
        caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    """A failed LIST or a handler's bug: warned of, listed again in MAX_RETRY_S; the
    thread lives on (it ending would leave kopf paused)."""
    stop = Stop(limit=2)
    api = Api(stop, lists=[error])
    with caplog.at_level(logging.WARNING):
        api.reflector().run()
    assert stop.waits == [MAX_RETRY_S, MAX_RETRY_S]
    assert caplog.text.count("list or watch of things") == 2, caplog.text
    assert api.refusals == []
