"""The Deployment's rollout, as the loop's port reads it (``DeploymentHandle.settled``):
a vLLM config is new pods, judged only once every replica runs the new template; and the
rendered Deployment rolls one spare pod at a time, with a deadline."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from slopilot.operator.engine_deployment import SCHEDULING_MARGIN_S
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import render_all
from slopilot.operator.rollout_status import rollout_of
from slopilot.operator.spec import parse_spec
from slopilot.tuner.loop.ports import Pending, Settled, Stuck
from tests.operator.operator_support import Cluster, operator_mint, with_namespaces
from tests.support.kube_server import serve_emulator

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dep(generation: int = 2, asked: int = 2, **status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": asked},
            "status": status}


def test_a_rollout_is_settled_only_when_every_replica_runs_the_new_template() -> None:
    done = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2}
    assert rollout_of(dep(**done)) == Settled()
    not_seen = rollout_of(dep(**(done | {"observedGeneration": 1})))
    assert isinstance(not_seen, Pending) and "generation 2" in not_seen.why
    half = rollout_of(dep(**(done | {"updatedReplicas": 1})))
    assert isinstance(half, Pending) and "1 of 2" in half.why
    old_left = rollout_of(dep(**(done | {"replicas": 3})))  # the surge pod's old peer
    assert isinstance(old_left, Pending) and "old" in old_left.why
    loading = rollout_of(dep(**(done | {"availableReplicas": 1})))
    assert isinstance(loading, Pending) and "available" in loading.why
    assert isinstance(rollout_of(dep(**{})), Pending)


def test_a_rollout_past_its_progress_deadline_is_stuck() -> None:
    stuck = rollout_of(dep(observedGeneration=2, replicas=3, updatedReplicas=1,
                           availableReplicas=2, conditions=[
                               {"type": "Available", "status": "True"},
                               {"type": "Progressing", "status": "False",
                                "reason": "ProgressDeadlineExceeded",
                                "message": 'ReplicaSet "chat-7d" has timed out progressing.'}]))
    assert isinstance(stuck, Stuck)
    assert "ProgressDeadlineExceeded" in stuck.why and "chat-7d" in stuck.why


def test_a_paused_deployment_is_stuck_not_pending_for_ever() -> None:
    """``kubectl rollout pause``: the controller makes no new pods and checks no deadline,
    so the rollout read Pending at every tick, and the trial (or cooldown) waited for
    ever on "0 of 1 replicas updated"."""
    paused = dep(observedGeneration=2, replicas=2, updatedReplicas=0, availableReplicas=2,
                 conditions=[{"type": "Progressing", "status": "Unknown",
                              "reason": "DeploymentPaused", "message": "Deployment is paused"}])
    paused["spec"]["paused"] = True
    state = rollout_of(paused)
    assert isinstance(state, Stuck) and "paused" in state.why, state
    assert "kubectl rollout resume" in state.why


def test_a_condition_of_an_older_generation_is_not_read_as_this_ones() -> None:
    """kubectl trusts the conditions only once the controller saw the template: a
    deadline passed by the previous rollout read the new one as stuck."""
    old = rollout_of(dep(generation=5, observedGeneration=4, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": "timed out"}]))
    assert isinstance(old, Pending) and "generation 5" in old.why, old


def _vllm_body() -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "manifests/samples/llmdeployment-vllm.yaml").read_text())
    body["metadata"]["name"] = "chat"
    del body["spec"]["model"]["tokenSecret"]
    return dict(body)


def test_the_rendered_deployment_surges_one_pod_and_keeps_every_one_serving() -> None:
    body = _vllm_body()
    body["metadata"] |= {"namespace": "team", "uid": "0b0e9a4e-4c1e-4d55-9b5e-1c9a3f6f0d11"}
    out = render_all(body, parse_spec(body))
    spec = out.deployment["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # Past the pods' own startup budget (startupProbe: 60 x 10 s), not within it.
    probe = out.deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert spec["progressDeadlineSeconds"] == 600 + SCHEDULING_MARGIN_S
    assert probe["periodSeconds"] * probe["failureThreshold"] < spec["progressDeadlineSeconds"]


def test_the_progress_deadline_follows_a_longer_startup_timeout() -> None:
    """A 70B checkpoint given spec.model.startupTimeout 2h still loading at 15 minutes was
    marked ProgressDeadlineExceeded, and its trial ended rollout_stuck, while its pods
    had their own 2 hours to start."""
    body = _vllm_body()
    body["metadata"] |= {"namespace": "team", "uid": "0b0e9a4e-4c1e-4d55-9b5e-1c9a3f6f0d11"}
    body["spec"]["model"]["startupTimeout"] = "2h"
    out = render_all(body, parse_spec(body))
    spec = out.deployment["spec"]
    probe = spec["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 7200
    assert spec["progressDeadlineSeconds"] == 7200 + SCHEDULING_MARGIN_S


def test_a_vllm_apply_is_pending_until_the_deployment_has_rolled_out(
        tmp_path: pathlib.Path) -> None:
    with serve_emulator(tmp_path) as kube, kube.api_client() as client:
        c = with_namespaces(kube, Cluster(client))
        body = c.create(_vllm_body())
        mint, pol = operator_mint(c), OperatorPolicy()
        reconcile(c.kube, body, policy=pol, mint=mint)
        h = KubeDeploymentHandle(c.kube, "default", "chat", mint=mint, policy=pol)

        def status(**fields: Any) -> None:
            c.kube.patch("apps/v1", "deployments", "default", "chat", {"status": fields},
                         subresource="status")

        live = c.kube.get("apps/v1", "deployments", "default", "chat")
        assert live is not None
        n, gen = live["spec"]["replicas"], live["metadata"]["generation"]
        status(observedGeneration=gen, replicas=n, updatedReplicas=n, availableReplicas=n)
        assert h.settled(0.0) == Settled()
        h.apply_config({"token_budget": 512, "chunk_size": 256}, canary=False, trial=True)
        after = c.kube.get("apps/v1", "deployments", "default", "chat")
        assert after is not None
        assert after["metadata"]["generation"] > gen  # the template changed
        assert isinstance(h.settled(1.0), Pending)  # the old pods still serve
        new = after["metadata"]["generation"]
        status(observedGeneration=new, replicas=n + 1, updatedReplicas=1,
               availableReplicas=n)
        assert isinstance(h.settled(2.0), Pending)
        status(observedGeneration=new, replicas=n, updatedReplicas=n, availableReplicas=n)
        assert h.settled(3.0) == Settled()


def test_the_loops_own_bound_lies_past_the_deployments_deadline() -> None:
    """Where the controller never says ProgressDeadlineExceeded (down, behind, or the
    deadline taken off the Deployment), the loop ends the wait itself: after the
    Deployment's deadline and ROLLOUT_MARGIN_S, so that the controller's word comes first."""
    from slopilot.operator.daemon import ROLLOUT_MARGIN_S, controller_settings
    for timeout, deadline in (("10m", 600), ("2h", 7200)):
        body = _vllm_body()
        body["metadata"] |= {"namespace": "team"}
        body["spec"]["model"]["startupTimeout"] = timeout
        spec = parse_spec(body)
        rendered = render_all(body, spec).deployment["spec"]["progressDeadlineSeconds"]
        settings = controller_settings(spec, "team", "chat")
        assert rendered == deadline + SCHEDULING_MARGIN_S
        assert settings.rollout_timeout_s == rendered + ROLLOUT_MARGIN_S


def test_each_move_of_the_rollout_is_progress_the_loop_can_see() -> None:
    """The loop's bound counts from the last move (``Pending.progress``): a new template,
    one more pod updated or available is one; the same status read again is none."""
    base = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1,
            "availableReplicas": 2}
    seen = {rollout_of(dep(**base)).marker,  # type: ignore[union-attr]
            rollout_of(dep(**(base | {"updatedReplicas": 2}))).marker,  # type: ignore[union-attr]
            rollout_of(dep(**(base | {"availableReplicas": 3}))).marker,  # type: ignore[union-attr]
            rollout_of(dep(generation=3, **base)).marker}  # type: ignore[union-attr]
    assert len(seen) == 4
    assert rollout_of(dep(**base)) == rollout_of(dep(**base))
