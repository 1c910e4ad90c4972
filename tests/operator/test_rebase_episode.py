"""What an edit of ``spec.engine`` does to the loop's memory (``loop_status.rebase_episode``).

A committed config belongs to the spec it was committed under: ``status.tunedConfig``
carries that spec's hash, and an edit makes it stale (``knobs.tuned_overlay``). The
loop's own memory of the commit (``best_config``, kept in ``status.controller`` after the
episode) is stale with it: once an edit left the tuned config behind, a rollback
restored the old commit over the edit and recorded it as the edited spec's tuned config.
An open episode's own best is its trials' and stays; its baseline becomes the spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slopilot.operator.knobs import engine_checksum
from slopilot.operator.loop_status import rebase_episode
from slopilot.operator.spec import parse_spec
from slopilot.tuner.loop.state import ControllerState, LoopState, PendingRestore, RolloutWatch
from tests.operator.operator_support import Cluster, llmd
from tests.support.kube_server import RunningEmulator

COMMITTED = {"token_budget": 512, "chunk_size": 256}
HERE = "builtin/smollm2-135m"
"""The backend and model ``llmd``'s CR runs (``LoopState.target``)."""


def committed_under(engine: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The CR with spec.engine ``now``, whose tuned config was committed under ``engine``."""
    body = llmd(engine=engine)
    base = engine_checksum(body)
    tuned = parse_spec(body).engine.with_overrides(COMMITTED).to_dict()
    return {**llmd(engine=now), "status": {"tunedConfig": {"engine": tuned, "base": base}}}


def loop_in(state: ControllerState, baseline: dict[str, Any]) -> LoopState:
    return LoopState(state=state, baseline_config=dict(baseline),
                     best_config=dict(COMMITTED), best_goodput=150.0)


def test_an_edit_after_the_commit_forgets_it_and_the_spec_is_the_baseline() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    for state in (ControllerState.STEADY, ControllerState.COOLDOWN, ControllerState.SCALING):
        loop = loop_in(state, before)
        rebase_episode(loop, body)
        assert (loop.best_config, loop.best_goodput) == (None, None), state
        assert loop.baseline_config == parse_spec(body).engine.to_dict()
        assert loop.baseline_config["token_budget"] == 2048


def test_an_edit_during_an_episode_keeps_its_best_and_rebases_its_baseline() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    for state in (ControllerState.TUNING, ControllerState.COMMIT):
        loop = loop_in(state, before)
        rebase_episode(loop, body)
        assert loop.best_config == COMMITTED and loop.best_goodput == 150.0, state
        assert loop.baseline_config["token_budget"] == 2048


def test_without_an_edit_the_commit_and_the_baseline_stay() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 1024})
    loop = loop_in(ControllerState.STEADY, before)
    rebase_episode(loop, body)
    assert loop == dataclasses.replace(loop_in(ControllerState.STEADY, before), target=HERE)


def test_a_loop_that_never_tuned_is_left_as_it_is() -> None:
    loop = LoopState()
    rebase_episode(loop, llmd(engine={"tokenBudget": 2048}))
    assert loop == LoopState(target=HERE)  # stamped: a switch from here on is seen


def test_an_edit_while_a_restore_is_owed_makes_the_spec_what_it_restores() -> None:
    # The episode's rollback failed and is retried: retried after the edit with the old
    # config, it undid the edit on every pod and recorded it as the edited spec's.
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    loop = loop_in(ControllerState.COOLDOWN, before)
    loop.pending_restore = PendingRestore(since=1.0, attempts=1, retry_at=1.0,
                                          error="RuntimeError: down")
    assert loop.rollback_config() == COMMITTED  # the episode's best, before the edit
    rebase_episode(loop, body)
    assert loop.rollback_config() == parse_spec(body).engine.to_dict()


def test_an_edit_during_a_commits_rollout_drops_its_revert() -> None:
    """The edit renders a new template over the commit's: reverted later to the config
    committed before it, the old knobs undid the edit as a rollback's did."""
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    loop = loop_in(ControllerState.COOLDOWN, before)
    loop.rollout = RolloutWatch(since=10.0, config=dict(COMMITTED), revert_to=dict(before))
    rebase_episode(loop, body)
    assert loop.rollout is not None and loop.rollout.revert_to is None
    unedited = committed_under({"tokenBudget": 1024}, {"tokenBudget": 1024})
    kept = loop_in(ControllerState.COOLDOWN, before)
    kept.rollout = RolloutWatch(since=10.0, config=dict(COMMITTED), revert_to=dict(before))
    rebase_episode(kept, unedited)
    assert kept.rollout is not None and kept.rollout.revert_to == before


def _mid_trial(target: str | None) -> LoopState:
    from slopilot.tuner.loop.state import RunningTrial

    return LoopState(state=ControllerState.TUNING, baseline_config={"token_budget": 1024},
                     best_config=dict(COMMITTED), best_goodput=900.0, target=target,
                     trial=RunningTrial(0, {"token_budget": 2048}, 10.0, canary=True))


def test_a_backend_switch_ends_the_episode_and_its_trial() -> None:
    """A switch of ``spec.backend`` (or the model) mid-trial: the daemon rebuilt its
    controller on the other backend's study and resumed the trial's number there (a
    KeyError rolled the tick back, or, switched back, the other engine's measurement was
    told to this one's trial), and the episode's best, the built-in engine's knobs, could
    be committed to vLLM. The episode ends: no trial, nothing of it kept to apply."""
    loop = _mid_trial("builtin/smollm2-135m")
    rebase_episode(loop, llmd(backend="vllm"))
    assert (loop.state, loop.trial, loop.pending_restore) == (ControllerState.STEADY, None,
                                                             None)
    assert (loop.best_config, loop.best_goodput, loop.baseline_config) == (None, None, None)
    assert loop.rollback_config() is None
    assert "engine_switched" in loop.reason and "builtin" in loop.reason
    assert loop.target == "vllm/smollm2-135m"


def test_a_model_switch_ends_the_episode_too_and_no_switch_keeps_it() -> None:
    loop = _mid_trial("builtin/smollm2-135m")
    rebase_episode(loop, llmd(model={"name": "llama-3-8b"}))
    assert loop.state is ControllerState.STEADY and loop.trial is None
    same = _mid_trial("builtin/smollm2-135m")
    rebase_episode(same, llmd())
    assert same.state is ControllerState.TUNING and same.trial is not None
    assert same.best_config == COMMITTED


def test_a_state_from_before_the_target_is_taken_as_the_current_one() -> None:
    """Written by an earlier release (no ``target``): nothing says it was another backend,
    as a tuned config of then belongs to the current one; it is stamped from now on."""
    loop = _mid_trial(None)
    rebase_episode(loop, llmd(backend="vllm"))
    assert loop.state is ControllerState.TUNING and loop.trial is not None
    assert loop.target == "vllm/smollm2-135m"


def test_a_state_from_before_the_target_ends_where_the_tuned_config_names_another() -> None:
    """Written by an earlier release, but the committed config's record says the
    built-in engine, and the spec now runs vLLM: the episode's best is that engine's."""
    from slopilot.operator.knobs import tuned_record

    body = llmd()
    body["status"] = {"tunedConfig": tuned_record(body, {"max_num_seqs": 8}, trial=False)}
    switched = {**body, "spec": {**body["spec"], "backend": "vllm"}}
    loop = _mid_trial(None)
    rebase_episode(loop, switched)
    assert loop.state is ControllerState.STEADY and loop.best_config is None
    assert "builtin/smollm2-135m -> vllm/smollm2-135m" in loop.reason


def test_the_daemon_resumes_no_trial_of_the_other_backend(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """What the daemon's factory is given after ``spec.backend`` switched mid-trial: a
    loop in steady with no trial, where it was given the built-in trial's number to
    resume in vLLM's study (a KeyError every tick, or, switched back, another engine's
    measurement told to it)."""
    from typing import cast

    from slopilot.operator.controller_build import build
    from slopilot.operator.crd import crd_manifest
    from slopilot.operator.daemon import DaemonContext
    from slopilot.operator.kube_handle import KubeDeploymentHandle
    from slopilot.operator.reconcile import reconcile
    from slopilot.operator.settings import operator_policy
    from slopilot.tuner.loop.controller import Controller
    from tests.operator.operator_support import operator_mint

    kube.install(crd_manifest())
    policy = operator_policy({})
    body = cluster.create(llmd())
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    built: list[DaemonContext] = []

    def factory(ctx: DaemonContext) -> Controller:
        built.append(ctx)
        return cast("Controller", None)

    def built_from(spec: dict[str, Any]) -> LoopState:
        fresh = cluster.get()
        fresh["spec"] = {**fresh["spec"], **spec}
        fresh["status"] = {"controller": _mid_trial(HERE).to_dict()}
        build(cluster.kube, cast("KubeDeploymentHandle", None), fresh, factory, policy)
        state = built[-1].state
        assert state is not None
        return state

    assert built_from({}).trial is not None  # the same backend: the trial resumes
    switched = built_from({"backend": "vllm"})
    assert switched.state is ControllerState.STEADY and switched.trial is None
    assert switched.target == "vllm/smollm2-135m"
