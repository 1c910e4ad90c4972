"""Two daemons on one CR (two operator replicas before the peering has paused one, or a
replica run ``--standalone`` beside another): one episode, one trial running.

Each daemon ticked its own controller and wrote its state over the other's: both asked
a trial of the study (two RUNNING, each beaten for by its daemon), each put its config
on the pods, and the status named whichever was written last. Now a daemon writes
``status.controller`` only over the state it last read or wrote there; one that finds
another's state there drops its own (its trial told failed) and resumes the other's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.operator.crd import crd_manifest
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import (
    NS,
    Cluster,
    add_pod,
    daemon_loop,
    llmd,
    operator_mint,
)
from tests.operator.standins import (
    PodStandIn,
    PrometheusStandIn,
    build_study_controller,
    serving,
)
from tests.operator.test_live_config import running, spec_config
from tests.support.kube_server import RunningEmulator

T = TypeVar("T")


@pytest.fixture
def engine_pod() -> Iterator[PodStandIn]:
    """A built-in engine pod's admin API, serving; ``two_daemons`` makes it the CR's."""
    pod = PodStandIn()
    with serving(pod):
        yield pod


def two_daemons(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                pod: PodStandIn | None = None) -> tuple[Any, Any, optuna.Study]:
    """A vLLM chat on a real study, with two daemons stepped once each (steady); with
    ``pod``, a built-in one whose one replica (trials on every replica) that pod is."""
    kube.install(crd_manifest())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    backend = {"backend": "vllm"} if pod is None else {}
    body = cluster.create(llmd(**backend, prometheus={"url": prom.url},
                               tuning={"window": "1h", "storage": storage}))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    if pod is not None:
        pod.token = operator_mint(cluster).for_body(cluster.get())
        pod.config = spec_config(cluster)
        add_pod(cluster, "chat", 0, pod.port)
    a, b = (daemon_loop(cluster, cluster.get(), monkeypatch, factory=build_study_controller,
                        policy=policy) for _ in range(2))
    assert a.step() and b.step()
    study = optuna.load_study(study_name=f"{NS}/chat/{body['metadata']['uid']}",
                              storage=storage)
    return a, b, study


def states(study: optuna.Study) -> dict[int, TrialState]:
    return {t.number: t.state for t in study.get_trials(deepcopy=False)}


def on_record(cluster: Cluster) -> int | None:
    trial = (cluster.status().get("controller") or {}).get("trial")
    return None if trial is None else int(trial["number"])


def test_a_daemon_that_finds_anothers_trial_on_record_resumes_it(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    assert a.step() and on_record(cluster) == 0
    for _ in range(2):
        assert b.step() and a.step()
    assert states(study) == {0: TrialState.RUNNING}  # b asked none of its own
    assert on_record(cluster) == 0
    assert b.controller is not None and b.controller.loop.trial is not None
    assert b.controller.loop.trial.number == 0


def test_a_daemon_whose_tick_raced_anothers_write_drops_its_trial(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    tick = b.controller.tick

    def raced(now: float, **kw: Any) -> Any:  # a writes its trial while b's tick is under way
        assert a.step()
        return tick(now, **kw)

    monkeypatch.setattr(b.controller, "tick", raced)
    assert b.step()
    assert on_record(cluster) == 0  # a's, not overwritten by b's
    assert states(study) == {0: TrialState.RUNNING, 1: TrialState.FAIL}
    assert "another" in study.trials[1].user_attrs["fail_reason"]
    assert b.step() and b.controller.loop.trial is not None
    assert b.controller.loop.trial.number == 0 and on_record(cluster) == 0


def engine_args(cluster: Cluster) -> list[str]:
    """The vLLM container's arguments as the Deployment renders them now."""
    dep = cluster.owned("apps/v1", "deployments", "chat")
    assert dep is not None
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def trial_on_record(cluster: Cluster) -> dict[str, Any]:
    """The running trial's knobs as ``status.controller`` names them."""
    return dict(cluster.status()["controller"]["trial"]["config"])


def other_draws(loop: Any) -> None:
    """``loop``'s study asks with its own seed: both daemons' samplers are seeded alike,
    and would draw the same first config, which hides whose config the pods run."""
    loop.controller.study.study.sampler = optuna.samplers.RandomSampler(seed=7)


def runs(cluster: Cluster, config: dict[str, Any]) -> bool:
    """Whether ``status.tunedConfig`` (what the Deployment renders) holds ``config``'s
    batch knobs (vLLM's sequence cap is derived from the budget, so not compared)."""
    tuned = (cluster.status().get("tunedConfig") or {}).get("engine") or {}
    return all(tuned.get(k) == v for k, v in config.items() if k != "max_num_seqs")


def a_records_first(a: Any, b: Any, monkeypatch: pytest.MonkeyPatch,
                    observe: Callable[[], T]) -> list[T]:
    """b steps, but a asks, applies and records its trial while b's tick is under way:
    what ``observe`` saw once a's trial was on record."""
    tick = b.controller.tick
    seen: list[T] = []

    def raced(now: float, **kw: Any) -> Any:
        assert a.step()
        seen.append(observe())
        return tick(now, **kw)

    monkeypatch.setattr(b.controller, "tick", raced)
    assert b.step()
    return seen


def test_vllm_a_losing_daemons_trial_config_is_not_left_on_the_deployment(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """a's trial is on record when b's stale tick asks one of its own: vLLM has no
    canary, so b's trial rolled every replica and was recorded as the deployment's
    config, which then ran under a's trial (measured as a's) and stayed after it."""
    a, b, _ = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    other_draws(b)
    seen = a_records_first(a, b, monkeypatch, lambda: engine_args(cluster))
    assert on_record(cluster) == 0
    assert b.step() and a.step()
    assert on_record(cluster) == 0
    assert runs(cluster, trial_on_record(cluster)), cluster.status().get("tunedConfig")
    assert engine_args(cluster) == seen[0]


def both_apply_before_a_writes(a: Any, b: Any, study: optuna.Study,
                               monkeypatch: pytest.MonkeyPatch,
                               observe: Callable[[], T]) -> list[T]:
    """a's trial applied, then b's over it, then a's state written first: what
    ``observe`` saw after each apply. b's trial is dropped (its state not on record)."""
    a_tick, b_tick = a.controller.tick, b.controller.tick
    seen: list[T] = []

    def raced(now: float, **kw: Any) -> Any:
        mine = a_tick(now, **kw)  # a's trial applied, its state not yet written
        seen.append(observe())
        theirs = b_tick(now, **kw)  # b's applied over it
        seen.append(observe())
        monkeypatch.setattr(a.controller, "tick", lambda _now, **_: mine)
        assert a.step()  # a's state written first
        return theirs

    monkeypatch.setattr(b.controller, "tick", raced)
    assert b.step()
    assert states(study) == {0: TrialState.RUNNING, 1: TrialState.FAIL}
    assert seen[0] != seen[1]  # b's trial did reach the replicas
    return seen


def test_vllm_a_trial_applied_before_anothers_state_was_written_is_put_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """b's trial rolled the replicas after a's did, but a's state reached the status
    first: b's trial is dropped, and its config must not stay on the deployment that
    measures a's trial."""
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    other_draws(b)
    seen = both_apply_before_a_writes(a, b, study, monkeypatch, lambda: engine_args(cluster))
    assert on_record(cluster) == 0
    for _ in range(2):
        assert b.step() and a.step()
    assert on_record(cluster) == 0
    assert runs(cluster, trial_on_record(cluster)), cluster.status().get("tunedConfig")
    assert engine_args(cluster) == seen[0]


def test_vllm_a_trial_config_on_record_without_its_trial_is_reverted_at_the_next_sync(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A trial's config is recorded as a trial, not as the committed config: a daemon
    that finds it with no trial on record (its trial's daemon lost, or the operator
    restarted after a trial's state was reset) puts the committed config back."""
    a, _, _ = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    before = engine_args(cluster)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    assert a.step() and on_record(cluster) == 0
    assert engine_args(cluster) != before
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat",
                       {"status": {"controller": None}}, subresource="status")
    a.close()
    fresh = daemon_loop(cluster, cluster.get(), monkeypatch, factory=build_study_controller,
                        policy=a.policy)
    prom.alerts = []  # no alert: the fresh daemon stays steady
    assert fresh.step()
    assert engine_args(cluster) == before
    assert "tunedConfig" not in cluster.status()


def test_vllm_a_trial_on_record_when_tuning_is_turned_off_is_not_rendered(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """Turned off while no operator ran (no daemon ended the trial, and the resume
    handler only reconciles), a trial's recorded config stayed on the pods for good."""
    kube.install(crd_manifest())
    policy = OperatorPolicy()
    body = cluster.create(llmd(backend="vllm", engine={"tokenBudget": 1024},
                               tuning={"enabled": False}))
    committed = parse_spec(body).engine.with_overrides({"token_budget": 2048}).to_dict()
    trial = parse_spec(body).engine.with_overrides({"token_budget": 512}).to_dict()
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "tunedConfig": {"engine": trial, "base": engine_checksum(body), "trial": True,
                        "committed": committed}}}, subresource="status")
    assert reconcile(cluster.kube, cluster.get(), policy=policy,
                     mint=operator_mint(cluster)).valid
    args = engine_args(cluster)
    assert args[args.index("--max-num-batched-tokens") + 1] == "2048"


def config_map_engine(cluster: Cluster) -> dict[str, Any]:
    """The built-in engine's config as the ConfigMap tells a pod that starts now."""
    cm = cluster.owned("v1", "configmaps", "chat-engine")
    assert cm is not None
    return dict(json.loads(cm["data"]["engine.json"]))


def holds(config: dict[str, Any], knobs: dict[str, Any]) -> bool:
    """Whether ``config`` runs ``knobs`` (a trial's)."""
    return all(config.get(k) == v for k, v in knobs.items())


def test_builtin_a_losing_daemons_trial_config_is_not_left_on_the_pods(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_pod: PodStandIn) -> None:
    """With one replica a built-in trial goes to every pod and was recorded as the
    deployment's config: a's trial on record, b's stale tick put its own on the pod and
    in status.tunedConfig, which the sync then sent the pod as the spec's (measured as
    a's trial) and the ConfigMap rendered, until the next commit."""
    a, b, _ = two_daemons(kube, cluster, prom, monkeypatch, tmp_path, engine_pod)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    other_draws(b)
    a_records_first(a, b, monkeypatch, lambda: running(engine_pod))
    assert on_record(cluster) == 0
    assert b.step() and a.step()
    assert on_record(cluster) == 0
    trial = trial_on_record(cluster)
    assert holds(running(engine_pod), trial), (running(engine_pod), trial)
    assert holds(config_map_engine(cluster), trial), cluster.status().get("tunedConfig")
    # And still a trial's record: b's rollback, after its own record was refused, wrote
    # its target over a's as the committed config, unconditionally.
    assert cluster.status()["tunedConfig"].get("trial") is True, cluster.status()


def test_builtin_a_trial_applied_before_anothers_state_was_written_is_put_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_pod: PodStandIn) -> None:
    """b's trial went to the pod after a's did, but a's state reached the status first:
    b's config must not stay on the pod, nor in the ConfigMap, under a's trial."""
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path, engine_pod)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    other_draws(b)
    seen = both_apply_before_a_writes(a, b, study, monkeypatch, lambda: running(engine_pod))
    assert on_record(cluster) == 0
    for _ in range(2):
        assert b.step() and a.step()
    assert on_record(cluster) == 0
    trial = trial_on_record(cluster)
    assert running(engine_pod) == seen[0]
    assert holds(config_map_engine(cluster), trial), cluster.status().get("tunedConfig")


def test_builtin_a_trial_config_on_record_without_its_trial_is_reverted_at_the_next_sync(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_pod: PodStandIn) -> None:
    """A one-replica trial's config is recorded as a trial's: a daemon that finds it with
    no trial on record puts the committed config back, on the pod and in the ConfigMap."""
    a, _, _ = two_daemons(kube, cluster, prom, monkeypatch, tmp_path, engine_pod)
    before = running(engine_pod)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    assert a.step() and on_record(cluster) == 0
    assert running(engine_pod) != before and config_map_engine(cluster) != before
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat",
                       {"status": {"controller": None}}, subresource="status")
    a.close()
    fresh = daemon_loop(cluster, cluster.get(), monkeypatch, factory=build_study_controller,
                        policy=a.policy)
    prom.alerts = []  # no alert: the fresh daemon stays steady
    assert fresh.step()
    assert running(engine_pod) == before and config_map_engine(cluster) == before
    assert "tunedConfig" not in cluster.status()
