"""The controller's transition table: drawn in the module, checked on every move, and
exactly what the controller does (every row is taken by some run, no move outside it)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slopilot.tuner.loop import controller as controller_module
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.controller import STEPS, Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.ports import Pending, Stuck
from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.loop.transitions import (
    TRANSITIONS,
    Event,
    Go,
    check,
    render_diagram,
    render_table,
)
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import (
    BAD,
    GOOD,
    START,
    FakeAlerts,
    FakeDeployment,
    FakeOffline,
    FakePlanner,
    FakeStudy,
    Rig,
    alert,
    by_share,
)

S = ControllerState
MOVE = re.compile(r"demo: (\w+) -> (\w+) on (\w+)$")


def test_the_diagram_in_the_controller_module_is_the_table() -> None:
    drawn = "\n".join("    " + line if line else "" for line in render_diagram().splitlines())
    assert controller_module.__doc__ is not None
    assert drawn in controller_module.__doc__, (
        "controller.py's diagram is out of date; paste the output of "
        "`python -m slopilot.tuner.loop.transitions`:\n" + render_diagram())


def test_docs_architecture_carries_the_table_and_its_picture() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs/architecture.md").read_text()
    hint = "docs/architecture.md is out of date: `python -m slopilot.tuner.loop.transitions "
    assert render_diagram() in text, hint + "` prints the picture"
    assert render_table() in text, hint + "--table` prints the table"


def test_every_state_has_a_step_and_an_exit_on_error() -> None:
    assert set(STEPS) == set(ControllerState)
    for state in ControllerState:
        check(state, S.COOLDOWN, Event.ERROR)  # the guardrail's move is always legal
    assert len({(t.source, t.target, t.event) for t in TRANSITIONS}) == len(TRANSITIONS)


@pytest.mark.parametrize(("source", "target", "event"), [
    (S.TUNING, S.STEADY, Event.COOLDOWN_OVER),  # no such pair
    (S.STEADY, S.TUNING, Event.SCALE_ALERT),  # a pair, but not on this event
    (S.COOLDOWN, S.TUNING, Event.RETUNE_ALERT),  # alerts wait for the cooldown
])
def test_an_illegal_transition_names_both_states_and_the_event(
        source: S, target: S, event: Event) -> None:
    with pytest.raises(ControllerError, match=(
            rf"illegal transition {source.value} -> {target.value} on {event.value}; "
            rf"from {source.value} the table allows: -> ")):
        check(source, target, event)


def test_the_controller_checks_every_move(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]))
    ctl = rig.build()
    assert ctl.tick(0.0).state is S.TUNING

    def bad_step(ctx: LoopContext, tick: Tick, entered: Go | None) -> Go:
        return Go(S.STEADY, Event.COOLDOWN_OVER, "skipping the commit")

    monkeypatch.setitem(STEPS, S.TUNING, bad_step)
    d = ctl.tick(1.0)
    # The illegal move is refused before it happens; the guardrail rolls back as for any bug.
    assert (d.state, d.action) == (S.COOLDOWN, Action.REVERT)
    assert "illegal transition tuning -> steady on cooldown_over" in d.reason
    assert 0 in rig.study.failed and rig.dep.config == START


def test_a_tick_that_moves_in_a_circle_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    circle = {S.TUNING: Go(S.COMMIT, Event.TRIAL_LIMIT, "limit"),
              S.COMMIT: Go(S.SCALING, Event.NO_FEASIBLE_CONFIG, "none", at_least=2),
              S.SCALING: Go(S.TUNING, Event.CAPACITY_SUFFICES, "enough")}
    for state, go in circle.items():
        monkeypatch.setitem(STEPS, state, lambda ctx, tick, entered, go=go: go)
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.SCALE)]))
    d = rig.build().tick(0.0)
    assert (d.state, d.action) == (S.COOLDOWN, Action.REVERT)
    assert "moves in one tick (steady -> scaling -> tuning -> commit -> scaling" in d.reason


def _broken(message: str) -> Callable[..., Any]:
    def fail(*_: Any, **__: Any) -> Any:
        raise RuntimeError(message)
    return fail


def _runs() -> list[tuple[Rig, list[float], Callable[[Rig, float], None] | None]]:
    """Runs that between them take every row of the table: (rig, tick times, a change
    made before each tick)."""
    retune, scale = FakeAlerts([alert(AlertAction.RETUNE)]), FakeAlerts([alert(AlertAction.SCALE)])

    def evaluator_breaks(rig: Rig, t: float) -> None:
        if t == 10.0:
            assert rig.ev is not None
            rig.ev.measure = _broken("evaluator crashed")  # type: ignore[method-assign]

    def commit_fails(rig: Rig, t: float) -> None:
        if t == 10.0:
            rig.dep.refuse = lambda c: RuntimeError("API server unreachable")

    def alerts_break(rig: Rig, t: float) -> None:
        rig.alerts.firing = _broken("alert rules unreadable")  # type: ignore[method-assign]

    def planner_breaks(rig: Rig, t: float) -> None:
        rig.planner.search = _broken("simulator crashed")  # type: ignore[method-assign]

    def no_data(rig: Rig, t: float) -> None:
        assert rig.ev is not None
        rig.ev.reject = 1000

    def surge(rig: Rig, t: float) -> None:
        if t == 5.0:
            rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]

    def stall(rig: Rig, t: float) -> None:
        if t == 5.0:
            rig.alerts.alerts = [alert(AlertAction.HOLD, "SlopilotEngineStalled")]

    def commit_sticks(rig: Rig, t: float) -> None:
        # The commit's rollout: pending from the apply (a rollout seen settled has
        # ended, and the cooldown counts from then), past the Deployment's progress
        # deadline by the cooldown's end.
        if t == 10.0:
            rig.dep.settled = lambda now: Pending(  # type: ignore[method-assign]
                "0 of 1 replicas updated")
        if t == 41.0:
            rig.dep.settled = lambda now: Stuck(  # type: ignore[method-assign]
                "ProgressDeadlineExceeded: ReplicaSet demo-2 has timed out progressing")

    def to_retune(rig: Rig, t: float) -> None:
        if t == 31.0:
            rig.alerts.alerts = [alert(AlertAction.RETUNE)]

    return [
        # retune alert -> tuning -> commit -> cooldown -> steady
        (Rig(alerts=retune), [0.0, 10.0, 41.0], None),
        # the commit's rollout sticks -> reverted, a new cooldown
        (Rig(alerts=retune), [0.0, 10.0, 41.0], commit_sticks),
        # scale alert, nothing holds offline -> scaled up
        (Rig(alerts=scale, planner=FakePlanner(needed=3),
             offline=FakeOffline([(dict(GOOD), False)])), [0.0], None),
        # retune alert, nothing holds offline -> scaling -> scaled up
        (Rig(alerts=retune, planner=FakePlanner(needed=1),
             offline=FakeOffline([(dict(GOOD), False)])), [0.0], None),
        # quiet with spare replicas -> scaled down
        (Rig(dep=FakeDeployment(n=3), planner=FakePlanner(needed=1)), [0.0, 60.0], None),
        # scale alert, a config holds offline -> tuning
        (Rig(alerts=scale, planner=FakePlanner(needed=3)), [0.0], None),
        # scale alert, capacity suffices -> tuning
        (Rig(dep=FakeDeployment(n=2), alerts=scale, planner=FakePlanner(needed=2),
             offline=None), [0.0], None),
        # at max replicas: the closest config live, trial limit, no feasible, inform
        (Rig(dep=FakeDeployment(n=4), alerts=scale, planner=FakePlanner(needed=None),
             offline=FakeOffline([(dict(BAD), False)]), settings={"max_trials": 1}),
         [0.0, 6.0, 7.0], None),
        # no count holds and more than 2 do not move it: 4 -> 2, then said and kept
        (Rig(dep=FakeDeployment(n=4), alerts=scale, offline=None,
             planner=by_share({1: 4.0, 2: 3.0, 4: 2.98})),  # type: ignore[arg-type]
         [0.0, 31.0, 32.0], None),
        # the same, quiet: the headroom path gives the 2 that do not help back
        (Rig(dep=FakeDeployment(n=4), offline=None,
             planner=by_share({1: 4.0, 2: 3.0, 4: 2.98})),  # type: ignore[arg-type]
         [0.0, 60.0], None),
        # a scale alert fires mid-episode -> scaling -> scaled up
        (Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), planner=FakePlanner(needed=2)),
         [0.0, 5.0], surge),
        # a hold alert fires mid-episode -> cooldown, nothing bought
        (Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)])), [0.0, 5.0], stall),
        # a trickle: the trial's window never holds the floor of requests, and the
        # episode ends unjudged
        (Rig(alerts=retune, settings={"min_class_requests": 100, "max_trial_s": 20}),
         [0.0, 10.0, 20.0], None),
        # the hour's trials used up mid-episode
        (Rig(alerts=retune, offline=None,
             settings={"max_trials_per_hour": 2, "max_trials": 10}),
         [0.0, 10.0, 11.0, 21.0], None),
        # every window of the episode read no data: no replica bought on it
        (Rig(alerts=retune, offline=None,
             settings={"max_trials": 1, "max_window_repeats": 1}),
         [0.0, 10.0, 11.0], no_data),
        # a scale-up the quota refuses: waited for, said, and no replica bought again
        (Rig(dep=FakeDeployment(n=1, ready_cap=1, why_not_ready="exceeded quota"),
             alerts=FakeAlerts([alert(AlertAction.SCALE)]), planner=FakePlanner(needed=3),
             offline=FakeOffline([(dict(GOOD), False)]), settings={"replica_ready_s": 5}),
         [0.0, 6.0, 31.0, 32.0], to_retune),
        # errors in each state
        (Rig(alerts=retune), [0.0, 10.0], evaluator_breaks),
        (Rig(dep=FakeDeployment(n=3), alerts=retune, offline=None,
             study=FakeStudy(queue=[dict(GOOD)])), [0.0, 10.0], commit_fails),
        (Rig(), [0.0, 1.0], alerts_break),  # steady, then again in cooldown
        (Rig(alerts=scale, offline=None), [0.0], planner_breaks),
    ]


def test_every_row_of_the_table_is_taken_and_nothing_else(
        caplog: pytest.LogCaptureFixture) -> None:
    taken: set[tuple[S, S, Event]] = set()
    for rig, times, change in _runs():
        ctl: Controller = rig.build()
        for t in times:
            if change is not None:
                change(rig, t)
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="slopilot.tuner.loop.controller"):
                ctl.tick(t)
            for record in caplog.records:
                m = MOVE.match(record.getMessage())
                if m:
                    taken.add((S(m[1]), S(m[2]), Event(m[3])))
    for state in S:  # tuning turned off: the operator stops the loop wherever it is
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="slopilot.tuner.loop.controller"):
            Rig().build(LoopState(state=state)).stop(1.0, "tuning turned off")
        for record in caplog.records:
            m = MOVE.match(record.getMessage())
            if m:
                taken.add((S(m[1]), S(m[2]), Event(m[3])))
    from slopilot.operator.loop_status import rebase_episode

    for state in S:  # the backend or model switched: the operator ends the episode
        loop = LoopState(state=state, target="builtin/another-model",
                         best_config={"token_budget": 512})
        rebase_episode(loop, {"spec": {"model": {"name": "m"}}})
        assert loop.state is S.STEADY, state
        assert loop.reason.startswith(f"{Event.ENGINE_SWITCHED.value}: "), loop.reason
        taken.add((state, S.STEADY, Event.ENGINE_SWITCHED))
    from slopilot.operator.trial_ends import end_on_storage_switch

    for state in S:  # the study's storage switched: the operator ends the episode
        loop = LoopState(state=state, trial=RunningTrial(0, {}, 0.0, canary=False))
        end_on_storage_switch(loop, {"status": {"studyStorages": ["sqlite:////a.db"]}},
                              "sqlite:////b.db")
        assert loop.state is S.STEADY and loop.ended_trial is not None, state
        assert loop.reason.startswith(f"{Event.STORAGE_SWITCHED.value}: "), loop.reason
        taken.add((state, S.STEADY, Event.STORAGE_SWITCHED))
    table = {(t.source, t.target, t.event) for t in TRANSITIONS}
    assert taken <= table  # holds by construction: a move outside it raises
    assert sorted(table - taken) == [], "rows no run takes"
