"""What the controller talks to, as small protocols: one set of adapters per world.

The same ``Controller`` drives local processes with a real Prometheus (``local/``),
Kubernetes pods (the operator), and a virtual-time simulated cluster (``sim/adapters.py``),
each through these interfaces. Every figure crosses as a ``WindowSummary``
(``engine/window_summary.py``), the one currency ``objective.score`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slopilot.engine.alert_factors import AlertFactors
from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.twin_predict import ClassP99
from slopilot.tuner.prometheus.alerts import Alert
from slopilot.tuner.study.evaluator import QueueReading
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace


class SimulatorBusy(RuntimeError):
    """The simulator could not take a call in time: its workers serve other deployments.

    ``OfflineSearch`` and ``Planner`` may raise it; the loop then goes on without the
    twin's answer, as for a twin it does not trust (``advice.py``)."""


class SimulatorFailed(RuntimeError):
    """A simulator call's process died before it answered (the kernel's OOM killer, say:
    a measured workload sets how heavy a call is); the next call gets a new process."""


NO_ANSWER: tuple[type[Exception], ...] = (SimulatorBusy, SimulatorFailed, TimeoutError,
                                          MemoryError)
"""What a simulator call raises where the twin has no answer and the loop goes on on live
evidence: busy (``SimulatorBusy``), its process dead (``SimulatorFailed``), past its time
limit (``sim/worker.SimTimeout``, a TimeoutError) or past its memory cap. None says
anything of the config that runs, so none rolls a trial back."""


@dataclass(frozen=True)
class Settled:
    """Every replica runs the config last applied: a live apply (the built-in engine's
    ``PUT``), or a rollout completed (every replica updated and available, none of the
    old template left)."""


@dataclass(frozen=True)
class RolloutProgress:
    """Where a rollout stands, in the Deployment's counts: what moves when it moves."""

    generation: int
    """The Deployment's ``metadata.generation``: a new template is a new rollout."""
    updated: int
    """Replicas of the new template (``status.updatedReplicas``)."""
    old: int
    """Replicas of earlier templates still running (``status.replicas - updated``)."""
    available: int
    """Replicas available (``status.availableReplicas``)."""

    def beyond(self, best: RolloutProgress | None) -> bool:
        """Whether this is a step past ``best``, the furthest seen: another template, more
        updated or available, fewer old. Counts that only come back to where they were (a
        new pod that crashes and is ready again) are no progress."""
        if best is None or self.generation != best.generation:
            return True
        return self.updated > best.updated or self.available > best.available \
            or self.old < best.old

    def furthest(self, best: RolloutProgress | None) -> RolloutProgress:
        """The furthest of this and ``best`` in each count (of this one's template)."""
        if best is None or self.generation != best.generation:
            return self
        return RolloutProgress(self.generation, max(self.updated, best.updated),
                               min(self.old, best.old), max(self.available, best.available))


@dataclass(frozen=True)
class Pending:
    """A rollout under way: some replicas still run the template before the last apply
    (or serve nothing yet). A window now measures old pods, not the config."""

    why: str
    progress: RolloutProgress | None = None
    """The Deployment's counts; None where there are none to read (no Deployment yet,
    its controller behind): then a change of ``why`` is the move. The loop calls a
    rollout stuck itself once it has not gone past its furthest for
    ``ControllerSettings.rollout_timeout_s`` (``rollout_watch.py``)."""


@dataclass(frozen=True)
class Stuck:
    """A rollout that will not complete (past the Deployment's progress deadline, paused,
    or, as the loop finds, unreported past its own bound): the config cannot be judged,
    and is rolled back."""

    why: str


Rollout = Settled | Pending | Stuck
"""Where the last apply stands on the replicas (``DeploymentHandle.settled``)."""


@dataclass(frozen=True)
class Replicas:
    """The replicas a deployment asks for and those that serve now. They differ after a
    scale whose pods are still starting, or will never start: no node has the GPU
    (Pending, Unschedulable) or the namespace's quota refuses the pod (FailedCreate). The
    loop judges capacity, and runs a canary, only on replicas that serve."""

    asked: int
    """Replicas asked for (a Kubernetes Deployment's ``spec.replicas``)."""
    ready: int
    """Replicas ready to serve now, which a canary, a scrape and a config reach."""
    why_not_ready: str | None = None
    """What keeps the missing ones from serving, where the platform says (a quota
    refused, no node fits); None where it says nothing, or none is missing."""

    @property
    def short(self) -> int:
        """Replicas asked for and not ready."""
        return max(self.asked - self.ready, 0)


@runtime_checkable
class DeploymentHandle(Protocol):
    """The replicas of one deployment; the operator implements it over Kubernetes."""

    def replicas(self) -> int:
        """Replicas asked for (not necessarily ready yet)."""
        ...

    def replica_counts(self) -> Replicas:
        """Replicas asked for and ready now (``Replicas``), read together."""
        ...

    def scale(self, n: int) -> None:
        """Ask for ``n`` replicas (the controller keeps ``n`` within min and max)."""
        ...

    def committed_config(self) -> dict[str, Any]:
        """The config the deployment keeps outside any trial (EngineConfig.to_dict form):
        the last one applied to every replica not as a ``trial``'s (a commit, a restore),
        as the handle records it, else the one it started with (the operator: the spec's,
        with the committed ``status.tunedConfig``).

        Never a trial's, even while one runs on every replica: a trial left there by a
        controller that lost its state (a restart, another operator replica's daemon, a
        rollback that failed) is no config an episode may begin on, roll back to, or plan
        replicas for. What the loop reads the deployment's config by; the replicas may
        run another meanwhile (a canary's trial, one on every replica)."""
        ...

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> str | None:
        """Apply ``config`` to the canary replica only, or to every replica; ``trial``:
        a trial's config, not one the episode keeps (a commit, a restore): applied to
        every replica, it leaves ``committed_config`` as it was, and a handle that
        records what every replica runs records it as a trial's.

        Returns the canary replica's name when the handle knows it (recorded in the
        trial), else None. Raises on failure (a refused config, an unreachable replica):
        the controller rolls back.
        """
        ...

    def endpoints(self) -> list[str]:
        """Base URLs of the replicas (the canary first), for scraping and load."""
        ...

    def settled(self, now: float) -> Rollout:
        """Whether the last ``apply_config`` runs on the replicas yet (``now``: the
        loop's clock). A handle that applies live answers ``Settled`` at once; one that
        rolls new pods out (vLLM's arguments) answers ``Pending`` until every replica
        runs the new template, and ``Stuck`` once the rollout is past its deadline. The
        loop measures no window of a config before it is settled (``rollout_wait.py``).
        """
        ...


class AlertReader(Protocol):
    """Firing alerts of one deployment; raises PrometheusUnavailable when it cannot tell."""

    def firing(self) -> list[Alert]: ...


class WindowEvaluator(Protocol):
    """Figures of a finished (or running) window, as a ``WindowSummary``.

    ``canary`` selects the canary replica's series only. Raises WindowRejected when the
    window does not count (too few samples, the load moved) and PrometheusUnavailable
    when the source is down.
    """

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary: ...


@runtime_checkable
class QueueGauge(Protocol):
    """A ``WindowEvaluator`` that also reads the queue of the replicas it measures. One
    without it (a factory's, a test's) has its trials' windows measured from their
    ``settle_s``, backlog or not."""

    def queue(self, at: float, *, canary: bool) -> QueueReading | None:
        """The queue at ``at`` on every replica, or the canary's; None where the
        replicas export no queue to read. Raises PrometheusUnavailable where the source
        is down, WindowRejected where the canary cannot be told."""
        ...


class WorkloadProbe(Protocol):
    """The traffic the deployment sees now, as a scenario the simulator can run.

    The scenario's ``replicas`` and ``engine`` are not used: the caller sets both.
    """

    def measure(self, now: float) -> Scenario: ...


@runtime_checkable
class TimedRates(Protocol):
    """A ``WorkloadProbe`` that also reads, over its window, what a trial's floor of
    requests counts (``ClassFigures.ttft_samples``) where that is not the arrivals its
    scenario carries: on vLLM, the first tokens the meter timed (streams only). A probe
    without it (the simulator's, the direct scrape's, one a factory built) is read by
    its arrivals."""

    def timed_rates(self, now: float) -> Mapping[str, float] | None:
        """Per ``priority_class``, the observations a TTFT P99 of the probe's window
        ranks, a second; None where they are the arrivals (the built-in engine). Raises
        PrometheusUnavailable where the source is down."""
        ...


class IterationSource(Protocol):
    """The deployment's iterations over a window: what the twin is checked against.

    Per kind, the increases of ``slopilot_iteration_seconds_sum`` and
    ``slopilot_iteration_shape_total`` over ``[start, end)`` on every replica (empty when
    nothing ran). Raises PrometheusUnavailable when the source is down.
    """

    def iterations(self, start: float, end: float) -> list[WindowSample]: ...


class OfflineSearch(Protocol):
    """A short simulator study on a measured workload: the warm start's source."""

    def best_configs(self, scenario: Scenario, replicas: int, start: Mapping[str, Any],
                     k: int) -> Sequence[tuple[dict[str, Any], bool]]:
        """Up to ``k`` best configurations, best first, each with "feasible in simulation"."""
        ...


class Planner(Protocol):
    """How many replicas hold the SLO at a load (``capacity.CapacityPlanner``)."""

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer: ...


class TwinSimulator(Protocol):
    """The twin's P99s over one window, for the twin check (``twin_predict.py``): run in
    the operator's simulator processes (``sim/worker.WorkerTwin``), not the controller's.
    ``bucketed``: read through the edges of pods started with the twin's SLO at
    ``factors`` (``ControllerSettings.alert_factors``). May raise any of ``NO_ANSWER``."""

    def p99s(self, twin: Scenario, config: Mapping[str, Any], replicas: int,
             window_s: float, *, seed: int, bucketed: bool,
             factors: AlertFactors) -> tuple[ClassP99, ...]: ...


class LiveStudy(Protocol):
    """The live Optuna study (``study.Tuner``), seen through the calls the loop makes, and
    ``close`` and ``delete_study``, which the deployment's owner makes once it drops the
    controller or the deployment is gone."""

    space: SearchSpace
    """What its trials are drawn from: a max-replicas verdict holds only for this space
    (``backoff.situation``)."""

    @property
    def name(self) -> str:
        """The study's name, which a trial's number is unique within (the family's
        successors number theirs from 0 again)."""
        ...

    def warm_start(self, configs: Sequence[Mapping[str, Any]]) -> object: ...

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's number and its config."""
        ...

    def tell(self, number: int, result: TrialResult) -> None: ...

    def tell_failed(self, number: int, reason: str) -> None: ...

    def resume(self, number: int) -> None:
        """Go on with trial ``number``, asked before a restart (``LoopState.trial``): this
        process holds it open now (its heartbeat), and ``tell`` takes it."""
        ...

    def close(self) -> None:
        """Stop the heartbeat of the trials held open (the controller is dropped); a
        trial still open goes stale unless another process resumes it."""
        ...

    def delete_study(self) -> None:
        """Remove the study and its trials from storage; nothing left to do when it is
        already gone."""
        ...


@runtime_checkable
class TrialStarts(Protocol):
    """A ``LiveStudy`` that also keeps when each live trial started, on the loop's clock,
    in its storage: a record that outlives the process. The loop's own
    (``LoopState.trial_starts``) reaches the status only after the tick that applied the
    trial; a process killed in between left a restarted loop's hourly cap short of that
    trial (``trial_count.py``). A study without it (a test's, the simulated cluster's) is
    counted by the loop's record alone."""

    def mark_started(self, number: int, at: float) -> None:
        """Record that trial ``number``, asked here and still open, starts at ``at`` (the
        loop's clock); raises where the storage cannot take it."""
        ...

    def started_since(self, since: float) -> list[float]:
        """The starts recorded in this study, and in the studies of its family (the
        deployment's studies before and after a space move), at ``since`` or later (one
        a trial, however it ended since), on the clock they were recorded on."""
        ...


@runtime_checkable
class StaleTrials(Protocol):
    """A ``LiveStudy`` whose storage fails a trial its process stopped beating for
    (``study.heartbeat``): one a killed process left RUNNING is failed by ``fail_stale``
    even while no trial is asked (``stale_trials.py``)."""

    def fail_stale(self) -> None:
        """Fail every RUNNING trial of the study whose heartbeat is older than the
        storage's grace period; nothing where the storage keeps no heartbeats. Raises
        where the storage cannot be reached."""
        ...
