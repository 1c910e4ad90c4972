"""The controller's ports over a ``SimCluster``: the same loop, virtual time.

``SimAlerts`` evaluates the alert table (``alert_table.py``, the one the rules are
rendered from) on the cluster's trailing rate window, once per rule interval of virtual
time with Prometheus' ``for`` semantics, so the benchmark's alerts mean what Prometheus'
would. (The cluster's summary has no waiting count or prefix hits: those two alerts read
no data here.)
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from slopilot.engine.config import ConfigError
from slopilot.engine.request import Priority
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.sim.distributions import Empirical
from slopilot.engine.sim.open_loop import OpenLoopPhase
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.workload import ClassMix
from slopilot.engine.sim.workload_spec import OpenLoopSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.ports import Replicas, Rollout, Settled
from slopilot.tuner.prometheus.adapters import QUEUE_RATE_S
from slopilot.tuner.prometheus.alerts import Alert, SummaryAlerts
from slopilot.tuner.prometheus.burstiness import (
    BURST_WINDOW_S,
    arrival_process,
    base_arrivals,
    from_times,
)
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.evaluator import SimulatorEvaluator
from slopilot.tuner.study.evaluator import QueueReading, WindowRejected
from slopilot.tuner.study.objective import HEADROOM, TrialResult, holds
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.sample_floor import (
    SIM_MIN_CLASS_REQUESTS,
    burst_floor,
    duration_for,
)
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner

log = logging.getLogger(__name__)


class SimDeployment:
    """DeploymentHandle over a SimCluster."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._committed = cluster.config.to_dict()

    def replicas(self) -> int:
        return len(self.cluster.active)

    def replica_counts(self) -> Replicas:
        # A simulated replica serves from the moment it is added.
        return Replicas(len(self.cluster.active), len(self.cluster.active))

    def scale(self, n: int) -> None:
        self.cluster.scale(n)

    def current_config(self) -> dict[str, Any]:
        """What every non-canary replica runs now: a trial's on every replica included."""
        return self.cluster.config.to_dict()

    def committed_config(self) -> dict[str, Any]:
        return dict(self._committed)

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        self.cluster.set_config(config, canary=canary)
        if not canary and not trial:
            self._committed = self.cluster.config.to_dict()

    def endpoints(self) -> list[str]:
        return [f"sim://replica-{r.index}" for r in self.cluster.active]

    def settled(self, now: float) -> Rollout:
        """Settled at once: the cluster takes a config as the engine's live apply does."""
        return Settled()


class SimAlerts:
    """The rules' alerts on the cluster's last ``rate_window_s``, every ``interval_s``."""

    def __init__(self, cluster: SimCluster, options: RuleOptions) -> None:
        self.cluster, self.opt = cluster, options
        self._alerts = SummaryAlerts(cluster.scenario.slo, options)

    def _summary_at(self, t: float, window_s: float) -> WindowSummary | None:
        # Early on, a window reaches back to the start, as a rate() over a young series.
        start = max(0.0, t - window_s)
        return self.cluster.summary(start, t) if t - start >= 1.0 else None

    def firing(self) -> list[Alert]:
        return self._alerts.firing(self.cluster.now, self._summary_at)


class SimWindows:
    """WindowEvaluator over the cluster: the window's figures, rejected when too few."""

    def __init__(self, cluster: SimCluster, *, min_requests: int = 20) -> None:
        self.cluster, self.min_requests = cluster, min_requests

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        s = self.cluster.summary(start, end, canary=canary)
        if s.overall.requests_finished < self.min_requests:
            raise WindowRejected(f"only {s.overall.requests_finished:.0f} requests finished "
                                 f"in [{start:.0f}, {end:.0f}); need {self.min_requests}")
        return s


    def queue(self, at: float, *, canary: bool) -> QueueReading | None:
        """``QueueGauge``: the cluster's queue now (``at`` is its clock, as the loop
        ticks it) and its arrivals over the last minute, as ``PrometheusWindows`` reads
        them: a trial on the cluster waits out its inherited backlog as a live one."""
        start = max(0.0, at - QUEUE_RATE_S)
        if at <= start:
            return None
        return QueueReading(waiting=float(self.cluster.waiting(canary=canary)),
                            arrivals_per_s=self.cluster.arrival_rate(start, at, canary=canary))


class SimIterations:
    """IterationSource over the cluster: its replicas' iteration series, per window."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def iterations(self, start: float, end: float) -> list[WindowSample]:
        return self.cluster.iteration_samples(start, end)


class SimProbe:
    """The traffic of the last ``window_s``, as a scenario: resampled lengths and mix,
    and arrivals as bursty as the last ``BURST_WINDOW_S`` read (``burstiness.from_times``:
    gamma at the cv its 15 s bins read, Poisson where they read calm, ``base``'s process
    where the run is too young for 8 bins). ``poisson_only`` plans every load as Poisson,
    as before the burstiness was measured (the benchmark's "before").

    ``twin`` is the scenario the controller's simulator runs on (its hardware and cost
    profile); by default the cluster's own, so the twin is right by construction. A
    plant on another profile than the twin's passes the twin's scenario here.
    """

    def __init__(self, cluster: SimCluster, *, window_s: float = 120.0,
                 duration_s: float = 120.0, twin: Scenario | None = None,
                 poisson_only: bool = False) -> None:
        self.cluster, self.window_s, self.duration_s = cluster, window_s, duration_s
        self.twin, self.poisson_only = twin, poisson_only

    def measure(self, now: float) -> Scenario:
        start = max(0.0, now - self.window_s)
        seen = [a for a in self.cluster.arrivals if start <= a.arrival_time < now]
        base = self.twin if self.twin is not None else self.cluster.scenario
        if len(seen) < 2:
            return base
        counts = Counter(a.priority for a in seen)
        rate = len(seen) / max(1e-9, now - start)
        since = max(0.0, now - max(self.window_s, BURST_WINDOW_S))
        burst = None if self.poisson_only else from_times(
            [a.arrival_time for a in self.cluster.arrivals if since <= a.arrival_time < now],
            since, now)
        phase = OpenLoopPhase(
            arrivals=arrival_process(rate, burst, None if self.poisson_only
                                     else base_arrivals(base)),
            prompt_tokens=Empirical(values=tuple(float(a.num_prompt_tokens) for a in seen)),
            output_tokens=Empirical(values=tuple(float(a.max_tokens) for a in seen)),
            classes=ClassMix.of({p: float(counts.get(p, 0)) for p in Priority}))
        return dataclasses.replace(base, workload=OpenLoopSpec((phase,)),
                                   duration_s=self.duration_s)


class SimOffline:
    """OfflineSearch: a short seeded simulator study on the measured workload.

    Configs that hold the SLO with ``margin`` to spare (every term at most ``1 - margin``
    of its limit) rank before those that merely hold: the best goodput sits on the SLO's
    edge in simulation, and the live replicas (scheduling jitter, a cost model a little
    off) push an edge config over it, so the warm start would spend its first trials on
    configs that just miss. Its runs are as long as the capacity oracle's need to be
    (``study/sample_floor.py``): long enough for ``min_class_requests`` of each judged
    class (0: no floor, the runs are ``duration_s``).
    """

    def __init__(self, space: SearchSpace, *, n_trials: int = 12, duration_s: float = 180.0,
                 seed: int = 0, margin: float = HEADROOM,
                 min_class_requests: int = SIM_MIN_CLASS_REQUESTS) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r}: expected a fraction in [0, 1), e.g. 0.1 "
                             "for 10 % headroom under every SLO term")
        if isinstance(min_class_requests, bool) or not isinstance(min_class_requests, int) \
                or min_class_requests < 0:
            raise ValueError(f"min_class_requests={min_class_requests!r}: expected a count "
                             f">= 0, e.g. {SIM_MIN_CLASS_REQUESTS} (0: no floor)")
        self.space, self.n_trials, self.duration_s, self.seed = space, n_trials, duration_s, seed
        self.margin, self.min_class_requests = margin, min_class_requests
        self.runs = 0

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> Sequence[tuple[dict[str, Any], bool]]:
        self.runs += 1
        tuner = Tuner(open_study(None, f"offline-{self.runs}", seed=self.seed), self.space)
        try:
            tuner.warm_start([{n: v for n, v in start.items() if n in self.space.bounds}])
        except ConfigError as exc:
            # The running config may lie outside the space (knobs set beyond the default
            # ranges): the study runs without it as a start; it is no candidate anyway.
            log.info("offline: the running config is outside the search space (%s)", exc)
        tuner.run(SimulatorEvaluator(scenario, duration_s=self._duration(scenario, replicas,
                                                                         start),
                                     seed=self.seed, replicas=replicas), self.n_trials)
        ranked = rank_for_warm_start([r for _, r in tuner.results()], self.margin)
        for r in ranked[:k]:
            log.info("offline: %s goodput=%.0f feasible=%s worst=%+.0f%%", _knobs(r.config),
                     r.goodput_tok_s, r.feasible, 100 * max(r.constraints, default=0.0))
        return [(dict(r.config), holds(r, self.margin)) for r in ranked[:k]]


    def _duration(self, scenario: Scenario, replicas: int, start: Mapping[str, Any]) -> float:
        """``duration_s``, longer where the running config's run of it holds fewer than
        ``SIM_MIN_CLASS_REQUESTS`` of a judged class: the study's P99s, on a dozen
        requests, ranked configs on their luck (``study/sample_floor.py``)."""
        try:
            probe = simulate(scenario, {n: v for n, v in start.items()
                                        if n in scenario.engine_config().to_dict()},
                             replicas=replicas, duration_s=self.duration_s,
                             seed=self.seed).summary
        except ConfigError:
            return self.duration_s
        return duration_for(probe, scenario.slo, self.duration_s,
                            floor=burst_floor(scenario, self.min_class_requests))


def _knobs(config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sorted(config.items()))


def rank_for_warm_start(results: Sequence[TrialResult], margin: float) -> list[TrialResult]:
    """Holds with ``margin`` to spare first; then the study's own order (``study.rank``)."""
    return sorted(results, key=lambda r: (holds(r, margin), *rank(r)), reverse=True)
