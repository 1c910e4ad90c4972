"""One contract, every way a trial is measured (as Optuna runs one storage test body over
every storage mode): the simulator's evaluator (the offline study), the simulated
cluster's windows (the controller in virtual time) and Prometheus' windows over a live
engine (the controller live: a real server, a real Prometheus scraping it, a real
PUT /admin/config). The window worlds go through the controller's own parts: apply the
config on the deployment, let a window pass, ``WindowEvaluator.measure``, ``score``."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from slopilot.engine.config import ConfigError
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.ports import WindowEvaluator
from slopilot.tuner.prometheus.adapters import MIN_REPLICA_SAMPLES, PrometheusWindows
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.sim.adapters import SimDeployment, SimWindows
from slopilot.tuner.sim.evaluator import SimulatorEvaluator
from slopilot.tuner.study.evaluator import Evaluator, WindowRejected
from slopilot.tuner.study.objective import TrialResult, constraint_names, score
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries
from tests.support.waits import wait_for
from tests.tuner.live_stack import SELECTOR, LiveStack, live_stack

CONFIG = {"token_budget": 512, "chunk_size": 256, "max_num_seqs": 64}
WINDOW_S = 4
# The finished requests a live window is let run until it holds: the windows' default
# floor (``min_requests=3``) and one for increase()'s extrapolation at the window's edges.
HOLD = 4
TINY = load_scenario("tiny-cpu")


def _slo(ms: float) -> SLOSpec:
    """Every class held to TTFT and TBT P99 of ``ms``."""
    return SLOSpec.from_dict({"max_preemptions_per_min": 10, "classes": {
        c: {"ttft_p99_ms": ms, "tbt_p99_ms": ms} for c in ("p0", "p1", "p2")}})


LOOSE, TIGHT = _slo(60_000), _slo(1)


class World(Protocol):
    """Where a trial runs; ``applied`` lists the configs that reached the engines."""

    applied: list[dict[str, Any]]

    def trial(self, config: dict[str, Any], slo: SLOSpec) -> TrialResult: ...


@dataclass
class Simulator:
    applied: list[dict[str, Any]] = field(default_factory=list)  # no live engine

    def trial(self, config: dict[str, Any], slo: SLOSpec) -> TrialResult:
        evaluator = SimulatorEvaluator("tiny-cpu", duration_s=15, slo=slo)
        assert isinstance(evaluator, Evaluator)
        return evaluator.evaluate(config)


def _window_trial(apply: Any, wait: Any, now: Any, windows: WindowEvaluator,
                  config: dict[str, Any], slo: SLOSpec) -> TrialResult:
    """What the controller does with a trial, on every replica (no canary)."""
    apply(config)
    start = now()
    wait()
    return score(windows.measure(start, now(), canary=False), slo, config)


@dataclass
class Cluster:
    cluster: SimCluster = field(default_factory=lambda: SimCluster(
        TINY, dict(TINY.engine), replicas=1, seed=0, duration_s=600))
    applied: list[dict[str, Any]] = field(default_factory=list)

    def _apply(self, config: dict[str, Any]) -> None:
        SimDeployment(self.cluster).apply_config(config, canary=False)
        self.applied.append(dict(config))

    def trial(self, config: dict[str, Any], slo: SLOSpec) -> TrialResult:
        c = self.cluster
        return _window_trial(self._apply, lambda: c.advance(c.now + 20.0), lambda: c.now,
                             SimWindows(c, min_requests=3), config, slo)


@dataclass
class Prometheus:
    stack: LiveStack

    @property
    def applied(self) -> list[dict[str, Any]]:
        return self.stack.applied

    def windows(self, slo: SLOSpec, **kw: Any) -> PrometheusWindows:
        args: dict[str, Any] = {"min_requests": 3, "load_tolerance": 1.0, **kw}
        return PrometheusWindows(query_at(self.stack.prometheus.url), SELECTOR, slo, **args)

    def _scalar(self, expr: str, at: float) -> float:
        answer = self.stack.prometheus.get("/api/v1/query", {"query": expr, "time": str(at)})
        result = answer.get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else 0.0

    def scraped_past(self, t: float) -> float | None:
        """The engine's last scrape time where it is past ``t`` (a window ending by then
        is wholly in Prometheus), else None."""
        last = self._scalar(f"timestamp(up{{{_selector()}}})", time.time())
        return last if last > t else None

    def window_holds(self, start: float) -> bool:
        """A window from ``start`` is scraped for at least ``WINDOW_S`` and the samples a
        rate needs, and holds ``HOLD`` finished requests: it grows with the machine's
        pace, not a guess at it (a 4 s sleep held 2 requests on a loaded box)."""
        end = self.scraped_past(start + WINDOW_S)
        if end is None:
            return False
        count = f"sum(vllm:e2e_request_latency_seconds_count{{{_selector()}}})"
        w = math.ceil(end - start)
        scrapes = self._scalar(f"count_over_time(up{{{_selector()}}}[{w}s])", end)
        return scrapes >= MIN_REPLICA_SAMPLES and \
            self._scalar(count, end) - self._scalar(count, start) >= HOLD

    def trial(self, config: dict[str, Any], slo: SLOSpec, **kw: Any) -> TrialResult:
        # The live window waits on Prometheus's scrapes of real time, until it holds the
        # requests a verdict needs. The engine judges each request by ``slo``, as the
        # operator's pods do by spec.slo.
        self.stack.judge_by(slo)
        began: list[float] = []

        def now() -> float:
            began.append(time.time())
            return began[-1]

        def wait() -> None:
            wait_for(lambda: self.window_holds(began[0]),
                     what=f"a window of {WINDOW_S} s and {HOLD} finished requests")

        return _window_trial(self.stack.apply_config, wait, now,
                             self.windows(slo, **kw), config, slo)


def _selector() -> str:
    return ",".join(f'{k}="{v}"' for k, v in SELECTOR.items())


@pytest.fixture(scope="module")
def stack(prometheus_binaries: PrometheusBinaries,  # noqa: F811
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with live_stack(prometheus_binaries, tmp_path_factory.mktemp("contract")) as s:
        yield s


@pytest.fixture(params=["simulator", "cluster", pytest.param(
    "prometheus", marks=[pytest.mark.prometheus, pytest.mark.slow])])
def world(request: pytest.FixtureRequest) -> World:
    if request.param == "simulator":
        return Simulator()
    if request.param == "cluster":
        return Cluster()
    return Prometheus(request.getfixturevalue("stack"))


def _trial(world: World, config: dict[str, Any], slo: SLOSpec) -> TrialResult:
    """What the Tuner and the controller do: a rejected window (a load wobble on a shared
    machine) is repeated, not counted; a window never accepted fails at the hang guard,
    naming the last rejection."""
    result: TrialResult = wait_for(lambda: world.trial(config, slo),
                                   what="a window the evaluator accepts",
                                   tolerate=(WindowRejected,), interval_s=0.0)
    return result


def test_contract(world: World) -> None:
    result = _trial(world, CONFIG, LOOSE)
    assert isinstance(result, TrialResult)
    assert math.isfinite(result.goodput_tok_s) and result.goodput_tok_s > 0
    assert result.constraint_names == constraint_names(LOOSE)
    assert len(result.constraints) == len(constraint_names(LOOSE)) == 7
    assert all(math.isfinite(c) for c in result.constraints)
    assert result.feasible
    assert dict(result.config) == CONFIG

    summary = result.summary
    assert isinstance(summary, WindowSummary)
    assert summary.overall.requests_finished > 0 and summary.duration_s > 0
    assert summary.overall.ttft_p99_ms is not None and summary.overall.ttft_p99_ms > 0
    # Every source's summary is plain JSON (no NaN) and reads back equal.
    text = json.dumps(summary.to_dict(), allow_nan=False)
    assert WindowSummary.from_dict(json.loads(text)) == summary

    tight = _trial(world, CONFIG, TIGHT)
    assert not tight.feasible
    assert tight.violation > result.violation
    assert all(t >= lo for t, lo in zip(tight.constraints, result.constraints, strict=True))

    before = len(world.applied)
    with pytest.raises(ConfigError, match="token_budget"):
        world.trial({"token_budget": 10}, LOOSE)
    with pytest.raises(ConfigError, match="unknown knob"):
        world.trial({"tokenbudget": 512}, LOOSE)
    assert len(world.applied) == before  # refused whole: nothing reached the engines


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_config_reaches_the_engine_and_windows_can_be_rejected(stack: LiveStack) -> None:
    live = Prometheus(stack)
    _trial(live, {"token_budget": 768, "chunk_size": 128}, LOOSE)
    config = stack.server.call(lambda engine: engine.config)
    assert (config.token_budget, config.chunk_size) == (768, 128)
    with pytest.raises(WindowRejected, match=r"requests finished in the \d+ s window; need"):
        live.trial(CONFIG, LOOSE, min_requests=10**6)


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_load_shift_rejects_the_window(prometheus_binaries: PrometheusBinaries,  # noqa: F811
                                         tmp_path: Path) -> None:
    with live_stack(prometheus_binaries, tmp_path, rate=8.0) as s:
        live = Prometheus(s)
        s.apply_config(CONFIG)
        end = time.time()
        s.load.stop()  # the traffic goes away as the trial starts
        wait_for(lambda: live.scraped_past(end + WINDOW_S),
                 what="Prometheus to scrape past the window")
        with pytest.raises(WindowRejected) as info:
            live.windows(LOOSE, min_requests=1, load_tolerance=0.25).measure(
                end, end + WINDOW_S, canary=False)
        assert "request rate moved" in str(info.value) or "requests finished" in str(info.value)
