"""Replicas bought where the twin's capacity search gave up, and when they go back.

A search that gives up (``steady_count.py``: holding flips near the line) answers the
smallest count holding above its largest miss, that count's next unchecked: enough to
scale up to, no evidence for a scale-down to it (``CapacityAnswer.fewer_hold``). A live
breach at a count in that band buys the twin's next count that holds with its next
(``scaling._above_given_up``), and, read alone, the rule kept those replicas for good:
the scale-down's search, giving up the same way at a lighter load, never let any go.

Two facts decide a scale-down on such a search, kept apart from the count itself:

- Above the count given up on, the twin's smallest count that holds with its next
  (searched from it with the scale-down's headroom, as any scale-down's answer) is an
  answer like any other: its next count was run and held. A quiet fleet above it goes
  there. The count given up on is that answer only where its own next count holds.
- A live breach outweighs the twin at its count. Each breach the give-up rule answered is
  kept (``LoopState.given_up_breach``: the largest count that breached, and the
  situation, ``backoff.situation`` less the count serving: the load, the committed
  config, the spec). While the situation is the same, the scale-down goes only above
  that count: a count that breached at this load, cut back to because the twin holds
  it, breaches again and buys the replicas back, every ``scale_down_after_s`` (the
  flapping this record stops). A load that moved by ``backoff.LOAD_FACTOR`` (beyond the
  probe's noise), a new config or a spec edit forgets it: the breach was evidence for
  its own load only. No clock ends it: at an unchanged load nothing but another live
  window says the count now holds, and the fleet keeps one count more than the twin's
  at worst.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop import advice, backoff
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.context import LoopContext


def _situation(ctx: LoopContext, scenario: Scenario) -> dict[str, Any]:
    """What a breach was live evidence under: the count serving is left out (the record
    is about a count, and the fleet moves above it)."""
    kept = backoff.situation(ctx, scenario)
    kept.pop("replicas", None)
    return kept


def breached(ctx: LoopContext, scenario: Scenario, count: int) -> None:
    """Keep a live breach at ``count`` where the twin's search gave up at or below it: the
    largest such count in the same situation."""
    situation = _situation(ctx, scenario)
    kept = floor(ctx, scenario)
    ctx.loop.given_up_breach = {"replicas": max(count, kept or 0), "situation": situation}


def floor(ctx: LoopContext, scenario: Scenario) -> int | None:
    """The largest count that breached live in the situation the probe measures now;
    None where none did (a record of another situation is forgotten here)."""
    kept = ctx.loop.given_up_breach
    if kept is None:
        return None
    count, then = kept.get("replicas"), kept.get("situation")
    if isinstance(count, bool) or not isinstance(count, int) or not isinstance(then, dict) \
            or backoff.changed(then, _situation(ctx, scenario)) is not None:
        ctx.loop.given_up_breach = None
        return None
    return count


def scale_down(ctx: LoopContext, now: float, scenario: Scenario,
               running: Mapping[str, Any], answer: CapacityAnswer,
               current: int) -> tuple[int, str] | None:
    """Where the scale-down's search (``answer``) gave up below ``current``, the count to
    go to, with why: the twin's smallest count that holds with its next count at or
    above the count given up on and above any count that breached live in this
    situation; None where that is ``current`` (or above), or the twin gives none."""
    given = answer.replicas
    if not answer.gave_up or given is None or given >= current:
        return None
    breach = floor(ctx, scenario)
    lo = given if breach is None else max(given, breach + 1)
    if lo >= current:
        return None
    above = advice.capacity(ctx, now, scenario, running, lo, current,
                            margin=ctx.headroom_margin, running=running, removing=True)
    if above is None or above.replicas is None or not above.fewer_hold(current):
        return None
    lucky = ", ".join(map(str, answer.lucky))
    why = (f"the twin's search gave up at {given} (held while the next count missed at "
           f"{lucky}), and from {lo} it holds {above.replicas} with its next count")
    if breach is not None:
        why += f" (above {breach}, which breached live at this load)"
    return above.replicas, why
