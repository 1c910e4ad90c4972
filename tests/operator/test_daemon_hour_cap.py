"""The hour's live-trial cap holds across an operator that dies mid-tick.

A trial is asked of the study and applied to the pods before the status write that
records its start (``LoopState.trial_starts``). A process killed in between (SIGKILL, an
OOM the trial itself may cause, a node lost) left a restarted operator with no record of
that start: the cap undercounted, and a crash loop applied trials without bound. The
start is stamped on the trial in the study before the apply; the restarted loop counts
the study's stamps with its own record (``trial_count.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.operator.operator_support import Cluster, add_pod, daemon_loop
from tests.operator.standins import PrometheusStandIn, build_study_controller, serving
from tests.operator.test_daemon_api_outage import died_unrecorded, study_trials
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.support.kube_server import RunningEmulator


def test_a_trial_a_dead_daemon_applied_unrecorded_counts_in_the_hourly_cap(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    policy = dataclasses.replace(policy, max_trials_per_hour=1)
    storage = policy.allowed_storage[0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        # Trial 0 applied, its start never reaching the status; then killed.
        died_unrecorded(cluster, body, monkeypatch, policy)
        restarted = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                                policy=policy)
        assert restarted.step()
        loop = restarted.controller.loop
        restarted.close()
    # The alert still fires, but this hour's one trial has run: no second is applied.
    assert study_trials(body, storage) == [(0, "RUNNING")]
    assert loop.trial is None and loop.state.value == "steady"
    # On record now: a second crash keeps it counted without the study's stamp.
    assert len(cluster.status()["controller"]["trial_starts"]) == 1
