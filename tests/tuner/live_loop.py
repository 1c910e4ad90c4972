"""Real replicas (``LocalDeployment``) scraped by the real Prometheus, for live-loop tests.

The rules are the deployment's, rendered with short windows (rate 6 s, ``for`` 1 s) so an
alert fires seconds after its condition holds. Load comes from the demo's seeded
open-loop generator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.local.deployment import LocalDeployment
from slopilot.tuner.local.loadgen import LoadGenerator, Phase
from slopilot.tuner.local.prometheus_server import LocalPrometheus
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, RuleOptions, render_rules_yaml
from tests.support.waits import HANG_GUARD_S, wait_for

NAME = "live"
SELECTOR = {DEPLOYMENT_LABEL: NAME}
# Seconds where production has minutes: the sustained-breach window too (5 rate windows).
RULES = RuleOptions(interval_s=1, rate_window_s=6, alert_for_s=1, tbt_periods=2,
                    breach_window_s=30)
START = {"token_budget": 2048, "chunk_size": 2048}
LIGHT = Phase(rate=2.0, prompt_mean=512, output_mean=64)
HEAVY = Phase(rate=2.0, prompt_mean=2048, output_mean=64,
              classes={"p0": 0.4, "p1": 0.5, "p2": 0.1})


@dataclass
class LiveLoop:
    deployment: LocalDeployment
    prometheus: LocalPrometheus
    load: LoadGenerator

    def query(self, query: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": query, **({} if at is None else {"time": str(at)})}
        answer = httpx.get(self.prometheus.url + "/api/v1/query", params=params,
                           timeout=HANG_GUARD_S).json()
        result: list[dict[str, Any]] = answer.get("data", {}).get("result", [])
        return result

    def _scalar(self, query: str) -> float:
        result = self.query(query)
        return float(result[0]["value"][1]) if result else 0.0

    def finished_requests(self) -> float:
        return self._scalar(
            f'sum(vllm:e2e_request_latency_seconds_count{{{DEPLOYMENT_LABEL}="{NAME}"}})')

    def history_s(self) -> float:
        """Seconds of scraped history of the deployment's series (up to a minute)."""
        return self._scalar(
            f'time() - min(min_over_time(timestamp(vllm:e2e_request_latency_seconds_count'
            f'{{{DEPLOYMENT_LABEL}="{NAME}"}})[1m:1s]))')


@contextmanager
def live_loop(workdir: Path, slo: SLOSpec, *, replicas: int = 1, phase: Phase = LIGHT,
              seed: int = 0) -> Iterator[LiveLoop]:
    with ExitStack() as stack:
        # A slow start on a loaded machine is waited for up to the hang guard, not the
        # product's 60 s and 30 s; a process that exits still fails the start at once.
        dep = stack.enter_context(LocalDeployment(NAME, workdir / "replicas", replicas=replicas,
                                                  max_replicas=3, knobs=START, slo=slo,
                                                  ready_timeout_s=HANG_GUARD_S))
        rules = workdir / "rules.yaml"
        rules.write_text(render_rules_yaml(slo, NAME, options=RULES))
        prom = stack.enter_context(LocalPrometheus(workdir / "prometheus", dep.targets_file,
                                                   [rules], ready_timeout_s=HANG_GUARD_S))
        load = stack.enter_context(LoadGenerator(dep.endpoints, phase, model=NAME, seed=seed))
        loop = LiveLoop(dep, prom, load)
        wait_for(lambda: loop.finished_requests() >= 5,
                 what="Prometheus to hold finished requests of the replicas")
        yield loop
