"""A controller the daemon replaces or leaves stops beating for its study's trials.

Each controller's study holds a heartbeat thread for the trials it has open. A new spec
generation rebuilt the controller and dropped the old one with its thread still beating,
and a daemon that ended left its controller's beating: a thread per rebuild, for as long
as the operator ran, each keeping a trial alive that its controller no longer ran.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import pytest

from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.daemon import DaemonContext
from slopilot.operator.daemon_ends import DaemonEnds
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.tuning_pool import TuningPool
from slopilot.tuner.loop.controller import Controller
from tests.operator.operator_support import NS, Cluster, add_pod, daemon_loop, llmd, operator_mint
from tests.operator.standins import PodStandIn, PrometheusStandIn, build_study_controller, serving
from tests.operator.test_live_config import spec_config
from tests.support.kube_server import RunningEmulator


def beating(controller: Controller) -> bool:
    heartbeat = controller.study.heartbeat  # type: ignore[attr-defined]
    return heartbeat is not None and heartbeat.running


def tuning_cr(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
              tmp_path: Path) -> tuple[dict[str, Any], OperatorPolicy, PodStandIn]:
    """A reconciled CR tuning on a SQLite study, its pod, and a retune alert firing."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    kube.install(crd_manifest())
    body = cluster.create(llmd(prometheus={"url": prom.url},
                               tuning={"window": "1h", "storage": storage}))
    mint = operator_mint(cluster)
    assert reconcile(cluster.kube, body, policy=policy, mint=mint).valid
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    return body, policy, PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))


def test_a_rebuilt_controller_stops_the_old_ones_heartbeat(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    loop = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                       policy=policy)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        assert loop.step()
        old = loop.controller
        assert old.loop.trial is not None and beating(old)
        cluster.patch("chat", {"spec": {"engine": {"maxNumSeqs": 64}}})  # a new generation
        assert loop.step()
        new = loop.controller
        assert new is not old and not beating(old)
        # The trial goes on under the new controller, which beats for it now.
        assert new.loop.trial.number == old.loop.trial.number and beating(new)
        assert new.study.heartbeat.beating == {new.loop.trial.number}


class Stopped:
    """kopf's ``stopped`` flag as the daemon reads it: set, with ``reason``, once
    ``until`` holds."""

    def __init__(self, until: Callable[[], bool], reason: kopf.DaemonStoppingReason) -> None:
        self.until, self.set_reason = until, reason
        self.is_set = False

    def __bool__(self) -> bool:
        self.is_set = self.is_set or self.until()
        return self.is_set

    @property
    def reason(self) -> kopf.DaemonStoppingReason | None:
        return self.set_reason if self.is_set else None


@pytest.mark.parametrize("reason", [kopf.DaemonStoppingReason.OPERATOR_EXITING,
                                    kopf.DaemonStoppingReason.OPERATOR_PAUSING,
                                    kopf.DaemonStoppingReason.FILTERS_MISMATCH,
                                    kopf.DaemonStoppingReason.RESOURCE_DELETED],
                         ids=lambda r: r.name.lower())
def test_an_ended_daemon_leaves_no_heartbeat_behind(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        reason: kopf.DaemonStoppingReason) -> None:
    """However it ends (its trial told failed, or left for a restarted or the other
    operator to resume), the daemon's controller stops beating."""
    from slopilot.operator import deployment_loop, tuning_daemon

    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    built: list[Controller] = []

    def recorded(ctx: DaemonContext) -> Controller:
        built.append(build_study_controller(ctx))
        return built[-1]

    monkeypatch.setattr(tuning_daemon, "load_factory", lambda: recorded)
    monkeypatch.setattr(deployment_loop, "post_decision", lambda *a, **kw: None)
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.01")
    memo = types.SimpleNamespace(kube=cluster.kube, tokens=operator_mint(cluster),
                                 policy=policy, locks=LockTable(), tuning_pool=TuningPool(),
                                 tuning_daemons=DaemonEnds())
    stopped = Stopped(lambda: bool((cluster.status().get("controller") or {}).get("trial")),
                      reason)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        daemon: Any = tuning_daemon.run_controller  # kopf's type: every kwarg it passes
        asyncio.run(daemon(stopped, name="chat", namespace=NS, uid=body["metadata"]["uid"],
                           memo=memo, logger=logging.getLogger("test")))
    heartbeat = built[0].study.heartbeat if built else None  # type: ignore[attr-defined]
    assert heartbeat is not None  # it did beat for its trial
    assert [beating(c) for c in built] == [False] * len(built)
