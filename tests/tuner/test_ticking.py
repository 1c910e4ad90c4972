"""tick_until on a fake clock: acting re-arms the guard only up to the phase's steps."""

from __future__ import annotations

import pytest

from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState
from tests.support.waits import HANG_GUARD_S, WaitHung
from tests.tuner.ticking import tick_until

STEP_S = HANG_GUARD_S / 2  # each tick takes half a guard on this fake clock


class Looping:
    """A controller that acts on every tick and never gets anywhere."""

    def __init__(self, clock: list[float], action: Action = Action.REPEAT) -> None:
        self.clock, self.action, self.ticks = clock, action, 0

    def tick(self, now: float) -> Decision:
        self.ticks += 1
        self.clock[0] += STEP_S
        return Decision(ControllerState.TUNING, self.action, "again", replicas=1)


def _run(ctl: Looping, clock: list[float], steps: int, ticks_allowed: int) -> None:
    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if ctl.ticks > ticks_allowed:  # the guard never fired: fail, do not loop forever
            raise AssertionError(f"still ticking after {ctl.ticks} acting ticks")

    tick_until(ctl, lambda d: False, what="an end that never comes", log=[], steps=steps,
               now=lambda: clock[0], clock=lambda: clock[0], sleep=sleep)


@pytest.mark.parametrize("steps", [0, 3])
def test_a_controller_acting_past_its_steps_fails_at_the_guard(steps: int) -> None:
    clock = [0.0]
    ctl = Looping(clock)
    with pytest.raises(WaitHung, match="an end that never comes"):
        _run(ctl, clock, steps, ticks_allowed=steps + 10)
    # Each of the first ``steps`` acting ticks re-armed the guard; after them, one guard.
    assert steps + 1 <= ctl.ticks <= steps + 3


def test_ticks_that_do_not_act_are_no_progress() -> None:
    clock = [0.0]
    ctl = Looping(clock, Action.NONE)
    with pytest.raises(WaitHung):
        _run(ctl, clock, 5, ticks_allowed=10)
    assert ctl.ticks <= 3
