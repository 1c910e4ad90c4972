"""SCALING: add replicas, or find that a new config (or the current count) will do.

A new config is cheaper than a replica, so unless live evidence already says no config
holds (``Go.at_least``, from COMMIT or the offline study), SCALING first asks the offline
study whether some config holds at the current count and tunes if so; when the study
finds none, at least one more replica is needed, whatever the capacity plan's shorter
simulation says of the current count. The capacity plan (with ``scale_up_margin`` to
spare) says how many replicas the measured load needs, within min and max (where its
search gave up at the count breaching, or below one in the band it misses, it is searched
again above that count; a breach at a count it holds with its next is the config's:
``_above_given_up``); at max replicas with nothing holding, the closest configs
still get one live episode, and an episode that then finds nothing ends here with an
inform, whose verdict holds off the next such episode in the same situation
(``backoff.py``).

When no count up to max holds and the search's own per-count results show the worst term
stops moving past some count (``replica_plateau.py``: an SLO below what one request
takes alone, such as a P0 TTFT limit under one prefill), replicas are not the cure: the
fleet goes to that count, up or down, and at it the loop says what the search found and
backs off as at max replicas. A capacity-bound overload (each step up still helps) still
buys max replicas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop import advice, backoff, given_up, replica_plateau, scale_wait
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.context import LoopContext, Tick
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.episode import start_episode
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.loop.transitions import Event, Go


def scaling(ctx: LoopContext, tick: Tick, entered: Go | None) -> Decision | Go:
    loop, s, now = ctx.loop, ctx.settings, tick.now
    if entered is None:  # resumed, or held by the trial rate limit last tick
        reason, at_least = loop.scale_reason or "resuming scaling", None
    else:
        reason, at_least = entered.reason, entered.at_least
    loop.reason = loop.scale_reason = reason
    # The replicas that serve where the last ones bought never did (scale_wait.py).
    current = scale_wait.serving(ctx, now)
    # Read once: a pod's spec or an HTTP GET. What the capacity is planned for: SCALING
    # is never inside an episode, so a best config kept is the last episode's commit,
    # which the deployment runs unless an edit of its spec has replaced it since. The
    # committed config, not a trial's that a controller which lost its state left on
    # every replica: the operator's sync puts the committed one back, and the new
    # count must carry that one.
    running = ctx.deployment.committed_config()
    scenario = ctx.probe.measure(now)
    ranked: advice.Ranked = []
    if at_least is None and ctx.offline is not None:
        ranked = advice.warm_starts(ctx, now, current, running, scenario)
        if any(ok for _, ok in ranked):
            return start_episode(
                ctx, now, f"retune_suffices: the simulator holds the SLO at {current} "
                f"replica(s) with other knobs; {reason}", Event.RETUNE_SUFFICES,
                allow_scale=False, ranked=ranked)
        if ranked and current < s.max_replicas:
            # The study ran every candidate longer than one capacity window does; its
            # verdict that none holds here is the better evidence, as on the retune path
            # (start_episode's at_least).
            reason = f"offline study: no config holds the SLO at {current} " \
                f"replica(s); {reason}"
            at_least = current + 1
    # Planned for the running config, not the study's best (ranked[0]): a scale applies
    # no config, and the loop applies only what a live trial judged (COMMIT), never a
    # config the study itself says does not hold here. So the running config is what the
    # new count must carry; an episode at that count may later find a cheaper config,
    # and the scale-down gives the spare replicas back.
    answer = advice.capacity(ctx, now, scenario, running, s.min_replicas, s.max_replicas,
                             margin=ctx.scale_up_margin, running=running)
    if answer is not None and (above := _above_given_up(
            ctx, now, scenario, running, answer, current, at_least)) is not None:
        answer, reason = above[0], f"{above[1]}; {reason}"
    if answer is None:
        return _on_live_evidence(ctx, now, scenario, current, at_least, reason)
    if answer.replicas is None and \
            (flat := replica_plateau.plateau(answer.results)) is not None:
        # The offline study's "one more than now" (at_least) is not taken here: the
        # running config's term does not move past the plateau, and the study found no
        # config that holds at this count either.
        return _plateau(ctx, now, scenario, current, flat, answer, reason)
    needed = answer.replicas if answer.replicas is not None else s.max_replicas
    if at_least is not None:
        needed = max(needed, at_least)
    needed = min(max(needed, s.min_replicas), s.max_replicas)
    if needed > current:
        return _scale_up(ctx, now, current, needed, reason)
    if at_least is not None:
        return _max_replicas(ctx, now, scenario, reason)
    if answer.replicas is not None and not answer.gave_up:
        return start_episode(ctx, now, f"capacity_suffices at {current} replica(s); "
                             f"{reason}", Event.CAPACITY_SUFFICES, allow_scale=False)
    # No replica to add and the simulator sees no config that holds (or gave up at a
    # count the maximum, breaching, lies above: ``_above_given_up`` searched above any
    # other): the closest ones are still worth a live episode (the model may be
    # pessimistic). An episode that then finds nothing comes back with at_least set and
    # stops above, and that verdict holds off the next such episode in the same
    # situation (backoff.py).
    if (held := _backed_off(ctx, now, reason)) is not None:
        return held
    sees = "the simulator sees no config that holds" if answer.replicas is None else \
        (f"{current} breaches; the twin's search gave up at {answer.replicas} (holding "
         "flips at this load), no evidence that the count holds")
    return start_episode(
        ctx, now, f"max_replicas {s.max_replicas} reached and {sees}; tuning for the "
        f"closest; {reason}", Event.TUNE_CLOSEST, allow_scale=False, ranked=ranked)


def _above_given_up(ctx: LoopContext, now: float, scenario: Scenario,
                    running: Mapping[str, Any], answer: CapacityAnswer, current: int,
                    at_least: int | None) -> tuple[CapacityAnswer | None, str] | None:
    """Where the twin's search from the minimum gave up on an answer at or below
    ``current`` (the count serving, which the alert or episode that led here says
    misses), the twin's answer searched again where the breach says something of it,
    with why; None where it did not give up there, or where the maximum serves. The
    answer is None where the twin gave none this time: the live evidence's one replica
    more is then taken.

    An answer given up on is the smallest count that held above the twin's last miss,
    its next count unchecked: holding flips near it, and a breach at it (the twin was
    wrong there, or the load grew into it) is live evidence that it misses. The search
    on the same table gives up on the same count, and read as "capacity suffices" the
    breach at the count a scale-up bought started a live episode of configs there, then
    bought one replica (into a count the twin's runs miss), and the hourly trial budget
    held the fleet at it, breaching, for hours. So a breach at the count given up on, or
    live evidence that the count serving misses (``at_least``: an episode or the offline
    study), is searched above it: the twin's smallest count that holds there, checked
    against its next count as any answer is, never below a count that breached.

    A breach above the count given up on says nothing of that count: the twin is asked
    about the count serving itself (searched from it). Where it holds with its next
    count, the twin holds it cleanly, above the band where holding flips, and the breach
    is the config's to answer (``capacity_suffices``, the answer searched from it);
    read as evidence against the count given up on, every alert at such a count bought
    one replica for good (a fleet at 15 on a twin giving up at 12 went to 21 in six
    bursts). Where the twin misses the count serving, or its next, the count lies in the
    band, and its answer from there is the count to scale to."""
    s, given = ctx.settings, answer.replicas
    if not answer.gave_up or given is None or given > current or current >= s.max_replicas:
        return None
    flips = (f"the twin's search gave up at {given} (held while the next count missed "
             f"at {', '.join(map(str, answer.lucky))}: holding flips at this load)")
    if current == given or at_least is not None:
        floor = max(current + 1, at_least or 0)
        why = f"{flips} and {current} breaches live: searched from {floor}"
        given_up.breached(ctx, scenario, current)
        return advice.capacity(ctx, now, scenario, running, floor, s.max_replicas,
                               margin=ctx.scale_up_margin, running=running), why
    here = advice.capacity(ctx, now, scenario, running, current, s.max_replicas,
                           margin=ctx.scale_up_margin, running=running)
    if here is not None and here.replicas == current and not here.gave_up:
        return here, (f"{flips}; {current}, above it, breaches live and the twin holds it "
                      "with its next count")
    given_up.breached(ctx, scenario, current)
    return here, (f"{flips} and {current} breaches live, a count the twin misses (or its "
                  f"next): searched from {current}")


def _on_live_evidence(ctx: LoopContext, now: float, scenario: Scenario, current: int,
                      at_least: int | None, reason: str) -> Decision | Go:
    """The twin gave no plan (not trusted, or busy). The alert, or an episode in which no
    config held, is live evidence for one more replica, not for the twin's count."""
    s, why = ctx.settings, advice.unavailable(ctx, now)
    needed = min(max(at_least or 0, current + 1), s.max_replicas)
    if needed > current:
        return _scale_up(ctx, now, current, needed,
                         f"{why}; one replica on live evidence; {reason}")
    if at_least is not None:
        return _max_replicas(ctx, now, scenario, f"{why}; {reason}")
    if (held := _backed_off(ctx, now, reason)) is not None:
        return held
    return start_episode(ctx, now, f"max_replicas {s.max_replicas} reached; {why}: live "
                         f"trials without warm start; {reason}", Event.TUNE_CLOSEST,
                         allow_scale=False, ranked=[])


def _plateau(ctx: LoopContext, now: float, scenario: Scenario, current: int,
             flat: replica_plateau.Plateau, answer: CapacityAnswer, reason: str) -> Go:
    """No count holds, and more than ``flat.replicas`` do not move the worst term: go
    there (the move's reason says what the search found), or, there already, say so. The
    verdict is kept at the count it leaves (``backoff.py``), so that neither the alerts
    still firing after the cooldown nor the next search's noise (its runs are short, its
    P99s a few requests' largest) move the fleet again until the situation changes."""
    s, target = ctx.settings, min(max(flat.replicas, ctx.settings.min_replicas),
                                  ctx.settings.max_replicas)
    if target < current and (short := answer.why_short(current)) is not None:
        # A run capped short of the requests a P99 needs says little of fewer replicas.
        target, reason = current, f"{short}; {reason}"
    if target > current:
        go = _scale_up(ctx, now, current, target, f"{flat.text()}; {reason}")
        if go.event is not Event.SCALED_UP:
            return go
        kept = backoff.record(ctx, now, scenario, settled=True)
        return dataclasses.replace(go, reason=f"{go.reason}; no new episode for "
                                   f"{kept.wait_s:g} s{backoff.UNLESS}")
    # Waiting does not move an SLO below what one request takes: only another load,
    # spec or config can, and any of those ends the backoff at once.
    if target < current:
        ctx.deployment.scale(target)
        kept = backoff.record(ctx, now, scenario, settled=True)
        return Go(ControllerState.COOLDOWN, Event.REPLICAS_FLAT,
                  f"scale_down {current}->{target}: {flat.text()}; no new episode for "
                  f"{kept.wait_s:g} s{backoff.UNLESS}; {reason}", action=Action.SCALE)
    kept = backoff.record(ctx, now, scenario, settled=True)
    return Go(ControllerState.COOLDOWN, Event.REPLICAS_FLAT,
              f"replica_plateau: {flat.text()}; staying at {current} of max "
              f"{s.max_replicas}; no new episode for {kept.wait_s:g} s{backoff.UNLESS}; "
              f"{reason}",
              action=Action.INFORM)


def _scale_up(ctx: LoopContext, now: float, current: int, needed: int, reason: str) -> Go:
    """Ask for ``needed`` replicas and wait for them; none above those that served while
    the refusal of the last ones bought is kept (a quota refused them: it refuses these
    too)."""
    short = scale_wait.held(ctx, now, needed)
    if short is not None:
        return Go(ControllerState.COOLDOWN, Event.REPLICAS_SHORT,
                  f"scale_up_held: {short}; scale_up {current}->{needed} not made; {reason}",
                  action=Action.INFORM)
    ctx.deployment.scale(needed)
    scale_wait.bought(ctx, now, needed)
    return Go(ControllerState.COOLDOWN, Event.SCALED_UP,
              f"scale_up {current}->{needed}: {reason}", action=Action.SCALE)


def _max_replicas(ctx: LoopContext, now: float, scenario: Scenario,
                  reason: str) -> Go:
    """The verdict: live evidence that nothing holds, and no replica left to add. Kept
    with its situation, so that the alerts still firing after the cooldown do not start
    the same episode again (backoff.py)."""
    kept = backoff.record(ctx, now, scenario)
    return Go(ControllerState.COOLDOWN, Event.MAX_REPLICAS,
              f"max_replicas {ctx.settings.max_replicas} reached and the SLO is not held; "
              f"no new episode for {kept.wait_s:g} s{backoff.UNLESS}; {reason}",
              action=Action.INFORM)


def _backed_off(ctx: LoopContext, now: float, reason: str) -> Go | None:
    """A tune-closest episode is what the kept verdict already tried: while its backoff
    runs, say so again instead (SCALING is entered from COMMIT too, and resumed after a
    restart, not only from STEADY, which checks the same)."""
    why = backoff.look(ctx, now).blocked
    if why is None:
        return None
    return Go(ControllerState.COOLDOWN, Event.MAX_REPLICAS,
              f"max_replicas {ctx.settings.max_replicas} reached and the SLO is not held; "
              f"{why}; {reason}", action=Action.INFORM)
