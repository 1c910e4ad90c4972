"""What every evaluator is: a config in, a scored ``TrialResult`` out; and the errors
every measurement shares (a window that does not count, an unreachable Prometheus).

The study's room holds them so that the simulator's evaluator, the Prometheus windows and
the controller share them without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import TrialResult


class WindowRejected(Exception):
    """The measurement window does not count: too few samples, or the load moved.

    The caller repeats the evaluation (the config stays applied); the trial is neither
    told nor counted.
    """

    def __init__(self, reason: str, *, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.config = dict(config or {})


class ReplicaRestarted(WindowRejected):
    """A replica measured restarted its process within the window, in place (the same
    pod): what it served on either side of the restart is in no figure, and a trial's
    config is gone from it (the new process starts from the committed config). The loop
    fails the trial it measures rather than measuring it again (``trial_window``)."""

    def __init__(self, reason: str, *, replicas: Sequence[str]) -> None:
        super().__init__(reason)
        self.replicas = tuple(replicas)


class PrometheusUnavailable(RuntimeError):
    """Prometheus cannot be reached or answered with an error; the message says which."""


@dataclass(frozen=True)
class QueueReading:
    """The measured replicas' queue now: what a trial's backlog wait reads
    (``loop/backlog_wait.py``)."""

    waiting: float
    """Requests waiting for their first step, summed over the replicas measured (vLLM's
    ``num_requests_waiting``)."""
    arrivals_per_s: float
    """Requests arriving on them a second, over the last minute: with the SLO's TTFT
    target, the queue a config that keeps up holds steady (Little's law)."""


@runtime_checkable
class Evaluator(Protocol):
    """Measures one configuration against an SLO."""

    @property
    def slo(self) -> SLOSpec: ...

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        """Score ``config``; ConfigError (before anything is applied) when it is invalid."""
        ...
