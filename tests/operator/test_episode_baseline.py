"""An episode begins on the committed config, never on a trial's that is on the pods.

A trial on every replica (vLLM's, or a built-in one's with one replica) is recorded in
``status.tunedConfig`` as a trial's, the committed config kept beside it. An operator that
restarts after the trial's config was recorded but before its loop state was (or whose
state was reset, or is another daemon's) finds no trial in ``status.controller``; an alert
still firing starts a new episode. That episode's baseline, its rollback target and the
warm start's reference, was read from the config the pods run: the old trial's, which
was never committed, and which its rollback then recorded as the committed config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slopilot.operator import deployment_loop
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import NS, Cluster, daemon_loop
from tests.operator.standins import PodStandIn, PrometheusStandIn, build_study_controller
from tests.operator.test_daemon_peers import engine_pod, two_daemons  # noqa: F401 - a fixture
from tests.operator.test_live_config import spec_config
from tests.support.kube_server import RunningEmulator

COMMITTED = {"token_budget": 1536, "chunk_size": 512}


def commit_by_hand(cluster: Cluster, knobs: dict[str, Any]) -> None:
    """``knobs`` over the spec recorded as the committed config, as a commit writes it."""
    body = cluster.get()
    engine = parse_spec(body).engine.with_overrides(knobs).to_dict()
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "tunedConfig": {"engine": engine, "base": engine_checksum(body)}}},
        subresource="status")


def knobs(config: dict[str, Any]) -> dict[str, Any]:
    """A config without the sequence cap: vLLM's pods get one derived from the budget."""
    return {k: v for k, v in config.items() if k != "max_num_seqs"}


@pytest.mark.parametrize("committed", [None, COMMITTED], ids=["spec", "committed"])
@pytest.mark.parametrize("backend", ["vllm", "builtin"])
def test_an_episode_begun_while_a_trial_is_recorded_keeps_the_committed_baseline(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_pod: PodStandIn,  # noqa: F811
        backend: str, committed: dict[str, Any] | None) -> None:
    a, _, _ = two_daemons(kube, cluster, prom, monkeypatch, tmp_path,
                          engine_pod if backend == "builtin" else None)
    if committed is not None:
        commit_by_hand(cluster, committed)
    before = spec_config(cluster)  # the committed config (the spec's where none is)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the operator stopped")

    # a applies and records its trial, then stops before its state reaches the status.
    with monkeypatch.context() as m:
        m.setattr(deployment_loop, "write_status", lost)
        assert a.step()
    a.close()
    tuned = cluster.status()["tunedConfig"]
    assert tuned.get("trial") is True and knobs(tuned["engine"]) != knobs(before), tuned
    assert (cluster.status().get("controller") or {}).get("trial") is None

    restarted = daemon_loop(cluster, cluster.get(), monkeypatch,
                            factory=build_study_controller, policy=a.policy)
    assert restarted.step()  # the alert still fires: a new episode, its first trial
    loop = restarted.controller.loop
    assert loop.trial is not None and loop.baseline_config is not None
    assert knobs(loop.baseline_config) == knobs(before), loop.baseline_config
    # Tuning turned off mid-trial restores the baseline: the committed config again.
    restarted.abandon("tuning was disabled", restore=True)
    tuned = cluster.status()["tunedConfig"]
    assert tuned.get("trial") is not True and knobs(spec_config(cluster)) == knobs(before)
