"""Small in-memory stand-ins for the controller's ports (tests only).

Each fake records what the controller asked of it, so a test can say exactly which
configs went where; none of them decides anything the controller should.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityAnswer, CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.ports import Replicas, Rollout, Settled
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from slopilot.tuner.study.evaluator import (
    PrometheusUnavailable,
    ReplicaRestarted,
    WindowRejected,
)
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace
from tests.support.summaries import figures, window

SLO = load_scenario("tiny-cpu").slo
START = {"token_budget": 2048, "chunk_size": 2048}
GOOD = {"token_budget": 512, "chunk_size": 256}
BAD = {"token_budget": 8192, "chunk_size": 8192}


def summary(p0_ttft: float = 100.0, p0_tbt: float = 20.0, goodput: float = 100.0,
            preemptions: float = 0.0) -> WindowSummary:
    """A window for tiny-cpu's SLO (P0 300/60 ms, P1 1000/150 ms)."""
    return window({"p0": figures(p0_ttft, p0_tbt, goodput / 2),
                   "p1": figures(200.0, 40.0, goodput / 2), "p2": figures(200.0, 40.0)},
                  preemptions=preemptions)


def alert(action: AlertAction, name: str = "SlopilotTTFTP99High") -> Alert:
    return Alert(name=name, action=action, severity="warning", priority_class="p0",
                 since=0.0)


@dataclass
class FakeDeployment:
    n: int = 1
    config: dict[str, Any] = field(default_factory=lambda: dict(START))
    canary_config: dict[str, Any] | None = None
    applied: list[tuple[dict[str, Any], bool]] = field(default_factory=list)
    scaled: list[int] = field(default_factory=list)
    refuse: Callable[[Mapping[str, Any]], Exception | None] = lambda c: None
    reads: int = 0
    """committed_config() calls: each is an HTTP GET or a spec parse in production."""
    committed: dict[str, Any] | None = None
    """The last config every replica took not as a trial's (None: ``config``, the one
    they started with)."""

    def __post_init__(self) -> None:
        if self.committed is None:
            self.committed = dict(self.config)

    ready_cap: int | None = None
    """Replicas that can become ready at most (a namespace quota, the GPU nodes there
    are); None: every replica asked is ready."""
    why_not_ready: str | None = None
    """What keeps the others from serving, as the platform says."""

    def replicas(self) -> int:
        return self.n

    def running(self) -> int:
        return self.n if self.ready_cap is None else min(self.n, self.ready_cap)

    def replica_counts(self) -> Replicas:
        ready = self.running()
        return Replicas(self.n, ready, self.why_not_ready if ready < self.n else None)

    def scale(self, n: int) -> None:
        self.scaled.append(n)
        self.n = n

    def committed_config(self) -> dict[str, Any]:
        self.reads += 1
        return dict(self.committed or {})

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        error = self.refuse(config)
        if error is not None:
            raise error
        self.applied.append((dict(config), canary))
        if canary:
            self.canary_config = dict(config)
        else:
            self.config, self.canary_config = dict(config), None
            if not trial:
                self.committed = dict(config)

    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{9000 + i}" for i in range(self.n)]

    def serving(self, canary: bool) -> dict[str, Any]:
        return self.canary_config if canary and self.canary_config else self.config

    def settled(self, now: float) -> Rollout:
        return Settled()  # a live apply, as the built-in engine's


@dataclass
class FakeAlerts:
    alerts: list[Alert] = field(default_factory=list)
    down: bool = False

    def firing(self) -> list[Alert]:
        if self.down:
            raise PrometheusUnavailable("Prometheus at http://127.0.0.1:1 is unreachable")
        return list(self.alerts)


@dataclass
class FakeEvaluator:
    """Figures as a function of the config the measured replica serves."""

    deployment: FakeDeployment
    figures: Callable[[Mapping[str, Any]], WindowSummary]
    reject: int = 0  # reject this many windows first
    restarted: int = 0  # then reject this many as a replica's process restarted in them
    calls: list[tuple[float, float, bool]] = field(default_factory=list)

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        self.calls.append((start, end, canary))
        if self.restarted:
            self.restarted -= 1
            raise ReplicaRestarted("replica(s) demo-0 restarted in the window",
                                   replicas=("demo-0",))
        if self.reject:
            self.reject -= 1
            raise WindowRejected("too few samples")
        return self.figures(self.deployment.serving(canary))


def by_config(c: Mapping[str, Any]) -> WindowSummary:
    """GOOD holds the SLO, BAD breaks P0 badly, anything else misses by a little."""
    if dict(c) == GOOD:
        return summary(goodput=150.0)
    if dict(c) == BAD:
        return summary(p0_ttft=2000.0, p0_tbt=300.0)
    return summary(p0_ttft=350.0)


@dataclass
class FakeStudy:
    queue: list[dict[str, Any]] = field(default_factory=list)
    warm: list[dict[str, Any]] = field(default_factory=list)
    told: dict[int, TrialResult] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    asked: int = 0
    deleted: bool = False
    resumed: list[int] = field(default_factory=list)
    closed: bool = False
    space: SearchSpace = field(default_factory=SearchSpace.from_bounds)
    name: str = "ns/fake/uid"

    def warm_start(self, configs: Sequence[Mapping[str, Any]]) -> None:
        self.warm = [dict(c) for c in configs]
        self.queue = self.warm + self.queue

    def ask(self) -> tuple[int, dict[str, Any]]:
        number = self.asked
        self.asked += 1
        return number, (self.queue.pop(0) if self.queue else {"token_budget": 1024,
                                                              "chunk_size": 1024})

    def tell(self, number: int, result: TrialResult) -> None:
        self.told[number] = result

    def tell_failed(self, number: int, reason: str) -> None:
        self.failed[number] = reason

    def resume(self, number: int) -> None:
        self.resumed.append(number)

    def close(self) -> None:
        self.closed = True

    def delete_study(self) -> None:
        self.deleted = True


class FakeProbe:
    def __init__(self) -> None:
        self.scenario: Scenario = load_scenario("tiny-cpu")
        self.calls = 0

    def measure(self, now: float) -> Scenario:
        self.calls += 1
        return self.scenario


@dataclass
class FakePlanner:
    needed: int | None = 1
    calls: list[tuple[int, int, float]] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)
    """The config each search planned for."""
    error: Exception | None = None
    """Raised by every search (a simulator call past its time limit, say)."""

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        self.calls.append((lo, hi, margin))
        self.configs.append(dict(config))
        if self.error is not None:
            raise self.error
        n = self.needed
        return CapacityAnswer(replicas=None if n is None or n > hi else max(n, lo))


TERMS = ("p0.ttft_p99", "p0.tbt_p99", "p1.ttft_p99", "p1.tbt_p99", "preemptions_per_min")


def by_share(shares: Mapping[int, float]) -> CapacityPlanner:
    """The capacity search itself (its gallop and bisection) on a table of P0 TTFT p99
    shares of its limit per replica count, the other terms well inside theirs."""
    def score_fn(scenario: Scenario, config: Mapping[str, Any], n: int) -> TrialResult:
        share = shares[n]
        return TrialResult(dict(config), 100.0, (share - 1, -0.5, -0.5, -0.5, -0.9),
                           share <= 1, constraint_names=TERMS)
    return CapacityPlanner(score_fn=score_fn)


@dataclass
class FakeOffline:
    ranked: list[tuple[dict[str, Any], bool]] = field(
        default_factory=lambda: [(dict(GOOD), True)])

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> list[tuple[dict[str, Any], bool]]:
        return self.ranked[:k]


@dataclass
class Rig:
    """A controller on these fakes: tiny-cpu's SLO, 10 s windows, up to 4 replicas."""

    dep: FakeDeployment = field(default_factory=FakeDeployment)
    alerts: FakeAlerts = field(default_factory=FakeAlerts)
    study: FakeStudy = field(default_factory=FakeStudy)
    planner: FakePlanner = field(default_factory=FakePlanner)
    offline: FakeOffline | None = field(default_factory=FakeOffline)
    settings: dict[str, Any] = field(default_factory=dict)
    ev: FakeEvaluator | None = None
    ctl: Controller | None = None
    probe: FakeProbe = field(default_factory=FakeProbe)
    """The load the probe measures (tiny-cpu's designed load unless a test sets it)."""

    def build(self, state: LoopState | None = None) -> Controller:
        self.ev = self.ev or FakeEvaluator(self.dep, by_config)
        # The fakes' windows hold 10 requests a class: their verdicts are the point,
        # not the floor a P99 needs (tests/tuner/test_low_traffic_trials.py judges it).
        defaults = {"slo": SLO, "window_s": 10, "cooldown_s": 30, "scale_down_after_s": 60,
                    "max_replicas": 4, "min_class_requests": 1}  # each overridden by
        # ``settings``
        settings = ControllerSettings(deployment="demo", **(defaults | self.settings))
        self.ctl = Controller(settings, self.dep, self.alerts, self.ev, self.study,
                              self.probe, self.planner, offline=self.offline, state=state)
        return self.ctl
