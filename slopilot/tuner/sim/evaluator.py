"""``SimulatorEvaluator``: a config scored on the simulator, in seconds.

It runs a scenario in virtual time with the config's knobs; the run is deterministic for
a seed, so the offline study compares configs on the same arrivals. Live trials have no
evaluator of their own: the controller applies a config, waits a window and reads it
through its ``WindowEvaluator`` (``prometheus/adapters.PrometheusWindows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import TrialResult, score


class SimulatorEvaluator:
    """Scores a config by simulating ``scenario`` (a Scenario, a shipped name or a path).

    ``slo`` defaults to the scenario's; ``duration_s``, ``seed`` and ``replicas``
    override the scenario's. Every evaluation replays the same seeded arrivals.
    """

    def __init__(self, scenario: Scenario | str | Path, *, duration_s: float | None = None,
                 seed: int | None = None, replicas: int | None = None,
                 slo: SLOSpec | None = None) -> None:
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if duration_s is not None and not duration_s > 0:
            raise ValueError(f"duration_s={duration_s!r}: expected seconds > 0")
        if replicas is not None and replicas < 1:
            raise ValueError(f"replicas={replicas!r}: expected at least one replica")
        self.duration_s = duration_s
        self.seed = seed
        self.replicas = replicas
        self._slo = slo if slo is not None else self.scenario.slo

    @property
    def slo(self) -> SLOSpec:
        return self._slo

    def start_config(self) -> dict[str, Any]:
        """The scenario's own knobs (the baseline a study should beat)."""
        return self.scenario.engine_config().to_dict()

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        # Validate first: a bad config raises ConfigError before any simulation runs.
        engine = self.scenario.engine_config().with_overrides(config)
        run = simulate(self.scenario, engine.to_dict(), replicas=self.replicas,
                       duration_s=self.duration_s, seed=self.seed)
        return score(run.summary, self._slo, config=dict(config))
