"""The kopf daemon that runs one tuner controller per LLMDeployment while tuning is enabled.

Each loop: read the object fresh, ``tick(now)`` the controller (at most one action), then
write ``status`` (phase, replicas, config, bestTrial, trials, lastAction, the ``Tuning``
condition) and the controller's whole loop state in ``status.controller``, and post an
event for every action. A restarted operator builds the controller from that persisted
state, so a scale or a trial already done is resumed (cooling down, or measuring the
running trial), not done again. Only the peering leader runs daemons (settings.py).
The controller itself comes from daemon.py's factory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.operator.conditions import ConditionType, condition, merge_conditions, now_rfc3339
from slopilot.operator.crd import API_VERSION, GROUP, PLURAL, VERSION
from slopilot.operator.daemon import (
    PHASES,
    ControllerFactory,
    DaemonContext,
    controller_settings,
    load_factory,
    tick_interval,
)
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import Kube
from slopilot.operator.reconcile import config_status, effective_spec
from slopilot.operator.spec import Phase, SpecError
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.state import (
    Action,
    ControllerError,
    ControllerState,
    Decision,
    LoopState,
)

log = logging.getLogger(__name__)


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
