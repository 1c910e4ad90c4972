"""SCALING plans the replica count for the config the deployment runs after the decision.

When the offline study found nothing that holds at the current count, the count used to
be planned for the study's best config (ranked[0]), which is never applied: the repro
scaled 1 -> 2, where the same twin says the running config needs 4 (the review's r10).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import GOOD, START, FakeAlerts, FakeOffline, Rig, alert


@dataclass
class ByConfigPlanner:
    """The twin's count per config: GOOD holds on 2 replicas, anything else on 4."""

    configs: list[dict[str, Any]] = field(default_factory=list)

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        self.configs.append(dict(config))
        need = 2 if dict(config) == GOOD else 4
        return CapacityAnswer(replicas=need if lo <= need <= hi else None)


def test_a_scale_up_is_planned_for_the_running_config() -> None:
    planner = ByConfigPlanner()
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.SCALE, "SlopilotTBTP99High")]),
              planner=planner,  # type: ignore[arg-type]
              offline=FakeOffline([(dict(GOOD), False)]))
    d = rig.build().tick(0.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.SCALE), d.line()
    # No config is applied with the scale: START keeps running, and START needs 4.
    assert rig.dep.config == START and rig.dep.applied == []
    assert planner.configs == [START]
    assert rig.dep.scaled == [4] and "scale_up 1->4" in d.reason
