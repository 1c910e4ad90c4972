"""One collection listed, then watched, again and again until the operator's stop.

Driven by a scripted API (each LIST and each watch answers as the test says, at once), a
clock the test moves and a stop whose waits return at once, recorded: no thread, no
sleep, nothing read from the wall clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import urllib3

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.kubeapi import ApiError
from slopilot.operator.reflector import RELIST_CAP_S, RELIST_FIRST_S, Reflector
from tests.operator.test_peering_keeper import Stop

GONE = ApiError(410, "Gone", "too old resource version")
FORBIDDEN = ApiError(403, "Forbidden", "namespaces is forbidden")


class Api:
    """A collection's LISTs and watches, each answered as the next of its script says
    (the last repeats). A LIST: a dict (the listing; its version the count of LISTs so
    far) or an exception. A watch: a list of events (an exception among them raised
    there: its connection lost), ``"long"`` (no event, ends
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
            for item in answer:
                if isinstance(item, Exception):
                    raise item
                yield item

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


def test_a_refusal_calls_the_403_policy_first_once_until_a_watch_is_let_through() -> None:
    """The 403 policy is told whether it is the first refusal since a watch was last let
    through (where a refusal starts), and its answer is the wait before the next LIST;
    a LIST let through whose watch is refused is no end of the refusal."""
    stop = Stop(limit=5)
    api = Api(stop, lists=[FORBIDDEN, {}, {}, FORBIDDEN, FORBIDDEN])
    api.watches = [FORBIDDEN, []]  # a watch refused counts too
    let_through: list[int] = []
    reflector = api.reflector()
    reflector.let_through = lambda: let_through.append(len(api.listed))
    reflector.run()
    assert api.refusals == [True, False, True, False]
    assert api.listed == ["1", "2"] and let_through == [2]
    wait_s = api.forbidden_wait_s
    assert stop.waits == [wait_s, wait_s, RELIST_FIRST_S, wait_s, wait_s]


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


def test_a_watch_refused_after_each_listing_is_one_refusal_until_a_watch_opens() -> None:
    """Listed but not watched (RBAC grants list, not watch): each listing let through
    counted as the refusal's end, so the policy warned of the "first" one each resync.
    The refusal ends when a watch is let through, and the caller is told so."""
    stop = Stop(limit=4)
    api = Api(stop, watches=[FORBIDDEN, FORBIDDEN, FORBIDDEN, [event("a")], FORBIDDEN])
    let_through: list[int] = []
    reflector = api.reflector()
    reflector.let_through = lambda: let_through.append(len(api.listed))
    reflector.run()
    assert api.listed == ["1", "2", "3", "4", "5"]
    assert api.refusals == [True, False, False, True]
    assert let_through == [4]  # told once, when the fourth watch opened
    assert stop.waits == [api.forbidden_wait_s] * 4


CUTS = [urllib3.exceptions.ProtocolError(
            "Connection broken", ConnectionResetError(104, "Connection reset by peer")),
        ConnectionResetError(104, "Connection reset by peer"),
        urllib3.exceptions.ReadTimeoutError(None, "/api/v1/namespaces", "Read timed out.")]


@pytest.mark.parametrize("cut", CUTS, ids=["protocol", "reset", "timeout"])
def test_a_watch_cut_on_its_own_is_listed_again_after_the_backoff_unwarned(
        caplog: pytest.LogCaptureFixture, cut: Exception) -> None:
    """An API server restarting (or a load balancer's idle timeout) resets the watch's
    connection: routine, so listed again at once after a watch that told events or
    lived, else after the relist backoff; not a warning (nor 30 s) each time. Said at
    INFO the first time, the others (within CUT_SAY_S) at DEBUG."""
    stop = Stop(limit=3)
    api = Api(stop, watches=[[cut], [cut], [event("a"), cut], [cut]])
    with caplog.at_level(logging.DEBUG):
        api.reflector().run()
    assert stop.waits == [RELIST_FIRST_S, 2 * RELIST_FIRST_S, RELIST_FIRST_S]
    assert api.listed == ["1", "2", "3", "4"] and api.seen == [event("a")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    cuts = [r for r in caplog.records if "watch of things was cut" in r.getMessage()]
    assert [r.levelno for r in cuts] == [logging.INFO] + [logging.DEBUG] * 3, caplog.text


def test_a_handlers_connection_error_is_warned_of_as_any_other() -> None:
    """Only the watch's own connection lost is routine: a handler's call that found no
    API server takes the general path (warned of, listed again MAX_RETRY_S later)."""
    stop = Stop(limit=2)
    api = Api(stop, watches=[[event("a")]])
    reflector = api.reflector()

    def seen(_event: dict[str, Any]) -> None:
        raise urllib3.exceptions.ProtocolError("Connection aborted")

    reflector.seen = seen
    reflector.run()
    assert stop.waits == [MAX_RETRY_S, MAX_RETRY_S]


def test_a_list_abandoned_by_the_stop_ends_the_loop_unwarned(
        caplog: pytest.LogCaptureFixture) -> None:
    """The stop frees a thread waiting for a LIST's answer (in_flight.py): its loop ends
    there, with no warning of a failed LIST and no wait."""
    from slopilot.operator.in_flight import Abandoned

    stop = Stop(limit=100)
    api = Api(stop)

    def list_all() -> dict[str, Any]:
        stop.set()  # the stop while the LIST is in flight: its wait freed
        raise Abandoned()

    reflector = api.reflector()
    reflector.list_all = list_all
    with caplog.at_level(logging.INFO):
        reflector.run()
    assert api.listed == [] and stop.waits == [] and caplog.records == []


class Clocked(Stop):
    """A stop whose waits move its API's clock by as long."""

    api: Api

    def wait(self, timeout: float | None = None) -> bool:
        self.api.now += timeout or 0.0
        return super().wait(timeout)


def said_while_running(reflector: Reflector, api: Api, name: str
                       ) -> list[tuple[float, str]]:
    """Run ``reflector`` to its stop, its INFO lines and above kept with the API's clock
    at each (its DEBUG ones dropped)."""
    said: list[tuple[float, str]] = []

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.INFO:
                said.append((api.now, record.getMessage()))

    reflector.log = logging.getLogger(name)
    reflector.log.addHandler(handler := Said())
    reflector.log.setLevel(logging.DEBUG)
    try:
        reflector.run()
    finally:
        reflector.log.removeHandler(handler)
    return said


def test_watches_cut_again_and_again_are_said_once_then_summed_up_each_interval() -> None:
    """A proxy cutting each watch at once had a line at each LIST, every 30 s for as long
    as it lasted: said at the first cut, then once each CUT_SAY_S, summing up the cuts
    since the last line (each cut said at DEBUG)."""
    from slopilot.operator.reflector import CUT_SAY_S

    stop = Clocked(limit=80)
    api = stop.api = Api(stop, watches=[[CUTS[0]]])
    cuts: list[float] = []
    reflector = api.reflector()
    reflector.watch_from = lambda version: (cuts.append(api.now), api.watch_from(version))[1]
    said = said_while_running(reflector, api, "tests.reflector.cuts")
    assert len(cuts) == 80 and len(api.listed) == 80  # each listed again, as before
    # 80 cuts, backing off 1 s doubling to 30 s: ~38 min. The first said at once, then
    # the first cut CUT_SAY_S after the last line sums up the cuts since.
    assert cuts[-1] > 3 * CUT_SAY_S
    times = [at for at, _ in said]
    assert times[0] == cuts[0] and len(said) >= 4
    assert all(b - a >= CUT_SAY_S and b == min(c for c in cuts if c >= a + CUT_SAY_S)
               for a, b in pairwise(times)), times
    assert cuts[-1] < times[-1] + CUT_SAY_S
    first = said[0][1]
    assert "the watch of things was cut (" in first and "times" not in first
    for (a, _), (b, line) in pairwise(said):
        count = sum(1 for c in cuts if a < c <= b)
        assert line.startswith(f"slopilot operator: the watch of things was cut {count} "
                               f"times in the last {CUT_SAY_S / 60:.0f} min"), line


def test_a_burst_of_cuts_that_ends_is_summed_up_when_the_watch_holds_again() -> None:
    """18 cuts in 7 min had one line, at the first: the rest were summed up only at the
    next cut CUT_SAY_S later, hours late if the burst had ended, and read as cuts of the
    last hours. A watch that holds again (it lived RELIST_CAP_S, its backoff reset) says
    the cuts of the burst at once, and the next cut starts a period of its own."""
    from slopilot.operator.reflector import CUT_SAY_S

    stop = Clocked(limit=19)
    api = stop.api = Api(stop, watches=[[CUTS[0]]] * 18 + ["long", [CUTS[0]]])
    said = said_while_running(api.reflector(), api, "tests.reflector.burst")
    burst_s = sum(w or 0.0 for w in stop.waits[:18]) + RELIST_CAP_S
    assert burst_s < CUT_SAY_S  # the burst ends before a second line would have come
    assert [line.split(" (")[0] for _, line in said] == [
        "slopilot operator: the watch of things was cut",
        f"slopilot operator: the watch of things holds again after 18 cuts in "
        f"{burst_s / 60:.0f} min",
        "slopilot operator: the watch of things was cut"], said
    assert [at for at, _ in said] == [0.0, burst_s, burst_s]
