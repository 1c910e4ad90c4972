"""Enough requests of each judged class for its P99 to mean something.

A P99 of n requests is their ``ceil(0.99 n)``-th smallest: under 100 that is their
maximum, and of a dozen their largest of a dozen, which is as often low as high of the
true P99 of the config (the class's tail sits above most draws of 12). A verdict on such
a window says little; the simulated ones (the capacity oracle, the warm-start study) are
made longer until they hold a floor of each judged class, and the live trial windows
are extended until they do (``ControllerSettings.min_class_requests``).

A judged class is one with a P99 term in the SLO that the summary has requests of
(finished, ranked by its TTFT, or waiting for a first token at the window's end): a
class the traffic does not send is no verdict's subject. One with clients still waiting
at the end and fewer samples than the floor is ``starved``: no commit is decided on its
few lucky first tokens (or on none) while its other clients wait; the loop holds it to
the floor as the classes the alerts are about (``trial_window._bound``), unless its
waiters past their target already read it over its SLO (they are in its P99).

A bursty load (gamma gaps of cv > 1, as the probes measure it: ``burstiness.py``) needs
more: its requests come in clumps, and a P99 over n of them rests on about n / cv^2
independent ones (the variance of a count of them grows as cv^2). The floor of a run on
such a scenario is scaled by cv^2 (``burst_floor``), still capped by the longest run; a
run that reaches the cap short of it is a ``Shortfall`` like any other, and the capacity
oracle takes no scale-down on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass

from slopilot.engine.request import Priority
from slopilot.engine.sim.arrivals import Gamma
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import OpenLoopSpec
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary

SIM_MIN_CLASS_REQUESTS = 200
"""Requests of the least served judged class a simulated run the loop acts on holds."""

SIM_MAX_DURATION_S = 3600.0
"""The longest a simulated run is made to reach ``SIM_MIN_CLASS_REQUESTS``: a trickle of
a class would otherwise be simulated for hours of virtual time on every probe."""

STRETCH = 1.25
"""A longer run aims this far past the floor: its count is a Poisson draw around the
rate's estimate, and one a little short would be read as the cap's shortfall."""


BURST_FLOOR_MAX = 9.0
"""The most a bursty load multiplies the floor by (cv 3's cv^2): at cv 6 the runs of one
capacity search simulated 36 times the requests, past the simulator worker's 300 s limit
(30 req/s on 1-8 replicas: 272 s on a shared 2-core machine), and a search that ends there
answers nothing at all, while it holds the operator's one simulator process."""


def burst_floor(scenario: Scenario, floor: int = SIM_MIN_CLASS_REQUESTS) -> int:
    """``floor`` for a run on ``scenario``: scaled by cv^2 where its arrivals are gamma of
    cv > 1 (the burstiest phase's), at most ``BURST_FLOOR_MAX`` times; as is where they
    are Poisson or smoother."""
    workload = scenario.workload
    cvs = [p.arrivals.cv for p in workload.phases if isinstance(p.arrivals, Gamma)] \
        if isinstance(workload, OpenLoopSpec) else []
    return round(floor * min(BURST_FLOOR_MAX, max([1.0, *cvs]) ** 2))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The least served judged class of a run, with fewer requests than the floor."""

    label: str
    requests: float
    floor: int
    duration_s: float
    capped: bool = False
    """The run was as long as it may be (``long_enough``'s cap): no longer one follows."""

    def describe(self) -> str:
        return (f"{self.label.upper()} {self.requests:.0f} of {self.floor} requests in "
                f"{_span(self.duration_s)}")

    def had(self) -> str:
        """``P1 had 94 requests in 60 s``: the count alone, for a sentence that names the
        floor after it (``94 of 100`` read as 94 of the 100 sent)."""
        return (f"{self.label.upper()} had {self.requests:.0f} request"
                f"{'s' if round(self.requests) != 1 else ''} in {_span(self.duration_s)}")


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def judged_counts(summary: WindowSummary, slo: SLOSpec) -> dict[str, float]:
    """Requests of each class with a P99 term that ``summary`` served: the observations
    its TTFT P99 ranks where the source counts them (``ClassFigures.ttft_samples``: on
    vLLM the meter's streams, which may be few of the requests finished), else the
    requests finished."""
    out: dict[str, float] = {}
    for p, c in slo.classes().items():
        figures = summary.classes[p]
        n = figures.requests_finished
        sent = n > 0 or (figures.ttft_samples or 0.0) > 0 \
            or (figures.requests_awaiting or 0.0) > 0
        if (c.ttft_p99_ms is not None or c.tbt_p99_ms is not None) and sent:
            out[p.label] = n if figures.ttft_samples is None else figures.ttft_samples
    return out


def starved(summary: WindowSummary, slo: SLOSpec, floor: int) -> frozenset[str]:
    """The judged classes with fewer than ``floor`` samples and at least as many requests
    still waiting for a first token at the window's end (``ClassFigures.requests_awaiting``)
    as first tokens served: a class its config serves few, or none, while its clients
    wait. Its P99 rests on the lucky few (a starved P1 read 200 ms on 2 of 113 requests),
    and no sample at all reads as an SLO met (``objective.NO_SAMPLES``). The first tokens
    served are its samples less those of the waiters ranked among them (past their
    target), at most all of them: so at least ``samples - awaiting``, and a class is
    starved where ``2 x awaiting >= samples``. A trickle with one request in flight at
    the end (5 served, 1 waiting) is not: its sparse P99 holds nothing back, as before."""
    out = set()
    for label, n in judged_counts(summary, slo).items():
        waiting = summary.classes[_priority(label)].requests_awaiting or 0.0
        if n < floor and waiting > 0 and 2.0 * waiting >= n:
            out.add(label)
    return frozenset(out)


def _priority(label: str) -> Priority:
    return next(p for p in Priority if p.label == label)


def shortfall(summary: WindowSummary, slo: SLOSpec, floor: int, duration_s: float,
              classes: Collection[str] | None = None) -> Shortfall | None:
    """The least served judged class when it has fewer than ``floor`` requests; of
    ``classes`` (labels) alone where given, the ones a verdict needs."""
    counts = {label: n for label, n in judged_counts(summary, slo).items()
              if classes is None or label in classes}
    if not counts or floor <= 0:
        return None
    label = min(counts, key=lambda k: counts[k])
    if counts[label] >= floor:
        return None
    return Shortfall(label, counts[label], floor, duration_s)


def long_enough(run: Callable[[float], WindowSummary], slo: SLOSpec, duration_s: float,
                *, floor: int = SIM_MIN_CLASS_REQUESTS,
                max_duration_s: float = SIM_MAX_DURATION_S
                ) -> tuple[WindowSummary, Shortfall | None]:
    """``run(duration_s)``, run again longer while its least served judged class falls
    short of ``floor`` (at the rate it came at, up to ``max_duration_s``); the summary
    and, where even the longest run falls short, by how much.

    A short run's count is a draw around its rate: a first run that flattered it aims
    its rerun short, so each rerun is at least twice the last (a handful from 120 s to
    the hour), and only a run that reached the cap is given up on."""
    summary = run(duration_s)
    short = shortfall(summary, slo, floor, duration_s)
    while short is not None:
        if duration_s >= max_duration_s:
            return summary, dataclasses.replace(short, capped=True)
        duration_s = min(max_duration_s, max(2.0 * duration_s, _aimed(short, duration_s)))
        summary = run(duration_s)
        short = shortfall(summary, slo, floor, duration_s)
    return summary, None


def duration_for(summary: WindowSummary, slo: SLOSpec, duration_s: float, *,
                 floor: int = SIM_MIN_CLASS_REQUESTS,
                 max_duration_s: float = SIM_MAX_DURATION_S) -> float:
    """How long a run like the one ``summary`` measured over ``duration_s`` must be for
    its least served judged class to reach ``floor`` (capped)."""
    short = shortfall(summary, slo, floor, duration_s)
    if short is None:
        return duration_s
    return max(duration_s, min(max_duration_s, _aimed(short, duration_s)))


def _aimed(short: Shortfall, duration_s: float) -> float:
    """The length that holds ``STRETCH`` x the floor at the rate ``short`` came at (a
    class whose P99 ranked none yet is counted as one: not a division by zero)."""
    return STRETCH * short.floor * duration_s / max(short.requests, 1.0)
