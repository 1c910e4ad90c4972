"""Each replica's registration as a peer, where tenants cannot write: a Lease in the
operator's own namespace.

In the namespaced install a KopfPeering lives in each served namespace, and kopf pauses
the whole operator while any of them lists a live peer of a higher (or the same)
priority. A tenant allowed to patch kopfpeerings in its own namespace could write such a
peer and stop every other tenant's CRs for good (KopfPeering has no status subresource
to keep its peers apart from its spec). So each replica registers the identity and
priority it hands kopf before kopf starts, in a Lease of the operator's namespace
(``holderIdentity``, an annotation, ``renewTime`` renewed a few times per peering
lifetime), and peer_strip.py removes from the served namespaces' KopfPeerings each peer
no fresh registration vouches for. A registration not renewed within the peering
lifetime counts as gone (its replica's kopf entries are then dead too); one not renewed
for ``FORGET_AFTER_S`` is deleted by the next replica to start (conditional on its
version: a replica cut off that long makes it again at its next renewal).

A debugging run outside the cluster with no ``$SLOPILOT_OPERATOR_NAMESPACE`` and no
service account knows no operator namespace: it registers nowhere (so in-cluster
replicas will strip its entries) and strips nothing itself.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
API_VERSION = "coordination.k8s.io/v1"
PLURAL = "leases"
PEERING_LABEL = "slopilot.dev/peering"
"""The peering name a Lease registers its replica in (its label, listed by it)."""
PRIORITY_ANNOTATION = "slopilot.dev/peering-priority"
NAME_PREFIX = "slopilot-peer-"
RENEWALS_PER_LIFETIME = 3
"""Renewals within one peering lifetime: two may fail before a registration is gone."""
FORGET_AFTER_S = 3600.0
"""A registration not renewed this long is deleted (each pod restart leaves one)."""
ROLE = "slopilot-operator-peers"
"""The Role of manifests/rbac.yaml that grants the Leases, as warnings name it."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_NAMESPACE_ENV = "SLOPILOT_OPERATOR_NAMESPACE"  # settings.NAMESPACE_ENV (kopf-free here)
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Wall = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def known_operator_namespace(env: Mapping[str, str] | None = None,
                             service_account: Path = _SERVICE_ACCOUNT_NAMESPACE
                             ) -> str | None:
    """The operator's namespace where one is told (``$SLOPILOT_OPERATOR_NAMESPACE``, else
    the pod's service account); None for a run outside the cluster that names none (the
    default settings.py falls back to is a guess, not a place known to be the
    operator's)."""
    env = os.environ if env is None else env
    if namespace := env.get(_NAMESPACE_ENV, "").strip():
        return namespace
    if service_account.is_file():
        return service_account.read_text(encoding="utf-8").strip() or None
    return None


def lease_name(identity: str) -> str:
    """The Lease of ``identity``: its own name where it is one (a pod's name), else a
    digest of it (kopf's identity off-cluster, ``user@host/...``, is none)."""
    name = NAME_PREFIX + identity
    if len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name):
        return name
    return NAME_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:32]


def micro_time(when: datetime.datetime) -> str:
    """A Lease's MicroTime, as the API server writes it."""
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: object) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Registered:
    """One replica's registration as read from its Lease."""

    identity: str
    priority: int
    renewed: datetime.datetime

    def fresh(self, now: datetime.datetime, lifetime_s: float) -> bool:
        return (now - self.renewed).total_seconds() < lifetime_s


def read_registrations(kube: Kube, namespace: str, peering: str
                       ) -> tuple[dict[str, Registered], list[tuple[str, str, datetime.datetime]]]:
    """The registrations in ``peering`` (identity -> the latest), and each Lease's
    ``(name, resourceVersion, renewTime)`` for the forgetting of old ones. A Lease
    without a holder, an integer priority or a renewTime registers nobody."""
    found: dict[str, Registered] = {}
    leases: list[tuple[str, str, datetime.datetime]] = []
    for lease in kube.list(API_VERSION, PLURAL, namespace,
                           label_selector=f"{PEERING_LABEL}={peering}"):
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        holder = spec.get("holderIdentity")
        try:
            priority = int((meta.get("annotations") or {}).get(PRIORITY_ANNOTATION, ""))
        except ValueError:
            continue
        if renewed is None or not isinstance(holder, str) or not holder:
            continue
        leases.append((str(meta.get("name")), str(meta.get("resourceVersion")), renewed))
        known = found.get(holder)
        if known is None or known.renewed < renewed:
            found[holder] = Registered(holder, priority, renewed)
    return found, leases


@dataclass
class Registration:
    """This replica's Lease: made before kopf starts, renewed while it runs, deleted at
    its stop."""

    kube: Kube
    namespace: str
    peering: str
    identity: str
    priority: int
    lifetime_s: int
    wall: Wall = utc_now

    @property
    def name(self) -> str:
        return lease_name(self.identity)

    def _body(self) -> dict[str, object]:
        now = micro_time(self.wall())
        return {"apiVersion": API_VERSION, "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {PEERING_LABEL: self.peering},
                             "annotations": {PRIORITY_ANNOTATION: str(self.priority)}},
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": self.lifetime_s,
                         "acquireTime": now, "renewTime": now}}

    def register(self) -> None:
        """Make (or take over) the Lease, and forget registrations long gone. ApiError
        where refused."""
        body = self._body()
        try:
            self.kube.create(API_VERSION, PLURAL, self.namespace, body)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":  # the same pod name started again
                raise
            self.kube.patch(API_VERSION, PLURAL, self.namespace, self.name, body)
        self._forget_old()

    def renew(self) -> None:
        """``renewTime`` now; the Lease made again where it went (forgotten by another
        replica while this one was cut off). ApiError where refused."""
        patch = {"spec": {"renewTime": micro_time(self.wall()),
                          "holderIdentity": self.identity},
                 "metadata": {"annotations": {PRIORITY_ANNOTATION: str(self.priority)}}}
        try:
            self.kube.patch(API_VERSION, PLURAL, self.namespace, self.name, patch)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.kube.create(API_VERSION, PLURAL, self.namespace, self._body())

    def withdraw(self) -> None:
        try:
            self.kube.delete(API_VERSION, PLURAL, self.namespace, self.name)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("slopilot operator: peer registration %s/%s not deleted (%s); "
                            "forgotten by the next replica to start after %.0f min",
                            self.namespace, self.name, exc, FORGET_AFTER_S / 60)

    def _forget_old(self) -> None:
        try:
            _, leases = read_registrations(self.kube, self.namespace, self.peering)
        except ApiError as exc:
            log.debug("peer registrations not listed to forget old ones (%s)", exc)
            return
        now = self.wall()
        for name, version, renewed in leases:
            if name == self.name or (now - renewed).total_seconds() < FORGET_AFTER_S:
                continue
            try:
                self.kube.delete(API_VERSION, PLURAL, self.namespace, name,
                                 resource_version=version)
            except ApiError as exc:  # renewed meanwhile (409), or gone (404)
                log.debug("old peer registration %s not deleted (%s)", name, exc)

    def keep(self, stop: threading.Event) -> None:
        """Renew until ``stop``, ``RENEWALS_PER_LIFETIME`` times per lifetime; a refused
        renewal is warned of (its replica's entries are stripped once it is stale)."""
        every_s = max(0.5, self.lifetime_s / RENEWALS_PER_LIFETIME)
        failing = False
        while not stop.wait(every_s):
            try:
                self.renew()
            except Exception as exc:  # the thread must not die: the next try may pass
                if not failing:
                    log.warning("slopilot operator: peer registration %s/%s not renewed "
                                "(%s): once %d s old, the other replicas remove this "
                                "one's KopfPeering entries; tried again each %.0f s",
                                self.namespace, self.name, exc, self.lifetime_s, every_s)
                failing = True
                continue
            if failing:
                log.info("slopilot operator: peer registration %s/%s renewed again",
                         self.namespace, self.name)
            failing = False
