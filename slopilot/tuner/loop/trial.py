"""A live trial's start and end: the next trial asked of the study and applied to the
canary or every replica (or, at the episode's trial limits, COMMIT), and an ended trial
counted, its replicas restored.

A trial starts when its apply returns (``LoopContext.took_effect``), not at the tick's
``now``: its window, its ``max_trial_s`` and its rollout's watch count from there. The
hour's trial count (``trial_starts``) keeps the tick's ``now``: it is entered before the
apply, so that an apply that raises still counts, and it bounds how many trials an hour
starts, not what a window measures. The same start is stamped on the trial in the study
before the apply, where it outlives a process killed before its status write
(``trial_count.py``)."""

from __future__ import annotations

import contextlib

from slopilot.engine.config import ConfigError
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop import restore, rollout_watch, trial_count
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.ports import Settled, TrialStarts
from slopilot.tuner.loop.state import ControllerState, RunningTrial
from slopilot.tuner.loop.transitions import Event, Go


def next_trial(ctx: LoopContext, now: float, reason: str) -> Decision | Go:
    loop, s = ctx.loop, ctx.settings
    # No episode starts while a rollback is owed; this is for a state written by hand.
    if (owed := restore.blocked(ctx, now)) is not None:
        return ctx.decide(Action.NONE, owed)
    if loop.episode_trials >= s.max_trials:
        return Go(ControllerState.COMMIT, Event.TRIAL_LIMIT,
                  f"trial_limit: {s.max_trials} trials")
    # The study's starts that the loop's record lacks (a crash before a status write),
    # should the tick's read have failed; raises, as the ask would, while it is out.
    trial_count.recount(ctx, now)
    if len(loop.trial_starts) >= s.hourly_trials:
        return Go(ControllerState.COMMIT, Event.TRIAL_RATE_LIMIT,
                  f"trial_rate_limit: {s.hourly_trials} per hour")
    number, config = ctx.study.ask()
    if (stuck := rollout_watch.held(loop, now, config)) is not None:
        # Not applied: its rollout would stick as before. Counted, so that a study that
        # keeps asking it ends the episode at max_trials.
        why = f"not tried: {rollout_watch.said(stuck, now)}"
        ctx.study.tell_failed(number, why)
        ctx.metrics.trial(s.deployment, TrialOutcome.FAILED)
        loop.episode_trials += 1
        return ctx.decide(Action.NONE, f"trial {number} {why}", trial=number,
                          config=config)
    # A canary is judged against the replicas beside it: it needs another that serves.
    # Asked-for replicas still starting (or refused a node or a quota) serve nothing,
    # and a "canary" on the one ready replica took all of the traffic.
    canary = s.canary and ctx.deployment.replica_counts().ready >= 2
    loop.trial_starts.append(now)
    try:
        if isinstance(ctx.study, TrialStarts):
            # In the study, before the apply: the status that keeps ``trial_starts`` is
            # written after the tick, and a process killed before then left the pods
            # running a trial that a restarted loop's hourly cap did not count.
            ctx.study.mark_started(number, now)
        replica = ctx.deployment.apply_config(config, canary=canary, trial=True)
    except ConfigError as exc:
        ctx.study.tell_failed(number, f"config refused: {exc}")
        ctx.metrics.trial(s.deployment, TrialOutcome.FAILED)
        loop.episode_trials += 1
        ctx.restore(canary)
        return ctx.decide(Action.REVERT, f"config_refused trial {number}: {exc}",
                          trial=number, config=config)
    except Exception as exc:  # the controller rolls back; the trial asked must not stay
        with contextlib.suppress(Exception):  # RUNNING, held by nothing until it is stale
            ctx.study.tell_failed(number, f"not applied: {type(exc).__name__}: {exc}")
        raise
    # The config serves from the apply's return, not from the tick's start: the ask and
    # the apply before it may have taken minutes (an RDB storage, a slow API server, a
    # canary's PUT), and a window counted from ``now`` measured the config before it.
    applied = ctx.took_effect(now)
    # A rollout's config runs nowhere yet: its window waits (``rollout_wait.py``); one
    # found stuck already is ended there, at the next look.
    if not canary:
        rollout_watch.began(loop, applied)
    rolling = rollout_watch.look(ctx, applied)
    loop.trial = RunningTrial(number, dict(config), applied, canary,
                              canary_replica=replica if canary else None, began_at=applied,
                              rolling=not isinstance(rolling, Settled), draining=True,
                              study=ctx.study.name)
    where = "canary" if canary else "all replicas"
    how = "" if isinstance(rolling, Settled) else f" (rolling out: {rolling.why})"
    return ctx.decide(Action.TRIAL, f"trial {number} on {where}{how}; {reason}",
                      trial=number, config=config)


def end_trial(ctx: LoopContext, t: RunningTrial, outcome: TrialOutcome, action: Action,
               reason: str, summary: WindowSummary | None) -> Decision:
    ctx.metrics.trial(ctx.settings.deployment, outcome)
    ctx.loop.episode_trials += 1
    ctx.loop.trial = None
    ctx.restore(t.canary)
    return ctx.decide(action, reason, trial=t.number, config=t.config, summary=summary)
