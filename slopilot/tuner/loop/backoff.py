"""After "max replicas reached and the SLO is not held": no new round for the same situation.

At max replicas, an episode that found nothing holding ends in COOLDOWN with an inform.
The alerts still fire after the cooldown, and without a memory of that verdict the loop
started the same episode again, after every cooldown: live trials of configs the last
round had just found wanting, on the live deployment, limited only by
``max_trials_per_hour`` (the review's r2: 41 rounds and 124 trials in six hours).

The verdict is kept (``LoopState.backoff``) with the situation it was reached in: the
replica count, the running config, the settings the spec gave (SLO, replica bounds,
trial settings) and the load the probe measured. Until ``until``, an alert in the same
situation starts nothing. Any change of the situation ends the backoff at once: the load
moving by more than ``LOAD_FACTOR`` (either way) or its class mix by ``MIX_SHIFT``, a
spec edit (the tuning bounds included: the verdict was for the space searched), a
different count or config. When it runs out with nothing changed, one more
round is tried (the twin and the measured load are coarse, and the traffic's shape moves
in ways the probe's figures do not show); another verdict in the same situation doubles
the wait, up to ``ControllerSettings.max_backoff_s``. It lives in the persisted state, so
a restarted operator keeps it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

from slopilot.engine.sim.open_loop import OpenLoopPhase
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import OpenLoopSpec
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.study.space import SearchSpace

LOAD_FACTOR = 1.25
"""Arrival rate or mean prompt/output length this many times higher or lower than at the
verdict: another situation. Smaller than the 2x a trial window's load check rejects: a
quarter less load can be what one more config needs at the edge."""
MIX_SHIFT = 0.1
"""A class's share of the requests moving by this much (0.1: 10 % to 20 % P0) is another
load: a larger P0 share is a harder SLO to hold at the same rate."""


@dataclass(frozen=True)
class Backoff:
    """The last max-replicas verdict, as ``LoopState.backoff`` keeps it (JSON-safe)."""

    situation: dict[str, Any]
    until: float
    """No new round in the same situation before this (the controller's clock)."""
    wait_s: float
    """How long this backoff was: the next verdict in the same situation doubles it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Backoff | None:
        """The record ``to_dict`` wrote; None for anything else (a status edited by hand
        or written by another version: forgetting a backoff costs one more round)."""
        try:
            situation, until, wait = data["situation"], float(data["until"]), \
                float(data["wait_s"])
        except (KeyError, TypeError, ValueError):
            return None
        if not isinstance(situation, dict) or not (math.isfinite(until)
                                                    and math.isfinite(wait)):
            return None
        return cls(situation, until, wait)


def situation(ctx: LoopContext, scenario: Scenario) -> dict[str, Any]:
    """What the verdict was reached under; a change of any of it may change the answer."""
    s = ctx.settings
    return {"replicas": ctx.deployment.replicas(),
            "config": dict(ctx.deployment.current_config()),
            # The spec, as far as the loop sees it: SLO, replica bounds, trial settings.
            "settings": hashlib.sha256(repr(s).encode()).hexdigest()[:16],
            # The verdict is "nothing in this space holds": a wider (or other) space may.
            "space": _digest(ctx.study.space),
            "load": load_figures(scenario)}


def _digest(space: SearchSpace) -> str:
    """The space in a few hex digits, the same for the same bounds however built."""
    canonical = (sorted((k, repr(b)) for k, b in space.bounds.items()),
                 sorted((k, repr(v)) for k, v in space.fixed.items()), space.budget_align)
    return hashlib.sha256(repr(canonical).encode()).hexdigest()[:16]


def load_figures(scenario: Scenario) -> dict[str, Any]:
    """The probe's load in a few figures: the current phase of an open-loop workload (the
    form the probes measure); any other workload by its digest (changed or not)."""
    workload = scenario.workload
    if isinstance(workload, OpenLoopSpec) and workload.phases:
        phase: OpenLoopPhase = workload.phases[-1]
        weights = phase.classes.weights
        total = sum(weights)
        return {"rate": phase.arrivals.mean_rate,
                "prompt": phase.prompt_tokens.nominal_mean,
                "output": phase.output_tokens.nominal_mean,
                "mix": [w / total for w in weights]}
    return {"digest": hashlib.sha256(repr(workload).encode()).hexdigest()[:16]}


def changed(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What moved between two situations, in words; None when it is the same one."""
    for key in ("replicas", "config", "settings", "space"):
        if then.get(key) != now.get(key):
            return {"settings": "the spec", "space": "the search space"}.get(key, f"the {key}")
    old, new = then.get("load") or {}, now.get("load") or {}
    if set(old) != set(new) or old.get("digest") != new.get("digest"):
        return "the load"
    for key in ("rate", "prompt", "output"):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            continue
        if a <= 0 or b <= 0 or abs(math.log(b / a)) > math.log(LOAD_FACTOR):
            return f"the load ({key} {a:.3g} -> {b:.3g})"
    shares = zip(old.get("mix") or [], new.get("mix") or [], strict=False)
    if any(abs(a - b) > MIX_SHIFT for a, b in shares):
        return "the load's class mix"
    return None


def record(ctx: LoopContext, now: float, scenario: Scenario) -> Backoff:
    """Keep a max-replicas verdict reached now: the wait doubles when the last one was in
    the same situation, and starts at twice the cooldown (one cooldown more than the
    cooldown the verdict enters) otherwise."""
    s, loop = ctx.settings, ctx.loop
    here = situation(ctx, scenario)
    last = Backoff.from_dict(loop.backoff) if loop.backoff is not None else None
    wait = 2 * s.cooldown_s
    if last is not None and changed(last.situation, here) is None:
        wait = 2 * last.wait_s
    wait = min(wait, max(s.max_backoff_s, s.cooldown_s))
    kept = Backoff(here, now + wait, wait)
    loop.backoff = kept.to_dict()
    return kept


def blocking(ctx: LoopContext, now: float) -> str | None:
    """Why no new round may start now (the backoff, in words), or None: no verdict kept,
    its wait over, or the situation changed since (then it is forgotten)."""
    loop = ctx.loop
    if loop.backoff is None:
        return None
    kept = Backoff.from_dict(loop.backoff)
    if kept is None:
        loop.backoff = None
        return None
    if now >= kept.until:
        return None  # kept to double the next wait if nothing changed
    moved = changed(kept.situation, situation(ctx, ctx.probe.measure(now)))
    if moved is not None:
        loop.backoff = None
        return None
    return describe(kept, now)


def describe(kept: Backoff, now: float) -> str:
    return (f"backoff: max_replicas reached and the SLO is not held at this load; no new "
            f"episode for {kept.until - now:.0f} s more (backoff {kept.wait_s:g} s, "
            f"doubling){UNLESS}")


UNLESS = " unless the load, the spec, the config or the replicas change"
