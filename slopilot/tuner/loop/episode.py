"""A tuning episode: start it, run live trials one window each (TUNING), commit the best.

An episode starts from STEADY (a retune alert) or SCALING (a new config is cheaper than a
replica) with the committed config as its baseline (``DeploymentHandle.committed_config``:
never a trial's left on the replicas) and the offline study's best configs queued as warm
starts. Each trial applies a config (to the canary when there are several
replicas), waits ``window_s`` and is scored on its window past its first ``settle_s``
(the requests that arrived under the config before it finish then); a trial that breaks
any class's SLO by more than ``revert_margin`` is cut short, a window that does not count
is repeated (rejected by the evaluator, or without a sample of a class the episode's
alerts are about: a class's P99 that was not measured is no evidence that it holds). The
first feasible trial, or the trial limits, end the episode in COMMIT, which applies the
best feasible config everywhere, or, when none held, asks SCALING for another replica. A scale
alert that fires during the episode (not one it began under) ends it at once: the open
trial failed, its rollback config restored, SCALING asked for another replica. A hold
alert (a stalled engine, targets down) ends it alike, but into COOLDOWN: no window of a
deployment that serves nothing is a verdict on a config or on its capacity.

This module holds the episode's start and end (and the TUNING step that runs it); a
trial's start and end are ``trial.py``'s, its window and verdict ``trial_window.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from slopilot.engine.request import Priority
from slopilot.tuner.loop import (
    advice,
    backlog_wait,
    missed_trials,
    restore,
    rollout_wait,
    rollout_watch,
    scale_wait,
    thin_traffic,
)
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.state import ControllerState, RunningTrial
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.loop.trial import end_trial, next_trial
from slopilot.tuner.loop.trial_window import running_trial
from slopilot.tuner.prometheus.alerts import AlertAction

log = logging.getLogger(__name__)
_CLASSES = frozenset(p.label for p in Priority)


def start_episode(ctx: LoopContext, now: float, reason: str, event: Event, *,
                  allow_scale: bool,
                  ranked: Sequence[tuple[dict[str, Any], bool]] | None = None
                  ) -> Decision | Go:
    """Reset the episode and move to TUNING; or to SCALING when ``allow_scale`` and the
    offline study finds nothing that holds; or hold when the hour's trials are used up,
    or while the last episode's rollback is still owed (``restore.py``): begun, the new
    one took the committed config as its baseline while the replicas ran a trial's, and
    its trials and commit applied configs over the restore owed."""
    loop, s = ctx.loop, ctx.settings
    if (owed := restore.blocked(ctx, now)) is not None:
        return ctx.decide(Action.NONE, f"{owed}; {reason}")
    if len(loop.trial_starts) >= s.hourly_trials:
        return ctx.decide(Action.HOLD, f"trial_rate_limit: {s.hourly_trials} "
                          f"trials in the last hour; {reason}")
    # The committed config, not what the replicas run: a trial's may be on every one (a
    # controller that lost its state left it), and begun on, the episode rolled back to
    # it and compared its trials with it as if it had been committed.
    loop.baseline_config = dict(ctx.deployment.committed_config())
    loop.best_config, loop.best_goodput = None, None
    loop.episode_trials = loop.episode_feasible = loop.episode_warm_starts = 0
    loop.episode_measured = 0
    replicas = ctx.deployment.replicas()
    if ranked is None and ctx.offline is not None:
        ranked = advice.warm_starts(ctx, now, replicas, loop.baseline_config)
    if (why := advice.unavailable(ctx, now)) is not None:
        reason = f"{reason}; {why}: live trials without warm start"
    if ranked and (stuck := [c for c, _ in ranked
                             if rollout_watch.held(loop, now, c) is not None]):
        # A config whose rollout stuck lately is no warm start: it would stick again.
        ranked = [(c, ok) for c, ok in ranked if c not in stuck]
        reason = f"{reason}; {len(stuck)} warm start(s) held: their rollouts stuck"
    if ranked:
        if not any(ok for _, ok in ranked) and allow_scale and replicas < s.max_replicas:
            return Go(ControllerState.SCALING, Event.NOTHING_HOLDS_OFFLINE,
                      f"offline study: no config holds the SLO at {replicas} replica(s); "
                      f"{reason}", at_least=replicas + 1)
        if not any(ok for _, ok in ranked) and allow_scale:
            # At max, SCALING's capacity search says whether fewer replicas do as well
            # (replica_plateau.py: an SLO no count holds kept 8 replicas on a retune
            # alert, each episode ending in too_little_traffic for a canary's share of
            # 8); when not, it tunes the closest configs as this episode would have.
            return Go(ControllerState.SCALING, Event.NOTHING_HOLDS_OFFLINE,
                      f"offline study: no config holds the SLO at max {replicas} "
                      f"replica(s); {reason}")
        ctx.study.warm_start([c for c, _ in ranked])
        loop.episode_warm_starts = len(ranked)
    return Go(ControllerState.TUNING, event, reason)


def tuning(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    s = ctx.settings
    if entered is not None:
        # What the episode is about: a window that measured none of these classes is no
        # verdict. An alert on every class (preemptions, batching) names none.
        acting = [a for a in tick.alerts
                  if a.action in (AlertAction.RETUNE, AlertAction.SCALE)]
        ctx.loop.episode_classes = sorted({a.priority_class for a in acting
                                           if a.priority_class in _CLASSES})
        ctx.loop.episode_alerts = sorted({a.describe() for a in acting})
        thin = thin_traffic.too_thin(ctx, tick.now, ctx.loop.episode_classes)
        if thin is not None:  # no trial goes live: none could be judged
            return Go(ControllerState.COMMIT, Event.TOO_LITTLE_TRAFFIC,
                      f"{thin}; {entered.reason}")
        ctx.metrics.action(s.deployment, Action.RETUNE, entered.reason)
        log.info("%s: %s", s.key, ctx.decide(Action.RETUNE, entered.reason).line())
        return next_trial(ctx, tick.now, f"retune: {entered.reason}")
    held = sorted({a.describe() for a in tick.alerts if a.action is AlertAction.HOLD})
    if held:
        return _end_for_hold(ctx, ", ".join(held))
    surge = sorted({a.describe() for a in tick.alerts if a.action is AlertAction.SCALE}
                   - set(ctx.loop.episode_alerts))
    # At max replicas no replica can answer it: the episode is the only remedy left; so
    # it is while the refusal of the last replicas bought is kept (scale_wait.py).
    if surge and ctx.deployment.replicas() < s.max_replicas \
            and scale_wait.held(ctx, tick.now) is None:
        return _end_for_scale(ctx, ", ".join(surge))
    if ctx.loop.trial is None:
        return next_trial(ctx, tick.now, "next trial")
    if (why := ctx.study.space.outside(ctx.loop.trial.config)) is not None:
        return _outside_space(ctx, ctx.loop.trial, why)
    if ctx.loop.trial.rolling:
        return rollout_wait.trial(ctx, tick.now, ctx.loop.trial)
    if ctx.loop.trial.draining and \
            (waiting := backlog_wait.trial(ctx, tick.now, ctx.loop.trial)) is not None:
        return waiting
    return running_trial(ctx, tick.now, ctx.loop.trial)


def _outside_space(ctx: LoopContext, t: RunningTrial, why: str) -> Decision:
    """A running trial whose config the study's space no longer holds (the spec's
    bounds narrowed during it, or a status written by hand): told failed and reverted
    now. Judged, it held and was committed to every replica over the new bounds."""
    reason = f"trial {t.number} is outside the search space now: {why}"
    ctx.study.tell_failed(t.number, reason)
    return end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT, f"outside_space {reason}",
                     None)


def _end_for_hold(ctx: LoopContext, alerts: str) -> Go:
    """A hold alert during the episode (a stalled engine, targets down): its windows
    judge a deployment that serves nothing or cannot be seen, so no trial can hold, and
    the episode went on to "no config holds" and bought a replica. The open trial is told
    failed, the rollback config goes back on every replica, and the loop cools down;
    STEADY then holds while the alert fires (``steady.py``)."""
    _fail_open_trial(ctx, f"episode ended: hold alert {alerts}")
    target = ctx.loop.rollback_config()
    if target is not None:
        ctx.deployment.apply_config(target, canary=False)
    return Go(ControllerState.COOLDOWN, Event.HOLD_ALERT,
              f"alert {alerts} during the episode (after {ctx.loop.episode_trials} "
              "trials): the episode ends, its rollback config restored; no retune nor "
              "scale while it fires", action=Action.HOLD)


def _fail_open_trial(ctx: LoopContext, why: str) -> None:
    loop = ctx.loop
    if loop.trial is not None:
        ctx.study.tell_failed(loop.trial.number, why)
        ctx.metrics.trial(ctx.settings.deployment, TrialOutcome.PRUNED)
        loop.trial = None


def _end_for_scale(ctx: LoopContext, alerts: str) -> Go:
    """A scale alert that fired after the episode began: the load changed under it, so
    its windows judge configs at a load it was not started for, and waiting out the
    episode (up to ``max_trials`` windows) leaves the critical alert unanswered. The open
    trial is told failed, the episode's rollback config goes back on every replica, and
    SCALING is asked for at least one more: the episode has been searching configs at
    this count, so the offline study's word for this count is not asked again (it would
    start the same episode)."""
    loop = ctx.loop
    _fail_open_trial(ctx, f"episode ended: scale alert {alerts}")
    target = loop.rollback_config()
    if target is not None:
        ctx.deployment.apply_config(target, canary=False)
    replicas = ctx.deployment.replicas()
    return Go(ControllerState.SCALING, Event.SCALE_ALERT,
              f"alert {alerts} during the episode (after {loop.episode_trials} trials): "
              "the episode ends, its rollback config restored", at_least=replicas + 1)


def commit(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    loop = ctx.loop
    if entered is None:
        loop.reason = reason = "resuming an interrupted commit"
        summary = None
    else:
        reason, summary = entered.reason, entered.summary
    _fail_open_trial(ctx, "episode ended")
    if loop.best_config is None:
        thin = entered is not None and entered.event is Event.TOO_LITTLE_TRAFFIC
        # An episode held before its first trial (``thin_traffic.py``) put nothing on the
        # replicas: it has nothing to restore, and it ends every cooldown.
        if loop.baseline_config is not None and not (thin and loop.episode_trials == 0):
            ctx.deployment.apply_config(loop.baseline_config, canary=False)
        if thin:
            # No verdict on any config: more replicas would serve the same trickle and
            # be judged on it no better.
            return Go(ControllerState.COOLDOWN, Event.TOO_LITTLE_TRAFFIC,
                      f"too_little_traffic: {reason}; holding the starting config "
                      "rather than scaling on no verdict", action=Action.HOLD,
                      summary=summary)
        if _rate_limited(ctx):
            # Cut episodes at one count add up (``missed_trials.py``): at ``max_trials``
            # measured misses, the whole episode's verdict, a replica is bought.
            total = missed_trials.add(ctx, tick.now, loop.episode_measured or 0)
            if total < ctx.settings.max_trials:
                return _hold_for_rate_limit(ctx, total)
            missed_trials.forget(ctx)
            return Go(ControllerState.SCALING, Event.NO_FEASIBLE_CONFIG,
                      f"no_feasible_config after {total} measured trials at "
                      f"{ctx.deployment.replicas()} replica(s) across episodes cut by the "
                      f"hour's budget ({loop.episode_trials} in this one), none held",
                      at_least=ctx.deployment.replicas() + 1)
        if loop.episode_measured == 0:  # None, not known (an older version's), is no 0
            return _hold_unmeasured(ctx)
        missed_trials.forget(ctx)
        return Go(ControllerState.SCALING, Event.NO_FEASIBLE_CONFIG,
                  f"no_feasible_config after {loop.episode_trials} trials",
                  at_least=ctx.deployment.replicas() + 1)
    missed_trials.forget(ctx)
    ctx.deployment.apply_config(loop.best_config, canary=False)
    # Its rollout, watched through the cooldown, is reverted to the committed config the
    # episode began on where it sticks (``rollout_wait.cooling``).
    previous = loop.baseline_config
    rollout_watch.began(loop, ctx.took_effect(tick.now), config=loop.best_config,
                        revert_to=previous if previous != loop.best_config else None)
    return Go(ControllerState.COOLDOWN, Event.COMMITTED, f"commit: {reason}",
              action=Action.COMMIT, config=loop.best_config, summary=summary)


def _rate_limited(ctx: LoopContext) -> bool:
    """Whether the episode ended because the hour's trials ran out, before its own
    ``max_trials``: then its misses are a sample cut short, not the search's verdict."""
    loop, s = ctx.loop, ctx.settings
    return loop.episode_trials < s.max_trials and \
        len(loop.trial_starts) >= s.hourly_trials


def _hold_for_rate_limit(ctx: LoopContext, total: int) -> Go:
    """Nothing held in the trials the hour allowed. That says the budget is spent, not
    that no config holds: read as live evidence, one trial that missed bought a replica
    while the warm starts the twin said hold were never tried. The episode's starting
    config is kept (restored by the caller) and the loop cools down; the alert, if it
    still fires, starts a new episode once the hour allows trials again (STEADY holds
    until then). ``total``: the measured misses of the cut episodes at this count and
    load so far (``missed_trials.py``), below ``max_trials``."""
    loop, s = ctx.loop, ctx.settings
    untried = max(0, loop.episode_warm_starts - loop.episode_trials)
    warm = f"; {untried} warm start(s) untried" if untried else ""
    return Go(ControllerState.COOLDOWN, Event.TRIAL_RATE_LIMIT,
              f"trial_rate_limit: {s.hourly_trials} trials in the last hour, none "
              f"of this episode's {loop.episode_trials} held{warm}; {total} of "
              f"{s.max_trials} measured misses at this count and load; holding the "
              "starting config rather than scaling on a spent budget", action=Action.HOLD)


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
