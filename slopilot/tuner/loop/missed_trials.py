"""Measured misses of episodes cut by the hour's trial budget, added up across them.

An episode cut by ``hourly_trials`` before its ``max_trials`` buys no replica
(``episode._hold_for_rate_limit``): its misses are a sample cut short, not the search's
verdict. Read alone, that rule never let a fleet the twin is optimistic about scale: the
alert fired again after each cooldown, the next episode began with the hour's budget
partly spent and was cut again, and the fleet sat breaching at one count for hours.

So the misses add up (``LoopState.missed_trials``): the measured trials of cut episodes
that held nothing, with the situation they were measured in (``backoff.situation``: the
count serving, the committed config, the spec, the search space and the load). While
the situation is the same, each cut episode adds its own; once the total reaches
``max_trials``, as many measured misses as one whole episode would have had, the commit
step reads it as that episode's verdict and asks SCALING for a replica on live evidence
(``no_feasible_config``). A trial that holds (a commit), a replica bought, or a change of
the situation (the load moving by ``backoff.LOAD_FACTOR`` past the probe's noise, a new
config, a spec edit) forgets the total: the misses were evidence for their own
situation only.
"""

from __future__ import annotations

from typing import Any

from slopilot.tuner.loop import backoff
from slopilot.tuner.loop.context import LoopContext


def add(ctx: LoopContext, now: float, misses: int) -> int:
    """Add a cut episode's ``misses`` (measured trials, none of which held) to the total
    kept for the situation the probe measures now, and return the new total (a total
    kept in another situation is forgotten first)."""
    here = backoff.situation(ctx, ctx.probe.measure(now))
    total = misses + kept(ctx, here)
    ctx.loop.missed_trials = {"trials": total, "situation": here}
    return total


def kept(ctx: LoopContext, here: dict[str, Any]) -> int:
    """The misses kept for situation ``here``; 0 where none are (or they were of another
    situation, or unreadable: a status written by hand)."""
    record = ctx.loop.missed_trials
    if record is None:
        return 0
    trials, then = record.get("trials"), record.get("situation")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0 \
            or not isinstance(then, dict) or backoff.changed(then, here) is not None:
        return 0
    return trials


def forget(ctx: LoopContext) -> None:
    """Drop the total: a trial held, or a replica was bought on it."""
    ctx.loop.missed_trials = None
