"""A tuner controller for an LLMDeployment's current spec.

Resumable: a restarted operator builds the controller from the persisted state, so a
scale or a trial already done is resumed (cooling down, or measuring the running trial),
not done again. Built only for a spec the administrator's policy allows and the
reconcile has applied; the study's storage is put on record before the study is opened.
The controller itself comes from daemon.py's factory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.operator.daemon import ControllerFactory, DaemonContext, controller_settings
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import Kube
from slopilot.operator.loop_status import rebase_episode
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.reconcile import not_reconciled
from slopilot.operator.spec import parse_spec
from slopilot.operator.study_ledger import record, shard_name
from slopilot.operator.trial_ends import end_on_storage_switch, end_told, fail_ended
from slopilot.operator.twin_profile import TwinChoice
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.study.storage_url import shown

log = logging.getLogger(__name__)


def _warn_on(body: Mapping[str, Any], reason: str, message: str) -> None:
    """A warning event on the CR (``kubectl describe`` shows it). Posted through kopf,
    which needs the context of its handlers and daemons: built outside them (a test's
    stepped daemon), the caller's log line is all there is."""
    try:
        kopf.warn(cast("kopf.Body", body), reason=reason, message=message)
    except LookupError:  # kopf's context variables are unset outside the operator
        log.debug("event %s not posted outside kopf: %s", reason, message)


def _with_twin(factory: ControllerFactory, twin: TwinChoice, ctx: DaemonContext
               ) -> Controller:
    return factory(dataclasses.replace(ctx, twin=twin))


def build(kube: Kube, handle: KubeDeploymentHandle, body: Mapping[str, Any],
          factory: ControllerFactory, policy: OperatorPolicy,
          twin: TwinChoice | None = None) -> Controller:
    """A controller for the current spec, resuming the persisted loop state if any; its
    twin runs ``twin`` (``resolve_twin``'s answer; None: the datasheet)."""
    if twin is not None:
        factory = functools.partial(_with_twin, factory, twin)
    spec = parse_spec(body)
    meta = body["metadata"]
    if problems := policy_problems(spec, policy, namespace=meta["namespace"]):
        # never query a URL the policy refuses
        raise ControllerError("; ".join(problems))
    if (why := not_reconciled(kube, body, spec)) is not None:  # never act on another's
        raise ControllerError(why)
    saved = (body.get("status") or {}).get("controller")
    try:
        state = LoopState.from_dict(saved) if isinstance(saved, Mapping) else None
    except ControllerError as exc:  # not resumed from: what it holds is not ours to act on
        meta = body["metadata"]
        raise ControllerError(
            f"status.controller: {exc}; to start the loop afresh (in steady, its trial "
            f"left to go stale in the study), remove it: kubectl -n {meta['namespace']} "
            f"patch llmdeployment {meta['name']} --subresource=status --type=merge "
            """-p '{"status":{"controller":null}}'""") from None
    resumed = state is not None
    # A fresh loop too: stamped with the backend and model it runs on, a switch later
    # ends its episode (rebase_episode).
    state = state if state is not None else LoopState()
    ran_on = rebase_episode(state, body)
    named = policy.named_storage(spec.tuning.storage, meta["namespace"])
    # Its trial's number was asked in the old storage's study: not resumed in the new one.
    # One edit that switched the backend too: its trial is failed in the old storage.
    ran_on = end_on_storage_switch(state, body, named, ran_on)
    # A trial a loop ended with no status write to say so: not resumed.
    end_told(state, body, policy, named)
    try:  # before the study is opened: every study the operator makes is on record
        record(kube, policy.operator_namespace, meta["namespace"], named)
    except Exception as exc:  # an API error or a dropped connection: built at a next step
        raise ControllerError(
            f"study storage {shown(named)}: not put on the operator's record of study storages "
            f"(ConfigMap {policy.operator_namespace}/{shard_name(meta['namespace'])}, which "
            f"the reclaim of studies left by deleted CRs reads): {type(exc).__name__}: "
            f"{exc}; the study is opened once it is") from None
    ctx = DaemonContext(kube, handle, spec, meta["namespace"], meta["name"],
                        controller_settings(spec, meta["namespace"], meta["name"],
                                            trials_per_hour_ceiling=policy.max_trials_per_hour),
                        state,
                        policy.study_storage(spec, namespace=meta["namespace"]),
                        uid=str(meta.get("uid", "")),
                        namespace_label=policy.namespace_label,
                        prometheus_tls=policy.prometheus_tls,
                        warn=functools.partial(_warn_on, body), ran_on=ran_on)
    controller = factory(ctx)
    # Built: a trial ended without a verdict (trial_ends.py) is told failed in its study.
    fail_ended(state, body, policy, named)
    log.info("%s/%s: controller built (resumed state: %s)", meta["namespace"], meta["name"],
             state.state.value if resumed else None)
    return controller
