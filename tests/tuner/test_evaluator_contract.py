"""One contract, every evaluator: the simulator on tiny-cpu, and Prometheus reading a live
engine (real server, real Prometheus scraping it, real PUT /admin/config)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slopilot.engine.config import ConfigError
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.sim.evaluator import PrometheusEvaluator, SimulatorEvaluator
from slopilot.tuner.study.evaluator import Evaluator, PrometheusUnavailable, WindowRejected
from slopilot.tuner.study.objective import TrialResult, constraint_names
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, free_port
from tests.tuner.live_stack import SELECTOR, LiveStack, live_stack

CONFIG = {"token_budget": 512, "chunk_size": 256, "max_num_seqs": 64}
WINDOW_S = 4


def _slo(ms: float) -> SLOSpec:
    """Every class held to TTFT and TBT P99 of ``ms``."""
    return SLOSpec.from_dict({"max_preemptions_per_min": 10, "classes": {
        c: {"ttft_p99_ms": ms, "tbt_p99_ms": ms} for c in ("p0", "p1", "p2")}})


LOOSE, TIGHT = _slo(60_000), _slo(1)


@pytest.fixture(scope="module")
def stack(prometheus_binaries: PrometheusBinaries,  # noqa: F811
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with live_stack(prometheus_binaries, tmp_path_factory.mktemp("contract")) as s:
        yield s


def _prometheus(stack: LiveStack, slo: SLOSpec, **kw: Any) -> PrometheusEvaluator:
    args: dict[str, Any] = {"window_s": WINDOW_S, "min_requests": 3, "load_tolerance": 1.0}
    args.update(kw)
    return PrometheusEvaluator(stack.prometheus.url, stack.apply_config, slo=slo,
                               selector=SELECTOR, **args)


@pytest.fixture(params=["simulator", pytest.param(
    "prometheus", marks=[pytest.mark.prometheus, pytest.mark.slow])])
def make(request: pytest.FixtureRequest) -> Callable[[SLOSpec], Evaluator]:
    if request.param == "simulator":
        return lambda slo: SimulatorEvaluator("tiny-cpu", duration_s=15, slo=slo)
    stack: LiveStack = request.getfixturevalue("stack")
    return lambda slo: _prometheus(stack, slo)


def _evaluate(evaluator: Evaluator, config: dict[str, Any], tries: int = 3) -> TrialResult:
    """What the Tuner does: a rejected window is repeated, not counted."""
    for _ in range(tries - 1):
        try:
            return evaluator.evaluate(config)
        except WindowRejected:
            continue  # a load wobble on a shared CI machine
    return evaluator.evaluate(config)


def _applied(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    if "stack" in request.fixturenames:
        stack: LiveStack = request.getfixturevalue("stack")
        return stack.applied
    return []


def test_contract(make: Callable[[SLOSpec], Evaluator], request: pytest.FixtureRequest
                  ) -> None:
    applied = _applied(request)
    loose = make(LOOSE)
    assert isinstance(loose, Evaluator)
    result = _evaluate(loose, CONFIG)
    assert isinstance(result, TrialResult)
    assert math.isfinite(result.goodput_tok_s) and result.goodput_tok_s > 0
    assert result.constraint_names == constraint_names(LOOSE)
    assert len(result.constraints) == len(constraint_names(LOOSE)) == 7
    assert all(math.isfinite(c) for c in result.constraints)
    assert result.feasible
    assert dict(result.config) == CONFIG

    tight = _evaluate(make(TIGHT), CONFIG)
    assert not tight.feasible
    assert tight.violation > result.violation
    assert all(t >= lo for t, lo in zip(tight.constraints, result.constraints, strict=True))

    before = len(applied)
    with pytest.raises(ConfigError, match="token_budget"):
        loose.evaluate({"token_budget": 10})
    with pytest.raises(ConfigError, match="unknown knob"):
        loose.evaluate({"tokenbudget": 512})
    assert len(applied) == before  # nothing reached the engines


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_config_reaches_the_engine_and_windows_can_be_rejected(stack: LiveStack) -> None:
    _evaluate(_prometheus(stack, LOOSE), {"token_budget": 768, "chunk_size": 128})
    live = stack.server.call(lambda engine: engine.config)
    assert (live.token_budget, live.chunk_size) == (768, 128)
    with pytest.raises(WindowRejected, match="requests finished in the 4 s window; need"):
        _prometheus(stack, LOOSE, min_requests=10**6).evaluate(CONFIG)


@pytest.mark.prometheus
def test_dead_prometheus_is_reported_before_anything_is_applied(stack: LiveStack) -> None:
    before = len(stack.applied)
    dead = PrometheusEvaluator(f"http://127.0.0.1:{free_port()}", stack.apply_config,
                               slo=LOOSE, selector=SELECTOR, window_s=2, min_requests=1,
                               timeout_s=2)
    with pytest.raises(PrometheusUnavailable, match="cannot reach Prometheus at http://127"):
        dead.evaluate(CONFIG)
    assert len(stack.applied) == before


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_load_shift_rejects_the_window(prometheus_binaries: PrometheusBinaries,  # noqa: F811
                                         tmp_path: Path) -> None:
    with live_stack(prometheus_binaries, tmp_path, rate=8.0) as s:
        def apply_and_stop_the_load(config: Any) -> None:
            s.apply_config(config)
            s.load.stop()  # the traffic goes away as the trial starts

        ev = PrometheusEvaluator(s.prometheus.url, apply_and_stop_the_load, slo=LOOSE,
                                 selector=SELECTOR, window_s=WINDOW_S, min_requests=1,
                                 load_tolerance=0.25)
        with pytest.raises(WindowRejected) as info:
            ev.evaluate(CONFIG)
        assert "request rate moved" in str(info.value) or "requests finished" in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prometheus_url": "localhost:9090"}, r"expected an http\(s\) URL"),
    ({"window_s": 0}, r"window_s=0: expected whole seconds"),
    ({"min_requests": 0}, r"min_requests=0"),
    ({"load_tolerance": 0}, r"load_tolerance=0"),
    ({"selector": {}}, r"selector is empty"),
])
def test_bad_prometheus_evaluator_arguments(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"prometheus_url": "http://127.0.0.1:9", "slo": LOOSE,
                            "selector": SELECTOR, "window_s": 4, "min_requests": 1}
    args.update(kwargs)
    url = args.pop("prometheus_url")
    with pytest.raises(ValueError, match=message):
        PrometheusEvaluator(url, lambda c: None, **args)
