"""STEADY and COOLDOWN: watch the alerts, scale down after a quiet spell, wait out a cooldown.

STEADY acts on the firing alerts by their ``action`` label: ``scale`` moves to SCALING,
``retune`` starts a tuning episode, ``inform`` is reported and nothing more. With no alert
that acts and none that says an SLO is breached (the TTFT warning informs, but the SLO is
breached all the same), replicas above the minimum are given back once the alerts have
been quiet for ``scale_down_after_s`` and the simulator holds the SLO with fewer (with
headroom).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slopilot.tuner.loop import advice, backoff
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.episode import start_episode
from slopilot.tuner.loop.state import Action, ControllerState, Decision
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.prometheus.alert_table import LONG_WINDOW_ALERTS, SLO_BREACH_ALERTS
from slopilot.tuner.prometheus.alerts import Alert, AlertAction

log = logging.getLogger(__name__)


def steady(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    if entered is not None:  # the cooldown just ended: the alerts are read next tick
        return ctx.decide(Action.NONE, entered.reason)
    alerts = _since_last_action(ctx, tick)
    scale = [a for a in alerts if a.action is AlertAction.SCALE]
    retune = [a for a in alerts if a.action is AlertAction.RETUNE]
    lifted = ""
    if scale or retune:
        ctx.loop.headroom_since = None
        # At max replicas with nothing holding, the verdict stands until the situation
        # changes or its backoff runs out: the same episode would find the same nothing.
        held = backoff.look(ctx, tick.now)
        if held.blocked is not None:
            return ctx.decide(Action.NONE, f"{held.blocked}; alert {names(scale + retune)}")
        lifted = f" ({held.lifted})" if held.lifted else ""
    if scale:
        return Go(ControllerState.SCALING, Event.SCALE_ALERT,
                  "alert " + names(scale) + lifted)
    if retune:
        return start_episode(ctx, tick.now, "alert " + names(retune) + lifted,
                             Event.RETUNE_ALERT, allow_scale=True)
    inform = [a for a in alerts if a.action is AlertAction.INFORM]
    if any(a.name in SLO_BREACH_ALERTS for a in inform):
        # An SLO breached is no spare capacity, whatever the alert asks the loop to do.
        ctx.loop.headroom_since = None
        return ctx.decide(Action.INFORM, "alert " + names(inform))
    step = _scale_down(ctx, tick.now)
    if step is None and inform:
        return ctx.decide(Action.INFORM, "alert " + names(inform))
    return step or ctx.decide(Action.NONE, "steady")


def _since_last_action(ctx: LoopContext, tick: Tick) -> list[Alert]:
    """The alerts that judge the running config: a sustained-breach alert reads a window
    of ``breach_window_s``, so until that long after the last commit or scale (the start
    of the last cooldown) it still counts the config before it, and is left out."""
    loop, s = ctx.loop, ctx.settings
    if loop.cooldown_until is None or \
            tick.now - (loop.cooldown_until - s.cooldown_s) >= s.breach_window_s:
        return list(tick.alerts)
    return [a for a in tick.alerts if a.name not in LONG_WINDOW_ALERTS]


def _scale_down(ctx: LoopContext, now: float) -> Go | None:
    loop, s = ctx.loop, ctx.settings
    current = ctx.deployment.replicas()
    if current <= s.min_replicas:
        loop.headroom_since = None
        return None
    if loop.headroom_since is None:
        loop.headroom_since = now
    if now - loop.headroom_since < s.scale_down_after_s:
        return None
    loop.headroom_since = now  # look again after another quiet period
    running = ctx.deployment.current_config()
    answer = advice.capacity(ctx, now, ctx.probe.measure(now), running, s.min_replicas,
                             current, margin=ctx.headroom_margin, running=running,
                             removing=True)
    if answer is None:  # no live evidence says fewer replicas would do: keep them
        log.info("%s: no scale-down: %s", s.key, advice.unavailable(ctx, now))
        return None
    if answer.replicas is None or answer.replicas >= current:
        return None
    ctx.deployment.scale(answer.replicas)
    return Go(ControllerState.COOLDOWN, Event.HEADROOM,
              f"scale_down {current}->{answer.replicas}: no alert that acts or says an "
              f"SLO is breached for {s.scale_down_after_s:g} s and the simulator holds "
              "the SLO with fewer",
              action=Action.SCALE)


def cooldown(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    loop = ctx.loop
    if entered is not None:
        loop.cooldown_until = tick.now + ctx.settings.cooldown_s
        return ctx.decide(entered.action, entered.reason, config=entered.config,
                          summary=entered.summary)
    if loop.cooldown_until is not None and tick.now < loop.cooldown_until:
        return ctx.decide(Action.NONE, "cooling down")
    return Go(ControllerState.STEADY, Event.COOLDOWN_OVER, "cooldown over")


def names(alerts: Sequence[Alert]) -> str:
    return ", ".join(sorted({a.describe() for a in alerts}))
