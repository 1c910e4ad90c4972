"""What an action starts counts from when the action took effect, not from the tick's
start: a trial's window, a cooldown, a rollout's watch, a wait for replicas bought.

A tick may take seconds to minutes before it applies anything (an Optuna RDB storage
that answers ``ask`` slowly, a slow API server, a canary's PUT). Timed from the ``now``
read before the tick, the trial's window began before its config ran: in ``make demo``
a 24.5 s tick applied trial 0, which was judged infeasible 0.9 s after its TRIAL line on
52 requests that had all run the config before it. Here the fakes advance an injected
clock instead of sleeping; ``Controller.tick(now, clock=...)`` reads it again after
each action returns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.ports import Rollout
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import (
    GOOD,
    FakeAlerts,
    FakeDeployment,
    FakeOffline,
    FakePlanner,
    FakeStudy,
    Rig,
    alert,
)
from tests.tuner.test_rollout_wait import RollingDeployment

T0 = 1_000.0
ASK_S = 12.0
"""How long the study takes to answer ``ask`` (the reviewer's busy machine)."""
APPLY_S = 3.0
"""How long an apply or a scale takes to return (a canary's PUT, a slow API server)."""


@dataclass
class Clock:
    """The clock ``now`` is read from; the fakes advance it as their calls take time."""

    t: float = T0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@dataclass
class SlowStudy(FakeStudy):
    clock: Clock = field(default_factory=Clock)

    def ask(self) -> tuple[int, dict[str, Any]]:
        self.clock.advance(ASK_S)
        return super().ask()


@dataclass
class SlowDeployment(FakeDeployment):
    """Each apply and scale returns ``APPLY_S`` after it was asked; ``applied_at`` and
    ``scaled_at`` are the clock's readings as each returned."""

    clock: Clock = field(default_factory=Clock)
    applied_at: list[float] = field(default_factory=list)
    scaled_at: list[float] = field(default_factory=list)

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        self.clock.advance(APPLY_S)
        super().apply_config(config, canary=canary, trial=trial)
        self.applied_at.append(self.clock())

    def scale(self, n: int) -> None:
        self.clock.advance(APPLY_S)
        super().scale(n)
        self.scaled_at.append(self.clock())


def _slow_rig(clock: Clock, replicas: int = 1) -> Rig:
    return Rig(dep=SlowDeployment(n=replicas, clock=clock), study=SlowStudy(clock=clock),
               alerts=FakeAlerts([alert(AlertAction.RETUNE)]))


def _tick(ctl: Controller, clock: Clock) -> Decision:
    return ctl.tick(clock(), clock=clock)


@pytest.mark.parametrize("replicas", [1, 2], ids=["every_replica", "canary"])
def test_a_trial_asked_and_applied_slowly_is_measured_from_its_apply(replicas: int
                                                                     ) -> None:
    clock = Clock()
    rig = _slow_rig(clock, replicas)
    ctl = rig.build()
    first = _tick(ctl, clock)
    assert first.action is Action.TRIAL and first.config == GOOD
    assert isinstance(rig.dep, SlowDeployment)
    applied = rig.dep.applied_at[-1]
    assert applied == T0 + ASK_S + APPLY_S
    t = ctl.loop.trial
    assert t is not None
    assert (t.started_at, t.began_at) == (applied, applied)
    # The very next tick: no window has run yet. Timed from the tick's start, this tick
    # judged (and committed) trial 0 on 15 s that held no second of it.
    at_once = _tick(ctl, clock)
    assert at_once.state is ControllerState.TUNING and at_once.action is Action.NONE, \
        at_once.line()
    assert rig.ev is not None and rig.ev.calls == []
    clock.advance(ctl.settings.window_s)
    judged = _tick(ctl, clock)
    assert judged.action is Action.COMMIT, judged.line()
    assert rig.ev.calls[0][0] == applied + ctl.settings.settle_s
    # The commit's cooldown (and the alerts' re-confirmation after it, which reads the
    # action's time back from it) counts from when the commit's apply returned.
    assert ctl.loop.cooldown_until == rig.dep.applied_at[-1] + ctl.settings.cooldown_s


def test_a_virtual_clock_reads_nothing_new() -> None:
    # Benchmarks and the simulated cluster tick on a virtual clock that stands still
    # within a tick: without a clock, what a tick starts counts from its ``now``.
    clock = Clock()
    rig = _slow_rig(clock)
    ctl = rig.build()
    ctl.tick(T0)
    assert ctl.loop.trial is not None and ctl.loop.trial.started_at == T0


def test_a_rollback_after_an_error_cools_down_from_its_apply() -> None:
    clock = Clock()
    rig = _slow_rig(clock, replicas=2)
    ctl = rig.build()
    _tick(ctl, clock)
    assert rig.ev is not None and isinstance(rig.dep, SlowDeployment)

    def broken(config: Mapping[str, Any]) -> WindowSummary:
        raise RuntimeError("the evaluator's query failed")
    rig.ev.figures = broken
    clock.advance(ctl.settings.window_s)
    d = _tick(ctl, clock)
    assert d.state is ControllerState.COOLDOWN and d.action is Action.REVERT, d.line()
    assert ctl.loop.cooldown_until == rig.dep.applied_at[-1] + ctl.settings.cooldown_s


def test_a_scale_up_waits_for_its_replicas_from_the_scale() -> None:
    clock = Clock()
    dep = SlowDeployment(n=2, ready_cap=2, why_not_ready="no node fits", clock=clock)
    rig = Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]),
              planner=FakePlanner(needed=4), offline=None,
              settings={"max_replicas": 6, "cooldown_s": 30, "replica_ready_s": 120})
    ctl = rig.build()
    d = _tick(ctl, clock)
    assert d.action is Action.SCALE and dep.scaled == [4], d.line()
    scaled = dep.scaled_at[-1]
    assert ctl.loop.replica_wait is not None and ctl.loop.replica_wait.since == scaled
    assert ctl.loop.cooldown_until == scaled + 30


READ_S = 5.0
"""How long a read of the rollout's state takes (a slow API server)."""


@dataclass
class ClockedRolling(RollingDeployment):
    """A rolling deployment on the injected clock: its rollout starts as the apply is
    asked, each apply returns ``APPLY_S`` later, each read of its state ``READ_S``
    later and reports the state at that moment."""

    clock: Clock = field(default_factory=Clock)
    applied_at: list[float] = field(default_factory=list)
    settled_at: list[float] = field(default_factory=list)
    """When each read that found the rollout done returned."""

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        self.now = self.clock()
        super().apply_config(config, canary=canary, trial=trial)
        self.clock.advance(APPLY_S)
        self.applied_at.append(self.clock())

    def settled(self, now: float) -> Rollout:
        self.clock.advance(READ_S)
        rolling = self.rolling is not None
        state = super().settled(self.clock())
        if rolling and self.rolling is None:
            self.settled_at.append(self.clock())
        return state


def _rolling_rig(dep: ClockedRolling) -> Rig:
    return Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
               offline=FakeOffline(), settings={"window_s": 120, "canary": False})


def _run(ctl: Controller, clock: Clock, until: float, step: float = 30.0
         ) -> Iterator[Decision]:
    """A tick every ``step`` s (or at once where the last one ran past it), to ``until``
    after ``T0``; each tick's decision as it is made."""
    t = T0 + step
    while t <= T0 + until:
        clock.t = max(clock.t, t)
        yield _tick(ctl, clock)
        t += step


def test_a_rolled_out_trial_is_measured_from_the_read_that_saw_it_done() -> None:
    clock = Clock()
    dep = ClockedRolling(clock=clock)
    rig = _rolling_rig(dep)
    ctl = rig.build()
    first = _tick(ctl, clock)
    assert first.action is Action.TRIAL
    # Watched from the apply's return: the bound on a rollout that never moves counts
    # from there.
    assert ctl.loop.rollout is not None and ctl.loop.rollout.since == dep.applied_at[-1]
    t = ctl.loop.trial
    assert t is not None and t.rolling
    for d in _run(ctl, clock, 400.0):
        if not t.rolling:
            break
        assert d.action is Action.NONE and "rolling out" in d.reason, d.line()
    assert not t.rolling and dep.settled_at
    assert (t.started_at, t.began_at) == (dep.settled_at[0], dep.settled_at[0])


def test_a_stuck_trials_rollback_is_watched_from_its_apply() -> None:
    clock = Clock()
    dep = ClockedRolling(clock=clock, roll_s=None)
    rig = _rolling_rig(dep)
    ctl = rig.build()
    stuck = next(d for d in _run(ctl, clock, 1000.0) if "rollout_stuck" in d.reason)
    assert stuck.action is Action.REVERT
    assert ctl.loop.rollout is not None
    assert ctl.loop.rollout.since == dep.applied_at[-1]
