"""``RobustEvaluator``: a config judged on representative windows, not on one stretch.

The windows are chosen once per study from the workload itself (``engine/sim/windows``:
for a trace its busiest windows by arrivals and by tokens, its sharpest burst's where
that lies outside them, a typical one, its heaviest prompts' where those lie outside
them all (among the prompts the deployment serves), and its fullest KV cache's where
the requests in flight ask the cache for more than it admits outside them all, each
with a warm-up; for a
generated workload several seeds), then every config is simulated on
each and judged by ``study/verdict.robust_verdict``: feasible only if every SLO term
holds in every window with ``HEADROOM`` to spare, ranked by the worst window.

A trace window's warm-up and drain cover its requests' lifetime (``engine/sim/lifetimes``):
``WARMUP_S`` and ``DRAIN_S`` where the requests live no longer (most traces: the shipped
one's live up to ~19 s), else the lifetime itself, so that a window starts on the engine
the trace drives it to and its requests are judged whole. When that makes the windows
dearer than the whole trace, the whole trace is judged instead: exact, and cheaper.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.lifetimes import Lifetime, covering_s, request_lifetime, residency_s
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.session_pace import SessionPace
from slopilot.engine.sim.simulator import Measure, SimRun, simulate
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.sim.twin import kv_admits_tokens_for, servable_tokens_for
from slopilot.engine.sim.window_kinds import KINDS
from slopilot.engine.sim.window_stats import Sliding
from slopilot.engine.sim.windows import WindowChoice, seed_windows, trace_windows
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import HEADROOM, TrialResult, WindowResult, score
from slopilot.tuner.study.verdict import robust_verdict

TRACE_WINDOW_S = 60.0
"""A trace window's default length: ~800 requests at the shipped trace's busy rate, so
its P99 rests on a few requests, not one, and three windows stay a few minutes' work."""
WARMUP_S = 30.0
"""Simulated before a trace window where its requests live no longer, so that it does not
start on an idle engine; else their lifetime."""
DRAIN_S = 20.0
"""Simulated after a window (arrivals continue) to follow its last requests, where they
live no longer (else their lifetime); this default is at most a third of the window, so
that a short window of short requests is not mostly drain."""
SEEDS = 3


def said_window(name: str) -> str:
    """A window's kind as a sentence names it (``window_kinds.KINDS``); its name where it
    is no kind there (a seed)."""
    return next((k.said for k in KINDS if k.name == name), name)


@dataclass(frozen=True)
class WindowPlan:
    """The windows a study judges on, and what choosing them meant."""

    windows: tuple[WindowChoice, ...]
    kind: str
    """``trace`` (busiest + typical), ``whole`` (the whole trace) or ``seeds``."""
    lifetime: Lifetime | None = None
    """A trace's request lifetime on one replica (None for a generated workload)."""
    sized: bool = False
    """The warm-up or the drain was lengthened to the lifetime (it outlives the default)."""
    whole_is_cheaper: bool = False
    """Judged whole because windows so sized would simulate more than the whole trace."""

    @property
    def simulated_s(self) -> float:
        """Virtual seconds one evaluation simulates at most (warm-ups and drains included;
        a window's run ends sooner once every request it counts is judged)."""
        return sum(w.warmup_s + w.length_s + w.drain_s for w in self.windows)

    def _trace_windows(self) -> str:
        """Which of a trace's windows there are: a sparse trace may have fewer than three
        (its busiest window the only one with arrivals, say)."""
        names = [w.name for w in self.windows]
        if names == ["busiest arrivals", "busiest tokens", "typical"]:
            return "the trace's busiest windows and a typical one"
        if names == ["busiest arrivals", "busiest tokens", "typical", "heaviest prompts"]:
            return "the trace's busiest windows, a typical one and its heaviest prompts'"
        said = [said_window(n) for n in names]
        only = " (its only one)" if len(said) == 1 else ""
        listed = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
        return "the trace's " + listed + only

    def describe(self) -> str:
        """One line for the output and the report."""
        what = {"trace": self._trace_windows(),
                "whole": "the whole trace",
                "seeds": f"{len(self.windows)} workload seed{'s' if len(self.windows) > 1 else ''}"}
        w0 = self.windows[0]
        each = " each" if len(self.windows) > 1 else ""
        text = (f"judged on {what[self.kind]}, {w0.length_s:,.0f} s{each} "
                f"(+{w0.warmup_s:,.0f} s warm-up, +{w0.drain_s:,.0f} s drain; "
                f"{self.simulated_s:,.0f} simulated s per config): "
                + "; ".join(w.describe() for w in self.windows))
        if self.sized and self.lifetime is not None:
            cover = covering_s(self.lifetime)
            if self.whole_is_cheaper:
                text += (f"; its windows, each with a warm-up and a drain of the requests' "
                         f"lifetime ({cover:,.0f} s), would simulate more than the whole "
                         f"trace: {self.lifetime.describe()}")
            else:
                covers = "the drain covers" if self.kind == "whole" else \
                    "warm-up and drain cover"
                text += f"; {covers} the requests' lifetime: {self.lifetime.describe()}"
        return text


def plan_windows(scenario: Scenario, *, duration_s: float | None = None, seeds: int = SEEDS,
                 warmup_s: float | None = None, drain_s: float | None = None,
                 whole: bool = False, config: Mapping[str, Any] | None = None,
                 replicas: int | None = None) -> WindowPlan:
    """Choose the windows for ``scenario`` (deterministic: the same inputs, the same
    windows). ``duration_s`` is a window's length (default: 60 s of a trace, a generated
    scenario's own duration); ``whole`` judges a trace on all of it at once.

    ``warmup_s`` and ``drain_s`` left out are what a trace's requests need (the module
    docstring; ``config``, the start config's knob overrides, sizes the lifetime's decode
    batch); given, they are used as given (a drain at most a third of the window).
    ``replicas`` (default the scenario's): the fewest a config is judged on, whose KV
    caches together the fullest cache's window is measured against (the router spreads
    the requests over them; more replicas only have more room)."""
    for name, value in (("duration_s", duration_s), ("warmup_s", warmup_s),
                        ("drain_s", drain_s)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value!r}: expected seconds >= 0")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s={duration_s!r}: expected a window of seconds > 0")
    if replicas is not None and (isinstance(replicas, bool) or replicas < 1):
        raise ValueError(f"replicas={replicas!r}: expected at least one replica")
    spec = scenario.workload
    length = duration_s or (TRACE_WINDOW_S if isinstance(spec, TraceSpec)
                            else scenario.duration_s)
    short_drain = min(DRAIN_S if drain_s is None else drain_s, length / 3)
    if not isinstance(spec, TraceSpec):
        return WindowPlan(tuple(seed_windows(scenario.seed, 1 if whole else seeds, length,
                                             drain_s=short_drain)), "seeds")
    records = spec.records()
    life = request_lifetime(scenario, records, config)
    cover = covering_s(life)
    # Each default stands where it already covers a lifetime: short requests keep the
    # windows they had, and only requests that outlive it lengthen it.
    long_warmup = warmup_s is None and cover > WARMUP_S
    long_drain = drain_s is None and cover > DRAIN_S
    warm = warmup_s if warmup_s is not None else max(WARMUP_S, cover)
    drain = cover if long_drain else short_drain
    sized = long_warmup or long_drain
    span = max(records[-1].arrival_time, 1.0)
    if whole:
        return WindowPlan((WindowChoice("whole trace", 0.0, span, 0.0, drain),), "whole",
                          life, sized)
    count = scenario.replicas if replicas is None else replicas
    windows = trace_windows(records, length, warmup_s=warm, drain_s=drain,
                            servable_tokens=servable_tokens_for(scenario, config),
                            residency_s=residency_s(scenario, records, life, config),
                            kv_admits_tokens=count * kv_admits_tokens_for(scenario, config))
    if windows[0].name == "whole trace":
        return WindowPlan(tuple(windows), "whole", life, sized)
    if sized and sum(w.warmup_s + w.length_s + w.drain_s for w in windows) >= span + drain:
        # Windows exist to cost less than the whole trace; with warm-ups and drains of
        # minutes they would not, and the whole trace is what the check replays.
        whole_trace = trace_windows(records, span, drain_s=drain)
        return WindowPlan(tuple(whole_trace), "whole", life, sized, whole_is_cheaper=True)
    return WindowPlan(tuple(windows), "trace", life, sized)


Progress = Callable[[float], None]


class RobustEvaluator:
    """Scores a config on every window of ``plan`` (see the module docstring).

    ``progress`` is told the virtual seconds this evaluator has simulated so far, in
    all its evaluations (a progress bar's feed).
    """

    def __init__(self, scenario: Scenario, plan: WindowPlan, *, replicas: int | None = None,
                 margin: float = HEADROOM, slo: SLOSpec | None = None,
                 progress: Progress | None = None) -> None:
        if replicas is not None and (isinstance(replicas, bool) or replicas < 1):
            raise ValueError(f"replicas={replicas!r}: expected at least one replica")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r}: expected a fraction in [0, 1)")
        self.scenario, self.plan, self.replicas, self.margin = scenario, plan, replicas, margin
        self._slo = slo if slo is not None else scenario.slo
        self.progress = progress
        self.simulated_s = 0.0
        """Virtual seconds simulated so far (a window's run may end before its horizon)."""
        self._planned_s = 0.0
        """The progress feed: each window done counts whole, as the plan's total does."""
        self._records: list[TraceRecord] | None = None
        if isinstance(scenario.workload, TraceSpec):
            self._records = scenario.workload.records()
        self.pace = SessionPace()
        """The last ``evaluate``'s follow-up turns sent before their previous answer
        ended, over its windows (``engine/sim/session_pace.py``)."""

    @property
    def slo(self) -> SLOSpec:
        return self._slo

    def start_config(self) -> dict[str, Any]:
        return self.scenario.engine_config().to_dict()

    def at_replicas(self, replicas: int) -> RobustEvaluator:
        """The same windows and judgement on ``replicas`` replicas (the capacity search);
        it has its own count of simulated seconds and no progress feed."""
        out = RobustEvaluator(self.scenario, self.plan, replicas=replicas, margin=self.margin,
                              slo=self._slo)
        out._records = self._records
        return out

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        engine = self.scenario.engine_config().with_overrides(config).to_dict()
        results = []
        pace = SessionPace()
        for w in self.plan.windows:
            summary = self._simulate(w, engine, pace=pace).summary
            results.append(WindowResult(w.name, w.describe(),
                                        score(summary, self._slo, config=dict(config))))
        self.pace = pace
        return robust_verdict(config, results, self.margin)

    def replay(self, config: Mapping[str, Any], sliding: Sliding) -> SimRun:
        """The plan's one window (the whole trace: ``plan_windows(whole=True)``) run with
        ``config``, each sliding window of it measured too (``SimRun.windows``)."""
        if len(self.plan.windows) != 1:
            raise ValueError(f"plan.kind={self.plan.kind!r} has {len(self.plan.windows)} "
                             "windows: replay runs a plan of one (plan_windows(whole=True))")
        engine = self.scenario.engine_config().with_overrides(config).to_dict()
        return self._simulate(self.plan.windows[0], engine, sliding)

    def _simulate(self, w: WindowChoice, engine: Mapping[str, Any],
                  sliding: Sliding | None = None, pace: SessionPace | None = None) -> SimRun:
        """``w`` run with ``engine``; a trace's session pace in it added to ``pace``."""
        measure = Measure(w.warmup_s, w.warmup_s + w.length_s,
                          w.warmup_s + w.length_s + w.drain_s)
        base, planned = self.simulated_s, self._planned_s
        reached = 0.0

        def tick(t: float) -> None:
            nonlocal reached
            reached = t
            if self.progress is not None:
                self.progress(planned + t)

        workload = None
        if self._records is not None:
            workload = self._trace_slice(w)
        # Until judged: a drain sized for the longest lifetime is paid only by the
        # windows whose requests take it (the window's figures are the same either way).
        run = simulate(self.scenario, engine, replicas=self.replicas,
                       seed=w.seed, measure=measure, workload=workload, progress=tick,
                       until_judged=True, sliding=sliding)
        if workload is not None and pace is not None:
            pace.add(workload.pace)
        self.simulated_s = base + reached
        self._planned_s = planned + measure.horizon_s
        if self.progress is not None:
            self.progress(self._planned_s)
        return run

    def _trace_slice(self, w: WindowChoice) -> TraceWorkload:
        """The records from the warm-up's start to the horizon, re-based to 0."""
        assert self._records is not None and isinstance(self.scenario.workload, TraceSpec)
        spec = self.scenario.workload
        t0 = w.start_s - w.warmup_s
        t1 = w.end_s + w.drain_s
        part = [dataclasses.replace(r, arrival_time=r.arrival_time - t0)
                for r in self._records if t0 <= r.arrival_time < t1]
        if not part:
            # trace_windows picks windows with traffic; a plan made by hand may not.
            raise ValueError(f"window {w.describe()}: no request arrives in it (nor in its "
                             "warm-up); judge the whole trace instead: --windows whole")
        return TraceWorkload(part, seed=self.scenario.seed,
                             classes=spec.classes, vocab_size=spec.vocab_size,
                             duration_s=t1 - t0)
