"""What the cluster's administrator lets a CR author ask of the operator.

A CR author is a tenant of one namespace; the operator acts from its own namespace with
its own rights. The spec's shape is judged by the CRD and ``parse_spec``; this is the
administrator's word on top of it, set once on the operator (environment variables, see
``settings.operator_policy``):

- images: only repositories on the allow-list run (the default: the repositories of the
  two backends' default images, ``images``, which the administrator may name). An entry
  is a repository (``ghcr.io/acme/engine``: any tag or digest of it) or a prefix ending
  in ``/*`` (``registry.acme.internal/llm/*``, or a whole registry: ``ghcr.io/*``); ``*``
  alone allows all.
- Prometheus: when an allow-list is set, only those hosts (``host`` or ``host:port``;
  ``*.suffix`` for any host under a domain) are fetched, and none when it is set empty.
  Unset: any host that passes the URL rules (``validation.prometheus_url_problem``).
- study storage: only the databases on the storage allow-list are opened, with the
  administrator's credentials (``study_storage.py``; the default: the default storage);
  an entry with ``{namespace}`` allows a CR its own namespace's only. A CR that names
  none gets the administrator's default storage for its namespace (default_storage.py;
  the default: the operator's own SQLite file), resolved the same way
  (``named_storage``: the one place a CR's storage is named).
- Prometheus certificates (``prometheus_tls``): verified, against a CA bundle the
  administrator names or the default CAs; only the administrator may turn that off.
- the images the operator picks (``images``): the meter's, and each backend's engine
  where a CR names none. No CR field changes the meter's: it judges that CR's goodput.
- the DCGM exporter's namespace (``dcgm_namespace``): where its series scraped without
  honorLabels may name a tenant's GPUs (``rules._Renderer.gpu_utilization``).
- where the pods may land (``spec.scheduling``, scheduling.py): a PriorityClass only
  from ``allowed_priority_classes`` (none by default; ``*``: any but ``system-*``, which
  no entry allows: a tenant's pods would preempt the cluster's own), and a toleration
  only of a taint key on ``allowed_tolerations`` (by default ``nvidia.com/gpu``, the GPU
  nodes' usual taint; ``*``: any, a keyless one that tolerates every taint included),
  as a taint is how an administrator keeps nodes for one team.
- who reaches each engine's ``http`` port (inference and ``/metrics``; network_peers.py):
  the pods of the CR's own namespace, the cluster's Prometheus (``prometheus_peers``) and
  the peers the administrator opens to every deployment (``engine_ingress_peers``, e.g.
  an ingress gateway's namespace). No CR field widens it: a tenant admits another
  namespace to its own engines with a NetworkPolicy of its own in its namespace, which
  no other team's policy (nor this operator) can write there.
- live trials an hour (``max_trials_per_hour``): the most any one CR's loop starts in an
  hour, whatever its ``spec.tuning.maxTrials`` (which raises the loop's own cap of 30 with
  it, up to here): each trial loads what tenants share (the cluster's Prometheus, the
  study storage, on vLLM a rollout of every replica with its surge GPUs). A CR asking
  more is told (``trial_ceiling_warning``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field

from slopilot.operator.default_storage import DefaultStorage, instead, resolve_unwritten
from slopilot.operator.images import SHIPPED_IMAGES, Images
from slopilot.operator.knobs import DEFAULT_STUDY_STORAGE
from slopilot.operator.network_peers import (
    DEFAULT_PROMETHEUS_PEERS,
    INGRESS_PEERS_ENV,
    NO_PROMETHEUS_PEER,
    PROMETHEUS_PEERS_ENV,
    Peer,
)
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.scheduling import label_key_problem
from slopilot.operator.spec import Backend, LLMDeploymentSpec
from slopilot.operator.study_storage import (
    StorageRefused,
    StorageRule,
    resolve_storage,
)
from slopilot.operator.validation import (
    DNS_1123_LABEL,
    DNS_1123_SUBDOMAIN,
    image_prefix,
    parse_image,
)
from slopilot.tuner.prometheus.rules import RuleError, check_namespace_label
from slopilot.tuner.prometheus.tls import VERIFIED, TLSVerify


class PolicyError(ValueError):
    """A malformed allow-list entry or setting; the message names the variable and the
    value."""


DCGM_NAMESPACE_ENV = "SLOPILOT_DCGM_NAMESPACE"
PRIORITY_CLASSES_ENV = "SLOPILOT_ALLOWED_PRIORITY_CLASSES"
TOLERATIONS_ENV = "SLOPILOT_ALLOWED_TOLERATIONS"
SYSTEM_PRIORITY = "system-"
"""The prefix of the cluster's own PriorityClasses (system-cluster-critical,
system-node-critical): Kubernetes reserves it, and no tenant's pod may take one."""
MAX_TRIALS_PER_HOUR_ENV = "SLOPILOT_MAX_TRIALS_PER_HOUR"
DEFAULT_MAX_TRIALS_PER_HOUR = 60
"""Twice the loop's own hourly default (30): a CR that leaves maxTrials at its default
(30), or raises it to 60, still runs a whole episode in one hour, as before the ceiling;
only a CR asking more (the CRD allows 1000) is held to it. At the default 2-minute window
60 trials are about what one loop can start in an hour anyway (a trial is at least one
window, plus its rollout), so the ceiling binds on short windows and large maxTrials."""
DEFAULT_TOLERATIONS = ("nvidia.com/gpu",)
"""The taint GPU nodes commonly carry (GKE's, the NVIDIA GPU operator's guidance), which
a GPU deployment must tolerate to run at all; it keeps CPU pods off GPUs, no team's
nodes from another."""


def check_dcgm_namespace(value: str) -> str:
    """``value`` if it can name the DCGM exporter's namespace, else a PolicyError with the
    fix. Checked at the start: a typo would otherwise read as no GPU series at all."""
    if not isinstance(value, str) or len(value) > 63 or not DNS_1123_LABEL.fullmatch(value):
        raise PolicyError(f"{DCGM_NAMESPACE_ENV}={str(value)[:80]!r} is not a namespace "
                          "name (a DNS label: at most 63 lowercase letters, digits and "
                          "'-', starting and ending with a letter or digit); set it to "
                          "the namespace the DCGM exporter runs in, e.g. gpu-operator, or "
                          "unset it to read its series only where they are scraped with "
                          "honorLabels")
    return value


def parse_trials_per_hour(raw: str) -> int:
    """``$SLOPILOT_MAX_TRIALS_PER_HOUR`` as a count, or a PolicyError naming it, the value
    and the fix. Checked at the start: a typo would otherwise cap every loop by surprise."""
    text = raw.strip()
    # Bounded first: ``int`` of thousands of digits raises its own error, naming nothing.
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
    if value < 1:
        raise PolicyError(f"{MAX_TRIALS_PER_HOUR_ENV}={raw[:80]!r} is not a positive whole "
                          "number: set it to the most live trials one LLMDeployment's loop "
                          f"may start in an hour, e.g. {DEFAULT_MAX_TRIALS_PER_HOUR}, or "
                          f"unset it for the default {DEFAULT_MAX_TRIALS_PER_HOUR}")
    return value


def trial_ceiling_warning(spec: LLMDeploymentSpec, policy: OperatorPolicy) -> str | None:
    """What a CR whose ``spec.tuning.maxTrials`` is over the administrator's ceiling is
    told (None: it is not, or it does not tune): its episodes end on the hour's cap before
    their own, so one never reaches the verdict that no config holds (the misses of such
    cut episodes add up to it only over several hours: ``loop/missed_trials.py``)."""
    tuning = spec.tuning
    ceiling = policy.max_trials_per_hour
    if not tuning.enabled or tuning.max_trials <= ceiling:
        return None
    return (f"spec.tuning.maxTrials={tuning.max_trials} is more than the operator's "
            f"ceiling of {ceiling} live trials an hour (${MAX_TRIALS_PER_HOUR_ENV}): an "
            f"episode ends once {ceiling} trials started in the last hour "
            "(trial_rate_limit), committing the best config that held, or, where none "
            "held, keeping its starting config and buying no replica on a sample cut "
            "short until such episodes' misses at one replica count and load add up to "
            "maxTrials; an alert still firing starts a new episode once the hour allows "
            f"trials again. Lower maxTrials to {ceiling} or less for an episode to reach "
            "its verdict, or ask the cluster admin to raise "
            f"{MAX_TRIALS_PER_HOUR_ENV}")


def _engine_repositories(images: Images) -> tuple[str, ...]:
    """The repositories of each backend's default image: the allow-list where none is set,
    so that a CR without ``spec.image`` runs its backend's default (a mirror's, where the
    administrator named one)."""
    out = []
    for backend in Backend:
        image = images.engine(backend)
        ref = parse_image(image)
        if ref is None:
            raise PolicyError(f"the {backend.value} default image {image!r} is not a "
                              "container image reference (registry/path:tag or "
                              "@sha256:digest)")
        out.append(ref.repository)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class OperatorPolicy:
    allowed_images: tuple[str, ...] | None = None
    """Repositories or ``prefix/*`` entries (``*``: all). None (the variable unset): the
    repositories of ``images``' engine defaults. Read ``image_allow_list``."""
    image_allow_list: tuple[str, ...] = field(init=False, default=())
    """``allowed_images`` as it applies (None resolved)."""
    images: Images = SHIPPED_IMAGES
    """The images the operator picks: the meter's, and the engines' where the CR names
    none (``$SLOPILOT_METER_IMAGE``, ``$SLOPILOT_BUILTIN_IMAGE``, ``$SLOPILOT_VLLM_IMAGE``)."""
    allowed_prometheus: tuple[str, ...] | None = None
    """None (the variable unset): any host. Empty: no host; an administrator who blanks
    the list means to shut tenants' URLs off, never to open them all."""
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    """Where the operator's pods run: the one source the NetworkPolicy admits to the
    engines' admin port."""
    default_storage: str = DEFAULT_STUDY_STORAGE
    """The storage a CR that names none gets (``$SLOPILOT_DEFAULT_STORAGE``, with
    ``{namespace}`` for one per namespace; default_storage.py). Read ``default``."""
    default: DefaultStorage = field(init=False, repr=False)
    allowed_storage: tuple[str, ...] | None = None
    """Study storages a CR may name (``study_storage.StorageRule``); may hold passwords.
    None (the variable unset): the default storage alone."""
    storage_rules: tuple[StorageRule, ...] = field(init=False, repr=False, default=())
    namespace_label: str | None = None
    """The label the cluster's prometheus-operator stamps with the namespace of every
    monitor and rule (its Prometheus's ``enforcedNamespaceLabel``). Set, the rules, the
    alerts and the controller's reads match it too, so no tenant's own rule or monitor
    can speak for another namespace's deployment. None: the ``slopilot_*`` labels only."""
    prometheus_tls: TLSVerify = VERIFIED
    """How every controller checks an https Prometheus's certificate (the default: against
    the default CAs). No CR field changes it: a tenant who could turn it off could have
    the loop act on numbers anyone on the path supplied."""
    dcgm_namespace: str | None = None
    """The namespace the DCGM exporter runs in (``$SLOPILOT_DCGM_NAMESPACE``). Set, the
    rules read its series scraped without honorLabels (``exported_namespace`` and
    ``exported_pod`` name the GPU's pod) under that ``namespace`` only. None: only those
    scraped with honorLabels count, where ``namespace`` is the deployment's own. No CR
    field changes it: a tenant who named it could have their own pods pose as the
    exporter for another namespace's GPUs."""
    allowed_priority_classes: tuple[str, ...] = ()
    """PriorityClasses a CR may name (``$SLOPILOT_ALLOWED_PRIORITY_CLASSES``); ``*``: any
    but ``system-*``. Empty (the default): none, the pods get the cluster's default."""
    allowed_tolerations: tuple[str, ...] = DEFAULT_TOLERATIONS
    """Taint keys a CR's tolerations may name (``$SLOPILOT_ALLOWED_TOLERATIONS``; set
    empty: none); ``*``: any, a keyless toleration of every taint included."""
    prometheus_peers: tuple[Peer, ...] = DEFAULT_PROMETHEUS_PEERS
    """The cluster's Prometheus pods (``$SLOPILOT_PROMETHEUS_PEERS``), admitted to every
    engine's ``http`` port to scrape ``/metrics``: the same peer
    manifests/operator-network-policy.yaml admits to the operator's own ``metrics``."""
    engine_ingress_peers: tuple[Peer, ...] = ()
    """Further peers admitted to every engine's ``http`` port, whatever its namespace
    (``$SLOPILOT_ENGINE_INGRESS_PEERS``; an ingress gateway's namespace). Empty (the
    default): its own namespace's pods and Prometheus alone."""
    max_trials_per_hour: int = DEFAULT_MAX_TRIALS_PER_HOUR
    """The most live trials any one CR's loop starts in an hour
    (``$SLOPILOT_MAX_TRIALS_PER_HOUR``; ``hourly_trials``). No CR field raises it: each
    trial queries the shared Prometheus, writes the shared study storage and, on vLLM,
    rolls every replica, and one tenant's ``maxTrials: 1000`` on a short window would
    otherwise start over a hundred an hour."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_allow_list", _engine_repositories(self.images)
                           if self.allowed_images is None else self.allowed_images)
        try:
            object.__setattr__(self, "default", DefaultStorage(self.default_storage))
            rules = tuple(StorageRule(e) for e in (
                (self.default_storage,) if self.allowed_storage is None
                else self.allowed_storage))
        except StorageRefused as exc:
            raise PolicyError(str(exc)) from None
        object.__setattr__(self, "storage_rules", rules)
        if self.dcgm_namespace is not None:
            check_dcgm_namespace(self.dcgm_namespace)
        ceiling = self.max_trials_per_hour
        if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 1:
            raise PolicyError(f"{MAX_TRIALS_PER_HOUR_ENV}={ceiling!r}: expected a positive "
                              f"count, e.g. {DEFAULT_MAX_TRIALS_PER_HOUR}")
        if not self.prometheus_peers:
            raise PolicyError(NO_PROMETHEUS_PEER)
        for setting, peers in ((PROMETHEUS_PEERS_ENV, self.prometheus_peers),
                               (INGRESS_PEERS_ENV, self.engine_ingress_peers)):
            for peer in peers:
                if not isinstance(peer, Peer):
                    raise PolicyError(f"{setting}: {peer!r} is not a peer; parse it with "
                                      "network_peers.parse_peers")
        if self.namespace_label is not None:
            try:
                check_namespace_label(self.namespace_label)
            except RuleError as exc:
                raise PolicyError(str(exc)) from None
        for entry in self.allowed_priority_classes:
            if entry == "*":
                continue
            if entry.startswith(SYSTEM_PRIORITY):
                raise PolicyError(f"{PRIORITY_CLASSES_ENV} entry {entry!r}: a system-* "
                                  "class is the cluster's own, and a tenant's pods holding "
                                  "it could preempt cluster-critical ones; the operator "
                                  "never allows it: remove it")
            if len(entry) > 253 or not DNS_1123_SUBDOMAIN.fullmatch(entry):
                raise PolicyError(f"{PRIORITY_CLASSES_ENV} entry {entry[:80]!r}: expected a "
                                  "PriorityClass name (lowercase letters, digits, '-' and "
                                  "'.'), or *")
        for entry in self.allowed_tolerations:
            if entry != "*" and label_key_problem(TOLERATIONS_ENV, entry) is not None:
                raise PolicyError(f"{TOLERATIONS_ENV} entry {entry[:80]!r}: expected a taint "
                                  "key such as nvidia.com/gpu, or *")
        for entry in self.image_allow_list:
            if entry == "*":
                continue
            if entry.endswith("/*"):
                if image_prefix(entry[:-2]) is not None:
                    continue
                ref = None
            else:
                ref = parse_image(entry, prefix=True)
            if ref is None or ref.reference:  # a repository, not one tag of it
                raise PolicyError(f"image allow-list entry {entry!r}: expected a repository "
                                  "such as ghcr.io/acme/engine, a prefix such as "
                                  "registry.acme.internal/llm/*, or *")
        for entry in self.allowed_prometheus or ():
            host = entry[2:] if entry.startswith("*.") else entry
            parts = urllib.parse.urlsplit(f"//{host}")
            try:
                parts.port  # noqa: B018  # raises on a bad port
            except ValueError:
                parts = urllib.parse.urlsplit("//")
            if not parts.hostname or parts.path or "@" in host:
                raise PolicyError(f"Prometheus allow-list entry {entry!r}: expected host, "
                                  "host:port or *.domain")

    def image_allowed(self, image: str) -> bool:
        ref = parse_image(image)
        if ref is None:
            return False
        for entry in self.image_allow_list:
            if entry == "*":
                return True
            if entry.endswith("/*"):
                stem = image_prefix(entry[:-2])
                if stem is not None and ref.repository.startswith(stem + "/"):
                    return True
                continue
            allowed = parse_image(entry)
            if allowed is not None and allowed.repository == ref.repository:
                return True
        return False

    def priority_class_allowed(self, name: str) -> bool:
        if name.startswith(SYSTEM_PRIORITY):
            return False
        return "*" in self.allowed_priority_classes or name in self.allowed_priority_classes

    def toleration_allowed(self, key: str) -> bool:
        """Whether a toleration of taint ``key`` may be asked ("": every taint)."""
        return "*" in self.allowed_tolerations or (
            bool(key) and key in self.allowed_tolerations)

    def named_storage(self, written: str | None, namespace: str) -> str:
        """The storage a CR of ``namespace`` names: ``spec.tuning.storage`` as written,
        else the default storage for ``namespace``. What the status and the operator's
        record keep (never a password), and what ``study_storage`` opens."""
        return self.default.named(namespace) if written is None else written

    def study_storage(self, spec: LLMDeploymentSpec, *, namespace: str) -> str:
        """The storage URL to open for the study of ``spec``, a CR of ``namespace`` (the
        admin's, with credentials; ``{namespace}`` in an entry is that namespace);
        StorageRefused when the policy does not allow what the CR names, saying where
        removing the field would give the namespace's default storage."""
        written = spec.tuning.storage
        if written is None:
            return resolve_unwritten(self.default, self.storage_rules, namespace)
        try:
            return resolve_storage(written, self.storage_rules, namespace)
        except StorageRefused as exc:
            hint = instead(self.default, self.storage_rules, namespace, written)
            raise StorageRefused(f"{exc}{hint}") from None

    def prometheus_allowed(self, url: str) -> bool:
        if self.allowed_prometheus is None:
            return True
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        for entry in self.allowed_prometheus:
            want = urllib.parse.urlsplit(f"//{entry.lower()}")
            want_host = (want.hostname or "").rstrip(".")
            if want.port is not None and want.port != port:
                continue
            if want_host.startswith("*."):
                if host.endswith(want_host[1:]):
                    return True
            elif host == want_host:
                return True
        return False


def policy_problems(spec: LLMDeploymentSpec, policy: OperatorPolicy, *,
                    namespace: str) -> list[str]:
    """The fields of ``spec``, a CR of ``namespace``, this operator's policy refuses, each
    with the fix."""
    out = []
    image = spec.image or policy.images.engine(spec.backend)
    if parse_image(image) is None:
        out.append(f"spec.image={image!r} is not a container image reference "
                   "(registry/path:tag or @sha256:digest)")
    elif not policy.image_allowed(image):
        where = "spec.image" if spec.image else f"the {spec.backend.value} default image"
        out.append(f"{where}={image!r} is not on the operator's image allow-list "
                   f"({_listing(policy.image_allow_list)}): use an allowed image, or ask the "
                   "cluster admin to add it to SLOPILOT_ALLOWED_IMAGES")
    if not policy.prometheus_allowed(spec.prometheus_url):
        out.append(f"spec.prometheus.url={spec.prometheus_url!r}: the host is not on the "
                   f"operator's Prometheus allow-list "
                   f"({_listing(policy.allowed_prometheus or ())}); "
                   "use an allowed Prometheus, or ask the cluster admin to add it to "
                   "SLOPILOT_ALLOWED_PROMETHEUS")
    try:
        policy.study_storage(spec, namespace=namespace)
    except StorageRefused as exc:
        out.append(str(exc))
    return out + scheduling_problems(spec, policy)


def scheduling_problems(spec: LLMDeploymentSpec, policy: OperatorPolicy) -> list[str]:
    """The priority class and tolerations of ``spec.scheduling`` the policy refuses."""
    out = []
    if (name := spec.scheduling.priority_class_name) and not policy.priority_class_allowed(
            name):
        if name.startswith(SYSTEM_PRIORITY):
            why = ("a system-* class is the cluster's own: pods holding it preempt "
                   "other teams' pods and the cluster's own, and the operator never "
                   "allows it")
        else:
            why = (f"not on the operator's allow-list "
                   f"({_listing(policy.allowed_priority_classes)}): a class above "
                   "others' lets these pods preempt other teams' pods")
        out.append(f"spec.scheduling.priorityClassName={name!r}: {why}; remove it, or "
                   f"ask the cluster admin to add a class to {PRIORITY_CLASSES_ENV}")
    for i, toleration in enumerate(spec.scheduling.tolerations):
        key = str(toleration.get("key") or "")
        if not policy.toleration_allowed(key):
            what = repr(key) if key else "without a key (every taint)"
            out.append(f"spec.scheduling.tolerations[{i}]: a toleration of {what} is not "
                       f"on the operator's allow-list "
                       f"({_listing(policy.allowed_tolerations)}): a taint may keep nodes "
                       "for another team; remove it, or ask the cluster admin to add the "
                       f"key to {TOLERATIONS_ENV}")
    return out


def _listing(entries: Sequence[str]) -> str:
    return ", ".join(entries) if entries else "empty"
