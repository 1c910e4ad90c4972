"""What one tick did (``Decision``), its ``Action`` and a trial's ``TrialOutcome``: for
logs, the status, the metrics and the demo."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.state import ControllerState


class Action(enum.StrEnum):
    """What one tick did; counted in slopilot_tuner_actions_total{action}."""

    NONE = "none"
    HOLD = "hold"  # kept the current config on purpose (Prometheus down, rate limit)
    RETUNE = "retune"  # started a tuning episode
    TRIAL = "trial"  # applied a trial config
    REPEAT = "repeat"  # a window that is no verdict yet (rejected, or a confirming one)
    COMMIT = "commit"
    REVERT = "revert"  # a trial cut short, or a rollback after an error
    COOLDOWN = "cooldown"
    SCALE = "scale"
    INFORM = "inform"


class TrialOutcome(enum.StrEnum):
    """slopilot_tuner_trials_total{state}."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    REVERTED = "reverted"


@dataclass(frozen=True)
class Decision:
    """The outcome of one tick: what happened and why, for logs, status and the demo."""

    state: ControllerState
    action: Action
    reason: str
    replicas: int
    prometheus_unavailable: bool = False
    trial: int | None = None
    config: Mapping[str, Any] | None = None
    summary: WindowSummary | None = None
    """Figures behind the decision (a measured window), when there were some."""
    twin: Mapping[str, Any] | None = None
    """The twin check this tick ran (``TwinCheck.to_dict``), if it ran one."""

    def line(self) -> str:
        parts = [f"state={self.state.value}", f"action={self.action.value}",
                 f"replicas={self.replicas}"]
        if self.trial is not None:
            parts.append(f"trial={self.trial}")
        if self.prometheus_unavailable:
            parts.append("prometheus_unavailable=true")
        if self.config is not None and self.action is not Action.NONE:
            parts.append("config=" + ",".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(self.config.items())))
        return " ".join(parts) + f" reason={self.reason}"
