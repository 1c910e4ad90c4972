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
says so once (an inform naming what the platform says keeps them) and judges on the
replicas that serve (``serving``); while the deployment still asks that count and fewer
serve (``LoopState.replicas_short``), an alert that asks for replicas is held and
SCALING buys none (``held``): a quota that refused the last ones refuses the next. It
ends once they serve (the quota raised) or the count asked changes (a scale-down, a
user's scale).
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import Replicas
from slopilot.tuner.loop.state import ReplicasShort, ReplicaWait


@dataclass(frozen=True)
class Look:
    """What the awaited replicas say at one look."""

    waiting: str | None = None
    """The wait goes on: what the replicas are, for the decision; None: it does not."""
    gave_up: str | None = None
    """``replica_ready_s`` passed with replicas not ready: the inform's reason."""


def bought(ctx: LoopContext, now: float, asked: int) -> None:
    """A scale-up to ``asked`` made now: its replicas are waited for."""
    ctx.loop.replica_wait = ReplicaWait(asked, now)
    ctx.loop.replicas_short = None


def look(ctx: LoopContext, now: float) -> Look:
    """Where the awaited replicas stand: ready (the wait ends, the cooldown counting from
    now), still coming, or past ``replica_ready_s`` (the shortfall is kept)."""
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
        if loop.cooldown_until is not None:
            loop.cooldown_until = max(loop.cooldown_until, now + s.cooldown_s)
        return Look()
    waited = now - wait.since
    if waited < s.replica_ready_s:
        return Look(waiting=f"waiting for the replicas bought: {_said(counts)}; up to "
                    f"replica_ready_s={s.replica_ready_s:g} s ({waited:.0f} s so far)")
    loop.replica_wait = None
    loop.replicas_short = ReplicasShort(counts.asked, counts.ready, now,
                                        counts.why_not_ready)
    return Look(gave_up=f"replicas_not_ready: {_said(counts)} {waited:.0f} s after the "
                f"scale-up (replica_ready_s={s.replica_ready_s:g} s); judging on the "
                f"{counts.ready} that serve, and no scale-up while they stay short")


def held(ctx: LoopContext) -> str | None:
    """Why no replica is bought now: the last ones bought still do not serve; None when
    no such shortfall is kept, or it has ended (then it is forgotten)."""
    counts = _short_counts(ctx)
    if counts is None:
        return None
    return (f"no scale_up: {_said(counts)} since a scale-up past replica_ready_s: "
            "more asked would not serve either")


def serving(ctx: LoopContext) -> int:
    """The replicas the loop judges capacity on: those asked, but the ones that serve
    while a kept shortfall holds."""
    counts = _short_counts(ctx)
    return ctx.deployment.replicas() if counts is None else counts.ready


def _short_counts(ctx: LoopContext) -> Replicas | None:
    """The replica counts while the kept shortfall holds; None (forgetting it) once the
    deployment asks another count or every asked replica serves."""
    short = ctx.loop.replicas_short
    if short is None:
        return None
    counts = ctx.deployment.replica_counts()
    if counts.asked != short.asked or counts.ready >= counts.asked:
        ctx.loop.replicas_short = None
        return None
    return counts


def _said(counts: Replicas) -> str:
    why = counts.why_not_ready or "the platform says not why"
    return f"{counts.ready} of {counts.asked} replicas ready ({why})"
