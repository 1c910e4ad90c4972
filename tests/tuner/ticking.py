"""Ticking a live controller until a decision: each acting step re-arms the hang guard,
up to the most steps the phase can take."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from slopilot.tuner.loop.decision import Action, Decision
from tests.support.waits import wait_for


class Ticks(Protocol):
    def tick(self, now: float) -> Decision: ...


def tick_until(ctl: Ticks, done: Callable[[Decision], bool], *, what: str,
               log: list[Decision], steps: int = 0, now: Callable[[], float] = time.time,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Decision:
    """Tick ``ctl`` every 0.5 s until a decision is ``done``; a hang shows the decisions.

    Each of the first ``steps`` decisions that act (a trial, a repeated window, a revert,
    a commit) is progress and re-arms the hang guard: how many steps a phase takes is up
    to the noise of 6 s windows and the machine's speed, and only a phase that stalls a
    whole guard fails. Acting past ``steps`` (the most the phase can take) is a loop, not
    progress: it no longer re-arms, so a controller that acts on and on fails a guard
    later, within pytest's limit, instead of running into it (or a CI job's)."""
    acted_before = _acted(log)

    def tick() -> Decision | None:
        d = ctl.tick(now())
        log.append(d)
        return d if done(d) else None

    def decisions() -> str:
        return "\n".join(x.line() for x in log
                         if x.action is not Action.NONE or x.summary is not None)

    return wait_for(tick, what, interval_s=0.5, diagnose=decisions,
                    progress=lambda: min(steps, _acted(log) - acted_before),
                    clock=clock, sleep=sleep)


def _acted(log: list[Decision]) -> int:
    return sum(x.action is not Action.NONE for x in log)
