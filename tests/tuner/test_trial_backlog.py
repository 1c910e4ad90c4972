"""A trial begun on a queue the config before it left (the overload an alert fired on)
is judged on its own traffic once it has worked that backlog off, and on the backlog
where it cannot: a config that drains it is not cut for its predecessor's latencies,
and one that does not is still cut at the early look, a tick later than before
(``backlog_wait.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.evaluator import QueueReading
from tests.tuner.controller_fakes import (
    BAD,
    GOOD,
    START,
    FakeAlerts,
    FakeDeployment,
    FakeOffline,
    Rig,
    alert,
    by_config,
    summary,
)

ARRIVALS = 4.0
"""Requests a second, whatever the config."""
BACKLOG = 120.0
"""Requests waiting when the trial is applied: 120 s of an overload at 1/s too many."""
SERVES = {"GOOD": 8.0, "BAD": 3.0, "SLOW": 4.05, "START": 3.0, "PLATEAU": 7.0}
"""Requests each config serves a second: GOOD drains the backlog in 30 s, BAD never
(its queue grows), SLOW in 40 min."""
SLOW = {"token_budget": 4096, "chunk_size": 512}
STEADY_QUEUE = 1.0
"""What a config that keeps up holds waiting."""
BACKLOG_TTFT_MS = 20_000.0
"""A window in which a request of the backlog got its first token: its P99 is theirs."""


def _name(config: Mapping[str, Any]) -> str:
    return next(n for n, c in (("GOOD", GOOD), ("BAD", BAD), ("SLOW", SLOW),
                               ("START", START), ("PLATEAU", PLATEAU)) if dict(config) == c)


@dataclass
class Plant(FakeDeployment):
    """One replica with the old config's backlog queued when the trial is applied."""

    now: float = 0.0
    applied_at: float | None = None

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        super().apply_config(config, canary=canary, trial=trial)
        if trial and self.applied_at is None:
            self.applied_at = self.now

    def drained_at(self) -> float:
        """When the trial's config has served the last request of the backlog."""
        assert self.applied_at is not None
        spare = SERVES[_name(self.config)] - ARRIVALS
        return self.applied_at + (BACKLOG - STEADY_QUEUE) / spare if spare > 0 \
            else float("inf")

    def waiting(self, at: float) -> float:
        if self.applied_at is None or at < self.applied_at:
            return BACKLOG
        spare = SERVES[_name(self.config)] - ARRIVALS
        return max(STEADY_QUEUE, BACKLOG - spare * (at - self.applied_at))


@dataclass
class BacklogWindows:
    """The plant's windows and its queue: a window in which a request of the backlog got
    its first token reads the backlog's P99; one after, the config's own figures."""

    plant: Plant
    calls: list[tuple[float, float, bool]] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        self.calls.append((start, end, canary))
        if self.plant.applied_at is not None and start < self.plant.drained_at():
            return summary(p0_ttft=BACKLOG_TTFT_MS)
        return by_config(self.plant.serving(canary))

    def queue(self, at: float, *, canary: bool) -> QueueReading | None:
        self.reads.append(at)
        return QueueReading(waiting=self.plant.waiting(at), arrivals_per_s=ARRIVALS)


def _rig(first: Mapping[str, Any], plant: Plant | None = None
         ) -> tuple[Rig, Plant, BacklogWindows]:
    plant = Plant() if plant is None else plant
    windows = BacklogWindows(plant)
    rig = Rig(dep=plant, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              offline=FakeOffline([(dict(first), True)]),
              settings={"window_s": 120, "canary": False})
    rig.ev = windows  # type: ignore[assignment]
    return rig, plant, windows


def _run(rig: Rig, plant: Plant, since: float, until: float,
         step: float = 10.0) -> list[tuple[float, Decision]]:
    ctl = rig.ctl or rig.build()
    out, t = [], since
    while t <= until:
        plant.now = t
        out.append((t, ctl.tick(t)))
        t += step
    return out


def test_a_config_that_drains_the_backlog_is_judged_on_its_own_traffic() -> None:
    rig, plant, windows = _rig(GOOD)
    ticks = _run(rig, plant, 0.0, 400.0)
    lines = [d.line() for _, d in ticks]
    assert not [x for x in lines if "slo_breach" in x], lines
    assert 0 in rig.study.told and rig.study.told[0].feasible, lines
    assert plant.committed == GOOD
    # No window reached back into the backlog: each began after its last first token.
    assert windows.calls and min(s for s, _, _ in windows.calls) >= plant.drained_at()
    waiting = [d for t, d in ticks if 0 < t < plant.drained_at()]
    assert waiting and all("backlog" in d.reason for d in waiting), lines


def test_a_config_that_cannot_drain_it_is_cut_on_it_at_the_early_look() -> None:
    rig, plant, _ = _rig(BAD)
    ticks = _run(rig, plant, 0.0, 200.0)
    cut = [(t, d) for t, d in ticks if "slo_breach" in d.reason]
    assert cut and cut[0][1].action is Action.REVERT and cut[0][1].trial == 0, \
        [d.line() for _, d in ticks]
    # A quarter window after the first queue reading (a tick after the apply), where
    # the early look cut it at 30 s before: not max_trial_s later.
    assert cut[0][0] <= 40.0
    assert not rig.study.told[0].feasible


def test_one_too_slow_to_drain_it_within_max_trial_is_judged_on_it() -> None:
    rig, plant, _ = _rig(SLOW)
    ticks = _run(rig, plant, 0.0, 200.0)
    cut = [(t, d) for t, d in ticks if "slo_breach" in d.reason]
    assert cut and cut[0][0] <= 40.0, [d.line() for _, d in ticks]
    assert not rig.study.told[0].feasible


PLATEAU = {"token_budget": 1024, "chunk_size": 512}
"""Serves the backlog fast at first, then no faster than clients give up: its queue
falls from 120 to 60 in 20 s and stays there (a review's queue of 1,000 settled at 200
where abandons balanced the shortfall)."""


@dataclass
class PlateauPlant(Plant):
    def waiting(self, at: float) -> float:
        if self.applied_at is None or at < self.applied_at or dict(self.config) != PLATEAU:
            return super().waiting(at)
        return max(60.0, BACKLOG - 3.0 * (at - self.applied_at))

    def drained_at(self) -> float:
        return float("inf") if dict(self.config) == PLATEAU else super().drained_at()


def test_a_queue_that_levels_off_above_steady_is_judged_on_it() -> None:
    """Its fall since the first reading stayed steep on average (a fast first minute),
    so the wait went on for about a max_trial_s with no window and no early look (975 s
    in the review's run). The fall is read over the last stretch of revert_after_s: a
    queue that stopped falling ends the wait, and the early look judges the trial."""
    rig, plant, _ = _rig(PLATEAU, PlateauPlant())
    ticks = _run(rig, plant, 0.0, 300.0)
    cut = [(t, d) for t, d in ticks if "slo_breach" in d.reason]
    assert cut and cut[0][0] <= 100.0, [d.line() for _, d in ticks]
    assert not rig.study.told[0].feasible


def test_the_wait_survives_a_restart_and_its_window_counts_from_the_drain() -> None:
    rig, plant, windows = _rig(GOOD)
    _run(rig, plant, 0.0, 10.0)
    assert rig.ctl is not None
    saved = LoopState.from_dict(rig.ctl.to_dict())
    assert saved.trial is not None and saved.trial.draining
    rig.ctl = None
    ctl = rig.build(state=saved)
    assert rig.ev is windows
    ticks, t = [], 20.0
    while t <= 60.0:
        plant.now = t
        ticks.append(ctl.tick(t))
        t += 10.0
    trial = ctl.loop.trial
    assert trial is not None and not trial.draining, [d.line() for d in ticks]
    drained = next(t for t in (20.0, 30.0, 40.0) if t >= plant.drained_at())
    # max_trial_s counts from the drain, as from a rollout's end: the wait is its own.
    assert trial.started_at == trial.began_at == drained


def test_an_evaluator_without_a_queue_is_judged_as_before() -> None:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              settings={"window_s": 120, "canary": False})
    ctl = rig.build()
    for t in (0.0, 10.0):
        ctl.tick(t)
    assert ctl.loop.trial is not None and not ctl.loop.trial.draining
