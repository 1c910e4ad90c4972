"""A storage that goes away under a running controller is said by its driver's own line.

Optuna's ``StorageInternalError`` says "invalid data in the commit, e.g. exceeding max
length" of a database that went away or is no database at all; the decision's reason,
and the ``Tuning`` condition with it, quote the error it was raised from
(``errors.said``)."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

from pathlib import Path

import pytest

from tests.operator.operator_support import Cluster, add_pod, daemon_loop
from tests.operator.standins import PrometheusStandIn, build_study_controller, serving
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.support.kube_server import RunningEmulator

HOUR_S = 3600.0


def test_a_storage_outage_says_the_drivers_own_error(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    db = tmp_path / "study.db"
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        loop = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                           policy=policy)
        loop.clock = lambda: now[0]
        assert loop.step()
        db.unlink()
        db.write_bytes(b"not a database" * 100)
        now[0] += HOUR_S + 1
        assert loop.step()
    # Optuna's own line blames "invalid data in the commit"; the driver's names the cause.
    assert "(cause: (sqlite3." in cluster.status()["controller"]["reason"]
