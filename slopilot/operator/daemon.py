"""One tuner controller per LLMDeployment, run by a kopf daemon while tuning is enabled.

Each loop: read the object fresh, ``tick(now)`` the controller (at most one action), then
write ``status`` (phase, replicas, config, bestTrial, trials, lastAction, the ``Tuning``
condition) and the controller's whole loop state in ``status.controller``, and post an
event for every action. A restarted operator builds the controller from that persisted
state, so a scale or a trial already done is resumed (cooling down, or measuring the
running trial), not done again. Only the peering leader runs daemons (settings.py).

The controller's ports (Prometheus alerts and windows, the study, the capacity planner)
come from a factory: ``$SLOPILOT_CONTROLLER_FACTORY`` (``module:function``) or
``prometheus_controller`` below.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import kopf

from slopilot.operator.conditions import ConditionType, condition, merge_conditions, now_rfc3339
from slopilot.operator.crd import API_VERSION, GROUP, PLURAL, VERSION
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import Kube
from slopilot.operator.reconcile import config_status, effective_spec
from slopilot.operator.render import applied_knobs
from slopilot.operator.spec import Backend, LLMDeploymentSpec, Phase, SpecError
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.state import (
    Action,
    ControllerError,
    ControllerSettings,
    ControllerState,
    Decision,
    LoopState,
)
from slopilot.tuner.study.space import SearchSpace

if TYPE_CHECKING:
    from slopilot.tuner.sim.worker import SimWorker

log = logging.getLogger(__name__)
FACTORY_ENV = "SLOPILOT_CONTROLLER_FACTORY"
TICK_ENV = "SLOPILOT_CONTROLLER_TICK_S"
DEFAULT_TICK_S = 5.0
BASE_SCENARIO_ENV = "SLOPILOT_BASE_SCENARIO"
DEFAULT_BASE_SCENARIO = "azure-conv-2023"
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


ControllerFactory = Callable[[DaemonContext], Controller]
_METRICS = TunerMetrics()  # one registry entry per process, shared by every deployment
_WORKER_LOCK = threading.Lock()
_WORKER: SimWorker | None = None


def sim_worker() -> SimWorker:
    """The process's simulator worker, shared by every deployment's controller.

    Their studies queue on it rather than each holding the operator's GIL for seconds
    (kopf's keep-alives and watches run on that same interpreter).
    """
    global _WORKER
    from slopilot.tuner.sim.worker import SimWorker

    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = SimWorker()
            # Shut it down while the interpreter is whole: a pool collected during
            # finalization prints an ignored AttributeError on the way out.
            atexit.register(_WORKER.close)
        return _WORKER


def controller_settings(spec: LLMDeploymentSpec, name: str) -> ControllerSettings:
    # vLLM cannot reconfigure one replica: its trials roll every replica.
    return ControllerSettings(
        deployment=name, slo=spec.slo, min_replicas=max(spec.min_replicas, 1),
        max_replicas=spec.max_replicas, window_s=spec.tuning.window_s,
        max_trials=spec.tuning.max_trials,
        canary=spec.tuning.canary and spec.backend is Backend.BUILTIN)


def search_space(spec: LLMDeploymentSpec) -> SearchSpace:
    """What the deployment's trials search: ``slopilot tune``'s space (the same
    ``SearchSpace.from_bounds``) with only the bounds the CR states, over only the knobs
    its backend applies (``render.applied_knobs``). A vLLM trial is a rollout of every
    replica (vLLM reconfigures nothing live), so its space is the three knobs vLLM takes:
    token budget, chunk size and max sequences."""
    return SearchSpace.from_bounds(spec.tuning.bounds or None, base=spec.engine,
                                   applies=applied_knobs(spec.backend))


def prometheus_controller(ctx: DaemonContext) -> Controller:
    """The production wiring: alerts, windows and workload from the spec's Prometheus.

    Windows select the deployment's series, and alerts are matched, by namespace and name
    (``slopilot_namespace`` and ``slopilot_deployment``, which the ServiceMonitor puts on
    every series it scrapes), and the canary's by its ``pod`` label (the first ready pod by name, as
    the handle applies trials to). The study lives in ``spec.tuning.storage`` under the
    deployment's namespaced name, so a restarted operator continues it. The simulator
    (warm start, capacity) runs the workload measured from Prometheus on the base
    scenario's hardware (``$SLOPILOT_BASE_SCENARIO``, default azure-conv-2023) with the
    spec's SLO and knobs.
    """
    import dataclasses

    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.prometheus.adapters import PrometheusProbe, PrometheusWindows
    from slopilot.tuner.prometheus.alerts import AlertSource
    from slopilot.tuner.prometheus.query import query_at
    from slopilot.tuner.prometheus.rules import identity_labels
    from slopilot.tuner.sim.adapters import SimOffline
    from slopilot.tuner.sim.worker import WorkerOffline, WorkerPlanner
    from slopilot.tuner.study.live import ResumableTuner
    from slopilot.tuner.study.tuner import StudyStorageError, open_study

    spec, name = ctx.spec, ctx.name
    scenario_name = os.environ.get(BASE_SCENARIO_ENV, DEFAULT_BASE_SCENARIO)
    try:
        base = load_scenario(scenario_name)
    except (OSError, ValueError) as exc:
        raise ControllerError(f"{BASE_SCENARIO_ENV}={scenario_name!r}: {exc}") from None
    base = dataclasses.replace(base, slo=spec.slo, engine=spec.engine.to_dict())
    selector = identity_labels(name, ctx.namespace)
    query = query_at(spec.prometheus_url)

    def canary_labels() -> dict[str, str]:
        pods = ctx.handle.pods()
        return {"pod": pods[0]["metadata"]["name"]} if pods else {}

    space = search_space(spec)
    try:
        study = open_study(spec.tuning.storage, f"{ctx.namespace}.{name}")
    except StudyStorageError as exc:
        raise ControllerError(f"spec.tuning.storage: {exc}; or set {FACTORY_ENV}=module:"
                              "function to build the controller's ports another way") from None
    window = max(2, int(ctx.settings.window_s))
    worker = sim_worker()
    return Controller(
        ctx.settings, ctx.handle, AlertSource(spec.prometheus_url, name, namespace=ctx.namespace),
        PrometheusWindows(query, selector, spec.slo, canary_labels=canary_labels),
        ResumableTuner(study, space), PrometheusProbe(query, selector, base, window_s=window),
        WorkerPlanner(worker), offline=WorkerOffline(worker, SimOffline(space)),
        metrics=_METRICS.in_namespace(ctx.namespace), state=ctx.state)


def load_factory() -> ControllerFactory:
    spec = os.environ.get(FACTORY_ENV)
    if not spec:
        return prometheus_controller
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ControllerError(f"{FACTORY_ENV}={spec!r}: expected module:function")
    return cast(ControllerFactory, getattr(importlib.import_module(module), attr))


def tick_interval() -> float:
    raw = os.environ.get(TICK_ENV, str(DEFAULT_TICK_S))
    try:
        value = float(raw)
    except ValueError:
        raise ControllerError(f"{TICK_ENV}={raw!r}: expected seconds, e.g. 5") from None
    if not value > 0:
        raise ControllerError(f"{TICK_ENV}={raw!r}: expected seconds above 0")
    return value


def tuning_enabled(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("tuning") or {}).get("enabled", True))


def status_after(body: Mapping[str, Any], controller: Controller, decision: Decision,
                 handle: KubeDeploymentHandle) -> dict[str, Any]:
    status = body.get("status") or {}
    loop = controller.loop
    phase = PHASES.get(decision.state, Phase.RUNNING)
    if decision.prometheus_unavailable:
        phase = Phase.DEGRADED
    tuning = decision.state in (ControllerState.TUNING, ControllerState.COMMIT)
    out: dict[str, Any] = {
        "phase": phase.value, "replicas": decision.replicas,
        "config": config_status(handle.spec().engine), "trials": loop.episode_trials,
        "controller": controller.to_dict(),
        "conditions": merge_conditions(status.get("conditions"), [condition(
            ConditionType.TUNING, tuning, decision.state.value.capitalize(), decision.reason,
            body["metadata"].get("generation"))])}
    if loop.best_config is not None:
        out["bestTrial"] = {"config": loop.best_config, "goodputTokS": loop.best_goodput}
    if decision.action is not Action.NONE:
        out["lastAction"] = {"action": decision.action.value, "reason": decision.reason,
                             "time": now_rfc3339()}
    return out


def post_decision(body: Mapping[str, Any], decision: Decision) -> None:
    if decision.action is Action.NONE:
        return
    target = cast("kopf.Body", body)
    reason = decision.action.value.capitalize()
    if decision.action in (Action.REVERT, Action.HOLD):
        kopf.warn(target, reason=reason, message=decision.reason)
    else:
        kopf.info(target, reason=reason, message=decision.line())


# Set by `slopilot operator` on SIGTERM/SIGINT before kopf begins to stop: a daemon that
# kopf starts while shutting down is not told to stop, so each one also checks this.
OPERATOR_STOPPING = threading.Event()


@kopf.daemon(GROUP, VERSION, PLURAL, id="controller", when=tuning_enabled,
             cancellation_timeout=10.0)
def run_controller(stopped: kopf.DaemonStopped, name: str, namespace: str | None,
                   memo: Any, logger: kopf.Logger, **_: Any) -> None:
    if namespace is None:
        raise kopf.PermanentError("LLMDeployment is namespaced; got none")
    kube: Kube = memo.kube
    handle = KubeDeploymentHandle(kube, namespace, name)
    interval, factory = tick_interval(), load_factory()
    controller: Controller | None = None
    built_for: int | None = None
    while not stopped and not OPERATOR_STOPPING.is_set():
        body = kube.get(API_VERSION, PLURAL, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        generation = body["metadata"].get("generation")
        try:
            if controller is None or built_for != generation:
                controller = build(kube, handle, body, factory)
                built_for = generation
            with memo.locks.hold(f"{namespace}/{name}"):
                decision = controller.tick(time.time())
                kube.patch(API_VERSION, PLURAL, namespace, name,
                           {"status": status_after(body, controller, decision, handle)},
                           subresource="status")
            post_decision(body, decision)
        except (SpecError, ControllerError) as exc:
            controller = None  # rebuilt once the spec or the environment is fixed
            logger.warning("controller not running: %s", exc)
            status = body.get("status") or {}
            kube.patch(API_VERSION, PLURAL, namespace, name, {"status": {
                "conditions": merge_conditions(status.get("conditions"), [condition(
                    ConditionType.TUNING, False, "ControllerUnavailable", str(exc),
                    generation)])}}, subresource="status")
        stopped.wait(interval)


def build(kube: Kube, handle: KubeDeploymentHandle, body: Mapping[str, Any],
          factory: ControllerFactory) -> Controller:
    """A controller for the current spec, resuming the persisted loop state if any."""
    spec = effective_spec(body)
    saved = (body.get("status") or {}).get("controller")
    state = LoopState.from_dict(saved) if isinstance(saved, Mapping) else None
    meta = body["metadata"]
    ctx = DaemonContext(kube, handle, spec, meta["namespace"], meta["name"],
                        controller_settings(spec, meta["name"]), state)
    controller = factory(ctx)
    log.info("%s/%s: controller built (resumed state: %s)", meta["namespace"], meta["name"],
             None if state is None else state.state.value)
    return controller
