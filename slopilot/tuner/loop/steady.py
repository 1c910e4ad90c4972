"""STEADY and COOLDOWN: watch the alerts, scale down after a quiet spell, wait out a cooldown.

STEADY acts on the firing alerts by their ``action`` label: ``hold`` (the deployment
serves nothing, or cannot be seen) stops it acting at all, whatever else fires, until it
clears; else ``scale`` moves to SCALING, ``retune`` starts a tuning episode, ``inform`` is
reported (once for each new set of them) and nothing more. With no alert
that acts and none that says an SLO is breached (the TTFT warning informs, but the SLO is
breached all the same), replicas above the minimum are given back once the alerts have
been quiet for ``scale_down_after_s`` and the simulator holds the SLO with fewer (with
headroom), or holds it with no count and more than fewer do not move it
(``replica_plateau.py``). After a commit or a scale, an alert that has held since before
it is re-confirmed on the loop's own window measured after it before it acts
(``_unconfirmed``), and a sustained-breach alert counts only once its rule's last
evaluation read a window that starts after the action took effect (``_read_after``; the
cooldown counts from then: its apply's or scale's return, a rollout's end, a scale-up's
replicas ready, each the clock read after the call that did or saw it,
``LoopContext.took_effect``).
COOLDOWN after a scale-up also waits for the replicas it bought (those that never come
are given back), and a scale alert is held for ``max_backoff_s`` after replicas bought
never served (``scale_wait.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop import (
    advice,
    backoff,
    given_up,
    replica_plateau,
    rollout_wait,
    scale_wait,
)
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.episode import start_episode
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.prometheus.alert_table import (
    LONG_WINDOW_ALERTS,
    SLO_BREACH_ALERTS,
    AlertName,
)
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from slopilot.tuner.study.evaluator import WindowRejected
from slopilot.tuner.study.objective import score, unmeasured

log = logging.getLogger(__name__)


def steady(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    if entered is not None:  # the cooldown just ended: the alerts are read next tick
        return ctx.decide(Action.NONE, entered.reason)
    if (back := scale_wait.owed(ctx, tick.now)) is not None:
        return ctx.decide(Action.INFORM, back)
    alerts = _since_last_action(ctx, tick)
    stop = _held(ctx, alerts)
    if stop is not None:
        return stop
    scale = [a for a in alerts if a.action is AlertAction.SCALE]
    retune = [a for a in alerts if a.action is AlertAction.RETUNE]
    short = scale_wait.held(ctx, tick.now) if scale else None
    if short is not None:  # the replicas bought last never served: more would not
        ctx.loop.headroom_since = None
        if not retune:
            return ctx.decide(Action.NONE, f"{short}; alert {names(scale)} held")
        scale = []
    lifted = ""
    if scale or retune:
        ctx.loop.headroom_since = None
        # At max replicas with nothing holding, the verdict stands until the situation
        # changes or its backoff runs out: the same episode would find the same nothing.
        held = backoff.look(ctx, tick.now)
        if held.blocked is not None:
            return ctx.decide(Action.NONE, f"{held.blocked}; alert {names(scale + retune)}")
        lifted = f" ({held.lifted})" if held.lifted else ""
        stale = _unconfirmed(ctx, tick.now, scale + retune)
        if stale is not None:
            old, why = stale
            scale = [a for a in scale if a not in old]
            retune = [a for a in retune if a not in old]
            if not (scale or retune):
                return ctx.decide(Action.NONE, f"{why}; alert {names(old)}{lifted}")
    if scale:
        return Go(ControllerState.SCALING, Event.SCALE_ALERT,
                  "alert " + names(scale) + lifted)
    if retune:
        return start_episode(ctx, tick.now, "alert " + names(retune) + lifted,
                             Event.RETUNE_ALERT, allow_scale=True)
    inform = [a for a in alerts if a.action is AlertAction.INFORM]
    which = frozenset(a.describe() for a in inform)
    said, ctx.informed_of = which == ctx.informed_of, which
    told = Action.NONE if said else Action.INFORM  # once for each new set of them
    if any(a.name in SLO_BREACH_ALERTS for a in inform):
        # An SLO breached is no spare capacity, whatever the alert asks the loop to do.
        ctx.loop.headroom_since = None
        return ctx.decide(told, "alert " + names(inform))
    step = _scale_down(ctx, tick.now)
    if isinstance(step, Go):
        return step
    if inform:
        return ctx.decide(told, "alert " + names(inform))
    return ctx.decide(Action.NONE, step or "steady")


def _held(ctx: LoopContext, alerts: Sequence[Alert]) -> Decision | None:
    """A hold while an alert whose action is ``hold`` fires; None when none does.

    A stalled engine fires the TTFT alerts too (its clients' first tokens never come),
    which ask for a retune: trials on a stuck executor, or replicas added beside it,
    answer nothing, and replicas given back for headroom while nothing is served or seen
    are capacity lost. Said once (``Action.HOLD``, a Warning event) for each new set of
    such alerts, then kept quietly, as an outage of Prometheus is."""
    hold = [a for a in alerts if a.action is AlertAction.HOLD]
    which = frozenset(a.describe() for a in hold)
    first, ctx.held_by = which != ctx.held_by, which
    if not hold:
        return None
    ctx.loop.headroom_since = None
    return ctx.decide(Action.HOLD if first else Action.NONE,
                      f"alert {names(hold)}: the deployment serves nothing or cannot be "
                      "seen; no retune nor scale while it fires")


def _since_last_action(ctx: LoopContext, tick: Tick) -> list[Alert]:
    """The alerts that judge the running config: a sustained-breach alert reads a window
    of ``breach_window_s`` that ends at its rule's last evaluation, so until that window
    starts after the last action took effect it still counts the config before it, and
    is left out (``_read_after``)."""
    acted = _last_action(ctx)
    if acted is None:
        return list(tick.alerts)
    return [a for a in tick.alerts
            if a.name not in LONG_WINDOW_ALERTS or _read_after(ctx, tick.now, a, acted)]


def _read_after(ctx: LoopContext, now: float, alert: Alert, acted: float) -> bool:
    """Whether ``alert``'s last evaluation read requests served after ``acted`` alone.

    Its rule reads ``breach_window_s`` at most (the longest window of any), up to the
    evaluation that gave this verdict, ``alert.evaluated_ago_s`` before the read: a range
    ``(t - window, t]`` counts the requests that finished after the first scrape in it,
    so with ``t - window >= acted`` none served before the action is counted. Counted
    from ``now`` alone, the first read after a 300 s cooldown (305 s after the action)
    was the verdict of the evaluation 25 s before, whose window still held 20 s of the
    requests before it: with 15 s scrapes and 30 s evaluations a P0 TTFT P99 of 2.14 s
    for a config at 0.33 s (docs/closed_loop.md, "Counted from the rules' last
    evaluation, and from the action's effect"). The evaluation's age is a
    difference of two of Prometheus' own times, so no skew between its clock and the
    operator's enters; a fixed margin (an interval and a scrape) would have been too
    short where Prometheus skips evaluations under load, and too long where it keeps up.
    """
    evaluated = now - alert.evaluated_ago_s
    return evaluated - ctx.settings.breach_window_s >= acted


def _last_action(ctx: LoopContext) -> float | None:
    """When the last action took effect (a commit, a scale, a hold or a rollback: its
    rollout's end or its replicas' readiness, ``rollout_wait.ended`` and
    ``scale_wait.look``, else its apply), the cooldown counting from then; None before
    the first."""
    until = ctx.loop.cooldown_until
    return None if until is None else until - ctx.settings.cooldown_s


def _unconfirmed(ctx: LoopContext, now: float, acting: Sequence[Alert]
                 ) -> tuple[list[Alert], str] | None:
    """The acting SLO alerts that have held since before the last action and that the
    loop's own window since then does not bear out, with why; None when none.

    Such an alert has held across the commit or scale: its rule reads a window of
    ``rate_window_s`` or ``breach_window_s``, evaluated every ``interval_s`` behind the
    clock, so after the cooldown it can still be firing on requests served before the
    action, under the config and at the load of then (a P99 over 5 minutes is over its
    SLO while more than 1 % of them breached). Acted on, it started one more episode that
    retuned for the load of now: a lighter one after the peak ended, and the config that
    held the peak was replaced (churn). It acts only when a window measured entirely
    after the action (past ``settle_s``, the last ``breach_window_s`` of it at most, the
    whole deployment) breaches the SLO, as a trial's window is judged. A window that
    says nothing (rejected, or without a sample of the alert's class or of the P99 it
    reads) leaves it its word, as before; so does any alert that became active after the
    action (its hold ran on windows after it), one that reads no SLO term (batching
    underused), and every alert whose last evaluation read no request from before the
    action (``_read_after``)."""
    acted = _last_action(ctx)
    s = ctx.settings
    if acted is None:
        return None
    # An evaluation whose window starts after the action judged requests served after
    # it alone, and its word stands: without this bound an alert and the loop that read
    # the SLO apart cost a window's queries every tick, and the alert never acted.
    old = [a for a in acting if a.since < acted and a.name in SLO_BREACH_ALERTS
           and not _read_after(ctx, now, a, acted)]
    start = max(acted + s.settle_s, now - s.breach_window_s)
    if not old or now <= start:
        return None
    try:
        summary = ctx.evaluator.measure(start, now, canary=False)
    except WindowRejected:
        return None
    absent = unmeasured(summary, s.slo)
    judged = [p for p, c in s.slo.classes().items()
              if c.ttft_p99_ms is not None or c.tbt_p99_ms is not None]
    if any(a.priority_class in absent or not _figure_measured(summary, a) for a in old) \
            or (judged and len(absent) == len(judged)):
        return None
    result = score(summary, s.slo, {})
    if not result.feasible:
        return None
    return old, (f"active since before the last commit or scale took effect "
                 f"({now - acted:.0f} s ago), and the last {now - start:.0f} s measured "
                 "since hold the SLO: not "
                 "re-confirmed, the alert's window still counts the load before it")


def _figure_measured(summary: WindowSummary, alert: Alert) -> bool:
    """Whether ``summary`` has a sample of the P99 ``alert`` reads: ``score`` reads a
    missing one as held, and a TTFT alert re-confirmed on a window of its class's gaps
    alone (its requests since all still queued) was left out on a figure never measured.
    An alert of no class's P99 (preemptions) reads a figure every window has."""
    ttft = alert.name in (AlertName.TTFT_P99_HIGH, AlertName.TTFT_P99_SUSTAINED)
    tbt = alert.name in (AlertName.TBT_P99_HIGH, AlertName.TBT_P99_SUSTAINED)
    if not (ttft or tbt):
        return True
    try:
        figures = summary.classes[Priority.parse(alert.priority_class)]
    except ValueError:
        return False
    return (figures.ttft_p99_ms if ttft else figures.tbt_p99_ms) is not None


def _scale_down(ctx: LoopContext, now: float) -> Go | str | None:
    """Fewer replicas when the alerts have been quiet and the simulator holds the SLO
    with fewer; else why not where it is worth saying, or None."""
    loop, s = ctx.loop, ctx.settings
    current = scale_wait.serving(ctx, now)
    if current <= s.min_replicas:
        loop.headroom_since = None
        return None
    if loop.headroom_since is None:
        loop.headroom_since = now
    if now - loop.headroom_since < s.scale_down_after_s:
        return None
    loop.headroom_since = now  # look again after another quiet period
    running = ctx.deployment.committed_config()  # never a trial's left behind
    scenario = ctx.probe.measure(now)
    answer = advice.capacity(ctx, now, scenario, running, s.min_replicas,
                             current, margin=ctx.headroom_margin, running=running,
                             removing=True)
    if answer is None:  # no live evidence says fewer replicas would do: keep them
        log.info("%s: no scale-down: %s", s.key, advice.unavailable(ctx, now))
        return None
    flat = replica_plateau.plateau(answer.results) if answer.replicas is None else None
    if flat is not None and flat.replicas < current and answer.why_short(current) is None:
        # No count holds, and those past the plateau serve no better: they are spend
        # without effect, kept for good by a scale-down that waited for a count that holds.
        target = max(flat.replicas, s.min_replicas)
        ctx.deployment.scale(target)
        kept = backoff.record(ctx, now, scenario, settled=True)  # as SCALING keeps it
        return Go(ControllerState.COOLDOWN, Event.REPLICAS_FLAT,
                  f"scale_down {current}->{target}: no alert that acts or says an SLO is "
                  f"breached for {s.scale_down_after_s:g} s, and {flat.text()}; no new "
                  f"episode for {kept.wait_s:g} s{backoff.UNLESS}", action=Action.SCALE)
    if answer.replicas is None or not answer.fewer_hold(current):
        # A run capped short of the requests a P99 needs holds on a few requests'
        # largest, low as often as not: the scale-downs taken on it breached and
        # were undone by the next alert.
        why = answer.why_short(current)
        if why is not None:
            log.info("%s: no scale-down: %s", s.key, why)
            return f"steady; no scale_down: {why}"
        if (down := given_up.scale_down(ctx, now, scenario, running, answer,
                                        current)) is not None:
            ctx.deployment.scale(down[0])
            return Go(ControllerState.COOLDOWN, Event.HEADROOM,
                      f"scale_down {current}->{down[0]}: no alert that acts or says an "
                      f"SLO is breached for {s.scale_down_after_s:g} s; {down[1]}",
                      action=Action.SCALE)
        if answer.replicas is not None and answer.replicas < current and answer.gave_up:
            log.info("%s: no scale-down: holding flips near %d replicas (held while the "
                     "next count missed at %s), and no count above it holds with its "
                     "next below the count serving (and above any that breached live "
                     "at this load)",
                     s.key, answer.replicas, ", ".join(map(str, answer.lucky)))
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
        # From when the action that led here took effect (its apply or scale returned),
        # not from the tick's start: the steps before it may have taken minutes.
        loop.cooldown_until = ctx.took_effect(tick.now) + ctx.settings.cooldown_s
        scale_wait.look(ctx, tick.now, give_up=False)  # ready at once: the wait ends
        rollout_wait.ended(ctx, tick.now)  # a live apply: in effect now
        return ctx.decide(entered.action, entered.reason, config=entered.config,
                          summary=entered.summary)
    # A scale-up's replicas are waited for (scale_wait.py): STEADY would judge the
    # capacity asked on the figures of the replicas that serve.
    seen = scale_wait.look(ctx, tick.now)
    # Its rollout's end, seen at the tick it comes, restarts it (``rollout_wait.ended``):
    # looked at only once the time was over, a rollout done within it went unseen.
    rollout_wait.ended(ctx, tick.now)
    if seen.gave_up is not None:
        return ctx.decide(Action.INFORM, seen.gave_up)
    if loop.cooldown_until is not None and tick.now < loop.cooldown_until:
        return ctx.decide(Action.NONE, "cooling down" if seen.waiting is None
                          else f"cooling down; {seen.waiting}")
    if seen.waiting is not None:
        return ctx.decide(Action.NONE, f"cooling down: {seen.waiting}")
    # A rollout under way holds it (STEADY would judge alerts on the old pods' figures);
    # a commit's that is stuck is reverted.
    held = rollout_wait.cooling(ctx, tick.now)
    if held is not None:
        return held
    return Go(ControllerState.STEADY, Event.COOLDOWN_OVER, "cooldown over")


def names(alerts: Sequence[Alert]) -> str:
    return ", ".join(sorted({a.describe() for a in alerts}))
