"""A live knob the user edits in spec.engine reaches the built-in engine's running pods.

The engine reads its ConfigMap only at start, and live knobs are left out of the pod
template's checksum so that a change does not restart the pods: before the operator
pushed them, an edit of ``spec.engine.tokenBudget`` changed the ConfigMap and the status
while every running pod kept the old budget (until it restarted, or a trial happened to
carry it), and the controller judged its windows as if they ran the new one.
"""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None until they appear.
# mypy: disable-error-code="attr-defined,index,union-attr,arg-type"

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from slopilot.operator.daemon import DaemonContext
from slopilot.operator.deployment_loop import CONFIG_SYNC_S
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.pod_sync_pool import PodSyncPool
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from slopilot.operator.tokens import TokenMint
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.prometheus.alerts import AlertSource
from tests.operator.operator_support import (
    NS,
    Cluster,
    add_pod,
    daemon_loop,
    kopf_loop,
    llmd,
    operator,
    operator_mint,
    pods_up,
    sync_timer,
    wait_for,
    wait_steady,
)
from tests.operator.standins import HoldingWindows, PodStandIn, PrometheusStandIn, serving
from tests.support.fired_timers import FiredTimer, FiredTimers
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S
from tests.tuner.controller_fakes import FakeProbe, FakeStudy


def spec_config(cluster: Cluster) -> dict[str, Any]:
    """What the ConfigMap tells a pod that starts now (the spec's engine config)."""
    return parse_spec(cluster.get()).engine.to_dict()


def running(pod: PodStandIn) -> dict[str, Any]:
    with pod.lock:
        return dict(pod.config or {})


def reconciled(kube: RunningEmulator, cluster: Cluster, body: dict[str, Any]
             ) -> tuple[dict[str, Any], OperatorPolicy, TokenMint]:
    """``body`` created and reconciled once (its Deployment, ConfigMap, admin token), as
    the operator would: the CR, the policy and the token mint the sync runs with."""
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    created = cluster.create(body)
    policy, mint = OperatorPolicy(), operator_mint(cluster)
    assert reconcile(cluster.kube, created, policy=policy, mint=mint).valid
    return created, policy, mint


def handler_memo(cluster: Cluster, policy: OperatorPolicy, mint: TokenMint) -> Any:
    """kopf's memo as the operator's startup fills it, for calling handlers directly."""
    import kopf

    from slopilot.operator.cr_locks import LockTable

    return kopf.Memo(kube=cluster.kube, tokens=mint, policy=policy, locks=LockTable(),
                     pod_syncs=PodSyncPool())


def handle_of(cluster: Cluster, body: dict[str, Any], policy: OperatorPolicy,
              mint: TokenMint, **kw: Any) -> KubeDeploymentHandle:
    return KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=policy,
                                uid=body["metadata"]["uid"], **kw)


def sync_until_the_drip_is_cut(handle: KubeDeploymentHandle, timers: FiredTimers,
                               dripping: PodStandIn) -> Any:
    """``handle.sync_config()``, with the deadline of the request that ``dripping``
    drips its answer to run out once it drips: a pod that answers, however slowly a busy
    machine lets it, is never cut, and the dripping one always is."""
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(handle.sync_config())
        except BaseException as exc:  # raised below, in the test's thread
            done.append(exc)

    sync = threading.Thread(target=run, daemon=True)
    sync.start()

    def the_drips_deadline() -> FiredTimer | None:
        # A pod's requests follow one another, each deadline cancelled as its answer
        # ends: once the answer drips and the other pods' requests are over, the one
        # deadline armed is the dripping request's.
        armed = timers.armed()
        return armed[0] if dripping.drip_begun.is_set() and len(armed) == 1 else None

    try:
        wait_for(the_drips_deadline, "a dripping answer, the only request under way").fire()
    finally:
        for timer in timers.armed():  # a failed wait must not leave the sync dripping
            timer.fire()
        sync.join(HANG_GUARD_S)
    assert done, "the sync did not end"
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


@pytest.mark.parametrize("tuning", [True, False], ids=["tuning-on", "tuning-off"])
def test_a_live_knob_edited_in_the_spec_reaches_every_running_pod(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, tuning: bool) -> None:
    pods = [PodStandIn(), PodStandIn()]
    with serving(*pods), operator(kube_login):
        cluster.create(llmd(replicas={"min": 2, "max": 2}, prometheus={"url": prom.url},
                            engine={"tokenBudget": 512},
                            tuning={"window": "1h", "enabled": tuning}))
        pods_up(cluster, pods, lambda: spec_config(cluster))
        cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 1024, "maxNumSeqs": 64}}})
        wait_for(lambda: all(running(p)["token_budget"] == 1024 for p in pods),
                 what="the edited budget on every running pod")
        assert all(running(p)["max_num_seqs"] == 64 for p in pods)
        assert all(running(p) == spec_config(cluster) for p in pods)
        cluster.patch("chat", {"spec": {"slo": {"profile": "relaxed"}}})
        wait_for(lambda: all(p.slo == parse_spec(cluster.get()).slo.to_dict() for p in pods),
                 what="the edited SLO on every running pod")


def test_the_sync_touches_only_pods_that_run_another_config_and_keeps_a_trials_own(
        kube: RunningEmulator, cluster: Cluster) -> None:
    body, policy, mint = reconciled(kube, cluster, llmd(
        engine={"tokenBudget": 1024}, tuning={"enabled": False}))
    want = spec_config(cluster)
    trial = {**want, "token_budget": 2048}
    token = mint.for_body(cluster.get())
    canary, right, stale = (PodStandIn(token, trial), PodStandIn(token, want),
                            PodStandIn(token, {**want, "token_budget": 512}))
    with serving(canary, right, stale):
        for i, pod in enumerate((canary, right, stale)):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        on_canary = {"trial": {"token_budget": 2048}, "trial_on": "chat-pod-0"}
        done = handle.sync_config(**on_canary)
        assert done.updated == ("chat-pod-2",) and done.left == ()
        assert (canary.puts, right.puts) == ([], [])
        assert running(stale) == want and len(stale.puts) == 1
        # A second sync finds nothing to do.
        assert handle.sync_config(**on_canary).updated == ()
        assert len(stale.puts) == 1
        # The canary restarts mid-trial, on the ConfigMap's config: it gets the trial's
        # back, or the trial's window would measure the spec's config as the trial's.
        with canary.lock:
            canary.config = dict(want)
        assert handle.sync_config(**on_canary).updated == ("chat-pod-0",)
        assert running(canary) == trial
        # A canary trial's config is the canary's alone: never recorded, or the
        # ConfigMap would render it to every replica.
        assert "tunedConfig" not in cluster.status()
        # A trial on every replica (one replica, or canaries off) is every pod's config.
        assert handle.sync_config(trial={"token_budget": 2048}).updated == (
            "chat-pod-1", "chat-pod-2")
        assert [running(p) for p in (canary, right, stale)] == [trial] * 3


def test_a_pod_the_sync_cannot_bring_over_is_named_with_why(
        kube: RunningEmulator, cluster: Cluster) -> None:
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want = spec_config(cluster)
    token = mint.for_body(cluster.get())
    older = PodStandIn(token, {**want, "block_size": 32, "token_budget": 2048})
    deaf = PodStandIn(token)  # serves no GET
    stranger = PodStandIn("another-token", want)
    with serving(older, deaf, stranger):
        for i, pod in enumerate((older, deaf, stranger)):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        done = handle.sync_config()
    assert done.updated == ()
    assert [why.split()[0].rstrip(":") for why in done.left] == [
        "chat-pod-0", "chat-pod-1", "chat-pod-2"]
    assert "block_size=32" in done.left[0] and "restart" in done.left[0]
    assert "HTTP 404" in done.left[1]
    assert "HTTP 401" in done.left[2]
    assert older.puts == [] and deaf.puts == []  # a restart knob is the rollout's to change


def test_a_vllm_deployment_is_never_synced_over_http(
        kube: RunningEmulator, cluster: Cluster) -> None:
    body, policy, mint = reconciled(kube, cluster, llmd(backend="vllm", tuning={"enabled": False}))
    pod = PodStandIn(mint.for_body(cluster.get()), {"token_budget": 1})
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        assert handle.sync_config().updated == ()
    assert (pod.gets, pod.puts) == (0, [])  # its knobs are arguments: a rollout sets them


def test_a_vllm_trial_records_the_sequences_its_pods_run(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """vLLM refuses more sequences than the token budget, so its pods are given the
    budget (engine_deployment.vllm_max_num_seqs); a trial of 1,024 sequences on a 256-token budget
    was recorded in status.tunedConfig as 1,024, a figure no pod ran."""
    body, policy, mint = reconciled(kube, cluster, llmd(backend="vllm"))
    handle = handle_of(cluster, body, policy, mint)
    handle.apply_config({"token_budget": 256, "chunk_size": 128, "max_num_seqs": 1024},
                        canary=False)
    tuned = cluster.get()["status"]["tunedConfig"]["engine"]
    assert (tuned["token_budget"], tuned["max_num_seqs"]) == (256, 256)
    args = cluster.kube.get("apps/v1", "deployments", NS, "chat")[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "256"
    assert handle.current_config()["max_num_seqs"] == 256


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _loop_and_two_pods(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                       monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[Any, Clock, dict[str, Any], PodStandIn, PodStandIn]:
    """A daemon on an injected clock, the spec's config, a pod on it and a pod on an
    older one (token_budget 512), neither serving yet."""
    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, engine={"tokenBudget": 1024}, tuning={"window": "1h"}))
    loop = daemon_loop(cluster, body, monkeypatch)
    clock = Clock()
    loop.clock = clock
    want = spec_config(cluster)
    token = mint.for_body(cluster.get())
    first, late = PodStandIn(token, want), PodStandIn(token, {**want, "token_budget": 512})
    return loop, clock, want, first, late


def test_a_pod_that_started_on_an_older_config_map_is_brought_over_by_the_daemon(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap is read once, at start: a pod that read it before an edit and became
    ready after the edit's sync runs the old config until the daemon's next sync."""
    from slopilot.operator import deployment_loop

    loop, clock, want, first, late = _loop_and_two_pods(kube, cluster, prom, monkeypatch)
    with serving(first, late):
        add_pod(cluster, "chat", 0, first.port)
        assert loop.step()
        assert first.gets == 1 and first.puts == []
        add_pod(cluster, "chat", 1, late.port)
        clock.now += deployment_loop.CONFIG_SYNC_S - 1
        assert loop.step()
        assert late.gets == 0  # not due yet
        clock.now += 1
        assert loop.step()
        assert running(late) == want and len(late.puts) == 1
        assert first.puts == []


def test_the_pods_are_synced_one_period_after_the_clock_stepped_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's period is timed on the operator's clock: stepped back a day (an NTP
    step), a pod on an older config ran it for that day, not a ``CONFIG_SYNC_S``."""
    loop, clock, want, first, late = _loop_and_two_pods(kube, cluster, prom, monkeypatch)
    with serving(first, late):
        add_pod(cluster, "chat", 0, first.port)
        assert loop.step()
        add_pod(cluster, "chat", 1, late.port)
        clock.now -= 86_400.0
        assert loop.step()
        clock.now += CONFIG_SYNC_S
        assert loop.step()
        assert running(late) == want


def test_with_tuning_off_the_timer_brings_over_a_pod_that_read_an_older_config_map(
        kube: RunningEmulator, cluster: Cluster) -> None:

    from slopilot.operator.handlers import tuning_disabled

    _, policy, mint = reconciled(kube, cluster, llmd(
        engine={"tokenBudget": 1024}, tuning={"enabled": False}))
    assert tuning_disabled(cluster.get()["spec"])
    want = spec_config(cluster)
    late = PodStandIn(mint.for_body(cluster.get()), {**want, "token_budget": 512})
    memo = handler_memo(cluster, policy, mint)
    with serving(late):
        add_pod(cluster, "chat", 0, late.port)
        sync_timer(cluster.get(), memo)
    assert running(late) == want and len(late.puts) == 1


def test_with_tuning_off_the_running_operator_brings_an_edit_to_the_pods(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    """kopf itself: the reconcile, on one of kopf's threads, asks its sync of the pod
    syncs' pool on kopf's event loop (made by the startup handler) without waiting for
    it, and the sync runs on the pool's thread; at exit the cleanup handler ends the
    pool and the operator exits cleanly."""
    with operator(kube_login):
        cluster.create(llmd(tuning={"enabled": False}))
        pod = PodStandIn()
        with serving(pod):
            pods_up(cluster, [pod], lambda: spec_config(cluster))
            with pod.lock:
                pod.slo = parse_spec(cluster.get()).slo.to_dict()
            cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 4096}}})
            wait_for(lambda: running(pod).get("token_budget") == 4096,
                     what="the edit on the pod, through the reconcile's sync")
            wait_for(lambda: (cluster.condition("PodsConfigured") or {}).get("status")
                     == "True", what="the sync's condition")


def test_an_edit_during_a_canary_trial_reaches_the_canary_under_the_trials_knobs(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    pods = [PodStandIn(), PodStandIn()]
    with serving(*pods), operator(kube_login):
        cluster.create(llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                            tuning={"window": "1h", "canary": True}))
        pods_up(cluster, pods, lambda: spec_config(cluster))
        wait_steady(cluster)
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        trial = wait_for(lambda: (cluster.status().get("controller") or {}).get("trial"),
                         what="the trial on record")
        assert trial["canary_replica"] == "chat-pod-0"
        trial_config = running(pods[0])
        assert trial_config["token_budget"] == 512  # the trial's (FakeStudy's GOOD)
        cluster.patch("chat", {"spec": {"engine": {"maxNumSeqs": 64}}})
        wait_for(lambda: all(running(p)["max_num_seqs"] == 64 for p in pods),
                 what="the edit on both replicas")
        # The canary runs the trial's knobs over the spec as it is now, as a trial
        # applied after the edit would: the trial goes on.
        assert running(pods[0]) == {**trial_config, "max_num_seqs": 64}
        assert running(pods[1]) == spec_config(cluster)
        assert cluster.status()["controller"]["trial"]["number"] == trial["number"]


def episode_under_way(cluster: Cluster, baseline: dict[str, Any], now: float) -> None:
    """A retune episode on record with a canary trial on chat-pod-0, begun on ``baseline``."""
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "controller": {"state": "tuning", "since": now, "baseline_config": baseline,
                       "trial": {"number": 0, "config": {"token_budget": 2048},
                                 "started_at": now, "canary": True,
                                 "canary_replica": "chat-pod-0"}}}},
        subresource="status")


@pytest.mark.parametrize("stepped", [True, False], ids=["built-before-edit", "built-after"])
def test_an_edit_during_an_episode_is_what_its_rollback_restores(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, stepped: bool) -> None:
    """The episode's baseline was the whole config of the spec it began on, laid back over
    the spec on a rollback: an edit made during the episode was undone on every pod, and
    recorded as the tuned config (status.tunedConfig, the ConfigMap) for good."""
    import time

    body, _, mint = reconciled(kube, cluster, llmd(
        replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
        tuning={"window": "1h", "canary": True}))
    before = spec_config(cluster)
    episode_under_way(cluster, before, time.time())
    token = mint.for_body(cluster.get())
    pods = [PodStandIn(token, {**before, "token_budget": 2048}), PodStandIn(token, before)]
    loop = daemon_loop(cluster, body, monkeypatch)
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        if stepped:
            assert loop.step()  # the controller of the spec before the edit
        cluster.patch("chat", {"spec": {"engine": {"maxNumSeqs": 64},
                                        "tuning": {"enabled": False}}})
        loop.abandon("tuning was disabled", restore=True)
        after = spec_config(cluster)
        assert after["max_num_seqs"] == 64
        assert [running(p) for p in pods] == [after, after]
    assert cluster.status()["tunedConfig"]["engine"]["max_num_seqs"] == 64


class BrokenPlanner:
    """A capacity search that fails as no simulator call should (a bug, not a busy or
    timed-out twin, which is no answer: ports.NO_ANSWER): the tick errors."""

    def search(self, *_: Any, **__: Any) -> Any:
        raise KeyError("token_budget")


def erring(ctx: DaemonContext) -> Controller:
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    alerts = AlertSource(ctx.spec.prometheus_url, ctx.name, namespace=ctx.namespace)
    return Controller(settings, ctx.handle, alerts, HoldingWindows(), FakeStudy(),
                      FakeProbe(), BrokenPlanner(), state=ctx.state)


def test_a_tick_error_after_a_commit_keeps_a_later_edit(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop kept its last commit after the episode (``best_config``): a tick that
    errored after an edit of spec.engine rolled back to it on every pod, and recorded it
    as the edited spec's tuned config, which then stood until the next edit."""
    import time

    body, policy, mint = reconciled(kube, cluster, llmd(
        replicas={"min": 1, "max": 4}, prometheus={"url": prom.url},
        tuning={"window": "1m"}))
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        # An episode committed token_budget 512 (the commit's own call) and the loop went
        # back to STEADY through its cooldown, as status.controller keeps it.
        before = spec_config(cluster)
        handle_of(cluster, body, policy, mint).apply_config({"token_budget": 512},
                                                            canary=False)
        cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {
            "status": {"controller": {
                "state": "steady", "since": time.time() - 7200, "baseline_config": before,
                "best_config": {"token_budget": 512}, "best_goodput": 150.0}}},
            subresource="status")
        assert running(pod)["token_budget"] == 512
        cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 2048}}})
        assert spec_config(cluster)["token_budget"] == 2048  # the commit is stale now

        loop = daemon_loop(cluster, cluster.get(), monkeypatch, factory=erring)
        assert loop.step()  # nothing firing: the pod is synced to the edit
        assert running(pod)["token_budget"] == 2048
        prom.fire("SlopilotTBTP99High", "scale", "chat", NS)
        assert loop.step()  # SCALING: the capacity search fails, the tick errors
        status = cluster.status()
        assert status["lastAction"]["action"] == "revert"
        assert "KeyError" in status["lastAction"]["reason"]
        assert running(pod)["token_budget"] == 2048
        assert spec_config(cluster)["token_budget"] == 2048
        assert status["config"]["tokenBudget"] == 2048
        assert status["controller"].get("best_config") is None  # the commit forgotten


def test_the_pods_judge_requests_by_the_slo_the_spec_has_now(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """The engine reads the ConfigMap's SLO only at start, as its knobs: an edit of
    spec.slo reaches the running pods by PUT /admin/slo, or their verdicts (the goodput
    the rules read) stay under the old objectives and the rules fall back to the
    histograms' product."""
    from slopilot.engine.slo import SLOSpec
    body, policy, mint = reconciled(kube, cluster, llmd(
        tuning={"enabled": False}, slo={"profile": "strict"}))
    cluster.patch("chat", {"spec": {"slo": {"profile": "relaxed"}}})
    want_slo = parse_spec(cluster.get()).slo.to_dict()
    assert want_slo["profile"] == "relaxed"
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    old = SLOSpec.from_profile("strict").to_dict()
    stale, right, untold = (PodStandIn(token, want, old), PodStandIn(token, want, want_slo),
                            PodStandIn(token, want))
    older = PodStandIn(token, {**want, "token_budget": 128}, serves_slo=False)
    with serving(stale, right, untold, older):
        for i, pod in enumerate((stale, right, untold, older)):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        done = handle.sync_config()
        assert done.slo_updated == ("chat-pod-0", "chat-pod-2")
        assert stale.slo == untold.slo == right.slo == want_slo
        assert right.slo_puts == [] and stale.puts == [] and untold.puts == []
        # An image from before /admin/slo: named, and its knobs still brought over.
        assert done.updated == ("chat-pod-3",) and running(older) == want
        assert len(done.left) == 1 and done.left[0].startswith("chat-pod-3")
        assert "HTTP 404" in done.left[0]
        assert handle.sync_config().slo_updated == ()


@pytest.mark.parametrize("answer", [(400, b'{"error": "no"}'), (200, b"[" * 50_000)],
                         ids=["400", "nested-past-the-parser"])
@pytest.mark.parametrize("path", ["/admin/config", "/admin/slo"])
def test_a_pod_answering_a_read_with_400_is_named_and_the_others_are_still_synced(
        kube: RunningEmulator, cluster: Cluster, path: str, answer: tuple[int, bytes]
        ) -> None:
    """The image is the tenant's: a 400 to the operator's GET was raised as a refusal of
    a config (ConfigError), and JSON nested past the parser's depth (50 KB, under the
    read's cap) as a RecursionError; no caller of the read caught either, so the whole
    sync ended at that pod and every pod after it kept its stale knobs."""
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    slo = parse_spec(cluster.get()).slo.to_dict()
    odd, stale = PodStandIn(token, want, slo), PodStandIn(token, {**want, "token_budget": 512})
    odd.raw_gets[path] = (answer[0], "application/json", answer[1])
    with serving(odd, stale):
        for i, pod in enumerate((odd, stale)):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        done = handle.sync_config()
    assert done.updated == ("chat-pod-1",) and running(stale) == want
    assert len(done.left) == 1 and done.left[0].startswith("chat-pod-0")
    assert path in done.left[0]
    assert ("HTTP 400" if answer[0] == 400 else "did not answer JSON") in done.left[0]


@pytest.mark.parametrize("path", ["/admin/config", "/admin/slo"])
def test_the_answer_to_a_put_is_not_read_into_the_operators_memory(
        kube: RunningEmulator, cluster: Cluster, path: str) -> None:
    """The GETs are read up to MAX_CONFIG_BYTES, but each PUT's answer was read whole
    (httpx's put): a tenant's image that differs from the spec (so the sync PUTs) and
    answers with an endless body filled the operator's memory, every tenant's operator,
    once a minute. The status is all the PUT needs; the body is never read."""
    from tests.operator.operator_support import wait_for

    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    slo = parse_spec(cluster.get()).slo.to_dict()
    # Only ``path`` differs from the spec: that is the one PUT sent.
    pod = PodStandIn(token, {**want, "token_budget": 512} if path == "/admin/config"
                     else want, None if path == "/admin/slo" else slo)
    pod.put_answer_bytes = 64 * 1024 * 1024
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        handle_of(cluster, body, policy, mint).sync_config()
        wait_for(lambda: pod.answer_cut.is_set() or pod.answer_sent.is_set(),
                 what="the padded answer to end")
        assert pod.answer_cut.is_set()


def test_the_timers_sync_closes_the_http_client_it_opens(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reconcile and each timer tick with tuning off made a KubeDeploymentHandle, and
    with it an httpx client that nothing closed: its keep-alive socket to every pod it
    reached stayed open until a garbage collection found the client (a cycle), once a
    minute per LLMDeployment."""

    import httpx

    from slopilot.operator import pod_admin
    opened: list[httpx.Client] = []

    class Recorded(httpx.Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(pod_admin.httpx, "Client", Recorded)
    _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    memo = handler_memo(cluster, policy, mint)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        sync_timer(cluster.get(), memo)
    assert pod.gets == 1
    assert opened and all(c.is_closed for c in opened)


def test_a_compressed_answer_is_not_inflated_past_the_cap(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """The GET is read up to MAX_CONFIG_BYTES, but counted after httpx decoded it: a
    tenant's image that answers 40 KiB of gzip (Content-Encoding, asked for or not) had
    them inflated to 40 MiB at once in the operator before the cap was looked at."""
    import gzip
    import tracemalloc

    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    bomb = gzip.compress(b" " * (40 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 64 * 1024
    pod.raw_gets["/admin/config"] = (200, "application/json", bomb)
    pod.raw_headers = {"Content-Encoding": "gzip"}
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        tracemalloc.start()
        try:
            done = handle.sync_config()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(done.left) == 1 and done.left[0].startswith("chat-pod-0")
    assert peak < 4 * 1024 * 1024, f"{peak} bytes at the peak"


@pytest.mark.parametrize("answer", ["GET", "PUT"])
def test_a_pod_that_drips_its_answer_cannot_hold_the_sync(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
        answer: str) -> None:
    """httpx's timeout restarts with every byte: a tenant's image that sent a byte every
    few seconds held the sync, a kopf handler thread and this CR's lock with it, for as
    long as it liked (a few such CRs and every tenant's reconciles wait). Each request to
    a pod now has a deadline for its whole answer."""
    from slopilot.operator import pod_admin
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    slo = parse_spec(cluster.get()).slo.to_dict()
    dripping = PodStandIn(token, {**want, "token_budget": 512}, slo)
    stale = PodStandIn(token, {**want, "token_budget": 512}, slo)
    with serving(dripping, stale):
        add_pod(cluster, "chat", 0, dripping.port)
        add_pod(cluster, "chat", 1, stale.port)
        # PUT: its GETs are answered (it runs another budget, so the sync PUTs), and the
        # PUT's answer drips.
        dripping.drip_methods = frozenset({answer})
        dripping.drip_s = 0.05
        timers = FiredTimers()
        handle = handle_of(cluster, body, policy, mint, timer=timers)
        done = sync_until_the_drip_is_cut(handle, timers, dripping)
        assert done.updated == ("chat-pod-1",) and running(stale) == want
        assert len(done.left) == 1 and done.left[0].startswith("chat-pod-0")
        assert (f"within the {pod_admin.POD_ANSWER_DEADLINE_S:g} s deadline per request"
                in done.left[0])
        assert dripping.answer_cut.wait(timeout=HANG_GUARD_S)  # the socket was shut, not left open


def test_the_timer_never_acts_on_a_spec_the_policy_refuses(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A refused spec touches nothing (the reconcile's rule): an edit that the operator's
    policy refuses (here an image off the allow-list) together with a knob must not have
    the knob sent to the pods of the last accepted spec by the timer's sync."""

    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    accepted = spec_config(cluster)
    cluster.patch("chat", {"spec": {"image": "evil.example/miner:1",
                                    "engine": {"tokenBudget": 4096}}})
    assert not reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint).valid
    pod = PodStandIn(mint.for_body(cluster.get()), accepted,
                     parse_spec(body).slo.to_dict())
    memo = handler_memo(cluster, policy, mint)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        sync_timer(cluster.get(), memo)
    assert pod.puts == [] and pod.slo_puts == [] and running(pod) == accepted


def _pods_condition(cluster: Cluster) -> dict[str, Any] | None:
    return next((c for c in cluster.status().get("conditions") or ()
                 if c["type"] == "PodsConfigured"), None)


def _status_writes(kube: RunningEmulator) -> int:
    return sum(1 for r in list(kube.emulator._requests)
               if r.method.value == "PATCH" and r.subresource == "status")


@pytest.mark.parametrize("tuning", [True, False], ids=["daemon", "timer"])
def test_the_status_says_which_pods_are_not_on_the_specs_config(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tuning: bool) -> None:
    """A pod the sync cannot bring over (here one from an older pod template, whose
    block size only its replacement changes) was only in the operator's log: the user
    saw status.config and believed every pod ran it. The PodsConfigured condition says
    which pod and why, and turns True once two syncs in a row find they all do (a pod
    right and wrong by turns does not have it written at every sync); written when it
    changes only."""

    body, policy, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h", "enabled": tuning}))
    want = spec_config(cluster)
    token, slo = mint.for_body(cluster.get()), parse_spec(cluster.get()).slo.to_dict()
    good, older = PodStandIn(token, want, slo), PodStandIn(token, {**want, "block_size": 32})
    loop = daemon_loop(cluster, body, monkeypatch) if tuning else None
    clock = Clock()
    memo = handler_memo(cluster, policy, mint)

    def sync() -> None:
        if loop is not None:
            loop.clock = clock
            clock.now += CONFIG_SYNC_S
            assert loop.step()
        else:
            sync_timer(cluster.get(), memo)

    with serving(good, older):
        add_pod(cluster, "chat", 0, good.port)
        add_pod(cluster, "chat", 1, older.port)
        sync()
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "False", cond
        assert cond["message"].startswith("chat-pod-1: runs block_size=32")
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        writes = _status_writes(kube)
        sync()  # the same answer: no write
        assert _status_writes(kube) == writes or loop is not None  # the daemon writes ticks
        assert _pods_condition(cluster) == cond
        with older.lock:
            older.config = dict(want)  # its replacement, on the new template
        sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        sync()
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "True", cond
        assert cond["message"].startswith("every ready pod runs the spec's live knobs")
        assert cluster.status()["pods"]["notConfigured"] == []


def test_the_pods_condition_goes_once_the_backend_is_vllm(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A built-in deployment with a pod the sync could not bring over, switched to vLLM:
    no sync runs for vLLM (no admin API), so nothing wrote the condition again, and
    "PodsNotConfigured" named a pod of the old backend for as long as the CR lived."""
    import logging

    from slopilot.operator import handlers

    _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want = spec_config(cluster)
    older = PodStandIn(mint.for_body(cluster.get()), {**want, "block_size": 32})
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: None)
    memo = handler_memo(cluster, policy, mint)
    log = logging.getLogger("test")
    with serving(older), kopf_loop() as kopf_:
        memo.pod_syncs = kopf_.pool
        add_pod(cluster, "chat", 0, older.port)
        handlers.reconcile_spec(body=cluster.get(), memo=memo, logger=log)
        kopf_.settled()  # the reconcile's sync, on the pool
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "False", cond
        cluster.patch("chat", {"spec": {"backend": "vllm"}})
        handlers.reconcile_spec(body=cluster.get(), memo=memo, logger=log)
    assert cluster.condition("Reconciled")["status"] == "True"
    assert _pods_condition(cluster) is None
    assert "pods" not in cluster.status()


def test_the_pods_condition_quotes_a_pods_answer_only_so_far(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """The restart knobs a pod says it runs are quoted as it answered them: a tenant's
    image answering a 60 KB block size put 60 KB per pod (five pods listed) into the
    CR's status, which every status write then carried."""

    _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want = spec_config(cluster)
    pods = [PodStandIn(mint.for_body(cluster.get()), {**want, "block_size": "9" * 60_000})
            for _ in range(2)]
    memo = handler_memo(cluster, policy, mint)
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        sync_timer(cluster.get(), memo)
        # The operator's log (a warning per pod, once a minute) quoted it whole too.
        left = handle_of(cluster, cluster.get(), policy, mint).sync_config().left
    cond = _pods_condition(cluster)
    assert cond is not None and cond["status"] == "False", cond
    assert cond["message"].startswith("chat-pod-0: runs block_size=")
    assert "chat-pod-1" in cond["message"]
    assert len(cond["message"]) < 4096
    assert len(left) == 2 and all(len(why) < 400 for why in left), [len(w) for w in left]


def _unbuildable(ctx: Any) -> Any:
    """A controller factory whose study storage is down (open_study's ControllerError)."""
    from slopilot.tuner.loop.errors import ControllerError

    raise ControllerError("spec.tuning.storage: cannot reach the study's database")


def test_an_edit_reaches_the_pods_while_the_controller_cannot_be_built(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With tuning on, the daemon is the one that syncs: while its controller could not be
    built (the study's database down), no sync ran at all, and an edit of a live knob,
    in a spec the reconcile had accepted, never reached the pods."""
    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, engine={"tokenBudget": 1024}, tuning={"window": "1h"}))
    loop = daemon_loop(cluster, body, monkeypatch, factory=_unbuildable)
    want = spec_config(cluster)
    token, slo = mint.for_body(cluster.get()), parse_spec(cluster.get()).slo.to_dict()
    pod = PodStandIn(token, {**want, "token_budget": 512}, slo)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        assert loop.step()
        assert loop.controller is None  # not built: the Tuning condition says why
        assert running(pod) == want


def test_the_timer_leaves_the_pods_to_the_daemon_once_tuning_is_on(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """kopf hands the timer the object as it was when it was due: a sync begun on that
    copy after tuning was turned on sent the spec's config over the trial the daemon had
    just started on the canary. The timer judges who syncs on the object as it is now."""

    _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    stale = cluster.get()  # what kopf handed the timer
    cluster.patch("chat", {"spec": {"tuning": {"enabled": True}}})
    want = spec_config(cluster)
    canary = PodStandIn(mint.for_body(cluster.get()), {**want, "token_budget": 512},
                        parse_spec(cluster.get()).slo.to_dict())  # the daemon's trial
    memo = handler_memo(cluster, policy, mint)
    with serving(canary):
        add_pod(cluster, "chat", 0, canary.port)
        sync_timer(stale, memo)
    assert canary.puts == [] and running(canary)["token_budget"] == 512


def test_the_sync_itself_never_acts_on_a_spec_the_policy_refuses(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """Its callers judged the object they had read, and the sync read it again: an edit
    in between (a tenant's, made during the daemon's tick, which may take minutes) that
    the policy refuses had its knobs and SLO sent to the pods of the last accepted spec.
    A refused spec touches nothing, whoever reads it."""
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    accepted, slo = spec_config(cluster), parse_spec(body).slo.to_dict()
    pod = PodStandIn(mint.for_body(cluster.get()), accepted, slo)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        cluster.patch("chat", {"spec": {"image": "evil.example/miner:1",
                                        "engine": {"tokenBudget": 4096},
                                        "slo": {"profile": "relaxed"}}})
        with pytest.raises(ApplyError, match="not on the operator's image allow-list"):
            handle.sync_config()
        # The controller's own writes, a trial's or a commit's, likewise.
        with pytest.raises(ApplyError, match="not on the operator's image allow-list"):
            handle.apply_config({"token_budget": 512}, canary=False)
    assert pod.puts == [] and pod.slo_puts == [] and running(pod) == accepted
    assert "tunedConfig" not in cluster.status()


def test_an_edit_the_policy_refuses_made_during_the_daemons_tick_is_not_synced(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from slopilot.tuner.loop.controller import Controller
    from tests.operator.standins import GOOD, FakeProbe, FakeStudy, HoldingWindows, MoreReplicas

    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h"}))
    accepted = spec_config(cluster)
    token, slo = mint.for_body(cluster.get()), parse_spec(body).slo.to_dict()

    class EditedDuringTick:
        def firing(self) -> list[Any]:  # a tick is under way: the tenant edits the CR
            cluster.patch("chat", {"spec": {"image": "evil.example/miner:1",
                                            "engine": {"tokenBudget": 4096}}})
            return []

    def factory(ctx: Any) -> Controller:
        settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
        return Controller(settings, ctx.handle, EditedDuringTick(),  # type: ignore[arg-type]
                          HoldingWindows(), FakeStudy(queue=[dict(GOOD)]), FakeProbe(),
                          MoreReplicas(ctx), state=ctx.state)

    loop = daemon_loop(cluster, body, monkeypatch, factory=factory)
    pod = PodStandIn(token, accepted, slo)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        assert loop.step()
    assert parse_spec(cluster.get()).engine.token_budget == 4096  # the edit was made
    assert pod.puts == [] and running(pod) == accepted


@pytest.mark.parametrize("how", ["sync", "commit"])
def test_one_sync_takes_at_most_its_deadline_however_many_pods_answer_slowly(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    """Each request to a pod had a deadline (POD_ANSWER_DEADLINE_S), the sync as a whole
    none: up to four requests a pod, one pod after another, so a tenant's image that
    answered each just inside the deadline held the sync for a minute per replica (an
    hour at 64), begun again every minute; with it a kopf handler thread and the CR's
    lock, on which every reconcile and drift repair of that CR waits on a thread of its
    own. The pods a sync has no time left for are named, and the next sync goes on."""
    from slopilot.operator import pod_admin
    # One pod at a time, so that the clock each request moves is read in a known order.
    monkeypatch.setattr(pod_admin, "SYNC_FANOUT", 1)
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    slo = parse_spec(cluster.get()).slo.to_dict()
    clock = Clock()
    answer_s = pod_admin.POD_ANSWER_DEADLINE_S - 1  # inside each request's deadline
    pods = [PodStandIn(token, {**want, "token_budget": 512}, slo) for _ in range(4)]
    asked: list[tuple[str, str]] = []

    def slow(method: str, path: str) -> None:
        asked.append((method, path))
        clock.now += answer_s

    for pod in pods:
        pod.on_request = slow
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        # The requests' deadlines are timed by ``clock`` alone: on the wall clock, what is
        # left of the sync (2 s before the last request) would cut a busy machine's answer.
        handle = KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=policy,
                                      uid=body["metadata"]["uid"], clock=clock,
                                      timer=FiredTimers())
        start = clock.now
        if how == "commit":  # a commit's PUTs to every replica, within the same bounds
            with pytest.raises(ApplyError, match=r"chat-pod-3.*SYNC_DEADLINE_S"):
                handle.apply_config({"token_budget": 768}, canary=False)
            assert "tunedConfig" not in (cluster.get().get("status") or {})
        else:
            done = handle.sync_config()
            assert done.pods == len(pods)
            assert [why.split()[0].rstrip(":") for why in done.left][-1] == "chat-pod-3"
            assert "SYNC_DEADLINE_S" in done.left[-1]
    # Every request began inside the sync's deadline, and none was begun after it.
    assert clock.now - start < pod_admin.SYNC_DEADLINE_S + answer_s
    assert len(asked) * answer_s < pod_admin.SYNC_DEADLINE_S + answer_s
    assert pods[-1].gets == 0 and pods[-1].puts == []


def test_a_request_gets_only_what_is_left_of_the_syncs_deadline(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's deadline bounds the request under way too, not only the next pod's:
    a pod that drips its answer is cut when the sync's time is up. The sync's clock
    stands still, so its whole deadline is left for the request, however long a busy
    machine took to send it."""
    from slopilot.operator import pod_admin
    monkeypatch.setattr(pod_admin, "POD_ANSWER_DEADLINE_S", 3600.0)
    monkeypatch.setattr(pod_admin, "SYNC_DEADLINE_S", 0.5)
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    dripping = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    dripping.drip_s = 0.05
    with serving(dripping):
        add_pod(cluster, "chat", 0, dripping.port)
        timers = FiredTimers()
        handle = handle_of(cluster, body, policy, mint, clock=Clock(), timer=timers)
        done = sync_until_the_drip_is_cut(handle, timers, dripping)
        assert dripping.answer_cut.wait(timeout=HANG_GUARD_S)
    assert len(done.left) == 1 and done.left[0].startswith("chat-pod-0")
    assert "0.5 s of this sync (SYNC_DEADLINE_S)" in done.left[0]


def _engine_pod(cluster: Cluster, namespace: str, pod: str, port: int, template_hash: str,
                deployment_uid: str | None = None) -> None:
    """A ready pod of a ReplicaSet that the Deployment ``chat`` of ``namespace``
    controls (what the Deployment controller makes): the one there now, or the one whose
    uid is ``deployment_uid``."""
    from slopilot.operator.owned_meta import selector
    from slopilot.operator.pod_layout import ADMIN_PORT_NAME

    if deployment_uid is None:
        deployment_uid = cluster.kube.get("apps/v1", "deployments", namespace,
                                          "chat")["metadata"]["uid"]
    labels = {**selector("chat"), "pod-template-hash": template_hash}
    rs = cluster.kube.create("apps/v1", "replicasets", namespace, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": f"chat-{template_hash}", "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "chat",
            "uid": deployment_uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "engine", "image": "x"}]}}}})
    cluster.kube.create("v1", "pods", namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"containers": [{"name": "engine", "image": "x", "ports": [
            {"name": ADMIN_PORT_NAME, "containerPort": port}]}]}})
    cluster.kube.patch("v1", "pods", namespace, pod, {"status": {
        "phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")


def test_a_deployments_token_and_config_reach_its_own_pods_only(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A tenant's ``chat`` never has another's pods synced, nor sends its token there:
    not the ``chat`` of another namespace, nor the pods of a deleted ``chat`` of the same
    name (another uid) that still run while the garbage collector takes them."""
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want = spec_config(cluster)
    other = cluster.custom.create_namespaced_custom_object(
        "slopilot.dev", "v1alpha1", "team-b", "llmdeployments",
        {**llmd(tuning={"enabled": False}), "metadata": {"name": "chat",
                                                         "namespace": "team-b"}})
    assert reconcile(cluster.kube, other, policy=policy, mint=mint).valid
    asked: dict[str, list[tuple[str, str]]] = {}

    def standin(name: str, token: str) -> PodStandIn:
        pod = PodStandIn(token, {**want, "token_budget": 512})
        pod.on_request = lambda method, path: asked.setdefault(name, []).append(
            (method, path))
        return pod

    old_deployment = cluster.owned("apps/v1", "deployments", "chat")["metadata"]["uid"]
    cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                   "llmdeployments", "chat")
    successor = cluster.create(llmd(tuning={"enabled": False}))
    assert reconcile(cluster.kube, successor, policy=policy, mint=mint).valid
    pods = {"old": standin("old", mint.for_body(body)),
            "new": standin("new", mint.for_body(successor)),
            "team-b": standin("team-b", mint.for_body(other))}
    with serving(*pods.values()):
        # The first chat's pod, which the garbage collector has not deleted yet.
        _engine_pod(cluster, NS, "chat-old", pods["old"].port, "0ld", old_deployment)
        _engine_pod(cluster, NS, "chat-new", pods["new"].port, "n3w")
        _engine_pod(cluster, "team-b", "chat-b", pods["team-b"].port, "b")
        assert len(cluster.core.list_namespaced_pod(NS).items) == 2
        done = handle_of(cluster, successor, policy, mint).sync_config()
    assert done.updated == ("chat-new",) and done.left == ()
    assert set(asked) == {"new"}
    assert [auth for _, auth in pods["new"].puts] == [f"Bearer {mint.for_body(successor)}"]


def test_a_pod_that_holds_its_answers_keeps_no_other_pod_from_its_config(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods were asked one after another: a pod whose engine thread is wedged (its
    event loop still answers the readiness probe, while a PUT waits on the engine
    thread until its deadline) held every pod after it, and two such pods spent the
    whole sync, so an edit reached no other pod, sync after sync. Here the slow pod
    answers only once the others have their config; asked one after another, they never
    would."""
    from slopilot.operator import pod_admin
    for limit in ("HTTP_TIMEOUT_S", "POD_ANSWER_DEADLINE_S", "SYNC_DEADLINE_S"):
        monkeypatch.setattr(pod_admin, limit, 3600.0)  # the hold outlasts none of them
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    slo = parse_spec(cluster.get()).slo.to_dict()
    pods = [PodStandIn(token, {**want, "token_budget": 512}, slo) for _ in range(3)]
    release = threading.Event()
    pods[0].on_request = lambda method, path: release.wait()
    done: list[Any] = []
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        sync = threading.Thread(target=lambda: done.append(handle.sync_config()))
        sync.start()
        try:
            wait_for(lambda: all(running(p) == want for p in pods[1:]),
                     "the pods after the slow one get their config")
        finally:
            release.set()
            sync.join(timeout=HANG_GUARD_S)
    assert done and set(done[0].updated) == {"chat-pod-0", "chat-pod-1", "chat-pod-2"}
    assert done[0].left == ()


def test_a_commit_reaches_every_other_pod_while_one_holds_its_answer(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit (``apply_config`` to every replica) sent its PUTs one pod after another,
    with no deadline but each request's: a wedged pod held the pods after it, and 64
    slow ones held the deployment's daemon thread for 16 minutes, a thread that outlives
    its cancelled daemon. It asks them as the sync does: side by side."""
    from slopilot.operator import pod_admin
    for limit in ("HTTP_TIMEOUT_S", "POD_ANSWER_DEADLINE_S", "SYNC_DEADLINE_S"):
        monkeypatch.setattr(pod_admin, limit, 3600.0)  # the hold outlasts none of them
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want, token = spec_config(cluster), mint.for_body(cluster.get())
    pods = [PodStandIn(token, dict(want)) for _ in range(3)]
    release = threading.Event()
    failed: list[BaseException] = []

    def commit() -> None:
        try:
            handle.apply_config({"token_budget": 512}, canary=False)
        except BaseException as exc:  # reported below
            failed.append(exc)

    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        handle = handle_of(cluster, body, policy, mint)
        # The pod the handle asks first holds its answer.
        first = int(str(handle.pods(cluster.get())[0]["metadata"]["name"]).rsplit("-", 1)[1])
        pods[first].on_request = lambda method, path: release.wait()
        worker = threading.Thread(target=commit)
        worker.start()
        try:
            wait_for(lambda: all(running(p)["token_budget"] == 512
                                 for i, p in enumerate(pods) if i != first),
                     "the pods after the slow one get the committed config")
        finally:
            release.set()
            worker.join(timeout=HANG_GUARD_S)
    assert not failed and all(running(p)["token_budget"] == 512 for p in pods)
