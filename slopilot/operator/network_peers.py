"""The pods outside an LLMDeployment's namespace its NetworkPolicy admits to ``http``,
as the administrator names them (``$SLOPILOT_PROMETHEUS_PEERS``,
``$SLOPILOT_ENGINE_INGRESS_PEERS``; policy.py).

A NetworkPolicy rule with no ``from`` admits every pod of every namespace, and policies
only add: no policy of a tenant's could take that back. So each engine's ``http`` port
(inference and ``/metrics``) admits its own namespace's pods, the cluster's Prometheus,
and the peers the administrator opens to every deployment (an ingress gateway's
namespace), nothing else. An entry is ``namespace`` (every pod of it) or
``namespace:key=value`` (its pods with that label; several joined by ``+``, all
needed), as one NetworkPolicy peer: both selectors at once, so a tenant's pod labelled
as Prometheus in its own namespace is no Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.scheduling import label_key_problem, label_value_problem
from slopilot.operator.validation import DNS_1123_LABEL

PROMETHEUS_PEERS_ENV = "SLOPILOT_PROMETHEUS_PEERS"
INGRESS_PEERS_ENV = "SLOPILOT_ENGINE_INGRESS_PEERS"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label Kubernetes puts on every namespace, its name (immutable, set by the API
server): the one namespace label no tenant can forge."""


NO_PROMETHEUS_PEER = (
    f"{PROMETHEUS_PEERS_ENV} is empty: no Prometheus could scrape an engine's /metrics, "
    "and no deployment be tuned; name Prometheus's pods (namespace:key=value, e.g. "
    "monitoring:app.kubernetes.io/name=prometheus), or unset it for that one")


class PeerError(ValueError):
    """An entry that names no peer; the message names the variable, the entry and the
    fix."""


@dataclass(frozen=True)
class Peer:
    """Pods of one namespace, all of them or those carrying every label of ``pods``."""

    namespace: str
    pods: tuple[tuple[str, str], ...] = ()
    setting: str = field(default=PROMETHEUS_PEERS_ENV, compare=False)
    """The variable that named it, for the error; no part of the peer."""

    def __post_init__(self) -> None:
        entry = self.entry()
        if len(self.namespace) > 63 or not DNS_1123_LABEL.fullmatch(self.namespace):
            raise PeerError(f"{self.setting} entry {entry[:120]!r}: {self.namespace[:80]!r} "
                            "is not a namespace name (a DNS label: lowercase letters, "
                            "digits and '-'); write namespace or namespace:key=value, "
                            "e.g. monitoring:app.kubernetes.io/name=prometheus")
        for key, value in self.pods:
            if (problem := label_key_problem("the pods' label", key)) is not None:
                raise PeerError(f"{self.setting} entry {entry[:120]!r}: {problem}")
            if (problem := label_value_problem(f"the pods' label {key}", value)):
                raise PeerError(f"{self.setting} entry {entry[:120]!r}: {problem}")

    def entry(self) -> str:
        """As the variable writes it."""
        labels = "+".join(f"{k}={v}" for k, v in self.pods)
        return f"{self.namespace}:{labels}" if labels else self.namespace

    def to_api(self) -> dict[str, Any]:
        """The NetworkPolicy peer: this namespace AND these pods (one peer, not two); a
        namespace alone as one selector, the form the API server hands back (it drops
        an empty ``matchLabels``, and a policy compared whole would read as drifted)."""
        peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {
            NAMESPACE_NAME_LABEL: self.namespace}}}
        if self.pods:
            peer["podSelector"] = {"matchLabels": dict(self.pods)}
        return peer


def parse_peer(entry: str, setting: str) -> Peer:
    """One entry of ``setting``: ``namespace`` or ``namespace:key=value[+key=value]``."""
    namespace, colon, labels = entry.strip().partition(":")
    pods: list[tuple[str, str]] = []
    if colon and not labels.strip():
        raise PeerError(f"{setting} entry {entry[:120]!r}: no label after ':'; "
                        "drop the ':' to admit every pod of the namespace")
    if colon:
        for part in labels.split("+"):
            key, eq, value = part.strip().partition("=")
            if not eq or not key:
                raise PeerError(f"{setting} entry {entry[:120]!r}: {part[:80]!r} is not "
                                "key=value; write namespace or namespace:key=value (labels "
                                "joined by +), e.g. monitoring:app.kubernetes.io/name="
                                "prometheus")
            pods.append((key, value))
    if len({k for k, _ in pods}) != len(pods):
        raise PeerError(f"{setting} entry {entry[:120]!r}: a label key named twice; "
                        "name each once")
    return Peer(namespace.strip(), tuple(sorted(pods)), setting)


def parse_peers(raw: str, setting: str) -> tuple[Peer, ...]:
    """The comma-separated entries of ``setting`` (blank: none)."""
    return tuple(parse_peer(e, setting) for e in raw.split(",") if e.strip())


DEFAULT_PROMETHEUS_PEERS = (Peer("monitoring", (("app.kubernetes.io/name", "prometheus"),)),)
"""A Prometheus Operator's Prometheus (whose pods it labels app.kubernetes.io/name:
prometheus) in ``monitoring``: the peer manifests/operator-network-policy.yaml admits to
the operator's own ``metrics`` (a test holds the two, and operator.yaml, equal)."""
