"""The closed loop: alerts in, knob changes and replica counts out, one tick at a time.

::

    STEADY --retune alert--> TUNING --feasible trial / limit--> COMMIT --> COOLDOWN --> STEADY
       |                       |  (no config holds)                ^
       +--scale alert--> SCALING <-----------------------------------+--> (sim: enough
                                   replicas) TUNING

``tick(now)`` does at most one step and returns a ``Decision``; it never sleeps, so the
demo's loop, the benchmark's virtual clock and the operator's kopf daemon all drive the
same object. ``now`` is seconds on the evaluator's clock (Unix time for Prometheus).
Guardrails: any error rolls back to the best known (or the starting) config; while
Prometheus is unreachable the current config is held and the decision says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from slopilot.engine.config import ConfigError
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.ports import (
    AlertReader,
    DeploymentHandle,
    LiveStudy,
    OfflineSearch,
    WindowEvaluator,
    WorkloadProbe,
)
from slopilot.tuner.loop.state import (
    Action,
    ControllerError,
    ControllerSettings,
    ControllerState,
    Decision,
    LoopState,
    RunningTrial,
    TrialOutcome,
)
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected
from slopilot.tuner.study.objective import score

log = logging.getLogger(__name__)
HOUR_S = 3600.0


class Planner(Protocol):
    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer: ...


class Controller:
    """One deployment's loop. Not a thread: call ``tick(now)`` periodically."""

    def __init__(self, settings: ControllerSettings, deployment: DeploymentHandle,
                 alerts: AlertReader, evaluator: WindowEvaluator, study: LiveStudy,
                 probe: WorkloadProbe, planner: Planner, *,
                 offline: OfflineSearch | None = None, metrics: TunerMetrics | None = None,
                 state: LoopState | None = None, headroom_margin: float = 0.2,
                 scale_up_margin: float = 0.1) -> None:
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
        # Hysteresis: scale up to a count that holds with 10 % to spare in simulation,
        # scale down only to one that holds with 20 %, so the two never undo each other.
        if not 0.0 <= scale_up_margin <= headroom_margin < 1.0:
            raise ControllerError(
                f"margins scale_up={scale_up_margin!r}, headroom={headroom_margin!r}: "
                "need 0 <= scale_up_margin <= headroom_margin < 1 (e.g. 0.1 and 0.2)")
        self.headroom_margin, self.scale_up_margin = headroom_margin, scale_up_margin

    @property
    def state(self) -> ControllerState:
        return self.loop.state

    def to_dict(self) -> dict[str, Any]:
        return self.loop.to_dict()

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float) -> Decision:
        loop = self.loop
        loop.trial_starts = [t for t in loop.trial_starts if now - t < HOUR_S]
        try:
            alerts = self.alerts.firing()
            if loop.prometheus_unavailable:
                loop.prometheus_unavailable = False
                if loop.trial is not None:
                    loop.trial.started_at = now  # the outage's window does not count
                log.info("%s: Prometheus is reachable again; resuming",
                         self.settings.deployment)
            decision = self._step(now, alerts)
        except PrometheusUnavailable as exc:
            decision = self._hold(now, exc)
        except Exception as exc:  # guardrail: never leave a half-tried config behind
            log.exception("%s: controller error; rolling back", self.settings.deployment)
            decision = self._rollback(now, exc)
        self._emit(decision)
        return decision

    def _step(self, now: float, alerts: list[Alert]) -> Decision:
        state = self.loop.state
        if state is ControllerState.TUNING:
            return self._tuning(now)
        if state is ControllerState.COMMIT:
            return self._commit(now, "resuming an interrupted commit")
        if state is ControllerState.SCALING:
            return self._scale(now, self.loop.scale_reason or "resuming scaling")
        if state is ControllerState.COOLDOWN:
            if self.loop.cooldown_until is not None and now < self.loop.cooldown_until:
                return self._decide(Action.NONE, "cooling down")
            self._enter(ControllerState.STEADY, now, "cooldown over")
            return self._decide(Action.NONE, "cooldown over")
        return self._steady(now, alerts)

    # ------------------------------------------------------------------ steady
    def _steady(self, now: float, alerts: list[Alert]) -> Decision:
        scale = [a for a in alerts if a.action is AlertAction.SCALE]
        retune = [a for a in alerts if a.action is AlertAction.RETUNE]
        if scale or retune:
            self.loop.headroom_since = None
        if scale:
            self.loop.scale_reason = "alert " + _names(scale)
            return self._scale(now, self.loop.scale_reason)
        if retune:
            return self._start_tuning(now, "alert " + _names(retune), allow_scale=True)
        inform = [a for a in alerts if a.action is AlertAction.INFORM]
        decision = self._headroom(now)
        if decision is None and inform:
            return self._decide(Action.INFORM, "alert " + _names(inform))
        return decision or self._decide(Action.NONE, "steady")

    def _headroom(self, now: float) -> Decision | None:
        loop, s = self.loop, self.settings
        current = self.deployment.replicas()
        if current <= s.min_replicas:
            loop.headroom_since = None
            return None
        if loop.headroom_since is None:
            loop.headroom_since = now
        if now - loop.headroom_since < s.scale_down_after_s:
            return None
        loop.headroom_since = now  # look again after another quiet period
        answer = self.planner.search(self.probe.measure(now), self.deployment.current_config(),
                                     s.min_replicas, current, margin=self.headroom_margin)
        if answer.replicas is None or answer.replicas >= current:
            return None
        self.deployment.scale(answer.replicas)
        return self._cool(now, Action.SCALE, f"scale_down {current}->{answer.replicas}: "
                          f"quiet for {s.scale_down_after_s:g} s and the simulator holds "
                          "the SLO with fewer")

    # ------------------------------------------------------------------ tuning
    def _start_tuning(self, now: float, reason: str, *, allow_scale: bool,
                      ranked: Sequence[tuple[dict[str, Any], bool]] | None = None
                      ) -> Decision:
        loop, s = self.loop, self.settings
        if len(loop.trial_starts) >= s.max_trials_per_hour:
            return self._decide(Action.HOLD, f"trial_rate_limit: {s.max_trials_per_hour} "
                                f"trials in the last hour; {reason}")
        loop.baseline_config = dict(self.deployment.current_config())
        loop.best_config, loop.best_goodput = None, None
        loop.episode_trials = loop.episode_feasible = 0
        replicas = self.deployment.replicas()
        if ranked is None and self.offline is not None:
            ranked = self._offline(now, replicas)
        if ranked:
            if not any(ok for _, ok in ranked) and allow_scale \
                    and replicas < s.max_replicas:
                loop.scale_reason = (f"offline study: no config holds the SLO at {replicas} "
                                     f"replica(s); {reason}")
                return self._scale(now, loop.scale_reason, at_least=replicas + 1)
            self.study.warm_start([c for c, _ in ranked])
        self._enter(ControllerState.TUNING, now, reason)
        self.metrics.action(s.deployment, Action.RETUNE, reason)
        log.info("%s: %s", s.deployment, self._decide(Action.RETUNE, reason).line())
        return self._next_trial(now, f"retune: {reason}")

    def _offline(self, now: float, replicas: int, scenario: Scenario | None = None
                 ) -> list[tuple[dict[str, Any], bool]]:
        """The offline study's best configs, minus the one that is running.

        The running config is what the firing alert measured: the live evidence that it
        does not hold outranks a simulator that says it does (a workload profile that
        lags the shift, a cost model off for this hardware), so it is no warm start.
        """
        current = dict(self.deployment.current_config())
        scenario = scenario if scenario is not None else self.probe.measure(now)
        ranked = self.offline.best_configs(scenario, replicas, current,
                                           self.settings.warm_start_k + 1) \
            if self.offline is not None else []
        return [(c, ok) for c, ok in ranked if any(current.get(k) != v for k, v in c.items())
                ][:self.settings.warm_start_k]

    def _next_trial(self, now: float, reason: str) -> Decision:
        loop, s = self.loop, self.settings
        if loop.episode_trials >= s.max_trials:
            return self._commit(now, f"trial_limit: {s.max_trials} trials")
        if len(loop.trial_starts) >= s.max_trials_per_hour:
            return self._commit(now, f"trial_rate_limit: {s.max_trials_per_hour} per hour")
        number, config = self.study.ask()
        canary = s.canary and self.deployment.replicas() > 1
        loop.trial_starts.append(now)
        try:
            replica = self.deployment.apply_config(config, canary=canary)
        except ConfigError as exc:
            self.study.tell_failed(number, f"config refused: {exc}")
            self.metrics.trial(s.deployment, TrialOutcome.FAILED)
            loop.episode_trials += 1
            self._restore(canary)
            return self._decide(Action.REVERT, f"config_refused trial {number}: {exc}",
                                trial=number, config=config)
        loop.trial = RunningTrial(number, dict(config), now, canary,
                                  canary_replica=replica if canary else None)
        where = "canary" if canary else "all replicas"
        return self._decide(Action.TRIAL, f"trial {number} on {where}; {reason}",
                            trial=number, config=config)

    def _tuning(self, now: float) -> Decision:
        loop, s = self.loop, self.settings
        t = loop.trial
        if t is None:
            return self._next_trial(now, "next trial")
        elapsed = now - t.started_at
        if elapsed < s.window_s:
            if elapsed < s.revert_after_s:
                return self._decide(Action.NONE, f"trial {t.number} running", trial=t.number)
            try:
                partial = self.evaluator.measure(t.started_at, now, canary=t.canary)
            except WindowRejected:
                return self._decide(Action.NONE, f"trial {t.number} running", trial=t.number)
            breach = self._p0_breach(partial)
            if breach is None:
                return self._decide(Action.NONE, f"trial {t.number} running", trial=t.number)
            self.study.tell(t.number, score(partial, s.slo, t.config))
            return self._end_trial(t, TrialOutcome.REVERTED, Action.REVERT,
                                   f"p0_breach trial {t.number} cut short: {breach}", partial)
        try:
            summary = self.evaluator.measure(t.started_at, now, canary=t.canary)
        except WindowRejected as exc:
            t.repeats += 1
            if t.repeats >= s.max_window_repeats:
                self.study.tell_failed(t.number, f"window rejected {t.repeats} times")
                return self._end_trial(t, TrialOutcome.FAILED, Action.REVERT,
                                       f"window_rejected trial {t.number} {t.repeats} "
                                       f"times: {exc.reason}", None)
            t.started_at = now
            return self._decide(Action.REPEAT, f"window_rejected trial {t.number} "
                                f"(repeat {t.repeats}): {exc.reason}", trial=t.number)
        result = score(summary, s.slo, t.config)
        self.study.tell(t.number, result)
        number, config = t.number, t.config
        self.metrics.trial(s.deployment, TrialOutcome.COMPLETE)
        loop.episode_trials += 1
        loop.trial = None
        if result.feasible:
            loop.episode_feasible += 1
            if loop.best_goodput is None or result.goodput_tok_s > loop.best_goodput:
                loop.best_config, loop.best_goodput = dict(config), result.goodput_tok_s
            return self._commit(now, f"trial {number} holds the SLO "
                                f"(goodput {result.goodput_tok_s:.0f} tok/s)", summary)
        worst = max(zip(result.constraint_names, result.constraints, strict=True),
                    key=lambda kv: kv[1], default=("?", 0.0))
        reason = f"trial {number} infeasible: {worst[0]} {worst[1]:+.0%} over"
        if loop.episode_trials >= s.max_trials or \
                len(loop.trial_starts) >= s.max_trials_per_hour:
            return self._next_trial(now, reason)  # ends the episode now
        return self._decide(Action.NONE, reason, trial=number, config=config,
                            summary=summary)

    def _p0_breach(self, summary: WindowSummary) -> str | None:
        p0 = summary.classes[Priority.P0]
        slo = self.settings.slo.p0
        limit = 1.0 + self.settings.revert_margin
        for key, value, bound in (("ttft_p99_ms", p0.ttft_p99_ms, slo.ttft_p99_ms),
                                  ("tbt_p99_ms", p0.tbt_p99_ms, slo.tbt_p99_ms)):
            if bound is not None and value is not None and value > limit * bound:
                return f"p0 {key}={value:.0f} > {limit:g} x {bound:g}"
        return None

    def _end_trial(self, t: RunningTrial, outcome: TrialOutcome, action: Action, reason: str,
                   summary: WindowSummary | None) -> Decision:
        self.metrics.trial(self.settings.deployment, outcome)
        self.loop.episode_trials += 1
        self.loop.trial = None
        self._restore(t.canary)
        return self._decide(action, reason, trial=t.number, config=t.config, summary=summary)

    def _restore(self, canary: bool) -> None:
        target = self.loop.best_config or self.loop.baseline_config
        if target is not None:
            self.deployment.apply_config(target, canary=canary)

    # ------------------------------------------------------------------ commit, scale
    def _commit(self, now: float, reason: str,
                summary: WindowSummary | None = None) -> Decision:
        loop = self.loop
        self._enter(ControllerState.COMMIT, now, reason)
        if loop.trial is not None:
            self.study.tell_failed(loop.trial.number, "episode ended")
            self.metrics.trial(self.settings.deployment, TrialOutcome.PRUNED)
            loop.trial = None
        if loop.best_config is None:
            if loop.baseline_config is not None:
                self.deployment.apply_config(loop.baseline_config, canary=False)
            loop.scale_reason = f"no_feasible_config after {loop.episode_trials} trials"
            return self._scale(now, loop.scale_reason,
                               at_least=self.deployment.replicas() + 1)
        self.deployment.apply_config(loop.best_config, canary=False)
        decision = self._cool(now, Action.COMMIT, f"commit: {reason}")
        return Decision(decision.state, Action.COMMIT, decision.reason, decision.replicas,
                        config=loop.best_config, summary=summary)

    def _scale(self, now: float, reason: str, *, at_least: int | None = None) -> Decision:
        loop, s = self.loop, self.settings
        self._enter(ControllerState.SCALING, now, reason)
        loop.scale_reason = reason
        current = self.deployment.replicas()
        config = loop.best_config or self.deployment.current_config()
        scenario = self.probe.measure(now)
        ranked: list[tuple[dict[str, Any], bool]] = []
        if at_least is None and self.offline is not None:
            # A new config is cheaper than a replica: scale only when none will do.
            ranked = self._offline(now, current, scenario)
            if any(ok for _, ok in ranked):
                return self._start_tuning(
                    now, f"retune_suffices: the simulator holds the SLO at {current} "
                    f"replica(s) with other knobs; {reason}", allow_scale=False,
                    ranked=ranked)
            if ranked:
                config = ranked[0][0]
        answer = self.planner.search(scenario, config, s.min_replicas, s.max_replicas,
                                     margin=self.scale_up_margin)
        needed = answer.replicas if answer.replicas is not None else s.max_replicas
        if at_least is not None:
            needed = max(needed, at_least)
        needed = min(max(needed, s.min_replicas), s.max_replicas)
        if needed > current:
            self.deployment.scale(needed)
            return self._cool(now, Action.SCALE, f"scale_up {current}->{needed}: {reason}")
        if answer.replicas is not None and at_least is None:
            return self._start_tuning(now, f"capacity_suffices at {current} replica(s); "
                                      f"{reason}", allow_scale=False)
        if at_least is None:
            # No replica to add and the simulator sees no config that holds: the closest
            # ones are still worth a live episode (the model may be pessimistic). An
            # episode that then finds nothing comes back with at_least set and stops here.
            return self._start_tuning(
                now, f"max_replicas {s.max_replicas} reached and the simulator sees no "
                f"config that holds; tuning for the closest; {reason}", allow_scale=False,
                ranked=ranked)
        return self._cool(now, Action.INFORM, f"max_replicas {s.max_replicas} reached and "
                          f"the SLO is not held; {reason}")

    def _cool(self, now: float, action: Action, reason: str) -> Decision:
        self._enter(ControllerState.COOLDOWN, now, reason)
        self.loop.cooldown_until = now + self.settings.cooldown_s
        return self._decide(action, reason)

    # ------------------------------------------------------------------ guardrails
    def _hold(self, now: float, exc: Exception) -> Decision:
        first = not self.loop.prometheus_unavailable
        self.loop.prometheus_unavailable = True
        action = Action.HOLD if first else Action.NONE
        return self._decide(action, f"prometheus_unavailable: holding the current config "
                            f"({exc})")

    def _rollback(self, now: float, exc: Exception) -> Decision:
        loop = self.loop
        if loop.trial is not None:
            try:
                self.study.tell_failed(loop.trial.number, f"error: {exc}")
            except Exception:  # the study may be what failed; the rollback matters more
                log.exception("%s: could not record the failed trial",
                              self.settings.deployment)
            self.metrics.trial(self.settings.deployment, TrialOutcome.FAILED)
            loop.trial = None
        target = loop.best_config or loop.baseline_config
        if target is not None:
            try:
                self.deployment.apply_config(target, canary=False)
            except Exception:  # keep the loop alive; the next tick retries from COOLDOWN
                log.exception("%s: rollback failed", self.settings.deployment)
        return self._cool(now, Action.REVERT, f"error: {type(exc).__name__}: {exc}; "
                          "rolled back to the best known config")

    # ------------------------------------------------------------------ bookkeeping
    def _enter(self, state: ControllerState, now: float, reason: str) -> None:
        if state is not self.loop.state:
            self.loop.state, self.loop.since = state, now
        self.loop.reason = reason

    def _decide(self, action: Action, reason: str, *, trial: int | None = None,
                config: Mapping[str, Any] | None = None,
                summary: WindowSummary | None = None) -> Decision:
        return Decision(self.loop.state, action, reason, self.deployment.replicas(),
                        self.loop.prometheus_unavailable, trial, config, summary)

    def _emit(self, d: Decision) -> None:
        dep = self.settings.deployment
        self.metrics.action(dep, d.action, d.reason)
        self.metrics.observe(dep, d.state, d.replicas)
        level = logging.INFO if d.action is not Action.NONE else logging.DEBUG
        log.log(level, "%s: %s", dep, d.line())


def _names(alerts: list[Alert]) -> str:
    return ", ".join(sorted({a.describe() for a in alerts}))
