"""``slopilot operator`` as users run it: a process with a kubeconfig, joined to the peering."""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client
import pytest
import yaml

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.tuner.local.held_port import HeldPort
from tests.operator.operator_support import Cluster, llmd, wait_for
from tests.support import waits
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

PEERING = Path(__file__).parents[2] / "manifests" / "kopf-peering.yaml"


def test_operator_command_reconciles_and_joins_the_slopilot_peering(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        tmp_path: Path) -> None:
    kube.install(crd_manifest(), *yaml.safe_load_all(PEERING.read_text()))
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONUNBUFFERED": "1"}
    env.pop("SLOPILOT_CONTROLLER_FACTORY", None)
    log = (tmp_path / "operator.log").open("w+")
    # A port of its own: kopf serves port 0 on port 80, which two pytest workers' (or
    # another process's) operators then raced for, the loser stopping before it
    # reconciled anything. kopf's server binds it with SO_REUSEADDR, as a held port allows.
    liveness = HeldPort()
    proc = subprocess.Popen(
        [sys.executable, "-m", "slopilot.cli", "operator", "--all-namespaces",
         "--peering=slopilot", f"--liveness=http://127.0.0.1:{liveness.port}/healthz"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    cluster = Cluster(kube_client)
    try:
        cluster.create(llmd())
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
                 what="the Deployment from the operator process")
        probe = waits.wait_for(lambda: httpx.get(f"http://127.0.0.1:{liveness.port}/healthz",
                                           timeout=HANG_GUARD_S),
                               what="the liveness probe served",
                               tolerate=(httpx.ConnectError,))
        assert probe.status_code == 200
        peering = wait_for(lambda: (cluster.custom.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "slopilot").get("status") or None),
            what="the operator to announce itself in the peering")
        assert len(peering) == 1
        # Without a factory for its Prometheus ports, the controller says why it is idle.
        tuning = wait_for(lambda: cluster.condition("Tuning"), what="the Tuning condition")
        assert tuning["reason"] == "ControllerUnavailable"
        assert "SLOPILOT_CONTROLLER_FACTORY" in tuning["message"]
        wait_for(lambda: cluster.status().get("phase") == "Running", what="phase Running")
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=HANG_GUARD_S)
        liveness.release()
        log.seek(0)
        output = log.read()
    assert code == 0, output


def test_a_liveness_port_of_0_is_refused_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    """kopf serves ``http://HOST:0/...`` on port 80 (``port or 80``), not a free port."""
    from slopilot.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["operator", "--all-namespaces", "--liveness=http://127.0.0.1:0/healthz"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--liveness 'http://127.0.0.1:0/healthz'" in err and "port 80" in err, err


def test_operator_command_needs_a_scope(capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    # A usage error, exit 2 as argparse's own are (it exited 1, as a failure would).
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--standalone"])
    assert exited.value.code == 2
    assert "--all-namespaces or --namespace" in capsys.readouterr().err


def test_the_operator_makes_its_peering_object_where_it_works(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    from slopilot.operator.kubeapi import Kube
    from slopilot.operator.peering import ensure_peering

    kube.install(*yaml.safe_load_all(PEERING.read_text()))  # the CRDs only
    api = Kube(kube_client)
    assert ensure_peering(api, "slopilot", namespaces=[]).created == [
        "ClusterKopfPeering/slopilot"]
    assert ensure_peering(api, "slopilot", namespaces=[]).created == []  # there already
    assert ensure_peering(api, "slopilot", namespaces=["team-a", "team-*"]).created == [
        "KopfPeering/team-a/slopilot"]  # a glob names no namespace to put one in


class RefusingIn(Kube):
    """The emulator, but a create in ``namespace`` answered ``error`` (NamespaceLifecycle
    admission's answers are not the emulator's)."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str,
                 error: ApiError) -> None:
        super().__init__(client)
        self.namespace, self.error = namespace, error

    def create(self, api_version: str, plural: str, namespace: str | None,
               body: Mapping[str, Any]) -> dict[str, Any]:
        if namespace == self.namespace:
            raise self.error
        return super().create(api_version, plural, namespace, body)


@pytest.mark.parametrize("error", [
    ApiError(403, "Forbidden", 'kopfpeerings.kopf.dev "slopilot" is forbidden: unable to '
             "create new content in namespace team-b because it is being terminated"),
    ApiError(404, "NotFound", 'namespaces "team-b" not found'),
], ids=["terminating", "gone"])
def test_a_namespace_gone_or_being_deleted_is_skipped_at_the_start(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        caplog: pytest.LogCaptureFixture, error: ApiError) -> None:
    """Stopping there was a deadlock: the namespace waits on its CR's finalizer, which
    only the operator releases."""
    from slopilot.cli import build_parser
    from slopilot.operator.commands import _reach_api

    kube.install(*yaml.safe_load_all(PEERING.read_text()))
    args = build_parser().parse_args(
        ["operator", "--namespace", "team-a", "--namespace", "team-b"])
    with caplog.at_level(logging.WARNING):
        reached = _reach_api(RefusingIn(kube_client, "team-b", error), args,
                             threading.Event())
    assert reached is not None and list(reached.closed) == ["team-b"]
    assert Kube(kube_client).get("kopf.dev/v1", "kopfpeerings", "team-a", "slopilot")
    assert f"namespace team-b {reached.closed['team-b']}" in caplog.text, caplog.text


@pytest.mark.parametrize(("error", "why"), [
    # The API server's Status, its message worded otherwise (another version's, a
    # translation): the NamespaceLifecycle admission's structured parts decide.
    (ApiError(403, "Forbidden", "admission refused the create", details={
        "name": "slopilot", "group": "kopf.dev", "kind": "kopfpeerings",
        "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                    "message": "namespace team-b is terminating"}]}),
     "is being deleted (Terminating)"),
    (ApiError(404, "NotFound", "no such namespace", details={
        "name": "team-b", "kind": "namespaces"}), "is gone"),
    # Refused for other reasons, whatever their wording.
    (ApiError(403, "Forbidden", "cannot create in namespace team-b because it is being "
              "terminated", details={"name": "slopilot", "kind": "kopfpeerings"}), None),
    (ApiError(404, "NotFound", 'namespaces "team-b" not found', details={
        "name": "slopilot", "group": "kopf.dev", "kind": "kopfpeerings"}), None),
    # No details at all (a proxy's answer, an old server): the message is all there is.
    (ApiError(403, "Forbidden", "unable to create new content in namespace team-b "
              "because it is being terminated"), "is being deleted (Terminating)"),
], ids=["terminating", "gone", "forbidden", "no-crd", "message-only"])
def test_a_closed_namespace_is_told_by_the_status_not_its_wording(
        error: ApiError, why: str | None) -> None:
    from slopilot.operator.peering import namespace_closed

    assert namespace_closed(error) == why


def test_an_api_error_keeps_the_status_details() -> None:
    from slopilot.operator.kubeapi import api_error

    status = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
              "message": "m", "details": {"kind": "kopfpeerings", "causes": [
                  {"reason": "NamespaceTerminating", "message": "x"}]}}
    error = api_error(403, status, b"")
    assert (error.status, error.reason, error.message) == (403, "Forbidden", "m")
    assert error.details["causes"][0]["reason"] == "NamespaceTerminating"
    assert api_error(502, ["not", "a", "status"], b"oops").details == {}


@pytest.mark.parametrize(("error", "fix"), [
    (ApiError(403, "Forbidden", 'kopfpeerings.kopf.dev is forbidden: User "x" cannot '
              'create resource "kopfpeerings" in the namespace "team-b"'),
     "ClusterRole slopilot-operator in that namespace"),
    (ApiError(404, "NotFound", "the server could not find the requested resource"),
     "apply manifests/kopf-peering.yaml (its CRDs) first"),
], ids=["rbac", "no-crd"])
def test_a_refused_peering_object_stops_the_start_naming_the_fix(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        error: ApiError, fix: str) -> None:
    from slopilot.cli import build_parser
    from slopilot.operator.commands import _reach_api

    kube.install(*yaml.safe_load_all(PEERING.read_text()))
    args = build_parser().parse_args(
        ["operator", "--namespace", "team-a", "--namespace", "team-b"])
    with pytest.raises(SystemExit, match=re.escape(fix)):
        _reach_api(RefusingIn(kube_client, "team-b", error), args, threading.Event())


def test_a_namespace_being_deleted_at_the_start_is_left_out_of_kopf(
        kube_login: RunningEmulator, kopf_runs: list[Callable[[threading.Event], None]],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Served without its KopfPeering (none can be created there), it would hold every
    other namespace paused until it is gone, which its CR's finalizer prevents."""
    import kopf

    from slopilot.cli import main
    from slopilot.operator import commands, kubeapi

    kube_login.install(*yaml.safe_load_all(PEERING.read_text()))
    terminating = ApiError(403, "Forbidden", "unable to create new content in namespace "
                           "team-b because it is being terminated")
    monkeypatch.setattr(kubeapi, "Kube", lambda client: RefusingIn(client, "team-b",
                                                                   terminating))
    kept: list[Any] = []
    monkeypatch.setattr(commands, "_keep_peerings",
                        lambda kube, name, patterns, stop, strip=None:
                        kept.append(patterns))
    served: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: served.update(kwargs))
    with caplog.at_level(logging.WARNING):
        assert main(["operator", "--namespace", "team-a", "--namespace", "team-b",
                     "--peering", "slopilot"]) == 0
    kopf_runs[0](threading.Event())
    assert list(served["namespaces"]) == ["team-a"]
    assert kept[0].served("team-a") and not kept[0].served("team-b")
    # The very collection kopf was given: team-b is put back there once gone.
    assert kept[0] is served["namespaces"]
    assert "slopilot operator uninstall -n team-b" in caplog.text, caplog.text


def test_a_namespace_of_a_glob_being_deleted_at_the_start_is_left_out_of_kopf(
        kube_login: RunningEmulator, kopf_runs: list[Callable[[threading.Event], None]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    from slopilot.cli import main
    from slopilot.operator import commands

    kube_login.install(*yaml.safe_load_all(PEERING.read_text()),
                       *({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
                         for meta in ({"name": "team-a"},
                                      {"name": "team-b", "finalizers": ["test/hold"]})))
    with kube_login.api_client() as client:
        kubernetes.client.CoreV1Api(client).delete_namespace("team-b")  # Terminating
    kept: list[Any] = []
    monkeypatch.setattr(commands, "_keep_peerings",
                        lambda kube, name, patterns, stop, strip=None:
                        kept.append(patterns))
    served: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: served.update(kwargs))
    assert main(["operator", "--namespace", "team-*", "--peering", "slopilot"]) == 0
    kopf_runs[0](threading.Event())
    assert list(served["namespaces"]) == ["team-*, !team-b"]
    patterns = kept[0]
    assert patterns.served("team-a") and patterns.served("team-c")
    assert not patterns.served("team-b")
    patterns.reopen("team-b")  # gone: a team-b created again is the glob's again
    assert list(served["namespaces"]) == ["team-*"] and patterns.served("team-b")
