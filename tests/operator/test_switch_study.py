"""What a backend or model switch does to the deployment's studies: the build hands the
study's open what the loop last ran on (``RanOn``: the loop state's target, else the
committed config's stamp), a study made before targets were recorded takes that one
(not the spec's current one), and a trial the switch ended is told failed in its own
study, the switch its reason (``daemon.open_deployment_study``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

from optuna.trial import TrialState

from slopilot.operator.controller_build import build
from slopilot.operator.crd import crd_manifest
from slopilot.operator.daemon import DaemonContext, open_deployment_study, study_name
from slopilot.operator.engine_switch import RanOn
from slopilot.operator.knobs import tuned_record
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.reconcile import reconcile
from slopilot.operator.settings import operator_policy
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.study_family import LeftTrial, open_for_space
from slopilot.tuner.study.study_target import StudyTarget
from tests.operator.operator_support import Cluster, llmd, operator_mint
from tests.operator.test_production_wiring import context
from tests.support.kube_server import RunningEmulator

BUILTIN = StudyTarget("builtin", "smollm2-135m")
VLLM = StudyTarget("vllm", "smollm2-135m")
STUDY = "default/chat/uid"


def _mid_trial(target: str | None, number: int = 0) -> LoopState:
    return LoopState(state=ControllerState.TUNING, baseline_config={"token_budget": 1024},
                     target=target,
                     trial=RunningTrial(number, {"token_budget": 2048}, 10.0, canary=True,
                                        study=STUDY))


def _built(cluster: Cluster, spec: dict[str, Any], status: dict[str, Any]) -> DaemonContext:
    """The context the daemon's factory gets for the CR with ``spec`` over its own and
    ``status``."""
    policy = operator_policy({})
    built: list[DaemonContext] = []

    def factory(ctx: DaemonContext) -> Controller:
        built.append(ctx)
        return cast("Controller", None)

    fresh = cluster.get()
    fresh["spec"] = {**fresh["spec"], **spec}
    fresh["status"] = status
    build(cluster.kube, cast("KubeDeploymentHandle", None), fresh, factory, policy)
    return built[-1]


def test_the_build_hands_the_study_what_the_loop_ran_on(
        kube: RunningEmulator, cluster: Cluster) -> None:
    kube.install(crd_manifest())
    body = cluster.create(llmd())
    assert reconcile(cluster.kube, body, policy=operator_policy({}),
                     mint=operator_mint(cluster)).valid
    same = _built(cluster, {}, {"controller": _mid_trial(BUILTIN.key).to_dict()})
    assert same.ran_on == RanOn(BUILTIN)  # no switch: nothing to fail
    switched = _built(cluster, {"backend": "vllm"},
                      {"controller": _mid_trial(BUILTIN.key, 3).to_dict()})
    assert switched.ran_on is not None and switched.ran_on.target == BUILTIN
    assert switched.ran_on.trial == LeftTrial(3, STUDY, {"token_budget": 2048})
    assert "engine_switched" in switched.ran_on.reason
    # A state from before the target was kept: the committed config's stamp says it.
    stamped = cluster.get()
    tuned = tuned_record(stamped, {"max_num_seqs": 8}, trial=False)
    legacy = _built(cluster, {"backend": "vllm"}, {"tunedConfig": tuned})
    assert legacy.ran_on == RanOn(BUILTIN)
    assert _built(cluster, {}, {}).ran_on is None  # nothing on record says anything


def test_a_study_made_before_the_upgrade_is_the_stamps_engines(tmp_path: Path) -> None:
    """Its trials were the built-in engine's (status.tunedConfig's stamp says so), and the
    CR runs vLLM since: taken as vLLM's, its built-in trials taught vLLM's sampler, and
    switched back, the built-in engine went on in a successor without them."""
    ctx = context(tmp_path, backend="vllm")
    base = study_name("team", "chat", "u1")
    space = ctx.spec.tuning.space
    tuner = ResumableTuner(open_study(ctx.storage, base), space)
    number, _ = tuner.ask()
    tuner.tell_failed(number, "a trial of the built-in engine")
    tuner.close()
    study = open_deployment_study(dataclasses.replace(ctx, ran_on=RanOn(BUILTIN)), space)
    assert study.study_name != base and study.trials == []
    assert StudyTarget.recorded(open_study(ctx.storage, base).user_attrs) == BUILTIN


def test_a_trial_a_switch_ended_is_told_failed_in_its_own_study(tmp_path: Path) -> None:
    ctx = context(tmp_path, backend="vllm")
    base = study_name("team", "chat", "u1")
    space = SearchSpace.from_bounds({})
    left = ResumableTuner(open_for_space(ctx.storage, base, space, BUILTIN).study, space)
    number, _ = left.ask()
    why = "engine_switched: builtin/smollm2-135m -> vllm/smollm2-135m"
    study = open_deployment_study(
        dataclasses.replace(ctx, ran_on=RanOn(BUILTIN, LeftTrial(number, base), why)),
        ctx.spec.tuning.space)
    assert study.study_name != base
    failed = open_study(ctx.storage, base).trials[number]
    assert failed.state is TrialState.FAIL and failed.user_attrs["fail_reason"] == why
    left.close()
