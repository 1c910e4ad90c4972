"""kopf settings for the slopilot operator, applied by the startup handler.

- Peering (leader election): replicas of the operator join the ClusterKopfPeering named
  ``slopilot`` (manifests/kopf-peering.yaml); only the highest-priority live peer handles
  objects, so two replicas never retune or scale the same deployment twice. ``slopilot
  operator`` passes the name to kopf (``--peering``) unless ``--standalone`` is given,
  with a priority drawn at random per process (``--priority``): kopf pauses peers of
  EQUAL priority too, so a fixed default would freeze every replica.
- A peer that dies without saying goodbye (SIGKILL, a lost node) blocks the others for
  up to its lifetime (60 s). ``$SLOPILOT_PEERING_LIFETIME_S`` shortens it, for tests;
  production leaves it unset (short lifetimes mean more keep-alive PATCHes).
- Progress and the last handled spec live in annotations under ``slopilot.dev/``, not in
  ``status.kopf``: the status belongs to the controller and users, and annotations survive
  an operator restart, so a half-done handler resumes instead of running twice.
- Events at INFO and above reach ``kubectl describe``; DEBUG stays in the operator's log.
- Bounded watches and requests: a silent connection is dropped and resumed from its
  resourceVersion rather than hanging.
- kopf's pool of handler threads, which every tenant's handlers share, has
  ``HANDLER_THREADS`` threads (unset: min(32, CPUs + 4), 6 on a 2-CPU pod). The
  handlers on it talk to the API server alone: what waits on a tenant's pods or its
  Prometheus runs on a pool of its own, a namespace's on a share of it (the pod syncs,
  pod_sync_pool.py; the tuning steps, tuning_pool.py). The drift repairs run on half of
  these threads at most, a namespace's on a share of that (drift_repairs.py).
- The administrator's policy (``operator_policy``): ``$SLOPILOT_ALLOWED_IMAGES``,
  ``$SLOPILOT_ALLOWED_PROMETHEUS`` and ``$SLOPILOT_ALLOWED_STORAGE`` (comma-separated
  allow-lists, see policy.py and study_storage.py; read first by ``started_policy``, so
  a bad entry stops the start), ``$SLOPILOT_DEFAULT_STORAGE`` (the study storage of a
  CR that names none, default_storage.py; set, one the allow-list refuses stops the
  start; unset, the shipped file, which an allow-list without it is warned of),
  ``$SLOPILOT_ALLOWED_PRIORITY_CLASSES`` and ``$SLOPILOT_ALLOWED_TOLERATIONS`` (what
  ``spec.scheduling`` may name, policy.py), ``$SLOPILOT_NAMESPACE_LABEL`` (the
  Prometheus's ``enforcedNamespaceLabel``, which the rules and the controller then
  match) and the operator's own namespace (``$SLOPILOT_OPERATOR_NAMESPACE``, else the
  service account's, else slopilot-system).
- The images the operator picks (``operator_images``): ``$SLOPILOT_METER_IMAGE`` (the
  meter in every vLLM pod), ``$SLOPILOT_BUILTIN_IMAGE`` and ``$SLOPILOT_VLLM_IMAGE`` (each
  backend's engine where a CR names no ``spec.image``); unset or blank, the shipped ones
  (the meter, the built-in engine's image where only that is named: both are slopilot).
  An air-gapped cluster names its mirrors here. A value that is no image reference stops
  the start; the allow-list, unset, is these engine images' repositories.
- ``$SLOPILOT_PROMETHEUS_PEERS`` and ``$SLOPILOT_ENGINE_INGRESS_PEERS``: the pods outside
  a deployment's namespace its NetworkPolicy admits to ``http`` (Prometheus; the
  administrator's extras, network_peers.py); a bad entry stops the start.
- ``$SLOPILOT_DCGM_NAMESPACE``: the namespace the DCGM exporter runs in, so the rules
  read its series scraped without honorLabels too (policy.py); a value that is no
  namespace name stops the start.
- ``$SLOPILOT_PROMETHEUS_MIB_PER_MIN``: the Prometheus answers one namespace's
  deployments may read a minute (default 16 MiB; daemon.py, answer_budget.py); a value
  that is no whole number of MiB from 1 to 4096 stops the start.
- ``$SLOPILOT_MAX_TRIALS_PER_HOUR``: the most live trials one CR's loop starts in an
  hour (default 60), whatever its ``spec.tuning.maxTrials`` (policy.py); a value that is
  no positive whole number stops the start.
- How an ``https`` Prometheus's certificate is checked (``prometheus_tls``): verified by
  default; ``$SLOPILOT_PROMETHEUS_CA_FILE`` names a PEM bundle of the CAs to trust
  instead (read here, so a bad file stops the start with the fix; then again at each
  read once the file changes, so a rotated CA needs no restart: ``tls.CABundle``), and
  ``$SLOPILOT_PROMETHEUS_TLS_VERIFY=false`` turns the check off for every deployment,
  with a warning. The operator's word alone: no CR field touches it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import kopf

from slopilot.operator.default_storage import DEFAULT_STORAGE_ENV
from slopilot.operator.images import SHIPPED_IMAGES, Images
from slopilot.operator.network_peers import (
    INGRESS_PEERS_ENV,
    NO_PROMETHEUS_PEER,
    PROMETHEUS_PEERS_ENV,
    PeerError,
    parse_peers,
)
from slopilot.operator.policy import (
    DCGM_NAMESPACE_ENV,
    MAX_TRIALS_PER_HOUR_ENV,
    PRIORITY_CLASSES_ENV,
    TOLERATIONS_ENV,
    OperatorPolicy,
    PolicyError,
    check_dcgm_namespace,
    parse_trials_per_hour,
)
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.study_storage import shared_with_namespaces
from slopilot.operator.validation import parse_image
from slopilot.tuner.prometheus.tls import VERIFIED, CAFileError, TLSVerify

HANDLER_THREADS = 16
"""kopf's pool for sync handlers (``settings.execution.max_workers``); unset, it was
asyncio's default, min(32, CPUs + 4): 6 on a 2-CPU operator pod. The handlers mostly wait
on the API server, so the count is not tied to CPUs; no pod sync holds one of them
(pod_sync_pool.py), so a tenant's slow pods leave them to every tenant's reconciles,
drift repairs and deletions; the drift repairs take at most half of them
(``drift_repairs.REPAIRS``), however many objects change."""
PREFIX = "slopilot.dev"
FINALIZER = f"{PREFIX}/finalizer"
WATCH_SERVER_TIMEOUT_S = 60
WATCH_CLIENT_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 30
WATCH_PAGE = 20
"""Objects per page of kopf's lists (``settings.watching.chunk_size``): the first list of
each watched kind, and each list again after a watch's 410. The owned kinds' watches
select the managed-by label, which anyone may copy onto their own ConfigMaps, Services
and Deployments: unpaged, a tenant's 800 ConfigMaps of 0.9 MB were one response of
720 MB, and the operator (2 GiB limit) was killed at every start. A page of the largest
objects etcd takes (about 1.5 MiB) is 30 MiB; an honest cluster's owned objects cost one
request per 20 (docs/benchmarks.md)."""
WORKER_IDLE_S = 0.2
"""How long kopf keeps an object's worker, and with it the last event's body, after the
event was handled (``settings.queueing.idle_timeout``, kopf's default 5 s). At 5 s every
object listed in the last 5 s was held whole: paged (10 a page), 800 labelled ConfigMaps
of 0.9 MB still peaked at 659 MiB; at 0.2 s, 187-211 MiB (docs/benchmarks.md). A worker
gone is made again at the object's next event; a handler's own wait (kopf's consistency
timeout) keeps its worker as long as it needs."""
PEERING_LIFETIME_S = 60
PEERING_LIFETIME_ENV = "SLOPILOT_PEERING_LIFETIME_S"
# kopf sends keep-alives every max(1, lifetime - 5..10) s; below 2 s a keep-alive in
# flight could already be late.
MIN_PEERING_LIFETIME_S = 2
RETRY_BACKOFF_S = 10
IMAGES_ENV = "SLOPILOT_ALLOWED_IMAGES"
PROMETHEUS_ENV = "SLOPILOT_ALLOWED_PROMETHEUS"
STORAGE_ENV = "SLOPILOT_ALLOWED_STORAGE"
NAMESPACE_ENV = "SLOPILOT_OPERATOR_NAMESPACE"
NAMESPACE_LABEL_ENV = "SLOPILOT_NAMESPACE_LABEL"
PROMETHEUS_CA_ENV = "SLOPILOT_PROMETHEUS_CA_FILE"
PROMETHEUS_TLS_VERIFY_ENV = "SLOPILOT_PROMETHEUS_TLS_VERIFY"
METER_IMAGE_ENV = "SLOPILOT_METER_IMAGE"
BUILTIN_IMAGE_ENV = "SLOPILOT_BUILTIN_IMAGE"
VLLM_IMAGE_ENV = "SLOPILOT_VLLM_IMAGE"
IMAGE_ENVS = {METER_IMAGE_ENV: "meter", BUILTIN_IMAGE_ENV: "builtin", VLLM_IMAGE_ENV: "vllm"}
"""Each variable and the ``images.Images`` field it sets."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
log = logging.getLogger(__name__)


def _entries(raw: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in raw.split(",") if e.strip())


def operator_policy(env: Mapping[str, str] | None = None) -> OperatorPolicy:
    """The administrator's allow-lists and the operator's namespace, from the environment."""
    env = os.environ if env is None else env
    namespace = env.get(NAMESPACE_ENV, "").strip()
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.is_file():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    kwargs: dict[str, object] = {"operator_namespace": namespace or DEFAULT_OPERATOR_NAMESPACE}
    if (images := env.get(IMAGES_ENV)) is not None:
        kwargs["allowed_images"] = _entries(images)
    if (hosts := env.get(PROMETHEUS_ENV)) is not None:
        kwargs["allowed_prometheus"] = _entries(hosts)
    if (storages := env.get(STORAGE_ENV)) is not None:
        kwargs["allowed_storage"] = _entries(storages)
    if (classes := env.get(PRIORITY_CLASSES_ENV)) is not None:
        kwargs["allowed_priority_classes"] = _entries(classes)
    if (keys := env.get(TOLERATIONS_ENV)) is not None:
        kwargs["allowed_tolerations"] = _entries(keys)
    if default := env.get(DEFAULT_STORAGE_ENV, "").strip():
        kwargs["default_storage"] = default
    if label := env.get(NAMESPACE_LABEL_ENV, "").strip():
        kwargs["namespace_label"] = label
    kwargs["prometheus_tls"] = prometheus_tls(env)
    kwargs["images"] = operator_images(env)
    try:
        if (peers := env.get(PROMETHEUS_PEERS_ENV)) is not None:
            kwargs["prometheus_peers"] = parse_peers(peers, PROMETHEUS_PEERS_ENV)
            if not kwargs["prometheus_peers"]:
                raise PolicyError(NO_PROMETHEUS_PEER)
        if (peers := env.get(INGRESS_PEERS_ENV)) is not None:
            kwargs["engine_ingress_peers"] = parse_peers(peers, INGRESS_PEERS_ENV)
    except PeerError as exc:
        # Its own variable and entry already named: not the allow-lists' suffix below.
        raise PolicyError(str(exc)) from None
    if dcgm := env.get(DCGM_NAMESPACE_ENV, "").strip():
        # Checked here, so the message is this variable's alone (the allow-lists' below
        # say which of theirs).
        kwargs["dcgm_namespace"] = check_dcgm_namespace(dcgm)
    if (ceiling := env.get(MAX_TRIALS_PER_HOUR_ENV, "")).strip():
        kwargs["max_trials_per_hour"] = parse_trials_per_hour(ceiling)
    try:
        policy = OperatorPolicy(**kwargs)  # type: ignore[arg-type]
    except PolicyError as exc:
        raise PolicyError(f"{exc} (in ${IMAGES_ENV}, ${PROMETHEUS_ENV}, ${STORAGE_ENV}, "
                          f"${DEFAULT_STORAGE_ENV}, ${NAMESPACE_LABEL_ENV}, "
                          f"${PRIORITY_CLASSES_ENV} or ${TOLERATIONS_ENV})") from None
    if default and (problem := policy.default.start_problem(policy.storage_rules)):
        raise PolicyError(problem)
    return policy


def started_policy(env: Mapping[str, str] | None = None) -> OperatorPolicy:
    """``operator_policy`` as the operator's start reads it first, before kopf runs: an
    entry it cannot read stops the start (PolicyError, naming it and the fix), where
    kopf's startup handler would retry it for good; an entry that undoes a
    ``{namespace}`` one (``*``, the same directory for all) is warned of once."""
    policy = operator_policy(env)
    for line in shared_with_namespaces(policy.storage_rules):
        log.warning(line)
    if (warning := policy.default.unset_warning(policy.storage_rules)) is not None:
        log.warning(warning)  # a set one the list refuses stopped the start above
    return policy


def operator_images(env: Mapping[str, str]) -> Images:
    """The images the administrator names for the operator to run (module docstring).

    Checked here, at the start, as docker reads a reference: a typo would otherwise show
    only as every new pod's ImagePullBackOff (or InvalidImageName), long after the
    operator started.
    """
    chosen: dict[str, str] = {}
    for variable, field in IMAGE_ENVS.items():
        raw = env.get(variable, "")
        if not raw.strip():
            continue
        if parse_image(raw) is None:
            shipped = getattr(SHIPPED_IMAGES, field)
            raise PolicyError(f"{variable}={raw[:200]!r} is not a container image reference: "
                              "expected registry/path:tag or registry/path@sha256:digest, "
                              f"e.g. registry.acme.internal/mirror/{_name(shipped)}; fix "
                              f"it, or unset it for the shipped {shipped}")
        chosen[field] = raw
    if "meter" not in chosen and "builtin" in chosen:
        # The meter is slopilot, as the built-in engine's image is: a cluster that
        # mirrored only that one must not have every vLLM pod pull the shipped meter.
        chosen["meter"] = chosen["builtin"]
    return Images(**chosen)


def _name(image: str) -> str:
    return image.rpartition("/")[2]


def prometheus_tls(env: Mapping[str, str]) -> TLSVerify:
    """How every controller checks an https Prometheus's certificate (module docstring).

    ``true``/``false`` exactly: a security switch read loosely (``False``, ``0``, ``no``)
    would leave the administrator guessing which way it went.
    """
    raw = env.get(PROMETHEUS_TLS_VERIFY_ENV, "")
    ca_file = env.get(PROMETHEUS_CA_ENV, "").strip()
    if raw not in ("", "true", "false"):
        raise PolicyError(f"{PROMETHEUS_TLS_VERIFY_ENV}={raw[:40]!r}: expected true or "
                          "false (unset: true, certificates verified)")
    if raw == "false":
        if ca_file:
            raise PolicyError(f"{PROMETHEUS_TLS_VERIFY_ENV}=false with {PROMETHEUS_CA_ENV}="
                              f"{ca_file!r}: a CA to trust means verifying; unset one of "
                              "them")
        log.warning("%s=false: https Prometheus certificates are not verified, so whoever "
                    "can intercept the operator's traffic to Prometheus can feed every "
                    "deployment's control loop its numbers; set %s to the CA's PEM bundle "
                    "instead", PROMETHEUS_TLS_VERIFY_ENV, PROMETHEUS_CA_ENV)
        return TLSVerify(enabled=False)
    if not ca_file:
        return VERIFIED
    tls = TLSVerify(ca_file=ca_file)
    try:
        # Read now, into the policy's own bundle: a file broken after the start then
        # keeps this version trusted rather than failing the controllers built later.
        tls.context()
    except CAFileError as exc:
        raise PolicyError(f"{PROMETHEUS_CA_ENV}: the CA bundle {exc}; mount the PEM "
                          "certificate of the CA that signed Prometheus's certificate there "
                          "(a ConfigMap or Secret volume), or unset it to trust the default "
                          "CAs") from None
    return tls


DAEMON_EXIT_WAIT_S = 2.0
"""How long kopf waits for a stopped daemon to end before it looks again only after the
daemon's ``cancellation_backoff`` (15 s for the tuning daemon): a deleted CR's daemon
ends its trial and study (I/O, under a second as a rule), and its finalizer was
released only at that second look, about 15 s after each deletion. Waited per object,
in that object's own worker."""


def peering_lifetime_s() -> int:
    """How long a silent peer counts as alive: ``$SLOPILOT_PEERING_LIFETIME_S`` or 60."""
    raw = os.environ.get(PEERING_LIFETIME_ENV)
    if raw is None or raw == "":
        return PEERING_LIFETIME_S
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{PEERING_LIFETIME_ENV}={raw!r} is not an integer number of "
                         "seconds; unset it for the default of 60") from None
    if value < MIN_PEERING_LIFETIME_S:
        raise ValueError(f"{PEERING_LIFETIME_ENV}={value} is below "
                         f"{MIN_PEERING_LIFETIME_S} s; set at least that, or unset it "
                         "for the default of 60")
    return value


def configure(settings: kopf.OperatorSettings) -> None:
    """Set everything but the peering name, priority and standalone mode (the command line
    sets those)."""
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "slopilot-operator"
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration")
    settings.peering.lifetime = peering_lifetime_s()
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.watching.chunk_size = WATCH_PAGE
    settings.queueing.idle_timeout = WORKER_IDLE_S
    settings.networking.request_timeout = REQUEST_TIMEOUT_S
    settings.execution.default_backoff = RETRY_BACKOFF_S
    settings.execution.max_workers = HANDLER_THREADS
    settings.background.instant_exit_timeout = DAEMON_EXIT_WAIT_S
