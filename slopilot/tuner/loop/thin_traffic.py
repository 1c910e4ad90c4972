"""Whether an episode's alert classes come often enough for any trial to be judged.

A trial is judged once each alert class holds ``min_class_requests`` requests, its window
extended up to ``max_trial_s`` (``trial_window.py``); short of that it ends
``too_little_traffic``, and the episode with it. An alert class that arrives too rarely
to reach the floor in ``max_trial_s`` made every episode so: a trial config live for
``max_trial_s`` that nobody judged, then the cooldown, then the next episode on the same
firing alert, most of the loop's time on unjudged configs. ``too_thin`` tells before
the first trial, from the load the workload probe measured (the one the warm start is
ranked on): no window is measured for it, so no evaluator call is added to the tick.
The rate is of what the floor counts (``ClassFigures.ttft_samples``, the first tokens a
class's TTFT P99 ranks): on the built-in engine every request's, the probe's arrivals; on
vLLM the streams the meter times wherever it timed one (``TimedRates``), which may be few
where most clients ask for whole bodies. Read off the arrivals there, the hold let such
a class's trials go live, each to end ``too_little_traffic`` after ``max_trial_s``.

The probe's rate rests on the requests of one window of ``window_s`` (the operator's
probe reads the same span as a trial's window): at 0.1 req/s over 120 s, 12 of them, and
a count of 8 (0.067 req/s, 80 in 20 minutes) is no rare draw. An episode is held only
where even the upper bound of that count (``Z``) reaches short of the floor: a class near
it gets its trials, as before, and a hold costs a cooldown before the next episode reads
the load again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import OpenLoopSpec
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import TimedRates
from slopilot.tuner.study.evaluator import PrometheusUnavailable

Z = 1.645
"""The one-sided 95 % bound on a Poisson count (Wilson's score form) the hold is judged on."""


def too_thin(ctx: LoopContext, now: float, classes: Sequence[str]) -> str | None:
    """Why no trial of this episode can reach ``min_class_requests`` of one of
    ``classes`` (none: of each class with a P99 objective the load sends) in
    ``max_trial_s`` (on a canary, its one replica's share), in words; None
    when each can, or when the probe says nothing of it (Prometheus down, a load that is
    no open-loop mix): then the trials tell, as before. A class the probe's
    ``timed_rates`` count is judged (and named ``timed``) on that count."""
    s = ctx.settings
    # An alert of no class (a preemption storm): the floor binds every judged class, a
    # class with a P99 objective that the traffic sends (``trial_window._bound``).
    sent_only = not classes
    if sent_only:
        classes = [p.label for p, c in s.slo.classes().items()
                   if c.ttft_p99_ms is not None or c.tbt_p99_ms is not None]
    probe = ctx.probe
    try:
        rates = class_rates(probe.measure(now))
        timed = probe.timed_rates(now) if isinstance(probe, TimedRates) else None
    except PrometheusUnavailable:
        return None
    if rates is None:
        return None
    timed = timed or {}
    replicas = ctx.deployment.replicas()
    share = 1.0 / replicas if s.canary and replicas > 1 else 1.0
    for label in classes:
        rate = rates.get(label)
        if rate is None or (sent_only and rate <= 0):
            continue
        rate = timed.get(label, rate)
        seen = rate * s.window_s
        bound = upper_count(seen) / s.window_s * share * s.max_trial_s
        if bound < s.min_class_requests:
            reach = rate * share * s.max_trial_s
            canary = f" (a canary's share of {replicas} replicas)" if share < 1.0 else ""
            kind = " timed" if label in timed else ""
            return (f"too little traffic to tune: {label.upper()} {rate:.2g} req/s{kind}"
                    f"{canary} reaches {reach:.0f} of {s.min_class_requests} requests in "
                    f"max_trial_s {_span(s.max_trial_s)} (at most {bound:.0f} on the "
                    f"{seen:.0f}{kind} requests of the probe's {s.window_s:g} s)")
    return None


def upper_count(n: float) -> float:
    """The one-sided 95 % upper bound on the mean of a Poisson count ``n``."""
    return n + Z * Z / 2 + Z * math.sqrt(n + Z * Z / 4)


def class_rates(scenario: Scenario) -> dict[str, float] | None:
    """Each class's arrival rate (req/s) in the probe's load: its last phase's rate times
    the class's share; None for a load that is no open-loop mix."""
    workload = scenario.workload
    if not isinstance(workload, OpenLoopSpec) or not workload.phases:
        return None
    phase = workload.phases[-1]
    rate = phase.arrivals.mean_rate
    return {p.label: rate * phase.classes.shares[p] for p in Priority}


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"
