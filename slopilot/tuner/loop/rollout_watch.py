"""The loop's own look at a rollout: its bound where the Deployment controller says
nothing, and the configs whose rollouts stuck, kept from trials for a while.

The controller's verdict (``ProgressDeadlineExceeded``) never comes when the
controller-manager is down, when the API server's watch lags behind, or when another
actor took ``progressDeadlineSeconds`` off the Deployment: the rollout read ``Pending``
at every look, and the trial, or the cooldown after a commit, waited for ever. So
``look`` keeps when the rollout last moved (``Pending.marker``: the generation and the
replica counts) and calls it ``Stuck`` once it has not moved for
``rollout_timeout_s``. Counted from the last move, not from the apply: a rollout of
many replicas may take longer than the bound as a whole, as the Deployment's own
deadline allows.

A config whose rollout stuck is held (``LoopState.stuck_configs``) for
``max_backoff_s``: the study or the offline ranking proposes it again at the next
episode (a commit is the study's best), and it rolled the same template into the same
quota or node shortage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import Pending, Rollout, Stuck
from slopilot.tuner.loop.state import LoopState, RolloutWatch, StuckConfig

MAX_HELD = 8
"""Stuck configs kept at most (the oldest go first): the status holds them."""


def look(ctx: LoopContext, now: float) -> Rollout:
    """``DeploymentHandle.settled``, ``Stuck`` too once a ``Pending`` rollout has not
    moved for ``rollout_timeout_s``. The watch ends with the rollout (settled or stuck);
    its commit's ``revert_to`` is read by the caller before it looks."""
    loop = ctx.loop
    state = ctx.deployment.settled(now)
    if not isinstance(state, Pending):
        loop.rollout = None
        return state
    watch = loop.rollout
    if watch is None:
        loop.rollout = RolloutWatch(since=now, progress=state.marker)
        return state
    if watch.progress is None or watch.progress != state.marker:
        watch.since, watch.progress = now, state.marker
        return state
    bound = ctx.settings.rollout_timeout_s
    if now - watch.since < bound:
        return state
    loop.rollout = None
    return Stuck(f"the Deployment controller never reported: no progress for "
                 f"{now - watch.since:.0f} s ({state.why}), past the loop's bound "
                 f"rollout_timeout_s={bound:g} with no ProgressDeadlineExceeded (a "
                 "controller-manager down or behind, or progressDeadlineSeconds taken off "
                 "the Deployment)")


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
    kept = [c for c in loop.stuck_configs if c.until > now and not _same(c.config, config)]
    entry = StuckConfig(dict(config), now + ctx.settings.max_backoff_s, why)
    loop.stuck_configs = [*kept, entry][-MAX_HELD:]
    return entry


def held(loop: LoopState, now: float, config: Mapping[str, Any]) -> StuckConfig | None:
    """The hold on ``config`` in force now; None where there is none."""
    for c in loop.stuck_configs:
        if c.until > now and _same(c.config, config):
            return c
    return None


def said(entry: StuckConfig, now: float) -> str:
    """A hold in words, for a decision."""
    return f"its rollout stuck ({entry.why}); held from trials for {entry.until - now:.0f} s"


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same knobs where both name them (a ranking may name fewer than the study)."""
    shared = set(a) & set(b)
    return bool(shared) and all(a[k] == b[k] for k in shared)
