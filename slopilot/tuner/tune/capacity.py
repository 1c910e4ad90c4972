"""The capacity answer: when no config holds the SLO on the replicas tuned at, the
smallest replica count that holds it with the best config found, by the loop's own
capacity search (``loop/capacity.CapacityPlanner``) over the same windows and verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.sim.robust import RobustEvaluator
from slopilot.tuner.study.objective import TrialResult


@dataclass(frozen=True)
class CapacityOutcome:
    replicas: int | None
    """The smallest count in [lo, hi] that holds; None when even ``hi`` does not."""
    config: Mapping[str, Any]
    lo: int
    hi: int
    tried: Mapping[int, TrialResult] = field(default_factory=dict)

    def sentence(self) -> str:
        tried = ", ".join(f"{n} {'holds' if r.feasible else 'misses'}"
                          for n, r in sorted(self.tried.items()))
        if self.replicas is None:
            return (f"Not even {self.hi} replicas hold the SLO with the closest config "
                    f"(tried: {tried}); raise --max-replicas, relax the SLO, or use a larger "
                    "GPU or model parallelism.")
        return (f"{self.replicas} replica{'s' if self.replicas != 1 else ''} hold the SLO "
                f"with the closest config's knobs, in every window with headroom (tried: "
                f"{tried}).")

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "lo": self.lo, "hi": self.hi,
                "config": dict(self.config),
                "tried": {str(n): {"feasible": r.feasible,
                                   "worst_term": max(r.constraints, default=0.0)}
                          for n, r in sorted(self.tried.items())}}


def capacity_answer(evaluator: RobustEvaluator, config: Mapping[str, Any], lo: int, hi: int,
                    note: Callable[[str], None] = lambda _: None) -> CapacityOutcome:
    """Search ``[lo, hi]`` from below with ``config`` (see ``CapacityPlanner.search_up``)."""

    def score(scenario: Scenario, cfg: Mapping[str, Any], n: int) -> TrialResult:
        note(f"capacity: simulating {n} replicas ...")
        result = evaluator.at_replicas(n).evaluate(cfg)
        note(f"capacity: {n} replicas {'hold' if result.feasible else 'do not hold'} the SLO")
        return result

    answer = CapacityPlanner(score_fn=score).search_up(evaluator.scenario, config, lo, hi,
                                                       margin=evaluator.margin)
    return CapacityOutcome(answer.replicas, dict(config), lo, hi, dict(answer.results))
