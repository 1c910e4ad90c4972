"""A replica's /metrics after a workload it served: engine histograms the scrape reads."""

from __future__ import annotations

import numpy as np

from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.sim.distributions import LogNormal
from slopilot.engine.sim.open_loop import OpenLoopPhase
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import OpenLoopSpec


def _prompts(requests: int, prompt_mean: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    prompts = rng.lognormal(np.log(prompt_mean) - 0.7**2 / 2, 0.7, requests)
    return [max(1, round(float(n))) for n in prompts]


def start(metrics: EngineMetrics, requests: int, prompt_mean: float, *,
          classes: tuple[Priority, ...] = (Priority.P0, Priority.P1), seed: int = 0
          ) -> list[int]:
    """``requests`` got their first token on ``metrics`` (prompts as ``serve``'s): their
    prompts, to ``finish`` later."""
    prompts = _prompts(requests, prompt_mean, seed)
    for i, n in enumerate(prompts):
        metrics.on_first_token(classes[i % len(classes)], 0.1, prompt_tokens=n)
    return prompts


def finish(metrics: EngineMetrics, prompts: list[int], *,
           classes: tuple[Priority, ...] = (Priority.P0, Priority.P1)) -> None:
    """The requests ``start`` started finished, with 64-token outputs."""
    for i, n in enumerate(prompts):
        metrics.on_finished(classes[i % len(classes)], e2e_s=1.0, queue_s=0.0,
                            prompt_tokens=n, generation_tokens=64, finish_reason=None)


def serve(metrics: EngineMetrics, requests: int, prompt_mean: float, *,
          classes: tuple[Priority, ...] = (Priority.P0, Priority.P1), seed: int = 0) -> None:
    """``requests`` started and finished on ``metrics``: lognormal prompts (sigma 0.7)
    of ``prompt_mean`` tokens, 64-token outputs, the classes in turn."""
    finish(metrics, start(metrics, requests, prompt_mean, classes=classes, seed=seed),
           classes=classes)


class Pages:
    """One replica's /metrics as polled: the page is fixed when ``take`` is called, so
    a scrape reads exactly the state set up for that poll (and a scrape's own thread,
    polling meanwhile, changes nothing)."""

    def __init__(self) -> None:
        self.page = b""

    def take(self, metrics: EngineMetrics, extra: bytes = b"") -> None:
        self.page = metrics.render() + extra


def phase(scenario: Scenario) -> OpenLoopPhase:
    """The first phase of an open-loop scenario (a measured one has only that)."""
    assert isinstance(scenario.workload, OpenLoopSpec)
    return scenario.workload.phases[0]


def prompt_mean(scenario: Scenario) -> float:
    prompts = phase(scenario).prompt_tokens
    assert isinstance(prompts, LogNormal)
    return prompts.mean
