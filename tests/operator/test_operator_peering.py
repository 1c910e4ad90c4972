"""Two ``slopilot operator`` replicas on one cluster: one acts, the other waits, then takes over.

Each process logs in with its own bearer token (its own kubeconfig), so the emulator's
request log tells which replica made each call, whatever client (kopf's or ours) made it.

No wall clock decides anything here: the replicas run with the production lifetime
(60 s, far above any keep-alive delay a busy machine causes, so the follower never
resumes while the leader lives), and a killed leader's lease is expired by the test
writing its ``lastseen`` into the past, as the passing of its lifetime would.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import kubernetes.client
import pytest
import yaml

from slopilot.operator import commands
from slopilot.operator.crd import crd_manifest
from slopilot.operator.settings import PEERING_LIFETIME_ENV, peering_lifetime_s
from tests.operator.operator_support import Cluster, llmd, wait_for
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

PEERING = Path(__file__).parents[2] / "manifests" / "kopf-peering.yaml"
PEERING_RESOURCES = {"clusterkopfpeerings", "kopfpeerings"}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
LONG_AGO = "2000-01-01T00:00:00+00:00"


@dataclass
class Replica:
    token: str
    proc: subprocess.Popen[bytes]
    log: IO[str]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=HANG_GUARD_S)


def start_replica(kube: RunningEmulator, tmp_path: Path, token: str, prio: int) -> Replica:
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = token
    kubeconfig = tmp_path / f"kubeconfig-{token}"
    kubeconfig.write_text(yaml.safe_dump(config))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    for name in ("SLOPILOT_CONTROLLER_FACTORY", "POD_ID", PEERING_LIFETIME_ENV):
        env.pop(name, None)
    log = (tmp_path / f"{token}.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slopilot.cli", "operator", "--all-namespaces",
         "--peering=slopilot", f"--priority={prio}"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    return Replica(token, proc, log)


def writes_by(kube: RunningEmulator, token: str) -> list[tuple[str, str, str | None]]:
    """(verb, resource plural, name) of every write the replica with ``token`` made."""
    out = []
    for r in list(kube.emulator):
        if (r.method.value in WRITES and r.resource is not None and r.resource.plural
                and r.headers.get("Authorization") == f"Bearer {token}"):
            out.append((r.method.value, r.resource.plural, r.name))
    return out


def object_writes(kube: RunningEmulator, token: str) -> list[tuple[str, str, str | None]]:
    """Writes other than the replica's own keep-alives in the peering object."""
    return [w for w in writes_by(kube, token) if w[1] not in PEERING_RESOURCES]


def peers(cluster: Cluster) -> dict[str, Any]:
    try:
        body = cluster.custom.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "slopilot")
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:  # the first replica has not created it yet
            return {}
        raise
    return dict(body.get("status") or {})


def expire(cluster: Cluster, priority: int) -> None:
    """The lease of the peer at ``priority`` runs out: its last keep-alive is long ago."""
    (identity, info), = [(i, p) for i, p in peers(cluster).items()
                         if p["priority"] == priority]
    cluster.custom.patch_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", "slopilot",
        {"status": {identity: {**info, "lastseen": LONG_AGO}}})


@pytest.fixture
def replicas(kube: RunningEmulator, tmp_path: Path) -> Iterator[list[Replica]]:
    kube.install(crd_manifest(), *yaml.safe_load_all(PEERING.read_text()))
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop(signal.SIGKILL)
        print(f"--- {replica.token} ---\n{replica.output()}")  # shown when the test fails
        replica.log.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_higher_priority_replica_acts_and_the_other_takes_over_when_it_goes(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, tmp_path: Path,
        replicas: list[Replica], sig: signal.Signals) -> None:
    cluster = Cluster(kube_client)
    # The leader first, so that the follower never sees a peering without it (were both
    # to start at once, the follower might act for a moment before the leader's first
    # keep-alive: kopf has no per-object locks).
    high = start_replica(kube, tmp_path, "op-high", 20)
    replicas.append(high)
    wait_for(lambda: any(p["priority"] == 20 for p in peers(cluster).values()),
             what="the priority-20 replica in the peering")
    low = start_replica(kube, tmp_path, "op-low", 10)
    replicas.append(low)
    # With a mandatory peering kopf starts paused, and stays so (silently) while it sees
    # a higher priority; it logs only when it resumes.
    wait_for(lambda: sorted(p["priority"] for p in peers(cluster).values()) == [10, 20],
             what="both replicas in the peering")
    assert "priority 10" in low.output() and "priority 20" in high.output()

    # (a) The leader reconciles; (b) the follower writes nothing but its keep-alives.
    cluster.create(llmd())
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
             what="the Deployment from the priority-20 replica")
    wait_for(lambda: cluster.status().get("phase") == "Running", what="phase Running")
    leader_writes = object_writes(kube, "op-high")
    assert ("POST", "deployments", None) in leader_writes, leader_writes
    assert any(w[1] == "llmdeployments" for w in leader_writes), leader_writes
    assert object_writes(kube, "op-low") == []
    assert "Resuming operations" not in low.output()
    assert writes_by(kube, "op-low"), "the follower sent no keep-alives at all"

    # (c) The leader goes (politely or not); the follower resumes and handles an edit.
    assert high.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL), high.output()
    if sig == signal.SIGKILL:  # no goodbye: its entry stays until its lease runs out
        assert any(p["priority"] == 20 for p in peers(cluster).values())
        expire(cluster, 20)
    wait_for(lambda: "Resuming operations after the pause" in low.output(),
             what="the priority-10 replica to resume")
    before = len(object_writes(kube, "op-high"))
    assert cluster.owned("apps/v1", "deployments", "chat")["spec"]["replicas"] == 1
    cluster.patch("chat", {"spec": {"replicas": {"min": 2, "max": 3}}})
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat")["spec"][
        "replicas"] == 2, what="the follower to raise replicas to the new min")
    assert ("PATCH", "deployments", "chat") in object_writes(kube, "op-low")
    assert len(object_writes(kube, "op-high")) == before  # the old leader is gone

    # Right after an update, too, SIGTERM ends the process cleanly. (It once hung in
    # about half the runs: kopf restarted a controller daemon while stopping and never
    # told it; `slopilot operator` now takes the signal itself and every daemon checks.)
    assert low.stop(signal.SIGTERM) == 0, low.output()


def parse(*argv: str) -> argparse.Namespace:
    from slopilot.cli import build_parser

    return build_parser().parse_args(["operator", "--all-namespaces", *argv])


def test_priority_is_random_per_process_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "_RNG", random.Random(1234))
    first, second = parse().priority, parse().priority
    expected = random.Random(1234)
    assert (first, second) == (expected.randint(1, 2**31 - 1),
                               expected.randint(1, 2**31 - 1))
    assert first != second  # two replicas, two priorities: neither freezes the other
    assert parse("--priority", "10").priority == 10
    assert parse("--priority=-5").priority == -5


def test_priority_must_be_an_integer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--priority", "high")
    assert "--priority 'high' is not an integer" in capsys.readouterr().err


@pytest.mark.parametrize(("raw", "message"), [
    ("soon", "SLOPILOT_PEERING_LIFETIME_S='soon' is not an integer"),
    ("1", "SLOPILOT_PEERING_LIFETIME_S=1 is below 2 s"),
])
def test_bad_peering_lifetime_is_refused_before_kopf_starts(
        monkeypatch: pytest.MonkeyPatch, raw: str, message: str) -> None:
    from slopilot.cli import main

    monkeypatch.setenv(PEERING_LIFETIME_ENV, raw)
    with pytest.raises(SystemExit, match=message):
        main(["operator", "--all-namespaces"])


def test_peering_lifetime_defaults_to_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEERING_LIFETIME_ENV, raising=False)
    assert peering_lifetime_s() == 60
    monkeypatch.setenv(PEERING_LIFETIME_ENV, "5")
    assert peering_lifetime_s() == 5
