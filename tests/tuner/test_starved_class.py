"""A class the trial's config starves of first tokens is never read as meeting its SLO.

The reviewer's case (``docs/closed_loop.md``): the alert is about P0, served well; from the
trial's start P1 gets almost no first token, and its clients still wait at the window's
end. The window's P1 figures were a P99 of None (no sample: read as met) or of the two
lucky requests served (200 ms), and the trial committed. Now a class with clients waiting
at the window's end and fewer samples than the floor binds the floor (the trial is
extended, and ends unjudged at ``max_trial_s``), and its waiters past their target are
in its P99 (the rules' +Inf: a miss). A class with no request at all is judged as before.
Each case drives the production Controller on an injected clock (tick every 15 s, windows
of 120 s, P0 the alert's class, tiny-cpu's SLO: P0 300/60 ms, P1 1000/150 ms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from slopilot.engine.sim.stats import REFUSED_TTFT_S
from slopilot.engine.window_summary import ClassFigures, WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from tests.support.summaries import figures, window
from tests.tuner.test_low_traffic_verdicts import _controller, _until_acted

P0_PER_S = 3.0


def _starved(p1: ClassFigures | None) -> Callable[[float, float], WindowSummary]:
    def at(start: float, end: float) -> WindowSummary:
        classes = {"p0": figures(100.0, 20.0, 50.0, finished=round(P0_PER_S * (end - start)))}
        if p1 is not None:
            classes["p1"] = p1
        return window(classes, duration_s=end - start)
    return at


def _waiting(*, finished: float, ttft: float | None, samples: float, awaiting: float
             ) -> ClassFigures:
    return dataclasses.replace(figures(ttft, None if not finished else 30.0, 0.0,
                                       finished=finished),
                               ttft_samples=samples, requests_awaiting=awaiting)


def _acted(ctl: Controller) -> list[tuple[float, Action, str]]:
    return [(t, d.action, d.reason) for t, d in _until_acted(ctl)]


def test_a_class_with_clients_waiting_and_no_first_token_is_no_commit() -> None:
    # No P1 sample at all, 5 clients waiting (within their target at the window's end):
    # read as "no samples" the class met its SLO, and the trial committed at 120 s.
    rig, ctl = _controller(_starved(_waiting(finished=0, ttft=None, samples=0,
                                             awaiting=5)))
    acted = _acted(ctl)
    assert Action.COMMIT not in [a for _, a, _ in acted], acted
    t, _, reason = acted[-1]
    assert t >= 1200.0 and "too little traffic to judge: P1 0 of 100" in reason
    assert rig.study.told == {} and 0 in rig.study.failed


def test_two_lucky_first_tokens_of_a_starved_class_are_no_commit() -> None:
    # P1: 2 requests served in 200 ms while 111 clients wait (within their target, say):
    # its P99 of the two lucky ones no longer commits the trial.
    rig, ctl = _controller(_starved(_waiting(finished=2, ttft=200.0, samples=2,
                                             awaiting=111)))
    acted = _acted(ctl)
    assert Action.COMMIT not in [a for _, a, _ in acted], acted
    assert "too little traffic to judge: P1 2 of 100" in acted[-1][2]
    assert rig.study.told == {} and 0 in rig.study.failed


def test_waiters_past_their_target_read_as_a_miss() -> None:
    # The live reading of s4: 111 P1 waiters past 1 s, in the P99's +Inf (the top edge).
    rig, ctl = _controller(_starved(_waiting(finished=2, ttft=REFUSED_TTFT_S * 1000.0,
                                             samples=113, awaiting=111)))
    acted = _acted(ctl)
    assert [a for _, a, _ in acted][:2] == [Action.TRIAL, Action.REVERT], acted
    assert acted[1][0] <= 120.0 and "p1" in acted[1][2]
    assert Action.COMMIT not in [a for _, a, _ in acted]
    assert not rig.study.told[0].feasible


def test_a_class_the_workload_does_not_send_is_judged_as_before() -> None:
    rig, ctl = _controller(_starved(None))
    acted = _acted(ctl)
    assert [(t, a) for t, a, _ in acted] == [(0.0, Action.TRIAL), (120.0, Action.COMMIT)]
    assert rig.study.told[0].feasible


@pytest.mark.parametrize(("served", "waiting"), [(1, 0), (5, 1)])
def test_a_sparse_class_with_few_waiting_still_holds_nothing_back(served: int,
                                                                  waiting: int) -> None:
    # A stray P1 request served fine, none waiting; or a trickle of 5 with one in flight
    # at the window's end: not starvation, and its sparse P99 holds nothing back.
    rig, ctl = _controller(_starved(_waiting(finished=served, ttft=200.0, samples=served,
                                             awaiting=waiting)))
    acted = _acted(ctl)
    assert [(t, a) for t, a, _ in acted] == [(0.0, Action.TRIAL), (120.0, Action.COMMIT)]
    assert rig.study.told[0].feasible
