"""The loop's own look at a rollout: its bound where the Deployment controller says
nothing, and the configs whose rollouts stuck, kept from trials for a while.

The controller's verdict (``ProgressDeadlineExceeded``) never comes when the
controller-manager is down, when the API server's watch lags behind, or when another
actor took ``progressDeadlineSeconds`` off the Deployment: the rollout read ``Pending``
at every look, and the trial, or the cooldown after a commit, waited for ever. So
``look`` keeps the furthest the rollout has gone (``Pending.progress``: its template's
most updated and available replicas, fewest old ones) and calls it ``Stuck`` once it has
gone no further for ``rollout_timeout_s``. Counted from the last step forward, not from
the apply: a rollout of many replicas may take longer than the bound as a whole, as the
Deployment's own deadline allows; and not from any change: a new pod that crash-loops
(ready, crashing, ready again) changed the counts every few minutes, and the bound never
ended.

A config whose rollout stuck is held (``LoopState.stuck_configs``) for
``max_backoff_s``: the study or the offline ranking proposes it again at the next
episode (a commit is the study's best), and it rolled the same template into the same
quota or node shortage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import Pending, Rollout, RolloutProgress, Stuck
from slopilot.tuner.loop.state import LoopState, RolloutWatch, StuckConfig

MAX_HELD = 8
"""Stuck configs kept at most (the oldest go first): the status holds them."""


def look(ctx: LoopContext, now: float) -> Rollout:
    """``DeploymentHandle.settled``, ``Stuck`` too once a ``Pending`` rollout has not gone
    past its furthest for ``rollout_timeout_s``. The watch ends with the rollout (settled
    or stuck); its commit's ``revert_to`` is read by the caller before it looks."""
    loop = ctx.loop
    state = ctx.deployment.settled(now)
    if not isinstance(state, Pending):
        loop.rollout = None
        return state
    watch = loop.rollout
    if watch is None:
        watch = loop.rollout = RolloutWatch(since=now)
        _moved(watch, state, now)
        return state
    if _moved(watch, state, now):
        return state
    bound = ctx.settings.rollout_timeout_s
    if now - watch.since < bound:
        return state
    loop.rollout = None
    return Stuck(f"the Deployment controller never reported: no progress for "
                 f"{now - watch.since:.0f} s ({state.why}), past the loop's bound "
                 f"rollout_timeout_s={bound:g} with no ProgressDeadlineExceeded (a "
                 "controller-manager down or behind, a new pod that keeps crashing, or "
                 "progressDeadlineSeconds taken off the Deployment)")


def _moved(watch: RolloutWatch, state: Pending, now: float) -> bool:
    """Whether ``state`` is a step past the furthest ``watch`` has seen (then kept, the
    bound counting from now). Counts that come back to where they were are none: a new
    pod that is ready, crashes and is ready again kept the bound from ever ending, as it
    keeps Kubernetes' own deadline."""
    seen = None if watch.generation is None else RolloutProgress(
        watch.generation, watch.updated, watch.old, watch.available)
    now_at = state.progress
    if now_at is None:  # no counts: the words are all that moves
        moved = seen is not None or watch.why != state.why
        watch.generation, watch.why = None, state.why
    else:
        moved = now_at.beyond(seen)
        best = now_at.furthest(seen)
        watch.generation, watch.updated = best.generation, best.updated
        watch.old, watch.available, watch.why = best.old, best.available, None
    if moved:
        watch.since = now
    return moved


def began(loop: LoopState, now: float, *, config: Mapping[str, Any] | None = None,
          revert_to: Mapping[str, Any] | None = None) -> None:
    """A new rollout may begin now (an apply to every replica): watched from now, a
    commit's with the config it replaces."""
    loop.rollout = RolloutWatch(
        since=now, config=dict(config) if config is not None else None,
        revert_to=dict(revert_to) if revert_to is not None else None)


def hold(ctx: LoopContext, now: float, config: Mapping[str, Any], why: str) -> StuckConfig:
    """Keep ``config`` from trials and warm starts for ``max_backoff_s``."""
    loop = ctx.loop
    base = loop.baseline_config or {}
    kept = [c for c in loop.stuck_configs
            if c.until > now and not _same(base, c.config, config)]
    entry = StuckConfig(dict(config), now + ctx.settings.max_backoff_s, why)
    loop.stuck_configs = [*kept, entry][-MAX_HELD:]
    return entry


def held(loop: LoopState, now: float, config: Mapping[str, Any]) -> StuckConfig | None:
    """The hold on ``config`` in force now; None where there is none."""
    base = loop.baseline_config or {}
    for c in loop.stuck_configs:
        if c.until > now and _same(base, c.config, config):
            return c
    return None


def said(entry: StuckConfig, now: float) -> str:
    """A hold in words, for a decision."""
    return f"its rollout stuck ({entry.why}); held from trials for {entry.until - now:.0f} s"


def _same(base: Mapping[str, Any], a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same config as it would run: each laid over ``base``, the config the episode
    began on (a ranking may name fewer knobs than the study; compared only where both
    named them, a held config held every other that shared one value with it)."""
    return {**base, **a} == {**base, **b}
