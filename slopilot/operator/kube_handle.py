"""``KubeDeploymentHandle``: the tuner controller's DeploymentHandle over Kubernetes.

- ``scale(n)`` patches the Deployment's replicas, kept within the spec's min and max,
  and only a Deployment whose controller reference names this CR's uid: one of the
  same name that another team made is neither scaled nor counted (``replicas`` is 0).
  The patch names the uid and resourceVersion it judged, so one made again under the
  name, or orphaned, after that look is not scaled either.
- ``apply_config`` for the built-in engine is a live ``PUT /admin/config`` on each ready
  pod (the canary alone, or all of them), on the pod's ``admin`` port, with the token the
  operator minted for this deployment (tokens.py). For vLLM, which has no live
  reconfiguration, it is a rollout: the new knobs change the container's arguments and
  the pod template's checksum annotation.
- ``sync_config`` brings every ready pod's live knobs to the spec's config (``spec.engine``
  with the committed ``tunedConfig``), which the engine otherwise reads only from its
  ConfigMap at start: an edit of a live knob reaches the running pods, and a pod that read
  an older ConfigMap is brought over. The pod a running trial measures gets the trial's
  knobs over it instead, as ``apply_config`` sent them. A pod that is not ready is not
  asked; where the status names it (``PodsConfigured``), it stays named, its holds and
  what the syncs remember of it kept, until a sync finds it ready and right.
- Every config applied to all replicas is recorded in ``status.tunedConfig`` (with a hash
  of the spec it was tuned from) and rendered into the owned objects, so a restarted pod
  starts with it and a later reconcile keeps it instead of reverting to the spec. A
  trial's on every replica (vLLM's, or a built-in one's with one replica or canaries
  off) is recorded as a trial's (``knobs.tuned_record``), only while the daemon's own
  loop state is on record (``holds``), and ``sync_config`` (but during a canary trial)
  puts the committed config back where no trial is on record, or the running trial's
  where another's is recorded, before it sends the pods theirs. ``committed_config``, what
  the loop begins an episode on, reads the committed record alone, never a trial's.

The token only goes to pods the operator made: a pod counts when its controlling owner is
a ReplicaSet whose controlling owner is the Deployment this LLMDeployment controls (uids,
not names, and the ``blockOwnerDeletion`` the ReplicaSet controller sets), with that
ReplicaSet's pod-template hash. Labels and annotations, which anyone who can create a pod
in the namespace can copy, decide nothing.

The canary is chosen once, at a trial's first canary apply, and kept until a config goes
to every replica; it is also recorded in the running trial (the controller's persisted
state), so a restarted operator measures and restores the same pod.

Everything else is read fresh from the API on each call: the handle holds no cache that an
operator restart or a user edit could make stale. Only the parse of the spec is reused
while the object's ``resourceVersion`` is the same (one tick reads it several times).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import httpx

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.server.admin_credential import ADMIN_TOKEN_SHA256_ENV
from slopilot.operator.crd import API_VERSION, KIND, PLURAL
from slopilot.operator.knobs import (
    committed_body,
    committed_overlay,
    trial_recorded,
    tuned_overlay,
    tuned_record,
)
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.ownership import controlled_by, controller_ref
from slopilot.operator.pod_holds import Hold, hold_for, holds_of
from slopilot.operator.pod_memory import PodMemory, named_of
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.reconcile import not_reconciled, reconcile
from slopilot.operator.render import ADMIN_PORT_NAME, selector, vllm_max_num_seqs
from slopilot.operator.spec import Backend, LLMDeploymentSpec, parse_spec
from slopilot.operator.status_writer import ATTEMPTS, replacing
from slopilot.operator.tokens import TokenMint
from slopilot.tuner.prometheus.bounded import (
    Deadline,
    StartTimer,
    bounded_client,
    thread_timer,
)
from slopilot.tuner.prometheus.safe_errors import http_failure, transport_failure

log = logging.getLogger(__name__)
HTTP_TIMEOUT_S = 5.0
POD_ANSWER_DEADLINE_S = 15.0
"""The longest one request to a pod's admin API may take, connect to last byte. The
image is the tenant's: httpx's timeout restarts with every byte, so one that drips its
answer held the sync (a kopf handler thread, and the CR's lock) for as long as it liked.
An engine answers in milliseconds, a PUT once the current iteration ends."""
SYNC_FANOUT = 8
"""Pods one sync asks at once (each with its own connection, for its own deadline)."""
SYNC_DEADLINE_S = 30.0
"""The longest one ``sync_config`` may take, every pod together; each request gets at
most what is left of it. A deadline per request alone let a tenant's image that answered
each just inside it hold the sync (a kopf handler thread and the CR's lock, which the
CR's reconciles and drift repairs wait on, each on a thread) a minute per replica. Healthy
engines answer all 64 replicas' reads in well under a second."""
MAX_CONFIG_BYTES = 64 * 1024
"""The most of a pod's ``GET /admin/config`` answer read (the admin API's own body cap)."""
TEMPLATE_HASH = "pod-template-hash"
CONFIG_PATH, SLO_PATH = "/admin/config", "/admin/slo"
SCALE_ATTEMPTS = 4
"""Reads and conditional patches one scale makes at most: the Deployment controller's
own status writes move the resourceVersion a patch is conditional on."""


class ApplyError(RuntimeError):
    """A replica did not take a config (unreachable, or an error other than a refusal)."""


class NotHeld(ApplyError):
    """Another writer's loop state is on record: the config was not recorded."""


class _NotTaken(ApplyError):
    """A pod took a document (PUT) and answers another (GET): held back (pod_holds.py)."""

    def __init__(self, hold: Hold, what: str) -> None:
        super().__init__(f"{hold.pod}: answers GET {hold.path} with {what} than it took "
                         "by PUT; not sent again until the spec or the pod changes (an "
                         "edit, an engine restart, a replacement)")
        self.hold = hold


def _quoted(value: Any) -> str:
    """A value a pod answered, as a log line or a status condition may quote it: the
    image is the tenant's, and its answer may be 64 KiB of anything."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


@dataclasses.dataclass(frozen=True)
class ConfigSync:
    """What one ``sync_config`` did: the pods it reconfigured, and ``"<pod>: <why>"`` for
    each one it could not read or bring over (its knobs or its SLO)."""

    updated: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    slo_updated: tuple[str, ...] = ()
    """The pods sent ``spec.slo`` to judge requests by (``PUT /admin/slo``)."""
    pods: int | None = None
    """The ready pods checked; None where the backend has no live config (vLLM)."""
    not_configured: tuple[str, ...] = ()
    """The pods ``left``, ``confirming`` and ``resting`` name, each once, by name."""
    held: tuple[Hold, ...] = ()
    """The pods not sent a document they took and contradicted (pod_holds.py)."""
    confirming: tuple[str, ...] = ()
    """``"<pod>: <why>"`` for each pod found right that stays named in PodsConfigured
    until more syncs in a row find it so (pod_memory.py)."""
    resting: tuple[str, ...] = ()
    """``"<pod>: <why>"`` for each pod the status names that is not ready now, so not
    checked, and stays named (pod_memory.py)."""
    not_ready: int = 0
    """The deployment's pods that are there but not ready (not checked)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _PodSync:
    """What a sync did to one pod: ``ConfigSync``'s figures, before they are gathered."""

    name: str
    updated: bool = False
    slo_updated: bool = False
    left: tuple[str, ...] = ()
    held: tuple[Hold, ...] = ()
    seen: tuple[tuple[str, Hold | None], ...] = ()
    """Each path read, with the hold of the document the pod took there (None: none
    sent), for the next sync (pod_memory.py)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Round:
    """What every pod of one sync is asked with."""

    token: str
    ends: float
    """The clock's reading by which the sync is over (``SYNC_DEADLINE_S``)."""
    generation: int | None
    holds: frozenset[Hold]
    """The holds the CR's status records (``status.pods.held``)."""


def ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    return conditions.get("Ready", "True") == "True"


def admin_port(pod: Mapping[str, Any]) -> int | None:
    """The engine container's port named ``admin``, as the operator rendered it."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        if container.get("name") != "engine":
            continue
        for port in container.get("ports") or ():
            if port.get("name") == ADMIN_PORT_NAME and isinstance(port.get("containerPort"),
                                                                   int):
                return int(port["containerPort"])
    return None


Holds = Callable[[Mapping[str, Any]], bool]
"""The CR as it is now in, whether the writer still holds the state on record there."""


class KubeDeploymentHandle:
    """The replicas of LLMDeployment ``namespace/name`` (see the module docstring)."""

    def __init__(self, kube: Kube, namespace: str, name: str, *, mint: TokenMint,
                 policy: OperatorPolicy | None = None,
                 http: httpx.Client | None = None, uid: str | None = None,
                 guard: Callable[[], AbstractContextManager[Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 memory: PodMemory | None = None,
                 holds: Holds | None = None,
                 timer: StartTimer = thread_timer) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.holds = holds
        """Whether the writer acting through this handle (a controller daemon) still
        holds the loop state on record in the CR read (``status.controller``): a vLLM
        config, or a built-in trial's on every replica, is recorded only then (None:
        always)."""
        self.guard = guard if guard is not None else contextlib.nullcontext
        """Held around each write to the Deployment and the rendered objects (the
        operator's per-deployment lock, which its reconciles hold too); never around a
        whole tick, whose simulator and Prometheus calls may take minutes."""
        self.uid = uid
        """The CR's uid, where the caller serves one CR (None: read from the object)."""
        self.mint = mint
        self.clock = clock
        """What ``SYNC_DEADLINE_S`` is counted by."""
        self.timer = timer
        """What each request's deadline is timed by: ``POD_ANSWER_DEADLINE_S``, or what
        ``clock`` says is left of the sync's."""
        self.memory = memory if memory is not None else PodMemory()
        """What the last sync sent each pod (pod_memory.py): the CR's, where the caller
        keeps one across handles (the timer makes a handle per sync)."""
        self.policy = policy if policy is not None else OperatorPolicy()
        # No keep-alive: each request opens its own connection, which its deadline can shut.
        self.http = http or bounded_client(HTTP_TIMEOUT_S)
        self._canary: str | None = None
        self._parsed: tuple[str, LLMDeploymentSpec] | None = None

    # ------------------------------------------------------------------ reads
    def body(self) -> dict[str, Any]:
        """The CR, fresh; ApplyError once it is gone. Where the handle knows the uid, a
        CR made since under the same name is gone too: another deployment, whose pods,
        token and tunedConfig are not this controller's to use."""
        body = self.kube.get(API_VERSION, PLURAL, self.namespace, self.name)
        if body is None:
            raise ApplyError(f"LLMDeployment {self.namespace}/{self.name} is gone")
        if self.uid is not None and str(body["metadata"].get("uid")) != self.uid:
            raise ApplyError(f"LLMDeployment {self.namespace}/{self.name} (uid {self.uid}) "
                             f"is gone: {body['metadata'].get('uid')} is a new one of the "
                             "same name")
        return body

    def spec(self) -> LLMDeploymentSpec:
        return self._spec_of(self.body())

    def _spec_of(self, body: Mapping[str, Any]) -> LLMDeploymentSpec:
        """``parse_spec(body)``, parsed once per version of the object: any change to
        its spec or status (``tunedConfig``) gives it a new ``resourceVersion``."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and self._parsed is not None and self._parsed[0] == str(version):
            return self._parsed[1]
        spec = parse_spec(body)
        if version is not None:
            self._parsed = (str(version), spec)
        return spec

    def _accepted(self, body: Mapping[str, Any]) -> LLMDeploymentSpec:
        """``body``'s spec, where the reconcile would accept it; else ApplyError. A
        caller's own check judged the object it read earlier: an edit since (during a
        tick that may take minutes) is only seen here, and a refused spec touches
        nothing, its knobs and SLO included."""
        spec = self._spec_of(body)
        if problems := policy_problems(spec, self.policy, namespace=self.namespace):
            raise ApplyError(f"{self.name}: the spec is refused: {'; '.join(problems)}")
        if (why := not_reconciled(self.kube, body, spec)) is not None:
            raise ApplyError(f"{self.name}: {why}")
        return spec

    def _uid(self) -> str:
        return self.uid if self.uid is not None else str(self.body()["metadata"].get("uid"))

    def deployment(self) -> dict[str, Any] | None:
        """The CR's Deployment: the one of its name whose controller reference names the
        CR's uid (None: none yet, or another's, which is never read as this CR's)."""
        dep = self.kube.get("apps/v1", "deployments", self.namespace, self.name)
        return dep if controlled_by(dep, KIND, self._uid()) else None

    def replicas(self) -> int:
        dep = self.deployment()
        return 0 if dep is None else int((dep.get("spec") or {}).get("replicas", 1))

    def current_config(self) -> dict[str, Any]:
        """The knobs every replica is to run now: the spec's, with ``status.tunedConfig``
        over them, a trial's recorded there (one on every replica) included."""
        return self.spec().engine.to_dict()

    def committed_config(self) -> dict[str, Any]:
        """The spec's knobs with the committed ``status.tunedConfig`` over them. A
        trial's recorded there is left out, whoever's it is (a daemon that lost its state
        in a restart, another replica's): an episode begun on it rolled back to a config
        never committed, and recorded that as committed."""
        body = self.body()
        if not trial_recorded(body):
            return self._spec_of(body).engine.to_dict()
        # Not the cached parse: this version's spec runs the trial's knobs.
        return parse_spec(committed_body(body)).engine.to_dict()

    def pods(self, body: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Ready engine pods this deployment's own ReplicaSets made, by name."""
        return [p for p in self._own_pods(body) if ready(p)]

    def _own_pods(self, body: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Engine pods this deployment's own ReplicaSets made, ready or not, by name."""
        body = body if body is not None else self.body()
        dep = self.kube.get("apps/v1", "deployments", self.namespace, self.name)
        if dep is None or not controlled_by(dep, KIND, body["metadata"].get("uid")):
            return []
        sel = ",".join(f"{k}={v}" for k, v in selector(self.name).items())
        sets = {rs["metadata"]["uid"]: rs for rs in self.kube.list(
            "apps/v1", "replicasets", self.namespace, label_selector=sel)
            if controlled_by(rs, "Deployment", dep["metadata"].get("uid"))}
        out = []
        for pod in self.kube.list("v1", "pods", self.namespace, label_selector=sel):
            ref = controller_ref(pod)
            rs = sets.get(str(ref.get("uid"))) if ref and ref.get("kind") == "ReplicaSet" \
                else None
            if rs is None:
                continue
            want = (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)
            if want is None or (pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH) != want:
                continue
            out.append(pod)
        return sorted(out, key=lambda p: p["metadata"]["name"])

    def endpoints(self) -> list[str]:
        return [self._url(p) for p in self.pods()]

    def canary_pod(self) -> str | None:
        """The pod trials run on now: this handle's choice, else the running trial's."""
        if self._canary is not None:
            return self._canary
        trial = ((self.body().get("status") or {}).get("controller") or {}).get("trial")
        name = trial.get("canary_replica") if isinstance(trial, Mapping) else None
        return name if isinstance(name, str) else None

    @staticmethod
    def _url(pod: Mapping[str, Any]) -> str:
        port = admin_port(pod)
        if port is None:
            raise ApplyError(f"pod {pod['metadata']['name']} has no '{ADMIN_PORT_NAME}' port "
                             "on its engine container")
        ip = str(pod["status"]["podIP"])
        host = f"[{ip}]" if ":" in ip else ip
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ actions
    def scale(self, n: int) -> None:
        """Patch the replicas of the Deployment this CR controls, on condition of the
        uid and resourceVersion it was judged by; ApplyError where it is not the CR's."""
        spec = self.spec()
        target = min(max(int(n), spec.min_replicas), spec.max_replicas)
        if target != n:
            log.info("%s: scale to %d kept within [%d, %d]: %d", self.name, n,
                     spec.min_replicas, spec.max_replicas, target)
        with self.guard():
            for _ in range(SCALE_ATTEMPTS):
                meta = self._own_deployment()["metadata"]
                # By name alone, a Deployment deleted and made again under the name (by
                # another owner) since the look above was scaled, and so was one orphaned
                # meanwhile (same uid, its owner reference stripped): the API server
                # refuses the patch for any other object or version (409).
                try:
                    self.kube.patch("apps/v1", "deployments", self.namespace, self.name,
                                    {"metadata": {"uid": meta.get("uid"),
                                                  "resourceVersion": meta.get(
                                                      "resourceVersion")},
                                     "spec": {"replicas": target}})
                    return
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        raise
        raise ApplyError(f"{self.name}: not scaled: Deployment/{self.name} changed between "
                         f"each of {SCALE_ATTEMPTS} reads and its conditional patch; the "
                         "next tick tries again")

    def _own_deployment(self) -> dict[str, Any]:
        """The Deployment as it is now, where this CR controls it; else ApplyError."""
        live = self.kube.get("apps/v1", "deployments", self.namespace, self.name)
        if live is None:
            raise ApplyError(f"{self.name}: not scaled: Deployment/{self.name} does not "
                             "exist (not made yet, or deleted)")
        if not controlled_by(live, KIND, self._uid()):
            raise ApplyError(f"{self.name}: not scaled: Deployment/{self.name} is not "
                             "managed by this LLMDeployment")
        return live

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> str | None:
        """Apply to the canary (whose pod name is returned) or to every replica. A
        config every replica runs is recorded in ``status.tunedConfig`` (a ``trial``'s
        as a trial's: ``tuned_record``); a canary's is not recorded. With ``holds``, none
        of it is done (``NotHeld``) unless this writer's loop state is on record: no pod
        is sent a config, and nothing recorded, for a daemon another has overtaken."""
        body = self.body()
        spec = self._accepted(body)
        # Judged whole before any replica sees it (raises ConfigError, named by field).
        new = spec.engine.with_overrides(config, live_only=spec.backend is Backend.BUILTIN)
        if self.holds is not None and not self.holds(body):
            # Before any PUT: an overtaken daemon's trial, commit or rollback put its
            # config on the pods under the other's trial, and its rollback, recorded as
            # committed, wrote over the other's trial record.
            raise NotHeld(f"LLMDeployment {self.namespace}/{self.name}: another writer's "
                          "loop state is on record in status.controller (another operator "
                          "replica's daemon): this config is not applied")
        if spec.backend is Backend.BUILTIN:
            pods = self.pods(body)
            if not pods:
                raise ApplyError(f"{self.name}: no ready pod of this deployment to "
                                 "reconfigure")
            token = self.mint.for_body(body)
            targets = [self._pick_canary(pods)] if canary else pods
            try:
                self._put_all(targets, new, token)
            finally:  # a PUT that failed may have been taken all the same
                self.memory.forget([str(p["metadata"].get("uid")) for p in targets],
                                   CONFIG_PATH)
            if canary:
                return str(targets[0]["metadata"]["name"])  # a trial: nothing recorded
            self._canary = None  # every replica runs the same config again
            # A trial on every replica is recorded as a trial's, as vLLM's are: recorded
            # as committed, another daemon's trial became the spec's config, which each
            # sync sent the pods and the ConfigMap rendered for every restarted one.
            self._record(body, tuned_record(body, new.to_dict(), trial=trial),
                         holds=self.holds)
            return None
        if canary:
            log.info("%s: vLLM cannot reconfigure one replica; rolling all of them",
                     self.name)
        # Recorded as the pods run it: vLLM is given at most the budget's sequences.
        new = dataclasses.replace(new, max_num_seqs=vllm_max_num_seqs(new))
        self._record(body, tuned_record(body, new.to_dict(), trial=trial), holds=self.holds)
        return None

    def _put_all(self, pods: list[dict[str, Any]], config: EngineConfig, token: str) -> None:
        """PUT ``config`` to every pod as a sync asks them: up to ``SYNC_FANOUT`` at once,
        all within ``SYNC_DEADLINE_S``. One after another, a wedged pod held the pods
        after it, and 64 slow ones held the daemon's thread for 16 minutes. ApplyError
        naming each pod that did not take it (after every pod was asked); ConfigError
        where one refused it."""
        ends = self.clock() + SYNC_DEADLINE_S

        def put(pod: Mapping[str, Any]) -> str | None:
            try:
                self._put(pod, config, token, ends)
            except ApplyError as exc:
                return str(exc)
            return None

        with ThreadPoolExecutor(max_workers=max(1, min(SYNC_FANOUT, len(pods))),
                                thread_name_prefix=f"apply-{self.name}") as pool:
            failed = [why for why in pool.map(put, pods) if why is not None]
        if failed:
            raise ApplyError("; ".join(failed))

    def sync_config(self, *, trial: Mapping[str, Any] | None = None,
                    trial_on: str | None = None, holds: Holds | None = None) -> ConfigSync:
        """Bring every ready pod to the config it should run, where its knobs differ: the
        spec's, or on the pod a running ``trial`` measures (``trial_on``; None: every
        pod) the trial's knobs over it, as ``apply_config`` sent them (a canary that
        restarted mid-trial came back on the ConfigMap's). First, unless a canary
        trial runs, ``status.tunedConfig`` is put right (``_sync_recorded``: the
        committed config where a trial's is recorded and no ``trial`` runs, the running
        trial's where another's is), only while ``holds`` (NotHeld: nothing recorded,
        no pod sent anything); the pods are then sent the config it renders. vLLM's
        knobs are arguments that a rollout sets: no pod is asked.

        Each pod is read first (``GET /admin/config``), so a pod already right is not
        written; so is the SLO it judges requests by (``/admin/slo``: ``spec.slo``). A pod
        that runs other restart knobs (block size, swap space) is from an
        older pod template: the rollout replaces it, and a live PUT could not change them.
        Up to ``SYNC_FANOUT`` pods at once, all of it within ``SYNC_DEADLINE_S``: the
        pods it has no time left for are in ``left``. A pod sent a document is read
        again, and one that contradicts what it took, then or at the next sync's first
        read (pod_memory.py), is in ``left`` and ``held``, and is not sent it again while
        the hold stands (pod_holds.py). A pod the status names that is found right stays
        named (``confirming``) until enough syncs in a row find it so (pod_memory.py),
        and so does one that is not ready (``resting``), with its holds.
        ApplyError, with nothing sent, for a spec the reconcile refuses.
        """
        body = self.body()
        spec = self._accepted(body)
        # A canary trial is not recorded: its config is the canary's alone, and put in
        # the record it would be rendered to every replica.
        whole = spec.backend is not Backend.BUILTIN or trial is None or trial_on is None
        if whole and self._sync_recorded(body, spec.backend, trial,
                                         holds if holds is not None else self.holds):
            body = self.body()  # the pods are sent the config now recorded
            spec = self._accepted(body)
        if spec.backend is not Backend.BUILTIN:
            return ConfigSync()
        trial_config = None if trial is None else \
            spec.engine.with_overrides(trial, live_only=True)
        slo = spec.slo.to_dict()
        own = self._own_pods(body)
        pods = [p for p in own if ready(p)]
        # Not checked, but not gone either: what the status names of them stays, or an
        # image that fails its readiness probe at every other sync had the status written
        # at every sync (named, named no more, named again).
        resting = [p for p in own if not ready(p)
                   and not p["metadata"].get("deletionTimestamp")]
        round_ = _Round(self.mint.for_body(body), self.clock() + SYNC_DEADLINE_S,
                        body["metadata"].get("generation"), holds_of(body))

        def sync(pod: Mapping[str, Any]) -> _PodSync:
            name = str(pod["metadata"]["name"])
            config = trial_config if trial_config is not None and trial_on in (None, name) \
                else spec.engine
            return self._sync_pod(pod, config, slo, round_)

        # Pods are asked side by side: one whose answers are slow (a wedged engine thread
        # holds a PUT until its deadline) holds its own worker, not every pod after it.
        with ThreadPoolExecutor(max_workers=max(1, min(SYNC_FANOUT, len(pods))),
                                thread_name_prefix=f"sync-{self.name}") as pool:
            done = list(pool.map(sync, pods))  # in the pods' order, whatever finished first
        updated = [d.name for d in done if d.updated]
        slo_updated = [d.name for d in done if d.slo_updated]
        if updated:
            log.info("%s: its config sent to %s", self.name, ", ".join(updated))
        if slo_updated:
            log.info("%s: its SLO sent to %s", self.name, ", ".join(slo_updated))
        uids = [str(p["metadata"].get("uid")) for p in pods]
        resting_ids = [(str(p["metadata"].get("uid")), str(p["metadata"]["name"]))
                       for p in resting]
        self.memory.remember([*uids, *(uid for uid, _ in resting_ids)],
                             ((uid, path, taken) for uid, d in zip(uids, done, strict=True)
                              for path, taken in d.seen))
        stay = self.memory.confirm([(uid, d.name, not d.left)
                                    for uid, d in zip(uids, done, strict=True)],
                                   named_of(body), resting_ids)
        confirming = tuple(f"{d.name}: runs what it should again; named until "
                           f"{stay[d.name]} syncs in a row find it so" for d in done
                           if d.name in stay)
        kept = [(uid, name) for uid, name in resting_ids if name in stay]
        # A hold of a pod not checked stands, as one of a pod that did not answer does.
        kept_uids = {uid for uid, _ in kept}
        # Sorted by pod: the status keeps the lists as given, and two that differ in
        # order alone would be written again.
        held = sorted([*(h for d in done for h in d.held),
                       *(h for h in round_.holds if h.uid in kept_uids)],
                      key=lambda h: (h.pod, h.path))
        named = sorted([*(d.name for d in done if d.left or d.name in stay),
                        *(name for _, name in kept)])
        return ConfigSync(tuple(updated), tuple(why for d in done for why in d.left),
                          tuple(slo_updated), len(pods), tuple(named), tuple(held),
                          confirming,
                          tuple(f"{name}: not ready; named until {stay[name]} syncs in "
                                "a row find it ready and running what it should"
                                for _, name in kept), len(resting))

    def _sync_pod(self, pod: Mapping[str, Any], config: EngineConfig, slo: dict[str, Any],
                  round_: _Round) -> _PodSync:
        """Bring one pod to ``config`` and ``slo`` by the round's end, where it runs
        others."""
        name = str(pod["metadata"]["name"])
        token, ends = round_.token, round_.ends
        want = config.to_dict()
        # A hold stands until the pod is found running the document, or something it is
        # keyed by changes: a sync that could not tell (the pod did not answer, the
        # deadline) keeps it, or a pod that fails every other read is sent it again.
        held = {h.path: h for h in (hold_for(pod, round_.generation, CONFIG_PATH, want),
                                    hold_for(pod, round_.generation, SLO_PATH, slo))
                if h in round_.holds}
        seen: dict[str, Hold | None] = {}

        def result(*, updated: bool = False, slo_updated: bool = False,
                   left: tuple[str, ...] = ()) -> _PodSync:
            return _PodSync(name, updated, slo_updated, left, tuple(held.values()),
                            tuple(seen.items()))

        if self.clock() >= ends:  # it waits for the next sync, named meanwhile
            return result(left=(f"{name}: not checked: this sync's {SYNC_DEADLINE_S:g} s "
                                "(SYNC_DEADLINE_S) went to slower pods",))
        try:
            runs = self._get(pod, token, ends=ends)
        except ApplyError as exc:
            return result(left=(str(exc),))
        if not isinstance(runs, dict):
            return result(left=(f"{name}: /admin/config did not answer a JSON object of "
                                "knobs",))
        seen[CONFIG_PATH] = None
        left: list[str] = []
        try:
            slo_updated = self._sync_slo(pod, slo, round_, seen)
            held.pop(SLO_PATH, None)
        except ApplyError as exc:  # the knobs are still brought over
            slo_updated = False
            left.append(str(exc))
            if isinstance(exc, _NotTaken):
                held[SLO_PATH] = exc.hold
        if restart := [f"{k}={_quoted(runs.get(k))}" for k in EngineConfig.restart_knobs()
                       if runs.get(k) != want[k]]:
            left.append(f"{name}: runs {', '.join(restart)}, which only a restart "
                        "changes; the rollout of the new pod template replaces it")
            return result(slo_updated=slo_updated, left=tuple(left))

        def runs_it(answer: Any) -> bool:
            return isinstance(answer, dict) and all(answer.get(k) == v
                                                    for k, v in want.items())

        if runs_it(runs):
            held.pop(CONFIG_PATH, None)
            return result(slo_updated=slo_updated, left=tuple(left))
        try:
            hold = self._unless_held(pod, CONFIG_PATH, want, round_, "other knobs")
            self._put(pod, config, token, ends)
            seen[CONFIG_PATH] = hold
            self._read_back(pod, hold, runs_it, round_, "other knobs")
        except (ApplyError, ConfigError) as exc:
            if isinstance(exc, _NotTaken):
                held[CONFIG_PATH] = exc.hold
            return result(slo_updated=slo_updated, left=(*left, str(exc)))
        held.pop(CONFIG_PATH, None)
        return result(updated=True, slo_updated=slo_updated, left=tuple(left))

    def _sync_slo(self, pod: Mapping[str, Any], slo: dict[str, Any], round_: _Round,
                  seen: dict[str, Hold | None]) -> bool:
        """Send ``slo`` (``spec.slo``) to ``pod`` unless it judges by it already; whether
        it was sent (and in ``seen``, what it took). The engine reads the ConfigMap's
        only at start, as its knobs."""
        token, ends = round_.token, round_.ends
        runs = self._get(pod, token, SLO_PATH, ends=ends)
        seen[SLO_PATH] = None
        if runs == slo:
            return False
        hold = self._unless_held(pod, SLO_PATH, slo, round_, "other objectives")
        name = pod["metadata"]["name"]
        url = self._url(pod) + SLO_PATH
        status, ctype = self._send(name, url, slo, token, ends)
        if status >= 300:
            try:
                self._refused(name, url, status, ctype)
            except ConfigError as exc:  # a 400: an engine that reads SLOs otherwise
                raise ApplyError(f"{exc} (the SLO at {url})") from None
        seen[SLO_PATH] = hold
        self._read_back(pod, hold, lambda answer: answer == slo, round_, "other objectives")
        return True

    def _unless_held(self, pod: Mapping[str, Any], path: str, document: Any,
                     round_: _Round, what: str) -> Hold:
        """The hold that sending ``document`` to ``path`` would earn, should the pod
        contradict it; _NotTaken, with nothing sent, where that hold stands already, or
        where the pod took the document at the last sync and answers another now
        (pod_memory.py)."""
        hold = hold_for(pod, round_.generation, path, document)
        if hold in round_.holds or self.memory.took(hold):
            raise _NotTaken(hold, what)
        return hold

    def _read_back(self, pod: Mapping[str, Any], hold: Hold, took: Callable[[Any], bool],
                   round_: _Round, what: str) -> None:
        """Read ``hold.path`` again after its PUT was taken; _NotTaken where the pod
        answers other than it took. An engine answers what it took from then on, so an
        answer that is not it, sent again, would be sent at every sync."""
        if not took(self._get(pod, round_.token, hold.path, ends=round_.ends)):
            raise _NotTaken(hold, what)

    def _pick_canary(self, pods: list[dict[str, Any]]) -> dict[str, Any]:
        wanted = self.canary_pod()
        for pod in pods:
            if pod["metadata"]["name"] == wanted:
                return pod
        if wanted is not None:
            log.warning("%s: canary %s is gone; the trial moves to %s", self.name, wanted,
                        pods[0]["metadata"]["name"])
        self._canary = str(pods[0]["metadata"]["name"])
        return pods[0]

    def _get(self, pod: Mapping[str, Any], token: str, path: str = CONFIG_PATH, *,
             ends: float | None = None) -> Any:
        """``path`` of ``pod``'s admin API, parsed (read up to ``MAX_CONFIG_BYTES``: the
        image is the tenant's, so the answer may be anything); by ``ends`` (the clock's
        reading) where given."""
        name = pod["metadata"]["name"]
        url = self._url(pod) + path
        # Read as sent, never inflated: the cap counts what the operator holds, and a
        # compressed answer (Content-Encoding, asked for or not) inflates a thousandfold.
        headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
        with self._bounded(name, url, ends) as extensions, \
                self.http.stream("GET", url, headers=headers, extensions=extensions) as resp:
            if resp.status_code == 400:  # a read sends no config for it to refuse
                raise ApplyError(f"{name} at {url}: " + http_failure(
                    resp.status_code, resp.headers.get("content-type")))
            if resp.status_code != 200:
                self._refused(name, url, resp.status_code,
                              resp.headers.get("content-type"))
            data = b""
            for chunk in resp.iter_raw():
                data += chunk
                if len(data) > MAX_CONFIG_BYTES:
                    raise ApplyError(f"{name}: {url} answered more than "
                                     f"{MAX_CONFIG_BYTES} bytes; a config is a few "
                                     "hundred")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # also nested past the parser's depth
            raise ApplyError(f"{name}: {url} did not answer JSON") from None

    @staticmethod
    def _refused(name: str, url: str, status: int, ctype: str | None) -> None:
        """Raise for a non-2xx answer; never quoting its body (safe_errors)."""
        what = http_failure(status, ctype)
        if status == 400:
            raise ConfigError(f"{name} refused the config: {what}")
        if status in (401, 403):
            raise ApplyError(
                f"{name} refused the operator's admin token ({what}): the pod does not run "
                f"this deployment's current {ADMIN_TOKEN_SHA256_ENV} (a rollout under way, "
                "or an image too old to read it: use a current slopilot image)")
        raise ApplyError(f"{name} at {url}: {what}")

    def _put(self, pod: Mapping[str, Any], config: EngineConfig, token: str,
             ends: float | None = None) -> None:
        name = pod["metadata"]["name"]
        url = self._url(pod) + CONFIG_PATH
        status, ctype = self._send(name, url, config.to_dict(), token, ends)
        if status >= 300:
            self._refused(name, url, status, ctype)

    def _send(self, name: str, url: str, data: Any, token: str,
              ends: float | None = None) -> tuple[int, str | None]:
        """PUT ``data`` to ``url``: the answer's status and content type. Its body is never
        read: the image is the tenant's, and an endless body read whole (httpx's
        ``put``) would fill the operator's memory."""
        with self._bounded(name, url, ends) as extensions, \
                self.http.stream("PUT", url, json=data, extensions=extensions,
                                 headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status_code, resp.headers.get("content-type")

    @contextlib.contextmanager
    def _bounded(self, name: str, url: str, ends: float | None = None
                 ) -> Iterator[dict[str, Any]]:
        """The ``extensions`` of one request to ``name``'s admin API, whose whole answer
        then has ``POD_ANSWER_DEADLINE_S``, or what is left until ``ends`` if less (a
        sync's deadline); its transport errors as ApplyError."""
        deadline_s = POD_ANSWER_DEADLINE_S
        bound = f"{deadline_s:g} s deadline per request (POD_ANSWER_DEADLINE_S)"
        if ends is not None and (left_s := ends - self.clock()) < deadline_s:
            if left_s <= 0:
                raise ApplyError(f"{name} at {url}: not asked: this sync's "
                                 f"{SYNC_DEADLINE_S:g} s (SYNC_DEADLINE_S) are over")
            # Named by the sync's whole deadline: what was left varies, and the
            # PodsConfigured message, which quotes this, is written only when it changes.
            deadline_s = left_s
            bound = f"{SYNC_DEADLINE_S:g} s of this sync (SYNC_DEADLINE_S)"
        deadline = Deadline(deadline_s, self.timer)
        late = (f"{name} at {url}: did not finish its answer within the {bound}; "
                "an engine answers in milliseconds: is this image the engine?")
        try:
            yield {"trace": deadline.trace}
        except httpx.HTTPError as exc:
            if deadline.passed:  # the deadline shut the socket under the read
                raise ApplyError(late) from None
            raise ApplyError(f"{name} at {url}: {transport_failure(exc)}") from None
        finally:
            deadline.cancel()
        if deadline.passed:  # a shut socket ends a body without a length as if complete
            raise ApplyError(late)

    def _sync_recorded(self, body: Mapping[str, Any], backend: Backend,
                       trial: Mapping[str, Any] | None, holds: Holds | None) -> bool:
        """Put in ``status.tunedConfig`` the config every replica is to run; whether it
        was written. vLLM runs it (its knobs are arguments, rendered from it), and so
        does a built-in pod (the ConfigMap's at start, the spec's at each sync): where
        it is a trial's config and no trial is on record (its daemon was overtaken by
        another's, or the state reset), the committed config goes back; where another
        trial is on record than the one recorded, that trial's config goes on. Never
        called for a built-in canary trial, which is not recorded. Written only while
        ``holds`` says the state judged is still on record."""
        if trial is None:
            if not trial_recorded(body):
                return False
            log.warning("%s: a trial's config is recorded but no trial is on record: the "
                        "committed config goes back", self.name)
            self._record(body, tuned_record(body, committed_overlay(body), trial=False),
                         holds=holds)
            return True
        # The trial's knobs over the committed config, as apply_config recorded them.
        builtin = backend is Backend.BUILTIN
        new = parse_spec(committed_body(body)).engine.with_overrides(trial,
                                                                     live_only=builtin)
        if not builtin:
            new = dataclasses.replace(new, max_num_seqs=vllm_max_num_seqs(new))
        engine = new.to_dict()
        if tuned_overlay(body) == engine:
            return False
        log.warning("%s: the recorded config is not the running trial's: the trial's goes "
                    "on", self.name)
        self._record(body, tuned_record(body, engine, trial=True), holds=holds)
        return True

    def _record(self, body: Mapping[str, Any], tuned: dict[str, Any] | None, *,
                holds: Holds | None = None) -> None:
        """Persist the config every replica runs (``tuned``: ``status.tunedConfig``, as
        judged from ``body``; None: none), then render it (ConfigMap, vLLM args). With ``holds``,
        only while the writer still holds the loop state on record, and conditional on
        the version judged: a second daemon's trial (before the peering paused it) was
        rendered over the first's, and measured as the first's."""
        uid = body["metadata"].get("uid")
        with self.guard():
            updated = self._write_record(uid, tuned, holds)
            outcome = reconcile(self.kube, updated, policy=self.policy, mint=self.mint)
        if not outcome.valid:
            raise ApplyError(f"{self.name}: the spec became invalid: {outcome.problems}")

    def _write_record(self, uid: Any, tuned: dict[str, Any] | None,
                      holds: Holds | None) -> dict[str, Any]:
        """``status.tunedConfig`` replaced whole by ``tuned`` (a committed record drops a
        trial's keys). The uid is a precondition: the
        pods' PUTs take a while, and a CR deleted and re-created under the name meanwhile
        took this one's tuned config (its ConfigMap rendered from it) when it was written
        by name. With ``holds``, the resourceVersion read is one too."""
        for _ in range(ATTEMPTS):
            fresh = self.body()
            if holds is not None and not holds(fresh):
                raise NotHeld(
                    f"LLMDeployment {self.namespace}/{self.name}: another writer's loop "
                    "state is on record in status.controller (another operator replica's "
                    "daemon): this config is not recorded, and the state on record is "
                    "resumed")
            old = (fresh.get("status") or {}).get("tunedConfig")
            meta: dict[str, Any] = {"uid": uid}
            if holds is not None:
                meta["resourceVersion"] = fresh["metadata"]["resourceVersion"]
            patch = {"metadata": meta, "status": {
                "tunedConfig": None if tuned is None else replacing(tuned, old)}}
            try:
                return self.kube.patch(API_VERSION, PLURAL, self.namespace, self.name,
                                       patch, subresource="status")
            except ApiError as exc:
                if exc.status == 409 and holds is not None and \
                        str(self.body()["metadata"].get("uid")) == str(uid):
                    continue  # a concurrent write moved the version: judged again
                if exc.status not in (404, 409):
                    raise
                raise ApplyError(f"LLMDeployment {self.namespace}/{self.name} (uid {uid}) "
                                 "is gone: its config was not recorded") from None
        raise ApplyError(f"LLMDeployment {self.namespace}/{self.name}: {ATTEMPTS} writes of "
                         "its config in a row met a concurrent write; not recorded")
