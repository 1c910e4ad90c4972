"""Waiting for the replicas a scale-up bought, and not buying ones that never come.

A scale asks the platform for pods; they serve once admitted by the namespace's quota,
placed on a node with a free GPU and their model loaded: minutes, or never (the quota
refuses them, ``FailedCreate``; no node fits, ``Pending``/``Unschedulable``). Judged as
if the asked replicas served, the windows after the cooldown read the old capacity: the
alert still firing bought one more replica after every cooldown up to max, none of them
serving, or started an episode at the asked count and blamed the config.

So a scale-up is recorded (``LoopState.replica_wait``) and COOLDOWN does not end before
the replicas it asked for are ready (``DeploymentHandle.replica_counts``) or
``replica_ready_s`` has passed. Ready late, the cooldown counts from then: the alerts'
windows until then measured the replicas that served. Still short at the bound, the loop
gives back the replicas that never came (scales to those that serve, never below
``min_replicas``) and says so in one inform naming what the platform says keeps them.
Kept asking for them, the Deployment was never complete: every rollout of a config read
Pending, then ProgressDeadlineExceeded (each vLLM trial waited out the deadline, ended
``rollout_stuck`` and held a good config from trials), Pending pods kept a
cluster-autoscaler adding GPU nodes, and a quota raised later started replicas nobody
needed. The refusal is remembered (``LoopState.replicas_short``) for ``max_backoff_s``,
the bound the loop already holds a repeated verdict and a stuck config by: meanwhile an
alert that asks for replicas above those that served is held and SCALING buys none
(``held``); without it every alert bought, waited ``replica_ready_s`` and gave back.
Past it a scale-up is tried again (the quota may have been raised since); before it, the
memory ends once more replicas serve than did (the quota raised and the deployment
scaled by hand). A refusal an older version kept (no ``until``, its Deployment still asking the
refused count) is given back at STEADY's first look (``owed``).

A quota that never rises refused every try: each left pods Pending for ``replica_ready_s``
(a cluster-autoscaler adding a GPU node each time), gave them back and informed, every
``max_backoff_s`` for ever. So the refusal is kept past its hold, and a try that again has
no more replicas serving than it did is one more strike (``ReplicasShort.strikes``): each
doubles the hold, up to ``MAX_HOLD_DOUBLINGS`` doublings, as kubelet backs off a
container that keeps crashing. More replicas serving than the refusal's ``ready`` (a
scale-up's that all serve, a quota raised and scaled by hand, a try that got some of
them) forgets it and its strikes.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import Replicas
from slopilot.tuner.loop.settings import MAX_HOLD_DOUBLINGS, ControllerSettings
from slopilot.tuner.loop.state import ReplicasShort, ReplicaWait


@dataclass(frozen=True)
class Look:
    """What the awaited replicas say at one look."""

    waiting: str | None = None
    """The wait goes on: what the replicas are, for the decision; None: it does not."""
    gave_up: str | None = None
    """``replica_ready_s`` passed with replicas not ready: the inform's reason."""


def bought(ctx: LoopContext, now: float, asked: int) -> None:
    """A scale-up to ``asked`` made now: its replicas are waited for, from when the scale
    returned (``replica_ready_s`` is the pods' time, not the tick's). A kept refusal
    stays: ``held`` let this one through only once it ended or up to what served."""
    ctx.loop.replica_wait = ReplicaWait(asked, ctx.took_effect(now))


def look(ctx: LoopContext, now: float, *, give_up: bool = True) -> Look:
    """Where the awaited replicas stand: ready (the wait ends, the cooldown counting from
    now), still coming, or past ``replica_ready_s`` (those that never came are given
    back and the refusal is kept). ``give_up=False`` (COOLDOWN entered, its decision
    already made) leaves the giving up to the next look, which says it."""
    loop, s = ctx.loop, ctx.settings
    wait = loop.replica_wait
    if wait is None:
        return Look()
    counts = ctx.deployment.replica_counts()
    if counts.asked != wait.asked:  # scaled since (by a user, a restore): nothing awaited
        loop.replica_wait = None
        return Look()
    if counts.ready >= wait.asked:
        loop.replica_wait = None
        short = loop.replicas_short
        if short is not None and counts.ready > short.ready:  # more than were refused
            loop.replicas_short = None
        if loop.cooldown_until is not None:  # from the read that saw them ready
            loop.cooldown_until = max(loop.cooldown_until,
                                      ctx.took_effect(now) + s.cooldown_s)
        return Look()
    waited = now - wait.since
    if waited < s.replica_ready_s or not give_up:
        return Look(waiting=f"waiting for the replicas bought: {_said(counts)}; up to "
                    f"replica_ready_s={s.replica_ready_s:g} s ({waited:.0f} s so far)")
    kept = max(counts.ready, s.min_replicas)
    if kept < counts.asked:
        # Raising, the wait is kept: the next tick looks, gives up and scales again.
        ctx.deployment.scale(kept)
        back = (f"the {counts.asked - kept} that never served given back "
                f"(scaled {counts.asked}->{kept})")
    else:
        back = f"none given back (min_replicas={s.min_replicas})"
    loop.replica_wait = None
    last = loop.replicas_short
    strikes = last.strikes + 1 if last is not None and _in_a_row(s, last, counts, now) \
        else 1
    short = ReplicasShort(counts.asked, counts.ready, now, counts.why_not_ready,
                          strikes=strikes)
    hold = hold_s(s, short)
    short.until = now + hold
    loop.replicas_short = short
    return Look(gave_up=f"replicas_not_ready: {_said(counts)} {waited:.0f} s after the "
                f"scale-up (replica_ready_s={s.replica_ready_s:g} s): {counts.asked} "
                f"asked, {counts.ready} serve; {back}; {_times(short)}: no scale-up "
                f"above {kept} for {_hold(s, short)}; tried again in {hold:.0f} s "
                "unless more serve")


def held(ctx: LoopContext, now: float, wanted: int | None = None) -> str | None:
    """Why no scale-up to ``wanted`` replicas (None: one more than asked now) is made:
    the last one's replicas above those that served never came, and ``max_backoff_s``
    has not passed since; None when no refusal is kept, it has ended (then it is
    forgotten), or ``wanted`` does not go above what served."""
    kept = _kept(ctx, now)
    if kept is None:
        return None
    short, until, counts = kept
    cap = max(short.ready, ctx.settings.min_replicas)
    if (counts.asked + 1 if wanted is None else wanted) <= cap:
        return None
    why = short.why or "the platform said not why"
    return (f"no scale_up above {cap}: a scale-up to {short.asked} had {short.ready} "
            f"serving past replica_ready_s ({why}); more would not serve either; "
            f"{_times(short)}; tried again in {until - now:.0f} s unless more serve")


def owed(ctx: LoopContext, now: float) -> str | None:
    """A refusal an older version kept (no ``until``) with the deployment still asking the
    refused replicas: they are given back now (STEADY's first look), as the wait's end
    gives them back today; the inform's reason, or None when none is owed."""
    short = ctx.loop.replicas_short
    if short is None or short.until is not None or _kept(ctx, now) is None:
        return None
    counts = ctx.deployment.replica_counts()
    kept = max(short.ready, ctx.settings.min_replicas)
    short.until = short.since + hold_s(ctx.settings, short)
    if counts.asked <= kept or counts.ready > short.ready:
        return None
    ctx.deployment.scale(kept)
    return (f"replicas_not_ready: a scale-up to {short.asked} had {short.ready} serving "
            f"past replica_ready_s ({short.why or 'the platform said not why'}); the "
            f"{counts.asked - kept} asked that never served given back (scaled "
            f"{counts.asked}->{kept}); no scale-up above {kept} for another "
            f"{short.until - now:.0f} s unless more serve")


def serving(ctx: LoopContext, now: float) -> int:
    """The replicas the loop judges capacity on: those asked, but the ones that serve
    while a kept refusal holds and the deployment asks more than served then (a state
    from an older version, which kept asking them; a scale by hand not yet ready)."""
    kept = _kept(ctx, now)
    if kept is None:
        return ctx.deployment.replicas()
    short, _, counts = kept
    if counts.asked > max(short.ready, ctx.settings.min_replicas):
        return min(counts.asked, counts.ready)
    return counts.asked


def hold_s(settings: ControllerSettings, short: ReplicasShort) -> float:
    """How long ``short`` holds scale-ups above what served: ``max_backoff_s``, doubled
    for each strike after the first, at most ``MAX_HOLD_DOUBLINGS`` times (a count
    written by hand into the status is never raised to its power)."""
    return settings.max_backoff_s * 2.0 ** min(max(short.strikes - 1, 0),
                                               MAX_HOLD_DOUBLINGS)


def _in_a_row(settings: ControllerSettings, last: ReplicasShort, counts: Replicas,
              now: float) -> bool:
    """Whether a refusal now repeats ``last``: no more serve than did (the quota has not
    moved), and tried again within the longest hold after ``last``'s ended. Past that the
    alert was quiet a while, and a refusal is the first again (counted from a month
    before, a new one was held twice as long), as kubelet's backoff forgets."""
    if counts.ready > last.ready:
        return False
    ended = last.until if last.until is not None else last.since + hold_s(settings, last)
    return now - ended <= settings.max_backoff_s * 2.0 ** MAX_HOLD_DOUBLINGS


def _kept(ctx: LoopContext, now: float) -> tuple[ReplicasShort, float, Replicas] | None:
    """The kept refusal, when it ends and the replica counts, while it holds; None once
    its ``until`` has passed (kept for its strikes) or more replicas serve than did (then
    forgotten, strikes and all: the quota was raised)."""
    short = ctx.loop.replicas_short
    if short is None:
        return None
    counts = ctx.deployment.replica_counts()
    if counts.ready > short.ready:
        ctx.loop.replicas_short = None
        return None
    until = short.until if short.until is not None else \
        short.since + hold_s(ctx.settings, short)  # an older version's: no until kept
    if now >= until:
        return None
    return short, until, counts


def _times(short: ReplicasShort) -> str:
    n = short.strikes
    return "refused once at this count" if n <= 1 else f"refused {n} times in a row"


def _hold(settings: ControllerSettings, short: ReplicasShort) -> str:
    factor = hold_s(settings, short) / settings.max_backoff_s
    return (f"max_backoff_s={settings.max_backoff_s:g} s x{factor:g} (doubled for each "
            f"refusal in a row, at most x{2 ** MAX_HOLD_DOUBLINGS})")


def _said(counts: Replicas) -> str:
    why = counts.why_not_ready or "the platform says not why"
    return f"{counts.ready} of {counts.asked} replicas ready ({why})"
