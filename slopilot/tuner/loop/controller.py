"""The closed loop: alerts in, knob changes and replica counts out, one tick at a time.

The states and every move between them (``transitions.TRANSITIONS``, drawn by
``transitions.render_diagram``; a test fails when this picture and the table differ)::

    STEADY    SCALING   TUNING    COMMIT    COOLDOWN
      |-------->|                                 scale_alert, nothing_holds_offline
      |------------------>|                       retune_alert
      |-------------------------------------->|   headroom, replicas_flat
                |-------->|                       retune_suffices, capacity_suffices, tune_closest
                |---------------------------->|   scaled_up, max_replicas, replicas_flat,
                                                  replicas_short
                |<--------|                       scale_alert
                          |-------->|             trial_holds, trial_limit, trial_rate_limit,
                                                  too_little_traffic
                          |------------------>|   hold_alert
                |<------------------|             no_feasible_config
                                    |-------->|   committed, trial_rate_limit, nothing_measured,
                                                  too_little_traffic
      |<--------------------------------------|   cooldown_over
                                       again->|   commit_stuck
      |<----------------------------- any state   engine_switched
      |<----------------------------- any state   storage_switched
      |<----------------------------- any state   tuning_off
      any state ----------------------------->|   error

``tick(now)`` reads the firing alerts, runs the current state's step (``STEPS``) and follows
the moves it returns (each checked against the table) until a step returns the tick's
``Decision``. It never sleeps, so the demo's loop, the benchmark's virtual clock and the
operator's kopf daemon all drive the same object; ``now`` is seconds on the evaluator's
clock (Unix time for Prometheus). A caller that reads ``now`` from a clock passes the
clock too (``tick(now, clock=...)``): what an action starts (a trial's window, a
cooldown, a rollout's watch, a wait for replicas) counts from the clock read after the
action returned (``LoopContext.took_effect``), as a tick may take minutes before it
applies anything. Guardrails: any error during an episode rolls back to
its best known (or its starting) config, and outside one leaves the deployment's config
as it is (``LoopState.rollback_config``); a rollback whose apply fails is owed: tried
again before anything else at later ticks, with a growing wait, and no episode starts
until it lands (``restore.py``). While Prometheus is unreachable the current config is
held and the decision says so, except a trial's: one that cannot be watched is told
failed and the episode's known config restored (``_hold``). The steps, by job:
``steady.py`` (STEADY, COOLDOWN), ``scaling.py`` (SCALING), ``episode.py`` (TUNING,
COMMIT; a trial's start and end in ``trial.py``, its window and verdict in
``trial_window.py``); ``advice.py`` asks the simulator.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from slopilot.tuner.loop import restore, stale_trials
from slopilot.tuner.loop.clock_step import rebase_future
from slopilot.tuner.loop.context import LoopContext, Step, Tick
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.episode import commit, tuning
from slopilot.tuner.loop.errors import ControllerError, said
from slopilot.tuner.loop.scaling import scaling
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.loop.steady import cooldown, steady
from slopilot.tuner.loop.transitions import Event, Go, check
from slopilot.tuner.loop.trial_count import HOUR_S, try_recount
from slopilot.tuner.study.evaluator import PrometheusUnavailable

log = logging.getLogger(__name__)

STEPS: Mapping[ControllerState, Step] = {
    ControllerState.STEADY: steady,
    ControllerState.SCALING: scaling,
    ControllerState.TUNING: tuning,
    ControllerState.COMMIT: commit,
    ControllerState.COOLDOWN: cooldown,
}


class Controller(LoopContext):
    """One deployment's loop. Not a thread: call ``tick(now)`` periodically."""

    def to_dict(self) -> dict[str, Any]:
        return self.loop.to_dict()

    def tick(self, now: float, *, clock: Callable[[], float] | None = None) -> Decision:
        """One step of the loop at ``now``. ``clock`` is where ``now`` was read (the
        operator's and the demo's wall clock): read again after each action returns, it
        times what the action starts (a trial's window, a cooldown, a rollout's watch, a
        wait for replicas) from when the action took effect, not from the tick's start
        (``LoopContext.took_effect``). None: a virtual clock that stands still within the
        tick (the benchmarks, the simulated cluster), and nothing new is read."""
        self.clock = clock
        loop = self.loop
        # Before the rebase: a start the study kept is matched with the record's as it
        # was written, before a clock stepped back moves the record's.
        try_recount(self, now)
        # A trial a killed process left RUNNING is failed once stale, episode or not.
        stale_trials.sweep(self, now)
        if moved := rebase_future(loop, self.settings, now):
            log.warning("%s: times kept in the future of the clock (it stepped back, or the "
                        "state was written on another clock), each wait restarted from "
                        "now: %s", self.settings.key, ", ".join(moved))
        loop.trial_starts = [t for t in loop.trial_starts if now - t < HOUR_S]
        try:
            # An owed rollback first: nothing else this tick may apply a config over it.
            retried = restore.retry(self, now)
            decision = retried if retried is not None else self._step(now)
        except PrometheusUnavailable as exc:
            decision = self._hold(exc)
        except Exception as exc:  # guardrail: never leave a half-tried config behind
            log.exception("%s: controller error; rolling back", self.settings.key)
            decision = self._rollback(now, exc)
        check = self.twin_check
        if check is not None and check.at == now:
            decision = dataclasses.replace(decision, twin=check.to_dict())
            level = logging.INFO if check.trusted else logging.WARNING
            log.log(level, "%s: %s", self.settings.key, check.line())
        self._emit(decision)
        return decision

    def _step(self, now: float) -> Decision:
        loop = self.loop
        alerts = self.alerts.firing()
        if loop.prometheus_unavailable:
            loop.prometheus_unavailable = False
            if loop.trial is not None:  # its restore failed all through the outage
                loop.trial.started_at = now  # the outage's window does not count
            log.info("%s: Prometheus is reachable again; resuming", self.settings.key)
        tick = Tick(now, alerts)
        return self._follow(STEPS[loop.state](self, tick, None), tick)

    def _follow(self, step: Decision | Go, tick: Tick) -> Decision:
        """Make the moves ``step`` asks for, running each new state's step, until one
        decides. No tick visits a state twice, so more moves than states is a bug."""
        path = [self.loop.state.value]
        while isinstance(step, Go):
            if len(path) > len(ControllerState):
                raise ControllerError(f"{len(path) - 1} moves in one tick "
                                      f"({' -> '.join(path)} -> {step.target.value}): "
                                      "a step loops back")
            self._move(step, tick.now)
            path.append(step.target.value)
            step = STEPS[step.target](self, tick, step)
        return step

    def _move(self, go: Go, now: float) -> None:
        loop = self.loop
        check(loop.state, go.target, go.event)
        log.debug("%s: %s -> %s on %s", self.settings.key, loop.state.value,
                  go.target.value, go.event.value)
        if go.target is not loop.state:
            loop.state, loop.since = go.target, now
        loop.reason = go.reason

    def stop(self, now: float, reason: str) -> None:
        """Tuning ends here (turned off, or the deployment deleted), and the episode with
        it: the open trial is told failed and the loop goes to STEADY. Turned on again,
        the loop then waits for an alert; a TUNING, COMMIT or SCALING state kept would go
        on with no alert asking. Restoring the pods' config is the caller's, an owed
        rollback's too (``restore.py``): kept, it was applied when tuning was turned on
        again, over whatever the deployment runs by then."""
        loop = self.loop
        if loop.pending_restore is not None:
            log.warning("%s: the owed restore is left to the caller: %s", self.settings.key,
                        restore.owed(loop.pending_restore, now))
            loop.pending_restore = None
        # A scale's replicas awaited are no longer the loop's to wait for: turned on
        # again, an old wait ended in an inform about a scale long past.
        loop.replica_wait = None
        # Nor is a rollout: kept, a commit's revert_to reverted a later cooldown's
        # deployment to the config before that commit, rolled out fine since.
        loop.rollout = None
        if loop.trial is not None:
            number, loop.trial = loop.trial.number, None
            try:
                self.study.tell_failed(number, reason)
                log.info("%s: trial %d told failed: %s", self.settings.key, number, reason)
            except Exception:  # left RUNNING, it goes stale once nothing beats for it
                log.exception("%s: could not fail trial %d", self.settings.key, number)
        self._move(Go(ControllerState.STEADY, Event.TUNING_OFF, reason), now)

    # ------------------------------------------------------------------ guardrails
    def _hold(self, exc: Exception) -> Decision:
        """Prometheus cannot be read: hold, and say so once. A trial cannot be judged
        while it lasts, so its config is not left to serve unwatched (one that breaks P0
        ten-fold, which the early look cuts at a quarter window, served the whole
        outage): the episode's known config is restored and the trial told failed, which
        the study learns from as it does from a refused config. The episode stays in
        TUNING and asks its next trial once Prometheus answers again."""
        loop = self.loop
        first = not loop.prometheus_unavailable
        loop.prometheus_unavailable = True
        quiet = Action.HOLD if first else Action.NONE
        t = loop.trial
        if t is None:
            return self.decide(quiet, f"prometheus_unavailable: holding the current "
                               f"config ({exc})")
        try:
            self.restore(t.canary)
        except Exception as restore_exc:  # kept open: the next tick of the outage retries
            log.exception("%s: could not restore the known config under trial %d",
                          self.settings.key, t.number)
            return self.decide(quiet, f"prometheus_unavailable: trial {t.number} cannot be "
                               f"watched and the known config could not be restored "
                               f"({restore_exc}); retrying ({exc})", trial=t.number)
        loop.trial = None
        # Counted as any failed trial: a Prometheus that comes and goes would otherwise
        # let an episode start trials without end.
        loop.episode_trials += 1
        self.metrics.trial(self.settings.deployment, TrialOutcome.FAILED)
        try:
            self.study.tell_failed(t.number, f"prometheus unavailable: {exc}")
        except Exception:  # left RUNNING, it goes stale once nothing beats for it
            log.exception("%s: could not fail trial %d", self.settings.key, t.number)
        return self.decide(Action.REVERT, f"prometheus_unavailable: trial {t.number} cannot "
                           "be watched: told failed, the known config restored and held "
                           f"({exc})", trial=t.number, config=t.config)

    def _rollback(self, now: float, exc: Exception) -> Decision:
        loop = self.loop
        number = None
        # With its cause (errors.said): Optuna's StorageInternalError blames "invalid
        # data in the commit" for a file another tenant held locked.
        cause = f"error: {type(exc).__name__}: {said(exc)}"
        if loop.trial is not None:
            number = loop.trial.number
            try:
                self.study.tell_failed(number, cause)
            except Exception:  # the study may be what failed; the rollback matters more
                log.exception("%s: could not record the failed trial",
                              self.settings.key)
            self.metrics.trial(self.settings.deployment, TrialOutcome.FAILED)
            loop.trial = None
        target = loop.rollback_config()
        if loop.pending_restore is not None:  # tried at its own pace, not at every error
            reason = f"{cause}; a restore is owed: {restore.owed(loop.pending_restore, now)}"
        elif target is None:
            reason = f"{cause}; outside an episode: the config left as it is"
        else:
            try:
                self.deployment.apply_config(target, canary=False)
                reason = f"{cause}; rolled back to the best known config"
            except Exception as apply_exc:  # owed: retried from the next tick (restore.py)
                log.exception("%s: rollback failed", self.settings.key)
                kept = restore.failed(loop, now, apply_exc, trial=number)
                reason = f"rollback_failed: {cause}; {restore.owed(kept, now)}"
        return self._follow(Go(ControllerState.COOLDOWN, Event.ERROR, reason,
                               action=Action.REVERT), Tick(now, ()))

    def _emit(self, d: Decision) -> None:
        dep = self.settings.deployment
        self.metrics.action(dep, d.action, d.reason)
        self.metrics.observe(dep, d.state, d.replicas)
        level = logging.INFO if d.action is not Action.NONE else logging.DEBUG
        log.log(level, "%s: %s", self.settings.key, d.line())
