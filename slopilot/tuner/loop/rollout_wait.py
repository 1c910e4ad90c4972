"""Waiting out a rollout: a config that reaches the replicas as new pods (vLLM's knobs
are its arguments) runs nowhere until they are ready, and the old pods serve meanwhile.

A window measured from the apply judged the old pods (the ServiceMonitor scrapes ready
pods only: the loading one is not seen at all, so no window was rejected for it), and a
good config was told infeasible on the old config's figures. So a trial whose apply left
the deployment ``Pending`` (``DeploymentHandle.settled``) is held: no window measured,
no early look (a fleet half rolled out is judged on nothing, its breaches included), no
next trial. Once ``Settled``, its window starts from that moment (the clock read after the
look that saw it, ``LoopContext.took_effect``). ``Stuck`` (past the
Deployment's progress deadline, paused, or not moved for the loop's own bound:
``rollout_watch.py``) ends it failed, ``rollout_stuck``, rolls it back, and holds its
config from trials for a while.

A cooldown (after a commit, a rollback or a scale) does not end while the rollout it
began runs: STEADY would read alerts and start an episode on the old pods' figures; and
it counts from the rollout's end (``ended``, read after the look that saw it): the
alerts' windows until then measured the old pods too. A rollout's watch begins when the
apply that began it returned. A
commit whose rollout is stuck is reverted: left, the Deployment kept a new ReplicaSet that
never became ready, ``status.tunedConfig`` said committed what no pod ran, and every
later reconcile rendered the stuck template. The committed config before it (the old
pods', which still serve: ``maxUnavailable: 0``) goes back on every replica and on
record, the decision says why (``commit_reverted``), and the stuck config is held from
trials, so that the next episode does not commit it again at once.
"""

from __future__ import annotations

import logging

from slopilot.tuner.loop import restore, rollout_watch
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.ports import Pending, Settled, Stuck
from slopilot.tuner.loop.state import ControllerState, RolloutWatch, RunningTrial
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.loop.trial import end_trial

log = logging.getLogger(__name__)


def trial(ctx: LoopContext, now: float, t: RunningTrial) -> Decision:
    """A rolling trial's tick: still pending, rolled out (its window starts now), or
    stuck (failed, rolled back, its config held)."""
    state = rollout_watch.look(ctx, now)
    if isinstance(state, Pending):
        return ctx.decide(Action.NONE, f"trial {t.number} rolling out: {state.why}; no "
                          "window until every replica runs it", trial=t.number)
    if isinstance(state, Stuck):
        why = f"rollout_stuck trial {t.number}: {state.why}"
        ctx.study.tell_failed(t.number, why)
        entry = rollout_watch.hold(ctx, now, t.config, state.why)
        ended = end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
                          f"{why}; rolled back, its config held from trials for "
                          f"{entry.until - now:.0f} s", None)
        # The rollback's own rollout, watched from when its apply returned.
        rollout_watch.began(ctx.loop, ctx.took_effect(now))
        return ended
    t.rolling = False
    # From the read that saw it done, not from the tick's start: the rollout may have
    # ended while this tick read the alerts and the rollout's state.
    t.started_at = t.began_at = ctx.took_effect(now)
    return ctx.decide(Action.NONE, f"trial {t.number} rolled out: its window starts",
                      trial=t.number)


def cooling(ctx: LoopContext, now: float) -> Decision | Go | None:
    """The cooldown's rollout, once its time is over: a decision while it runs, a move
    where it is stuck (a commit's reverted, back into COOLDOWN; any other's, the cooldown
    ends: waiting longer changes nothing, and the next episode's trials meet the same
    deadline), None where none runs."""
    watch = ctx.loop.rollout  # read first: the look ends it
    state = rollout_watch.look(ctx, now)
    if isinstance(state, Pending):
        return ctx.decide(Action.NONE, f"cooling down: rolling out: {state.why}")
    if not isinstance(state, Stuck):
        return None
    if watch is not None and watch.revert_to is not None:
        return _revert_commit(ctx, now, watch, state.why)
    log.warning("%s: rollout_stuck: %s", ctx.settings.key, state.why)
    return Go(ControllerState.STEADY, Event.COOLDOWN_OVER,
              f"cooldown over; rollout_stuck: {state.why}")


def ended(ctx: LoopContext, now: float) -> None:
    """A cooldown's look at its rollout, at every tick of it: once every replica runs the
    config, the cooldown counts from now, as it counts from a scale-up's replicas' being
    ready (``scale_wait.look``). The alerts' windows until then measured the old pods:
    counted from the apply, a rollout longer than the cooldown left STEADY reading a
    sustained-breach alert whose whole window was the old config's, and one of half the
    cooldown left half of it. Still pending, or stuck, it is left to ``cooling`` once the
    cooldown's time is over, as before."""
    loop = ctx.loop
    if loop.rollout is None or loop.cooldown_until is None:
        return
    if not isinstance(ctx.deployment.settled(now), Settled):
        return
    loop.rollout = None  # ended: ``cooling``'s look finds it settled
    loop.cooldown_until = max(loop.cooldown_until,
                              ctx.took_effect(now) + ctx.settings.cooldown_s)


def _revert_commit(ctx: LoopContext, now: float, watch: RolloutWatch, why: str) -> Go:
    """The commit's rollout is stuck: the committed config before it back on every
    replica and on record, the stuck one held (module docstring). An apply that fails is
    owed as a rollback's is (``restore.py``), with the previous config as its target."""
    loop = ctx.loop
    previous = dict(watch.revert_to or {})
    stuck = dict(watch.config or loop.best_config or {})
    log.warning("%s: commit_reverted: rollout_stuck: %s", ctx.settings.key, why)
    entry = rollout_watch.hold(ctx, now, stuck, why)
    # The record of the last episode is the committed config: the previous one again.
    loop.best_config, loop.best_goodput = dict(previous), None
    done = "the previous committed config back on every replica"
    try:
        ctx.deployment.apply_config(previous, canary=False)
    except Exception as exc:  # owed: tried again from the next tick
        log.exception("%s: the stuck commit's revert failed", ctx.settings.key)
        kept = restore.failed(loop, now, exc)
        done = f"the revert failed: {restore.owed(kept, now)}"
    rollout_watch.began(loop, ctx.took_effect(now))
    return Go(ControllerState.COOLDOWN, Event.COMMIT_STUCK,
              f"commit_reverted: rollout_stuck: {why}; {done}; the stuck config held "
              f"from trials for {entry.until - now:.0f} s", action=Action.REVERT, config=previous)
