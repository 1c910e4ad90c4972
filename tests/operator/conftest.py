"""Fixtures for operator tests: a Kubernetes API emulator served over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes.client
import pytest

from slopilot.operator import commands
from slopilot.operator.policy import OperatorPolicy
from tests.operator.operator_support import Cluster
from tests.operator.standins import PrometheusStandIn, serving
from tests.support.kube_server import RunningEmulator, serve_emulator


@pytest.fixture(autouse=True)
def study_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own answers to "was this trial told failed" (failed_trials.py), kept
    from no other test, and waited for however long the study takes: the operator's 2 s
    bound is for a database that hangs, and a busy machine's SQLite read past it would
    change what a test's reconcile renders."""
    from slopilot.operator import vllm_take_back
    from slopilot.operator.failed_trials import FailedTrials

    monkeypatch.setattr(vllm_take_back, "FAILED_TRIALS", FailedTrials(deadline_s=3600.0))


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[RunningEmulator]:
    """The emulator on 127.0.0.1:<free port>, with the ``default`` namespace.

    ``kube.kubeconfig`` is a kubeconfig file for kopf (``KUBECONFIG``) and kubectl-like
    tools; ``kube.emulator.objects`` is kmock's store for assertions.
    """
    with serve_emulator(tmp_path) as running:
        yield running


@pytest.fixture
def kube_client(kube: RunningEmulator) -> Iterator[kubernetes.client.ApiClient]:
    """The official client, configured for the emulator."""
    with kube.api_client() as client:
        yield client


@pytest.fixture
def kube_login(kube: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> RunningEmulator:
    """Point kopf's default login (via the official client) at the emulator.

    kubernetes.config reads ``KUBECONFIG`` once, at import, into
    ``KUBE_CONFIG_DEFAULT_LOCATION``; setting the variable in a test is too late, so the
    module default is patched as well.
    """
    import kubernetes.config.kube_config as kube_config

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kube.kubeconfig))
    return kube


@pytest.fixture
def cluster(kube_client: kubernetes.client.ApiClient) -> Cluster:
    """The official client's view of the emulator (operator_support.Cluster)."""
    return Cluster(kube_client)


@pytest.fixture
def controller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's controllers from standins.build_controller, ticking every 0.2 s."""
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY", "tests.operator.standins:build_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.2")


@pytest.fixture
def teams(tmp_path: Path) -> Path:
    """A folder for one study database per namespace (``teams/{namespace}.db``)."""
    out = tmp_path / "teams"
    out.mkdir()
    return out


@pytest.fixture
def studies(tmp_path: Path) -> Path:
    """The directory the administrator's ``sqlite:////dir/*`` entry allows."""
    out = tmp_path / "studies"
    out.mkdir()
    return out


@pytest.fixture
def directory_policy(studies: Path) -> OperatorPolicy:
    """Studies in any file of ``studies``."""
    return OperatorPolicy(allowed_storage=(f"sqlite:///{studies}/*",))


@pytest.fixture
def prom() -> Iterator[PrometheusStandIn]:
    """A Prometheus stand-in answering the alerts a test sets (standins.py)."""
    p = PrometheusStandIn()
    with serving(p):
        yield p


@pytest.fixture
def kopf_runs(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[threading.Event], None]]:
    """``slopilot operator`` with kopf itself never started: what the command would
    have run, recorded (and no reclaim of studies, no in-cluster login)."""
    ran: list[Callable[[threading.Event], None]] = []

    def record(run_kopf: Callable[[threading.Event], None], *_: object) -> int:
        ran.append(run_kopf)
        return 0
    monkeypatch.setattr(commands, "_run_until_signalled", record)
    monkeypatch.setattr(commands, "_reclaim", lambda namespaces: None)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return ran
