"""What one deployment's loop works with, shared by the steps of every state.

``LoopContext`` holds the settings, the ports (``ports.py``), the persisted memory
(``LoopState``) and the metrics; ``Controller`` is a ``LoopContext`` that ticks. A state's
step is a plain function ``(ctx, tick, entered) -> Decision | Go``: ``entered`` is the move
that brought the loop into the state during this tick (None when the tick starts there),
and a returned ``Go`` moves on to the next state's step within the same tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.ports import (
    AlertReader,
    DeploymentHandle,
    IterationSource,
    LiveStudy,
    OfflineSearch,
    Planner,
    TwinSimulator,
    WindowEvaluator,
    WorkloadProbe,
)
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.loop.transitions import Go
from slopilot.tuner.loop.twin_check import TwinCheck
from slopilot.tuner.loop.twin_predict import InProcessTwin
from slopilot.tuner.prometheus.alerts import Alert

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tick:
    """What one tick observed before any step ran."""

    now: float
    """Seconds on the evaluator's clock (Unix time for Prometheus)."""
    alerts: Sequence[Alert]
    """The deployment's firing alerts."""


class LoopContext:
    def __init__(self, settings: ControllerSettings, deployment: DeploymentHandle,
                 alerts: AlertReader, evaluator: WindowEvaluator, study: LiveStudy,
                 probe: WorkloadProbe, planner: Planner, *,
                 offline: OfflineSearch | None = None, metrics: TunerMetrics | None = None,
                 state: LoopState | None = None, headroom_margin: float = 0.2,
                 scale_up_margin: float = 0.1,
                 iterations: IterationSource | None = None,
                 twin: TwinSimulator | None = None) -> None:
        self.settings = settings
        self.deployment = deployment
        self.alerts = alerts
        self.evaluator = evaluator
        self.study = study
        self.probe = probe
        self.planner = planner
        self.offline = offline
        self.metrics = metrics if metrics is not None else TunerMetrics()
        self.loop = state if state is not None else LoopState()
        if self.loop.trial is not None:  # asked before a restart: held here from now on
            study.resume(self.loop.trial.number)
        self._forget_best_outside_space()
        self.iterations = iterations
        """Where the twin is checked (None: the twin is trusted unchecked, as before)."""
        self.twin: TwinSimulator = twin if twin is not None else InProcessTwin()
        """Where the check's window is simulated: the operator's simulator processes
        (``sim/worker.WorkerTwin``); None, this process (a world without an event loop)."""
        self.twin_check: TwinCheck | None = None
        """The last check, with its corrected profile (in memory; the status has a copy)."""
        self.twin_history: list[tuple[float, list[WindowSample]]] = []
        """(end, iterations) of the last checked windows that do not overlap (in memory:
        a restarted controller corrects from the next window on)."""
        self.held_by: frozenset[str] = frozenset()
        """The hold alerts (``Alert.describe()``) the last tick in STEADY held for: a hold
        is said once for each new set (in memory: a restarted controller says it again)."""
        self.informed_of: frozenset[str] = frozenset()
        """The inform alerts the last tick in STEADY reported, likewise said once for each
        new set: said every tick, one firing for hours posted an event on the CR a tick."""
        self.twin_no_answer: tuple[float, str] | None = None
        """(when, why) the simulator last gave this loop no answer: busy with other
        deployments' calls, or past a call's time limit or memory cap."""
        # Hysteresis: scale up to a count that holds with 10 % to spare in simulation,
        # scale down only to one that holds with 20 %, so the two never undo each other.
        if not 0.0 <= scale_up_margin <= headroom_margin < 1.0:
            raise ControllerError(
                f"margins scale_up={scale_up_margin!r}, headroom={headroom_margin!r}: "
                "need 0 <= scale_up_margin <= headroom_margin < 1 (e.g. 0.1 and 0.2)")
        self.headroom_margin, self.scale_up_margin = headroom_margin, scale_up_margin
        self.starts_recounted = False
        """Whether the study's trial starts were merged into ``loop.trial_starts`` yet
        (``trial_count.recount``): once per controller, before its first trial."""
        self.starts_unread = False
        """Whether the last try to read them failed (said once until one succeeds)."""
        self.stale_swept_at: float | None = None
        """When the study's stale trials were last failed (``stale_trials.sweep``); None:
        not yet by this controller."""
        self.stale_unswept = False
        """Whether the last sweep failed (said once until one succeeds)."""
        self.clock: Callable[[], float] | None = None
        """Where the tick's ``now`` was read (``Controller.tick``'s ``clock``), read again
        by ``took_effect``; None: a virtual clock that stands still within a tick."""

    def _forget_best_outside_space(self) -> None:
        """An open episode's best (or one whose rollback is still owed) that this
        study's space no longer holds (its bounds narrowed since, or a status written by
        hand) is forgotten: committed or rolled back to, it put every replica on a config
        the spec's bounds rule out. Its baseline, the config it began on, is the rollback
        target again."""
        loop = self.loop
        if not loop.restore_owed or loop.best_config is None:
            return
        why = self.study.space.outside(loop.best_config)
        if why is not None:
            log.warning("%s: the episode's best config is forgotten: %s (the search "
                        "space now)", self.settings.key, why)
            loop.best_config = loop.best_goodput = None

    @property
    def state(self) -> ControllerState:
        return self.loop.state

    def decide(self, action: Action, reason: str, *, trial: int | None = None,
               config: Mapping[str, Any] | None = None,
               summary: WindowSummary | None = None) -> Decision:
        return Decision(self.loop.state, action, reason, self.deployment.replicas(),
                        self.loop.prometheus_unavailable, trial, config, summary)

    def took_effect(self, now: float) -> float:
        """When the action that just returned (an apply, a scale, a read that saw a
        rollout done) took effect: the tick's clock read now, never before the tick's
        ``now``; ``now`` itself where the tick has no clock (a virtual one that stands
        still within a tick). Taken after the call returns: a config a PUT is still
        carrying does not yet serve, and a window counted from before it measured the
        config before (``Controller.tick``)."""
        if self.clock is None:
            return now
        return max(now, self.clock())

    def restore(self, canary: bool) -> None:
        """Back to the episode's best config, or the one it started from."""
        target = self.loop.rollback_config()
        if target is not None:
            self.deployment.apply_config(target, canary=canary)


Step = Callable[[LoopContext, Tick, Go | None], Decision | Go]
