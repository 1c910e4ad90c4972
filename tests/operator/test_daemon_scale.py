"""Many tuning CRs at once: the daemons do not take kopf's handler threads from reconciles.

kopf runs sync handlers on a pool of min(32, CPUs + 4) threads (6 on a 2-core box). A
sync daemon held one of them for its life, so with a handful of tuning CRs a new CR got
no objects at all. The daemons are async now, stepping on the operator's own pool
(tuning_pool.py), of which these 40 CRs of one namespace hold their namespace's share.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import threading

import kubernetes.client
import pytest

from slopilot.operator.tuning_pool import STEP_THREADS
from tests.operator.operator_support import Cluster, llmd, operator, wait_for
from tests.operator.standins import PrometheusStandIn, serving
from tests.support.kube_server import RunningEmulator

CRS = 40


def test_forty_tuning_crs_leave_kopf_free_to_reconcile_a_new_one(
        kube_login: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY", "tests.operator.standins:build_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "10")
    cluster = Cluster(kube_client)
    prom = PrometheusStandIn()
    with serving(prom), operator(kube_login) as runner:
        for i in range(CRS):
            cluster.create(llmd(f"t{i}", prometheus={"url": prom.url}))
        names = [f"t{i}" for i in range(CRS)]
        wait_for(lambda: all(cluster.status(n).get("controller") for n in names),
                 what=f"all {CRS} controllers ticking")
        # A thread each before: as many as the tenant's CRs.
        steps = {t.name for t in threading.enumerate() if t.name.startswith("tuning-")}
        assert 0 < len(steps) <= STEP_THREADS, sorted(steps)
        # With every daemon running, a new CR still gets its objects and its status.
        cluster.create(llmd("late", prometheus={"url": prom.url}, tuning={"enabled": False}))
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "late"),
                 what="the new CR's Deployment")
        wait_for(lambda: cluster.status("late").get("phase") == "Running",
                 what="the new CR's status")
    assert runner.exit_code == 0
