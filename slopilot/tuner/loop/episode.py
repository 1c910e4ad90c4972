"""A tuning episode: start it, run live trials one window each (TUNING), commit the best.

An episode starts from STEADY (a retune alert) or SCALING (a new config is cheaper than a
replica) with the running config as its baseline and the offline study's best configs
queued as warm starts. Each trial applies a config (to the canary when there are several
replicas), waits ``window_s`` and is scored on its window past its first ``settle_s``
(the requests that arrived under the config before it finish then); a trial that breaks
any class's SLO by more than ``revert_margin`` is cut short, a window that does not count
is repeated (rejected by the evaluator, or without a sample of a class the episode's
alerts are about: a class's P99 that was not measured is no evidence that it holds). The
first feasible trial, or the trial limits, end the episode in COMMIT, which applies the
best feasible config everywhere, or, when none held, asks SCALING for another replica. A scale
alert that fires during the episode (not one it began under) ends it at once: the open
trial failed, its rollback config restored, SCALING asked for another replica.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop import advice
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.state import (
    Action,
    ControllerState,
    Decision,
    RunningTrial,
    TrialOutcome,
)
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.loop.trial import _end_trial, _next_trial
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.evaluator import WindowRejected
from slopilot.tuner.study.objective import (
    HEADROOM,
    TrialResult,
    holds,
    score,
    unmeasured,
)

log = logging.getLogger(__name__)
_CLASSES = frozenset(p.label for p in Priority)


def start_episode(ctx: LoopContext, now: float, reason: str, event: Event, *,
                  allow_scale: bool,
                  ranked: Sequence[tuple[dict[str, Any], bool]] | None = None
                  ) -> Decision | Go:
    """Reset the episode and move to TUNING; or to SCALING when ``allow_scale`` and the
    offline study finds nothing that holds; or hold when the hour's trials are used up."""
    loop, s = ctx.loop, ctx.settings
    if len(loop.trial_starts) >= s.max_trials_per_hour:
        return ctx.decide(Action.HOLD, f"trial_rate_limit: {s.max_trials_per_hour} "
                          f"trials in the last hour; {reason}")
    loop.baseline_config = dict(ctx.deployment.current_config())
    loop.best_config, loop.best_goodput = None, None
    loop.episode_trials = loop.episode_feasible = loop.episode_warm_starts = 0
    loop.episode_measured = 0
    replicas = ctx.deployment.replicas()
    if ranked is None and ctx.offline is not None:
        ranked = advice.warm_starts(ctx, now, replicas, loop.baseline_config)
    if (why := advice.unavailable(ctx, now)) is not None:
        reason = f"{reason}; {why}: live trials without warm start"
    if ranked:
        if not any(ok for _, ok in ranked) and allow_scale and replicas < s.max_replicas:
            return Go(ControllerState.SCALING, Event.NOTHING_HOLDS_OFFLINE,
                      f"offline study: no config holds the SLO at {replicas} replica(s); "
                      f"{reason}", at_least=replicas + 1)
        ctx.study.warm_start([c for c, _ in ranked])
        loop.episode_warm_starts = len(ranked)
    return Go(ControllerState.TUNING, event, reason)


def tuning(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    s = ctx.settings
    if entered is not None:
        # What the episode is about: a window that measured none of these classes is no
        # verdict. An alert on every class (preemptions, batching) names none.
        acting = [a for a in tick.alerts if a.action is not AlertAction.INFORM]
        ctx.loop.episode_classes = sorted({a.priority_class for a in acting
                                           if a.priority_class in _CLASSES})
        ctx.loop.episode_alerts = sorted({a.describe() for a in acting})
        ctx.metrics.action(s.deployment, Action.RETUNE, entered.reason)
        log.info("%s: %s", s.key, ctx.decide(Action.RETUNE, entered.reason).line())
        return _next_trial(ctx, tick.now, f"retune: {entered.reason}")
    surge = sorted({a.describe() for a in tick.alerts if a.action is AlertAction.SCALE}
                   - set(ctx.loop.episode_alerts))
    # At max replicas no replica can answer it: the episode is the only remedy left.
    if surge and ctx.deployment.replicas() < s.max_replicas:
        return _end_for_scale(ctx, ", ".join(surge))
    if ctx.loop.trial is None:
        return _next_trial(ctx, tick.now, "next trial")
    if (why := ctx.study.space.outside(ctx.loop.trial.config)) is not None:
        return _outside_space(ctx, ctx.loop.trial, why)
    return _running_trial(ctx, tick.now, ctx.loop.trial)


def _outside_space(ctx: LoopContext, t: RunningTrial, why: str) -> Decision:
    """A running trial whose config the study's space no longer holds (the spec's
    bounds narrowed during it, or a status written by hand): told failed and reverted
    now. Judged, it held and was committed to every replica over the new bounds."""
    reason = f"trial {t.number} is outside the search space now: {why}"
    ctx.study.tell_failed(t.number, reason)
    return _end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT, reason, None)


def _end_for_scale(ctx: LoopContext, alerts: str) -> Go:
    """A scale alert that fired after the episode began: the load changed under it, so
    its windows judge configs at a load it was not started for, and waiting out the
    episode (up to ``max_trials`` windows) leaves the critical alert unanswered. The open
    trial is told failed, the episode's rollback config goes back on every replica, and
    SCALING is asked for at least one more: the episode has been searching configs at
    this count, so the offline study's word for this count is not asked again (it would
    start the same episode)."""
    loop = ctx.loop
    if loop.trial is not None:
        ctx.study.tell_failed(loop.trial.number, f"episode ended: scale alert {alerts}")
        ctx.metrics.trial(ctx.settings.deployment, TrialOutcome.PRUNED)
        loop.trial = None
    target = loop.rollback_config()
    if target is not None:
        ctx.deployment.apply_config(target, canary=False)
    replicas = ctx.deployment.replicas()
    return Go(ControllerState.SCALING, Event.SCALE_ALERT,
              f"alert {alerts} during the episode (after {loop.episode_trials} trials): "
              "the episode ends, its rollback config restored", at_least=replicas + 1)


def _running_trial(ctx: LoopContext, now: float, t: RunningTrial) -> Decision | Go:
    s = ctx.settings
    elapsed = now - t.started_at
    if elapsed < s.window_s:
        return _early_look(ctx, now, t, elapsed)
    start = _measured_from(ctx, t)
    if now - start > 2 * s.window_s:
        # Looked at long after its window (an operator down for days, a late tick): the
        # last window is the trial's, not days of loads and a config the pods may have
        # lost in between, in one range query over all of it.
        start = now - s.window_s
    try:
        summary = ctx.evaluator.measure(start, now, canary=t.canary)
    except WindowRejected as exc:
        return _repeat(ctx, now, t, exc.reason)
    why = _no_verdict(ctx, summary)
    if why is not None:
        return _repeat(ctx, now, t, why)
    return _scored(ctx, now, t, summary)


def _repeat(ctx: LoopContext, now: float, t: RunningTrial, why: str) -> Decision:
    """A window that does not count: measured again, up to ``max_window_repeats`` times
    in a row, after which the trial counts as failed and is reverted."""
    t.repeats += 1
    if t.repeats >= ctx.settings.max_window_repeats:
        ctx.study.tell_failed(t.number, f"window rejected {t.repeats} times: {why}")
        return _end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
                          f"window_rejected trial {t.number} {t.repeats} times: {why}",
                          None)
    t.started_at = now
    return ctx.decide(Action.REPEAT, f"window_rejected trial {t.number} "
                      f"(repeat {t.repeats}): {why}", trial=t.number)


def _no_verdict(ctx: LoopContext, summary: WindowSummary) -> str | None:
    """Why a measured window says nothing of the trial, or None when it does.

    ``score`` reads a class without samples as meeting its SLO, which is right for a
    class the workload does not send. It is not for the class an alert fired on: a
    canary's window (a share of the traffic) can miss a small class entirely, and the
    trial then "held" with nothing measured for what the episode is about. A class the
    alerts are not about may be absent (a trace without P2); a window in which no class
    with an SLO was measured at all is never a verdict."""
    absent = unmeasured(summary, ctx.settings.slo)
    about = [c for c in ctx.loop.episode_classes if c in absent]
    if about:
        return f"no sample of {', '.join(about)} (the class the alert fired on) in the window"
    judged = [p for p, c in ctx.settings.slo.classes().items()
              if c.ttft_p99_ms is not None or c.tbt_p99_ms is not None]
    if judged and len(absent) == len(judged):
        return "no sample of any class with an SLO in the window"
    return None


def _measured_from(ctx: LoopContext, t: RunningTrial) -> float:
    """Where a trial's window is measured from: past its first seconds, in which the
    requests that arrived under the config before it finish (``settle_s``); a repeat
    follows a window of the same config, so it is measured whole, as is a confirming one."""
    first = t.repeats == 0 and t.edge_constraints is None
    return t.started_at + (ctx.settings.settle_s if first else 0.0)


def _early_look(ctx: LoopContext, now: float, t: RunningTrial,
                elapsed: float) -> Decision:
    """Mid-window, after ``revert_after_s``: cut a trial short that breaks a class's SLO
    badly."""
    partial, start = None, _measured_from(ctx, t)
    if elapsed >= ctx.settings.revert_after_s and now > start:
        try:
            partial = ctx.evaluator.measure(start, now, canary=t.canary)
        except WindowRejected:
            partial = None  # too little to tell yet: the window goes on
    breach = None if partial is None else _breach(ctx, partial)
    if partial is None or breach is None:
        return ctx.decide(Action.NONE, f"trial {t.number} running", trial=t.number)
    ctx.study.tell(t.number, score(partial, ctx.settings.slo, t.config))
    ctx.loop.episode_measured += 1
    return _end_trial(ctx, t, TrialOutcome.REVERTED, Action.REVERT,
                      f"slo_breach trial {t.number} cut short: {breach}", partial)


def _scored(ctx: LoopContext, now: float, t: RunningTrial,
            summary: WindowSummary) -> Decision | Go:
    loop, s = ctx.loop, ctx.settings
    result = score(summary, s.slo, t.config)
    if t.edge_constraints is not None:
        result = _with_first_window(result, t.edge_constraints, t.edge_goodput)
    elif result.feasible and not holds(result, HEADROOM):
        return _confirm(ctx, now, t, result)
    ctx.study.tell(t.number, result)
    ctx.metrics.trial(s.deployment, TrialOutcome.COMPLETE)
    loop.episode_trials += 1
    loop.episode_measured += 1
    loop.trial = None
    if result.feasible:
        loop.episode_feasible += 1
        if loop.best_goodput is None or result.goodput_tok_s > loop.best_goodput:
            loop.best_config, loop.best_goodput = dict(t.config), result.goodput_tok_s
        return Go(ControllerState.COMMIT, Event.TRIAL_HOLDS, f"trial {t.number} holds the "
                  f"SLO (goodput {result.goodput_tok_s:.0f} tok/s)", summary=summary)
    worst = max(zip(result.constraint_names, result.constraints, strict=True),
                key=lambda kv: kv[1], default=("?", 0.0))
    reason = f"trial {t.number} infeasible: {worst[0]} {worst[1]:+.0%} over"
    if loop.episode_trials >= s.max_trials or \
            len(loop.trial_starts) >= s.max_trials_per_hour:
        return _next_trial(ctx, now, reason)  # ends the episode now
    return ctx.decide(Action.NONE, reason, trial=t.number, config=t.config, summary=summary)


def _confirm(ctx: LoopContext, now: float, t: RunningTrial, result: TrialResult
             ) -> Decision:
    """A window that holds, but with a term within ``HEADROOM`` of its limit: one more
    window of the same config before it counts. The simulator's verdicts need 10 % to
    spare, and a live window's P99 rests on a few dozen requests of a class (nearly its
    maximum): one window at 99.7 % of a limit used to commit everywhere. A config held
    on two windows commits (a config truly at the limit passes one about half the
    time, two about a quarter); one clear of the margin still commits on its first."""
    t.edge_constraints, t.edge_goodput = list(result.constraints), result.goodput_tok_s
    t.started_at = now
    name, value = max(zip(result.constraint_names, result.constraints, strict=True),
                      key=lambda kv: kv[1])
    return ctx.decide(Action.REPEAT, f"confirming trial {t.number}: {name} at "
                      f"{value + 1:.1%} of its limit, within the {HEADROOM:.0%} margin: "
                      "one more window", trial=t.number, config=t.config,
                      summary=result.summary)


def _with_first_window(second: TrialResult, first: Sequence[float],
                       goodput: float | None) -> TrialResult:
    """The trial's result over its two windows: each term the worse window's, the lower
    goodput, feasible only when both held."""
    constraints = tuple(max(a, b) for a, b in zip(first, second.constraints, strict=True))
    return dataclasses.replace(
        second, constraints=constraints, feasible=all(c <= 0.0 for c in constraints),
        goodput_tok_s=second.goodput_tok_s if goodput is None
        else min(goodput, second.goodput_tok_s))


def _breach(ctx: LoopContext, summary: WindowSummary) -> str | None:
    """A class's P99 over ``1 + revert_margin`` times its SLO, for every class with an
    SLO: the early look's rule for P0, applied to each (a P1 at 10 x its SLO, or any
    breach on a workload without P0, ran its whole window). The margin stays wide: a
    partial window's P99 rests on few requests, and a trial cut on noise is a trial lost."""
    limit = 1.0 + ctx.settings.revert_margin
    for p, slo in ctx.settings.slo.classes().items():
        figures = summary.classes[p]
        for key, value, bound in (("ttft_p99_ms", figures.ttft_p99_ms, slo.ttft_p99_ms),
                                  ("tbt_p99_ms", figures.tbt_p99_ms, slo.tbt_p99_ms)):
            if bound is not None and value is not None and value > limit * bound:
                return f"{p.label} {key}={value:.0f} > {limit:g} x {bound:g}"
    return None


def commit(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    loop = ctx.loop
    if entered is None:
        loop.reason = reason = "resuming an interrupted commit"
        summary = None
    else:
        reason, summary = entered.reason, entered.summary
    if loop.trial is not None:
        ctx.study.tell_failed(loop.trial.number, "episode ended")
        ctx.metrics.trial(ctx.settings.deployment, TrialOutcome.PRUNED)
        loop.trial = None
    if loop.best_config is None:
        if loop.baseline_config is not None:
            ctx.deployment.apply_config(loop.baseline_config, canary=False)
        if _rate_limited(ctx):
            return _hold_for_rate_limit(ctx)
        if loop.episode_measured == 0:
            return _hold_unmeasured(ctx)
        return Go(ControllerState.SCALING, Event.NO_FEASIBLE_CONFIG,
                  f"no_feasible_config after {loop.episode_trials} trials",
                  at_least=ctx.deployment.replicas() + 1)
    ctx.deployment.apply_config(loop.best_config, canary=False)
    return Go(ControllerState.COOLDOWN, Event.COMMITTED, f"commit: {reason}",
              action=Action.COMMIT, config=loop.best_config, summary=summary)


def _rate_limited(ctx: LoopContext) -> bool:
    """Whether the episode ended because the hour's trials ran out, before its own
    ``max_trials``: then its misses are a sample cut short, not the search's verdict."""
    loop, s = ctx.loop, ctx.settings
    return loop.episode_trials < s.max_trials and \
        len(loop.trial_starts) >= s.max_trials_per_hour


def _hold_for_rate_limit(ctx: LoopContext) -> Go:
    """Nothing held in the trials the hour allowed. That says the budget is spent, not
    that no config holds: read as live evidence, one trial that missed bought a replica
    while the warm starts the twin said hold were never tried. The episode's starting
    config is kept (restored by the caller) and the loop cools down; the alert, if it
    still fires, starts a new episode once the hour allows trials again (STEADY holds
    until then)."""
    loop, s = ctx.loop, ctx.settings
    untried = max(0, loop.episode_warm_starts - loop.episode_trials)
    warm = f"; {untried} warm start(s) untried" if untried else ""
    return Go(ControllerState.COOLDOWN, Event.TRIAL_RATE_LIMIT,
              f"trial_rate_limit: {s.max_trials_per_hour} trials in the last hour, none "
              f"of this episode's {loop.episode_trials} held{warm}; holding the starting "
              "config rather than scaling on a spent budget", action=Action.HOLD)


def _hold_unmeasured(ctx: LoopContext) -> Go:
    """Every trial of the episode failed without a measured window: rejected windows (a
    Prometheus that answers with no series, a canary with too few requests), refused
    configs, an outage. That says nothing of the configs nor of the capacity: read as
    "nothing held", it bought a replica while the metrics were blind, and the reason
    said no config held. The starting config is kept (restored by the caller) and the
    loop cools down; an alert still firing after it starts a new episode."""
    n = ctx.loop.episode_trials
    return Go(ControllerState.COOLDOWN, Event.NOTHING_MEASURED,
              f"nothing_measured: no window measured in this episode's {n} trial(s) "
              "(rejected windows, no data or refused configs); holding the starting "
              "config rather than scaling on no evidence", action=Action.HOLD)
