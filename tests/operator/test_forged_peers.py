"""A tenant's forged peer in its own namespace's KopfPeering pauses no other tenant.

kopf pauses the whole operator while any served namespace's KopfPeering lists a live
peer of a higher or the same priority, and KopfPeering has no status subresource: a
tenant allowed to patch kopfpeerings in its namespace wrote a peer of priority 2**31
with a lifetime of 10**9 s, and no other tenant's CR was reconciled again. Each replica
now registers its identity and priority in a Lease of the operator's own namespace
(peer_registry.py), and the keeper strips from the served namespaces' KopfPeerings what
no fresh registration vouches for (peer_strip.py).
"""

# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import argparse
import datetime
import logging
import threading
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.peer_registry import (
    API_VERSION,
    PLURAL,
    Registration,
    known_operator_namespace,
    lease_name,
    read_registrations,
)
from slopilot.operator.peer_strip import WARN_EVERY_S, PeerStrip, corrections
from slopilot.operator.peering_keeper import keep_peerings
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.served_patterns import ServedPatterns
from slopilot.operator.study_reclaim import serving
from tests.operator.operator_support import Cluster, llmd, wait_for
from tests.operator.test_operator_rbac import MANIFESTS, Operator
from tests.operator.test_peering_keeper import (  # noqa: F401  # fixtures
    operators,
    peering_crds,
    peering_in,
    served_by,
    start_operator,
)
from tests.support.kube_server import RunningEmulator

PEERING = "slopilot"
LIFETIME_S = 60
NOW = datetime.datetime(2026, 12, 8, 0, 0, tzinfo=datetime.UTC)
OPS = DEFAULT_OPERATOR_NAMESPACE


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def entry(priority: int, lifetime: int = LIFETIME_S) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": NOW.isoformat()}


def peering(ns: str, **peers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
            "metadata": {"name": PEERING, "namespace": ns}, "status": peers}


class Wall:
    """An injectable wall clock (the Leases' renewTime is wall time)."""

    def __init__(self, now: datetime.datetime) -> None:
        self.now = now

    def __call__(self) -> datetime.datetime:
        return self.now


@pytest.fixture
def cluster(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Kube:
    kube.install(*yaml.safe_load_all((MANIFESTS / "kopf-peering.yaml").read_text(
        encoding="utf-8")), namespace(OPS), namespace("team-a"), namespace("team-b"))
    return Kube(kube_client)


def status_in(kube: Kube, ns: str) -> dict[str, Any]:
    found = kube.get("kopf.dev/v1", "kopfpeerings", ns, PEERING)
    assert found is not None
    return dict(found.get("status") or {})


def register(kube: Kube, identity: str, priority: int, when: datetime.datetime) -> None:
    Registration(kube, OPS, PEERING, identity, priority, LIFETIME_S,
                 wall=Wall(when)).register()


def test_the_judgement_keeps_only_registered_peers_at_their_priority() -> None:
    status = {"op-1": entry(10), "op-2": entry(99), "forged": entry(2**31),
              "junk": "not an entry", "bad-time": {"priority": 5, "lastseen": "yesterday"}}
    assert corrections(status, {"op-1": 10, "op-2": 5, "bad-time": 5}) == {
        "op-2": {"priority": 5}, "forged": None, "junk": None, "bad-time": None}
    assert corrections({"op-1": entry(10)}, {"op-1": 10}) == {}
    assert corrections(None, {}) == {}


def test_forged_peers_are_stripped_registered_ones_kept_and_priorities_set_back(
        cluster: Kube, caplog: pytest.LogCaptureFixture) -> None:
    register(cluster, "op-1", 10, NOW)
    register(cluster, "op-2", 20, NOW)
    # op-gone's replica stopped renewing 2 lifetimes ago: gone, though its entry says
    # it lives for 10**9 s.
    register(cluster, "op-gone", 30, NOW - datetime.timedelta(seconds=2 * LIFETIME_S))
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-a", peering(
        "team-a", **{"op-1": entry(10), "op-2": entry(20),
                     "op-gone": entry(30, lifetime=10**9),
                     "tenant-a-fake": entry(2**31, lifetime=10**9)}))
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-b", peering(
        "team-b", **{"op-1": entry(2**40), "op-2": entry(20)}))
    clock = [0.0]
    strip = PeerStrip(cluster, PEERING, OPS, LIFETIME_S, ("op-1", 10),
                      serving(["team-a", "team-b"]), wall=Wall(NOW), clock=lambda: clock[0])
    stop = threading.Event()
    keeper = threading.Thread(target=keep_peerings, args=(
        cluster, PEERING, serving(["team-a", "team-b"]), stop),
        kwargs={"judge": strip.judge}, daemon=True)
    def said(level: int) -> list[str]:
        return [r.getMessage() for r in list(caplog.records)
                if r.levelno == level and "team-a/slopilot" in r.getMessage()]

    # The strip's judgement about warning comes after its PATCH is answered: each wait
    # is for the log line, the judgement's last act, not for the server's state, which a
    # descheduled keeper thread reaches first (and the clock moved then would change
    # what it says).
    with caplog.at_level(logging.DEBUG, logger="slopilot.operator.peer_strip"):
        keeper.start()
        try:
            wait_for(lambda: set(status_in(cluster, "team-a")) == {"op-1", "op-2"},
                     what="team-a's forged and stale peers removed")
            wait_for(lambda: status_in(cluster, "team-b")["op-1"]["priority"] == 10,
                     what="team-b's forged priority set back")
            warned = wait_for(lambda: said(logging.WARNING), what="team-a's warning")
            assert status_in(cluster, "team-a")["op-2"] == entry(20)  # untouched
            assert status_in(cluster, "team-b")["op-1"]["lastseen"] == NOW.isoformat()
            assert len(warned) == 1 and "Tenants must not write kopfpeerings" in warned[0]
            assert "'tenant-a-fake'" in warned[0] and "'op-gone'" in warned[0]

            # Written again while watched: stripped again, warned of once per
            # WARN_EVERY_S.
            cluster.patch("kopf.dev/v1", "kopfpeerings", "team-a", PEERING,
                          {"status": {"again": entry(2**31)}})
            wait_for(lambda: said(logging.DEBUG),
                     what="the forged peer written again removed, not warned of")
            assert "again" not in status_in(cluster, "team-a")
            clock[0] += WARN_EVERY_S
            cluster.patch("kopf.dev/v1", "kopfpeerings", "team-a", PEERING,
                          {"status": {"third": entry(2**31)}})
            wait_for(lambda: len(said(logging.WARNING)) == 2,
                     what="the third forged peer removed and warned of")
            assert "third" not in status_in(cluster, "team-a")
        finally:
            stop.set()
            keeper.join(10)
    assert not keeper.is_alive()
    warned = said(logging.WARNING)
    assert len(warned) == 2, warned
    assert "'again'" not in "".join(warned) and "'third'" in warned[1]


def test_a_replica_registered_after_the_registrations_were_read_is_kept(
        cluster: Kube) -> None:
    """A new replica registers before its kopf writes: a peer not known is looked up
    again before it is removed."""
    register(cluster, "op-1", 10, NOW)
    strip = PeerStrip(cluster, PEERING, OPS, LIFETIME_S, ("op-1", 10),
                      serving(["team-a"]), wall=Wall(NOW))
    assert strip.registered(fresh_read=False) == {"op-1": 10}
    register(cluster, "op-new", 40, NOW)
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-a", peering(
        "team-a", **{"op-1": entry(10), "op-new": entry(40)}))
    strip.judge(cluster.get("kopf.dev/v1", "kopfpeerings", "team-a", PEERING) or {})
    assert set(status_in(cluster, "team-a")) == {"op-1", "op-new"}


def test_a_namespace_not_served_is_not_judged(cluster: Kube) -> None:
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-b", peering(
        "team-b", other=entry(2**31)))
    strip = PeerStrip(cluster, PEERING, OPS, LIFETIME_S, ("op-1", 10),
                      serving(["team-a"]), wall=Wall(NOW))
    strip.judge(cluster.get("kopf.dev/v1", "kopfpeerings", "team-b", PEERING) or {})
    assert set(status_in(cluster, "team-b")) == {"other"}


def test_a_registration_is_renewed_made_again_withdrawn_and_old_ones_forgotten(
        cluster: Kube) -> None:
    register(cluster, "op-old", 5, NOW - datetime.timedelta(hours=2))
    wall = Wall(NOW)
    mine = Registration(cluster, OPS, PEERING, "op-1", 10, LIFETIME_S, wall=wall)
    mine.register()
    found, _ = read_registrations(cluster, OPS, PEERING)
    assert set(found) == {"op-1"}  # op-old's, two hours unrenewed, was deleted
    wall.now = NOW + datetime.timedelta(seconds=20)
    mine.renew()
    assert read_registrations(cluster, OPS, PEERING)[0]["op-1"].renewed == wall.now
    cluster.delete(API_VERSION, PLURAL, OPS, lease_name("op-1"))  # forgotten meanwhile
    mine.renew()
    assert set(read_registrations(cluster, OPS, PEERING)[0]) == {"op-1"}
    mine.withdraw()
    assert read_registrations(cluster, OPS, PEERING)[0] == {}


def test_an_identity_that_is_no_object_name_gets_a_digest() -> None:
    assert lease_name("slopilot-operator-7d9f-x2x") == "slopilot-peer-slopilot-operator-7d9f-x2x"
    name = lease_name("alice@laptop/20261208000000/abc")
    assert name.startswith("slopilot-peer-") and "@" not in name and "/" not in name


def test_the_operator_namespace_is_known_only_where_told(tmp_path: Path) -> None:
    nowhere = tmp_path / "absent"
    assert known_operator_namespace({}, nowhere) is None
    assert known_operator_namespace({"SLOPILOT_OPERATOR_NAMESPACE": "ops"}, nowhere) == "ops"
    account = tmp_path / "namespace"
    account.write_text("slopilot-system\n", encoding="utf-8")
    assert known_operator_namespace({}, account) == "slopilot-system"


def test_keep_peerings_hands_each_peering_object_to_the_judge(
        cluster: Kube) -> None:
    """No registry, no strip: the keeper hands what it lists and watches to its judge."""
    seen: list[dict[str, Any]] = []
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-a", peering("team-a"))
    stop = threading.Event()
    keeper = threading.Thread(target=keep_peerings, args=(
        cluster, PEERING, serving(["team-a"]), stop), kwargs={"judge": seen.append},
        daemon=True)
    keeper.start()
    try:
        wait_for(lambda: any(p["metadata"]["namespace"] == "team-a" for p in seen),
                 what="team-a's peering object judged")
        cluster.patch("kopf.dev/v1", "kopfpeerings", "team-a", PEERING,
                      {"status": {"x": entry(1)}})
        wait_for(lambda: any("x" in (p.get("status") or {}) for p in seen),
                 what="the watched change judged")
    finally:
        stop.set()
        keeper.join(10)


def test_the_judge_failing_leaves_the_watch_going(
        cluster: Kube, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def failing(p: dict[str, Any]) -> None:
        calls.append(p["metadata"]["namespace"])
        raise RuntimeError("boom")

    cluster.create("kopf.dev/v1", "kopfpeerings", "team-a", peering("team-a"))
    stop = threading.Event()
    keeper = threading.Thread(target=keep_peerings, args=(
        cluster, PEERING, serving(["team-a"]), stop), kwargs={"judge": failing}, daemon=True)
    with caplog.at_level(logging.WARNING):
        keeper.start()
        try:
            wait_for(lambda: calls, what="the first judgement")
            cluster.patch("kopf.dev/v1", "kopfpeerings", "team-a", PEERING,
                          {"status": {"x": entry(1)}})
            wait_for(lambda: len(calls) >= 2, what="the next event judged")
        finally:
            stop.set()
            keeper.join(10)
    assert "not judged for forged peers (boom)" in caplog.text


def test_a_tenants_forged_peer_pauses_no_other_tenant(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, tmp_path: Path,
        peering_crds: None, operators: list[Operator]) -> None:  # noqa: F811
    """The operator's own process, as its ServiceAccount with the namespaced RBAC: team-a
    (who may patch kopfpeerings there) writes a peer of priority 2**31 living 10**9 s
    into its KopfPeering; team-b's new CR is still reconciled. Before, kopf paused the
    whole operator for good."""
    served_by(kube, "team-a", "team-b")
    operators.append(op := start_operator(kube, tmp_path, "--namespace", "team-a",
                                          "--namespace", "team-b", "--priority", "10"))
    team_a = Cluster(kube_client, namespace="team-a")
    team_b = Cluster(kube_client, namespace="team-b")
    body = llmd("first", tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-b"
    team_b.create(body)
    wait_for(lambda: team_b.owned("apps/v1", "deployments", "first"),
             what="team-b served at the start")
    ours = set(wait_for(lambda: peering_in(team_a, "team-a").get("status"),
                        what="the operator's own entry in team-a"))
    # kopf writes under the very identity the replica registered (the other replicas
    # vouch for its entries by it).
    assert ours == set(read_registrations(Kube(kube_client), OPS, PEERING)[0])

    forged = {"priority": 2**31, "lifetime": 10**9,
              "lastseen": datetime.datetime.now(datetime.UTC).isoformat()}
    team_a.custom.patch_namespaced_custom_object(
        "kopf.dev", "v1", "team-a", "kopfpeerings", PEERING,
        {"status": {"tenant-a-fake": forged}})
    wait_for(lambda: "tenant-a-fake" not in (peering_in(team_a, "team-a").get("status")
                                             or {}), what="the forged peer removed")
    body = llmd("second", tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-b"
    team_b.create(body)
    wait_for(lambda: team_b.owned("apps/v1", "deployments", "second"),
             what="team-b's CR reconciled after team-a's forged peer")
    assert set(peering_in(team_a, "team-a").get("status") or {}) <= ours
    # Logged after the strip's PATCH is answered, which the CR's reconcile need not wait
    # for.
    wait_for(lambda: "KopfPeering team-a/slopilot was written by someone other"
             in op.output(), what="the strip's warning")
    assert op.stop() == 0, op.output()
    # Its registration went with it.
    assert read_registrations(Kube(kube_client), OPS, PEERING)[0] == {}


class RefusedLeases(Kube):
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if "/leases" in path:
            raise ApiError(403, "Forbidden", "leases is forbidden")
        return super().request(method, path, **kwargs)


def _register_args() -> argparse.Namespace:
    return argparse.Namespace(peering=PEERING, priority=10)


def test_a_run_with_no_operator_namespace_registers_nowhere_and_strips_nothing(
        cluster: Kube, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from slopilot.operator import commands, peer_registry

    monkeypatch.delenv("SLOPILOT_OPERATOR_NAMESPACE", raising=False)
    monkeypatch.setattr(peer_registry, "_SERVICE_ACCOUNT_NAMESPACE", Path("/nonexistent"))
    with caplog.at_level(logging.WARNING):
        assert commands._register_peer(cluster, _register_args(), "me", LIFETIME_S,
                                       ServedPatterns(["team-a"], {}),
                                       threading.Event()) is None
    assert [r.getMessage() for r in caplog.records if "no operator namespace known" in
            r.getMessage()] != []
    assert len(caplog.records) == 1
    assert read_registrations(cluster, OPS, PEERING)[0] == {}


def test_a_refused_registration_is_warned_of_naming_the_role(
        cluster: Kube, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from slopilot.operator import commands

    monkeypatch.setenv("SLOPILOT_OPERATOR_NAMESPACE", OPS)
    with caplog.at_level(logging.WARNING):
        assert commands._register_peer(RefusedLeases(kube_client), _register_args(), "me",
                                       LIFETIME_S, ServedPatterns(["team-a"], {}),
                                       threading.Event()) is None
    assert "cannot register as a peer in namespace slopilot-system (403" in caplog.text
    assert "slopilot-operator-peers" in caplog.text


def test_a_registered_run_renews_until_its_stop(
        cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.operator import commands

    monkeypatch.setenv("SLOPILOT_OPERATOR_NAMESPACE", OPS)
    stop = threading.Event()
    made = commands._register_peer(cluster, _register_args(), "me", 2,
                                   ServedPatterns(["team-a"], {}), stop)
    assert made is not None
    first = read_registrations(cluster, OPS, PEERING)[0]["me"]
    assert first.priority == 10
    try:
        wait_for(lambda: read_registrations(cluster, OPS, PEERING)[0]["me"].renewed >
                 first.renewed, what="the registration renewed")
    finally:
        stop.set()
        made.renewals.join(10)
    made.lease.withdraw()
    assert read_registrations(cluster, OPS, PEERING)[0] == {}


def test_registrations_that_may_not_be_read_are_warned_of_once_per_period(
        cluster: Kube, kube_client: kubernetes.client.ApiClient,
        caplog: pytest.LogCaptureFixture) -> None:
    cluster.create("kopf.dev/v1", "kopfpeerings", "team-a", peering(
        "team-a", forged=entry(2**31)))
    clock = [0.0]
    strip = PeerStrip(RefusedLeases(kube_client), PEERING, OPS, LIFETIME_S, ("op-1", 10),
                      serving(["team-a"]), wall=Wall(NOW), clock=lambda: clock[0])
    body = cluster.get("kopf.dev/v1", "kopfpeerings", "team-a", PEERING) or {}
    with caplog.at_level(logging.WARNING):
        strip.judge(body)
        strip.judge(body)
        clock[0] += WARN_EVERY_S
        strip.judge(body)
    assert caplog.text.count("peer registrations in namespace slopilot-system may not be "
                             "listed (403") == 2
    assert set(status_in(cluster, "team-a")) == {"forged"}  # nothing judged unread
