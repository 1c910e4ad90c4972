"""How the operator builds one LLMDeployment's tuner controller (controller_build.py calls it for
each CR's loop, deployment_loop.py, which tuning_daemon.py runs).

The controller's ports (Prometheus alerts and windows, the study, the capacity planner)
come from a factory: ``$SLOPILOT_CONTROLLER_FACTORY`` (``module:function``) or
``prometheus_controller`` below.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from slopilot.operator.alert_spec import edge_factors
from slopilot.operator.engine_deployment import progress_deadline_s
from slopilot.operator.engine_switch import RanOn
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import DEFAULT_MAX_TRIALS_PER_HOUR
from slopilot.operator.settings import PROMETHEUS_CA_ENV
from slopilot.operator.spec import Backend, LLMDeploymentSpec, Phase
from slopilot.operator.twin_profile import TwinChoice
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.settings import ControllerSettings, default_hourly_trials
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.prometheus.tls import VERIFIED, CAFileError, TLSVerify

if TYPE_CHECKING:
    import optuna

    from slopilot.engine.sim.scenario import Scenario
    from slopilot.tuner.sim.worker import SimWorker
    from slopilot.tuner.study.space import SearchSpace

log = logging.getLogger(__name__)
FACTORY_ENV = "SLOPILOT_CONTROLLER_FACTORY"
TICK_ENV = "SLOPILOT_CONTROLLER_TICK_S"
DEFAULT_TICK_S = 5.0
MIN_TICK_S, MAX_TICK_S = 0.01, 3600.0
BASE_SCENARIO_ENV = "SLOPILOT_BASE_SCENARIO"
SIM_WORKERS_ENV = "SLOPILOT_SIM_WORKERS"
SIM_WORKERS_PER_NAMESPACE_ENV = "SLOPILOT_SIM_WORKERS_PER_NAMESPACE"
MAX_SIM_WORKERS = 64
PROMETHEUS_BUDGET_ENV = "SLOPILOT_PROMETHEUS_MIB_PER_MIN"
MAX_PROMETHEUS_MIB_PER_MIN = 4096
DEFAULT_BASE_SCENARIO = "azure-conv-2023"
SPACE_CHANGED = "StudySpaceChanged"
"""The event's reason when the deployment's tuning moves to a successor study."""
PHASES = {ControllerState.TUNING: Phase.TUNING, ControllerState.COMMIT: Phase.TUNING,
          ControllerState.SCALING: Phase.SCALING}


@dataclass(frozen=True)
class DaemonContext:
    """What a factory gets to build one deployment's controller."""

    kube: Kube
    handle: KubeDeploymentHandle
    spec: LLMDeploymentSpec
    namespace: str
    name: str
    settings: ControllerSettings
    state: LoopState | None
    storage: str
    """The study's storage URL as the policy resolved ``spec.tuning.storage``
    (``OperatorPolicy.study_storage``: the administrator's URL, with its credentials)."""
    uid: str = ""
    """The CR's uid: a deleted and re-created CR of the same name is another deployment."""
    twin: TwinChoice = field(default_factory=TwinChoice)
    """The twin's cost model: ``spec.twin.profile``'s calibrated profile, or the datasheet."""
    namespace_label: str | None = None
    """``OperatorPolicy.namespace_label``: the enforced label the reads match as well."""
    prometheus_tls: TLSVerify = VERIFIED
    """``OperatorPolicy.prometheus_tls``: how every read checks an https Prometheus."""
    warn: Callable[[str, str], None] = field(default=lambda _reason, _message: None)
    """Posts a warning (reason, message) on the CR, as a Kubernetes Event
    (``controller_build.build`` passes kopf's); news the log alone would hide."""
    ran_on: RanOn | None = None
    """What the loop last ran on, and the trial a switch away ended (``rebase_episode``'s
    answer): what a study with no target recorded was run on, and where that trial is
    told failed. None: nothing on record says (the spec's current target)."""


ControllerFactory = Callable[[DaemonContext], Controller]
_METRICS = TunerMetrics()  # one registry entry per process, shared by every deployment
_WORKER_LOCK = threading.Lock()
_WORKER: SimWorker | None = None


def _setting(name: str) -> str | None:
    """An administrator's variable, None where unset or blank (as the policy's are)."""
    raw = os.environ.get(name, "").strip()
    return raw or None


def _whole(raw: str, most: int) -> int | None:
    """``raw`` as a whole number from 1 to ``most``, else None. Its length is bounded
    first: ``int`` of thousands of digits raises its own error, naming no variable."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(most)):
        return None
    value = int(raw)
    return value if 1 <= value <= most else None


def sim_workers() -> int:
    """``$SLOPILOT_SIM_WORKERS``: simulator processes the deployments share (default 1;
    each may take ``DEFAULT_MEMORY_LIMIT_MB``, so size the operator's memory limit)."""
    raw = _setting(SIM_WORKERS_ENV)
    if raw is None:
        return 1
    value = _whole(raw, MAX_SIM_WORKERS)
    if value is None:
        raise ControllerError(f"{SIM_WORKERS_ENV}={raw[:40]!r}: expected a whole number "
                              f"of processes from 1 to {MAX_SIM_WORKERS}, or unset for 1")
    return value


def sim_workers_per_namespace(workers: int) -> int | None:
    """``$SLOPILOT_SIM_WORKERS_PER_NAMESPACE``: of ``workers``, how many one namespace's
    deployments may hold at once (unset: all of them). Below ``workers`` it keeps a
    process for the other namespaces while one namespace's calls run long, at the cost of
    leaving it idle while that namespace alone has calls waiting."""
    raw = _setting(SIM_WORKERS_PER_NAMESPACE_ENV)
    if raw is None:
        return None
    value = _whole(raw, workers)
    if value is None:
        raise ControllerError(f"{SIM_WORKERS_PER_NAMESPACE_ENV}={raw[:40]!r}: expected a "
                              f"whole number of processes from 1 to {SIM_WORKERS_ENV} "
                              f"({workers}), or unset for no cap")
    return value


def prometheus_bytes_per_min() -> int:
    """``$SLOPILOT_PROMETHEUS_MIB_PER_MIN``: the Prometheus answers one namespace's
    deployments may read a minute, in MiB (unset: ``NAMESPACE_BYTES_PER_MIN``, 16 MiB).
    Raised for a namespace of many large deployments; each MiB more is about 40 ms a
    minute of parsing under the GIL that one tenant's server can make every other wait
    (answer_budget.py)."""
    from slopilot.tuner.prometheus.answer_budget import NAMESPACE_BYTES_PER_MIN

    raw = _setting(PROMETHEUS_BUDGET_ENV)
    if raw is None:
        return NAMESPACE_BYTES_PER_MIN
    value = _whole(raw, MAX_PROMETHEUS_MIB_PER_MIN)
    if value is None:
        raise ControllerError(f"{PROMETHEUS_BUDGET_ENV}={raw[:40]!r}: expected a whole "
                              f"number of MiB from 1 to {MAX_PROMETHEUS_MIB_PER_MIN}, or "
                              "unset for 16")
    return value * 2**20


def base_scenario() -> Scenario:
    """``$SLOPILOT_BASE_SCENARIO``'s scenario (default ``DEFAULT_BASE_SCENARIO``): the
    hardware the deployments' twins run on where a CR names no profile."""
    from slopilot.engine.sim.scenario import load_scenario

    name = _setting(BASE_SCENARIO_ENV) or DEFAULT_BASE_SCENARIO
    try:
        return load_scenario(name)
    except (OSError, ValueError) as exc:
        raise ControllerError(f"{BASE_SCENARIO_ENV}={name[:80]!r}: {exc}"[:500]) from None


def check_daemon_settings() -> None:
    """Reads every setting a deployment's daemon reads, as the operator starts: a bad one
    stops the start naming it (ControllerError), where read at a controller's build it
    failed every tuning CR at every step."""
    sim_workers_per_namespace(sim_workers())
    tick_interval()
    base_scenario()
    prometheus_bytes_per_min()


def sim_worker() -> SimWorker:
    """The process's simulator workers, shared by every deployment's controller.

    Their studies wait for a free worker (each waits at most ``QUEUE_TIMEOUT_S``, then
    its loop goes on without the twin) rather than each holding the operator's GIL for
    seconds (kopf's keep-alives and watches run on that same interpreter). The waiting
    calls are served in turn by namespace (``prometheus_controller`` passes it).
    """
    global _WORKER
    from slopilot.tuner.sim.worker import SimWorker

    with _WORKER_LOCK:
        if _WORKER is None:
            workers = sim_workers()
            _WORKER = SimWorker(workers, per_tenant=sim_workers_per_namespace(workers))
            # Shut it down while the interpreter is whole: a pool collected during
            # finalization prints an ignored AttributeError on the way out.
            atexit.register(_WORKER.close)
        return _WORKER


def study_name(namespace: str, name: str, uid: str) -> str:
    """Keyed by namespace, name and uid: two namespaces' ``chat`` never share a study, and
    a new CR of a deleted one's name starts its own (never the old one's running trial)."""
    return f"{namespace}/{name}/{uid}" if uid else f"{namespace}/{name}"


def open_deployment_study(ctx: DaemonContext, space: SearchSpace) -> optuna.Study:
    """The deployment's study that ``space`` can be asked in (``study_family.py``): its
    own, or, where its trials were run under a space Optuna cannot go on in (an upgrade
    that changed a knob's choices, kind or ``log``) or on another backend or model, the
    successor of the space (and the backend and model), which is said once, as it is
    made: in the log and as an event on the CR. A study made before targets were
    recorded is taken as ``ctx.ran_on``'s, and the trial a switch ended is told failed in
    its own study (``engine_switch.py``)."""
    from slopilot.tuner.study.storage import StudyStorageError
    from slopilot.tuner.study.study_family import fail_left_trial, open_for_space
    from slopilot.tuner.study.study_target import StudyTarget

    target = StudyTarget(ctx.spec.backend.value, ctx.spec.model_ref)
    base = study_name(ctx.namespace, ctx.name, ctx.uid)
    ran_on = ctx.ran_on
    found = open_for_space(ctx.storage, base, space, target,
                           unrecorded=None if ran_on is None else ran_on.target)
    if ran_on is not None and ran_on.trial is not None and ran_on.target != target:
        try:
            failed = fail_left_trial(ctx.storage, base, ran_on.target, ran_on.trial,
                                     ran_on.reason)
        except StudyStorageError as exc:  # tuning goes on: the trial goes stale instead
            log.warning("%s/%s: trial %d, ended by the switch, not told failed: %s",
                        ctx.namespace, ctx.name, ran_on.trial.number, exc)
        else:
            if failed is not None:
                log.info("%s/%s: trial %d told failed in study %s: %s", ctx.namespace,
                         ctx.name, ran_on.trial.number, failed, ran_on.reason)
    move = found.move
    if move is not None and move.made:
        log.warning("%s/%s: %s", ctx.namespace, ctx.name, move.message())
        ctx.warn(SPACE_CHANGED, move.message())
    elif move is not None:
        log.info("%s/%s: tuning goes on in study %s (the search space, or the backend or "
                 "model, changed since %s)", ctx.namespace, ctx.name, move.successor,
                 move.base)
    return found.study


def operator_metrics(namespace: str) -> TunerMetrics:
    """The operator's controller series, recorded for deployments of ``namespace``."""
    return _METRICS.in_namespace(namespace)


ROLLOUT_MARGIN_S = 300
"""The loop's own bound on a rollout that does not move (``rollout_timeout_s``) is the
Deployment's ``progressDeadlineSeconds`` and this: the controller's verdict, where it
comes, comes first (a tick or two late at most), and the bound ends only the waits it
never ends."""


def controller_settings(spec: LLMDeploymentSpec, namespace: str, name: str, *,
                        trials_per_hour_ceiling: int = DEFAULT_MAX_TRIALS_PER_HOUR
                        ) -> ControllerSettings:
    # The hour's trials: the loop's own cap, raised with maxTrials so one episode can run
    # them all, but never over the administrator's ceiling (``OperatorPolicy``), as each
    # trial loads what tenants share.
    # vLLM cannot reconfigure one replica: its trials roll every replica. A replica a
    # scale bought is waited for as long as the Deployment waits for a rollout's: the
    # model's startupTimeout, then the time to schedule and pull.
    return ControllerSettings(
        rollout_timeout_s=progress_deadline_s(spec) + ROLLOUT_MARGIN_S,
        deployment=name, namespace=namespace, slo=spec.slo,
        min_replicas=max(spec.min_replicas, 1),
        max_replicas=spec.max_replicas, window_s=spec.tuning.window_s,
        max_trials=spec.tuning.max_trials,
        max_trials_per_hour=min(trials_per_hour_ceiling,
                                default_hourly_trials(spec.tuning.max_trials)),
        breach_window_s=spec.alerts.breach_window_s,
        min_class_requests=spec.tuning.min_class_requests,
        max_trial_s=spec.tuning.max_trial_s,
        canary=spec.tuning.canary and spec.backend is Backend.BUILTIN,
        twin_max_error=spec.twin.max_error, twin_correction=spec.twin.correction,
        alert_factors=edge_factors(spec.alerts),
        replica_ready_s=float(progress_deadline_s(spec)))


def prometheus_controller(ctx: DaemonContext) -> Controller:
    """The production wiring: alerts, windows and workload from the spec's Prometheus.

    Windows select the deployment's series, and alerts are matched, by namespace and name
    (``slopilot_namespace`` and ``slopilot_deployment``, which the ServiceMonitor puts on
    every series it scrapes, and the policy's enforced namespace label where it names
    one), and the canary's by its ``pod`` label (the pod the running trial was applied
    to, recorded in the trial). The study lives in
    ``spec.tuning.storage`` under ``study_name``, so a restarted operator continues it.
    The simulator (warm start, capacity) runs the workload measured from Prometheus on the base
    scenario's hardware (``$SLOPILOT_BASE_SCENARIO``, default azure-conv-2023) with the
    spec's SLO and knobs, or on the calibrated profile of ``spec.twin.profile``
    (``ctx.twin``: the spec's model on the profile's device). Every read (alerts,
    windows, workload, iterations) checks an https Prometheus as ``ctx.prometheus_tls``
    says; windows, workload and iterations are read on Prometheus's clock, and the
    alerts' activeAt moved onto the operator's (``clock_offset.PrometheusClock``: the
    operator's node's clock may be off Prometheus's).
    """
    import dataclasses

    from slopilot.operator.service_monitor import latency_sources
    from slopilot.tuner.prometheus.adapters import PrometheusProbe, PrometheusWindows
    from slopilot.tuner.prometheus.alerts import AlertSource
    from slopilot.tuner.prometheus.answer_budget import BUDGETS
    from slopilot.tuner.prometheus.bounded import answer_cap
    from slopilot.tuner.prometheus.clock_offset import PrometheusClock
    from slopilot.tuner.prometheus.iterations import PrometheusIterations
    from slopilot.tuner.prometheus.profiling import probe_window_s
    from slopilot.tuner.prometheus.query import query_at
    from slopilot.tuner.prometheus.rules import identity_labels
    from slopilot.tuner.sim.adapters import SimOffline
    from slopilot.tuner.sim.worker import WorkerOffline, WorkerPlanner, WorkerTwin
    from slopilot.tuner.study.live import ResumableTuner
    from slopilot.tuner.study.storage import StudyStorageError

    spec, name = ctx.spec, ctx.name
    base = ctx.twin.apply(dataclasses.replace(
        base_scenario(), slo=spec.slo, engine=spec.engine.to_dict(),
        dispatch=spec.twin.dispatch))
    selector = identity_labels(name, ctx.namespace, ctx.namespace_label)
    try:
        # Every window, probe and twin check on Prometheus's clock: the loop's times are
        # this process's clock, which may be off the one that stamps the samples.
        metrics = operator_metrics(ctx.namespace)
        # Each answer within what its queries can really return, and the namespace's
        # answers within their budget a minute: a tenant's own server answering at the
        # cap stalled every namespace's steps (bounded.py, answer_budget.py).
        charge = BUDGETS.charge(ctx.namespace, name, prometheus_bytes_per_min())
        query = PrometheusClock(
            query_at(spec.prometheus_url, verify=ctx.prometheus_tls, charge=charge,
                     max_bytes=answer_cap(spec.max_replicas, spec.tuning.window_s)),
            label=f"{ctx.namespace}/{name}", observe=lambda offset: metrics.clock(name, offset))
        alerts = AlertSource(spec.prometheus_url, name, namespace=ctx.namespace,
                             namespace_label=ctx.namespace_label, verify=ctx.prometheus_tls,
                             offset_s=query.offset_s, charge=charge)
    except CAFileError as exc:  # a bundle never read: a policy not made by settings.py
        raise ControllerError(f"{PROMETHEUS_CA_ENV}: the CA bundle {exc}; mount the "
                              "Prometheus CA's PEM certificate there again") from None

    def canary_labels() -> dict[str, str]:
        pod = ctx.handle.canary_pod()
        return {"pod": pod} if pod else {}

    space = spec.tuning.space  # what the parse judged: tune's space, the backend's knobs
    try:
        study = open_deployment_study(ctx, space)
    except StudyStorageError as exc:
        raise ControllerError(f"spec.tuning.storage: {exc}; or set {FACTORY_ENV}=module:"
                              "function to build the controller's ports another way") from None
    worker = sim_worker()
    latency = latency_sources(spec.backend)
    return Controller(
        ctx.settings, ctx.handle, alerts,
        # From the sources the deployment's recording rules read (reconcile.py): the same
        # P99s and goodput in the trials' objective and status as in Prometheus.
        PrometheusWindows(query, selector, spec.slo, canary_labels=canary_labels,
                          latency=latency,
                          max_scrape_interval_s=spec.alerts.max_scrape_interval_s),
        ResumableTuner(study, space),
        # The same TTFT source: the thin-traffic hold counts what the trials' floor does.
        PrometheusProbe(query, selector, base, window_s=probe_window_s(ctx.settings.window_s),
                        latency=latency),
        # Each namespace waits for the shared workers in its own turn: another tenant's
        # many CRs delay its calls by one of theirs per freed worker, not by all of them.
        WorkerPlanner(worker, tenant=ctx.namespace),
        offline=WorkerOffline(worker, SimOffline(space), tenant=ctx.namespace),
        metrics=metrics, state=ctx.state,
        iterations=PrometheusIterations(query, selector),
        twin=WorkerTwin(worker, tenant=ctx.namespace))


def load_factory() -> ControllerFactory:
    spec = os.environ.get(FACTORY_ENV)
    if not spec:
        return prometheus_controller
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ControllerError(f"{FACTORY_ENV}={spec!r}: expected module:function")
    return cast(ControllerFactory, getattr(importlib.import_module(module), attr))


def tick_interval() -> float:
    """``$SLOPILOT_CONTROLLER_TICK_S``: seconds between a daemon's steps (default 5)."""
    raw = _setting(TICK_ENV)
    if raw is None:
        return DEFAULT_TICK_S
    try:
        value = float(raw) if len(raw) <= 40 else math.nan
    except ValueError:
        value = math.nan
    # inf stepped each daemon once and never again; a tick far under a scrape only
    # queries Prometheus for nothing new.
    if not MIN_TICK_S <= value <= MAX_TICK_S:
        raise ControllerError(f"{TICK_ENV}={raw[:40]!r}: expected seconds from "
                              f"{MIN_TICK_S:g} to {MAX_TICK_S:g}, e.g. {DEFAULT_TICK_S:g}, "
                              "or unset for the default")
    return value
