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
NOISE_SE = 3.0
"""A rate or a class share must also move by this many standard errors of the difference
between two probe windows (Poisson counts, binomial shares) before it is another load.
The probe reads one window of ``window_s``: at 2.9 req/s over 60 s (~174 requests) a 40 %
P0 share reads 45 % in one window and 32 % in another about once in twenty, and with
MIX_SHIFT alone that noise lifted every backoff within minutes and reset its doubling (a
load beyond max replicas got a round of trials every cooldown or two again)."""


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
    load = load_figures(scenario)
    if "rate" in load:
        # How many requests the figures rest on, for the noise floor of ``changed``: the
        # probes measure the last ``window_s`` (the operator's and the benchmark's).
        load["requests"] = load["rate"] * s.window_s
    return {"replicas": ctx.deployment.replicas(),
            "config": dict(ctx.deployment.committed_config()),
            # The spec, as far as the loop sees it: SLO, replica bounds, trial settings.
            "settings": hashlib.sha256(repr(s).encode()).hexdigest()[:16],
            # The verdict is "nothing in this space holds": a wider (or other) space may.
            "space": _digest(ctx.study.space),
            "load": load}


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
        return {"rate": phase.arrivals.mean_rate,
                "prompt": phase.prompt_tokens.nominal_mean,
                "output": phase.output_tokens.nominal_mean,
                "mix": list(phase.classes.shares.values())}
    return {"digest": hashlib.sha256(repr(workload).encode()).hexdigest()[:16]}


def changed(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What moved between two situations, in words; None when it is the same one."""
    for key in ("replicas", "config", "settings", "space"):
        if then.get(key) != now.get(key):
            return {"settings": "the spec", "space": "the search space"}.get(key, f"the {key}")
    old, new = then.get("load") or {}, now.get("load") or {}
    # ``requests`` is no figure of the load, and a verdict kept before it was recorded
    # has none: then no noise floor, as before.
    if set(old) - {"requests"} != set(new) - {"requests"} or \
            old.get("digest") != new.get("digest"):
        return "the load"
    counts = [n if isinstance(n, (int, float)) and n > 0 else None
              for n in (old.get("requests"), new.get("requests"))]
    n_old, n_new = (float(counts[0] or 0.0), float(counts[1] or 0.0))
    counted = None not in counts
    for key in ("rate", "prompt", "output"):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            continue
        if a <= 0 or b <= 0:
            return f"the load ({key} {a:.3g} -> {b:.3g})"
        bound = math.log(LOAD_FACTOR)
        if key == "rate" and counted:  # the log of a Poisson count's ratio
            bound = max(bound, NOISE_SE * math.sqrt(1 / n_old + 1 / n_new))
        if abs(math.log(b / a)) > bound:
            return f"the load ({key} {a:.3g} -> {b:.3g})"
    for i, (a, b) in enumerate(zip(old.get("mix") or [], new.get("mix") or [],
                                   strict=False)):
        bound = MIX_SHIFT
        if counted:  # two binomial shares
            p = (a * n_old + b * n_new) / (n_old + n_new)
            bound = max(bound, NOISE_SE * math.sqrt(p * (1 - p) * (1 / n_old + 1 / n_new)))
        if abs(a - b) > bound:
            return f"the load's class mix (p{i} share {a:.0%} -> {b:.0%})"
    return None


def record(ctx: LoopContext, now: float, scenario: Scenario, *,
           settled: bool = False) -> Backoff:
    """Keep a max-replicas verdict reached now: the wait doubles when the last one was in
    the same situation, and starts at twice the cooldown (one cooldown more than the
    cooldown the verdict enters) otherwise. ``settled``: a verdict waiting does not
    change (no replica count holds, and more do not move it: ``replica_plateau.py``),
    kept for ``max_backoff_s`` at once; a change of the situation still ends it."""
    s, loop = ctx.settings, ctx.loop
    here = situation(ctx, scenario)
    last = Backoff.from_dict(loop.backoff) if loop.backoff is not None else None
    wait = s.max_backoff_s if settled else 2 * s.cooldown_s
    if last is not None and changed(last.situation, here) is None:
        wait = 2 * last.wait_s
    wait = min(wait, max(s.max_backoff_s, s.cooldown_s))
    kept = Backoff(here, now + wait, wait)
    loop.backoff = kept.to_dict()
    return kept


@dataclass(frozen=True)
class Look:
    """What a kept verdict says at one look."""

    blocked: str | None = None
    """Why no new round may start now (the backoff, in words); None: one may."""
    lifted: str | None = None
    """What ended the backoff before its wait was over, in words, for the round that
    starts now to say (a round in the middle of a backoff is otherwise a surprise)."""


def look(ctx: LoopContext, now: float) -> Look:
    """Whether the kept verdict holds off a new round now: no verdict kept, its wait over,
    or the situation changed since (then it is forgotten, and ``lifted`` says what)."""
    loop = ctx.loop
    if loop.backoff is None:
        return Look()
    kept = Backoff.from_dict(loop.backoff)
    if kept is None:
        loop.backoff = None
        return Look()
    if now >= kept.until:
        return Look()  # kept to double the next wait if nothing changed
    moved = changed(kept.situation, situation(ctx, ctx.probe.measure(now)))
    if moved is not None:
        loop.backoff = None
        return Look(lifted=f"backoff lifted early: {moved} changed")
    return Look(blocked=describe(kept, now))


def describe(kept: Backoff, now: float) -> str:
    return (f"backoff: max_replicas reached and the SLO is not held at this load; no new "
            f"episode for {kept.until - now:.0f} s more (backoff {kept.wait_s:g} s, "
            f"doubling){UNLESS}")


UNLESS = " unless the load, the spec, the config or the replicas change"
