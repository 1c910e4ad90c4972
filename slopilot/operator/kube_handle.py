"""``KubeDeploymentHandle``: the tuner controller's DeploymentHandle over Kubernetes.

- ``scale(n)`` patches the Deployment's replicas, kept within the spec's min and max,
  and only a Deployment whose controller reference names this CR's uid: one of the
  same name that another team made is neither scaled nor counted (``replicas`` is 0).
  The patch names the uid and resourceVersion it judged, so one made again under the
  name, or orphaned, after that look is not scaled either. It stamps the scale on the
  Deployment over the loop state on record (scale_stamp.py): a scale whose tick was
  never recorded is made again from the count that state knew, not one more.
- ``apply_config`` for the built-in engine is a live ``PUT /admin/config`` on each ready
  pod (the canary alone, or all of them), on the pod's ``admin`` port, with the token the
  operator minted for this deployment (tokens.py). For vLLM, which has no live
  reconfiguration, it is a rollout: the new knobs change the container's arguments and
  the pod template's checksum annotation.
- ``sync_config`` brings every ready pod's live knobs and SLO to the spec
  (config_sync.py), once ``status.tunedConfig`` is put right (tuned_status.py).

The handle holds one object per job: the pods' admin API (``admin``, pod_admin.py), the
record of the config every replica runs (``tuned``, tuned_status.py), and the sync of the
pods to the spec (``syncer``, config_sync.py).

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
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import httpx

from slopilot.engine.config import EngineConfig
from slopilot.operator import vllm_take_back
from slopilot.operator.config_sync import ConfigSync, ConfigSyncer
from slopilot.operator.crd import API_VERSION, KIND, PLURAL
from slopilot.operator.engine_deployment import vllm_max_num_seqs
from slopilot.operator.knobs import committed_body, trial_recorded, tuned_record
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.owned_pods import owned_pods
from slopilot.operator.ownership import controlled_by
from slopilot.operator.pod_admin import CONFIG_PATH, ApplyError, PodAdmin, admin_url, ready
from slopilot.operator.pod_memory import PodMemory
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.reconcile import not_reconciled
from slopilot.operator.replica_readiness import why_not_ready
from slopilot.operator.rollout_status import rollout_of
from slopilot.operator.scale_stamp import ScaleStamp, read_stamp, record_digest
from slopilot.operator.spec import MAX_REPLICAS, Backend, LLMDeploymentSpec, parse_spec
from slopilot.operator.tokens import TokenMint
from slopilot.operator.tuned_status import Holds, NotHeld, TunedStatus
from slopilot.tuner.loop.ports import Pending, Replicas, Rollout, Settled
from slopilot.tuner.prometheus.bounded import StartTimer, thread_timer

log = logging.getLogger(__name__)
SCALE_ATTEMPTS = 4
"""Reads and conditional patches one scale makes at most: the Deployment controller's
own status writes move the resourceVersion a patch is conditional on."""


class KubeDeploymentHandle:
    """The replicas of LLMDeployment ``namespace/name`` (see the module docstring)."""

    def __init__(self, kube: Kube, namespace: str, name: str, *, mint: TokenMint,
                 policy: OperatorPolicy | None = None,
                 http: httpx.Client | None = None, uid: str | None = None,
                 guard: Callable[[], AbstractContextManager[Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 memory: PodMemory | None = None,
                 holds: Holds | None = None,
                 timer: StartTimer = thread_timer,
                 record: Callable[[], Any] | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.holds = holds
        self.record = record
        """The loop state on record that the running tick began from (``status.controller``
        as ``loop_status.on_record`` reads it), which each scale is stamped over
        (scale_stamp.py); None: no stamp (the caller runs no loop)."""
        self._stamped: str | None = None
        """The state on record this handle's last scale was stamped over."""
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
        self.memory = memory if memory is not None else PodMemory()
        """What the last sync sent each pod (pod_memory.py): the CR's, where the caller
        keeps one across handles (the timer makes a handle per sync)."""
        self.policy = policy if policy is not None else OperatorPolicy()
        self.admin = PodAdmin(http, clock=clock, timer=timer)
        self.tuned = TunedStatus(kube, namespace, name, mint=mint, policy=self.policy,
                                 guard=self.guard, body=self.body)
        self.syncer = ConfigSyncer(self.admin, self.memory, name)
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
        """The replicas the Deployment asks; the count from before a scale the state on
        record does not know, while it is the lost tick's to make again (scale_stamp.py)."""
        dep = self.deployment()
        if dep is None:
            return 0
        unrecorded = self._unrecorded(dep)
        if unrecorded is not None and unrecorded.over != self._stamped:
            return unrecorded.before
        return _asked(dep)

    def replica_counts(self) -> Replicas:
        """The replicas asked for (``replicas``) and the ready pods of this deployment's
        own ReplicaSets: those a canary, a config and a scrape reach. Counted from the
        pods, not the Deployment's ``status.readyReplicas``, which its controller writes
        behind them and which counts any pod its selector matches. With fewer ready than
        asked, why, where a condition or the pods say (replica_readiness.py)."""
        asked = self.replicas()
        dep, sets, pods = self._owned()
        if dep is None:
            return Replicas(asked, 0)
        ready_now = sum(1 for p in pods if ready(p))
        if ready_now >= asked:
            return Replicas(asked, ready_now)
        return Replicas(asked, ready_now, why_not_ready(
            dep, sets, [p for p in pods if not ready(p)]))

    def _unrecorded(self, dep: Mapping[str, Any]) -> ScaleStamp | None:
        """The Deployment's stamp of a scale made over the state on record now, which it
        still asks; None where there is none (scale_stamp.py)."""
        if self.record is None:
            return None
        stamp = read_stamp(dep)
        if stamp is None or stamp.to != _asked(dep) \
                or stamp.over != record_digest(self.record()):
            return None
        return stamp

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
        return self._owned(body)[2]

    def _owned(self, body: Mapping[str, Any] | None = None) -> tuple[
            dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
        """This CR's Deployment (None: none, or another's), its own ReplicaSets, and the
        engine pods they made, ready or not, by name (owned_pods.py)."""
        body = body if body is not None else self.body()
        found = owned_pods(self.kube, self.namespace, self.name, body["metadata"].get("uid"),
                           max_replicas=self._spec_of(body).max_replicas)
        return found.deployment, found.replica_sets, found.pods

    def endpoints(self) -> list[str]:
        return [admin_url(p) for p in self.pods()]

    def settled(self, now: float) -> Rollout:
        """The built-in engine's configs are live PUTs: settled once applied. vLLM's
        are a rollout, read from the Deployment's status (rollout_status.py); none of
        this CR's yet is pending."""
        if self.spec().backend is Backend.BUILTIN:
            return Settled()
        dep = self.deployment()
        if dep is None:
            return Pending(f"no Deployment/{self.name} of this LLMDeployment yet")
        return rollout_of(dep)

    def canary_pod(self) -> str | None:
        """The pod trials run on now: this handle's choice, else the running trial's."""
        if self._canary is not None:
            return self._canary
        trial = ((self.body().get("status") or {}).get("controller") or {}).get("trial")
        name = trial.get("canary_replica") if isinstance(trial, Mapping) else None
        return name if isinstance(name, str) else None

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
                dep = self._own_deployment()
                meta = dep["metadata"]
                # By name alone, a Deployment deleted and made again under the name (by
                # another owner) since the look above was scaled, and so was one orphaned
                # meanwhile (same uid, its owner reference stripped): the API server
                # refuses the patch for any other object or version (409).
                patch: dict[str, Any] = {
                    "metadata": {"uid": meta.get("uid"),
                                 "resourceVersion": meta.get("resourceVersion")},
                    "spec": {"replicas": target}}
                stamp = self._stamp(dep, target)
                if stamp is not None:  # in the same patch: no scale without its stamp
                    patch["metadata"]["annotations"] = stamp.annotation()
                try:
                    self.kube.patch("apps/v1", "deployments", self.namespace, self.name,
                                    patch)
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        raise
                    continue
                self._stamped = None if stamp is None else stamp.over
                return
        raise ApplyError(f"{self.name}: not scaled: Deployment/{self.name} changed between "
                         f"each of {SCALE_ATTEMPTS} reads and its conditional patch; the "
                         "next tick tries again")

    def _stamp(self, dep: Mapping[str, Any], target: int) -> ScaleStamp | None:
        """The stamp of a scale of ``dep`` to ``target``, from the count the state on
        record knew (the lost scale's before, where this is that scale made again)."""
        if self.record is None:
            return None
        unrecorded = self._unrecorded(dep)
        before = unrecorded.before if unrecorded is not None else _asked(dep)
        return ScaleStamp(record_digest(self.record()), before, target)

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
            if canary and len(pods) < 2:
                # The canary's config is judged against the others'; on the one pod
                # that serves, a trial took all of the traffic with none to compare.
                raise ApplyError(f"{self.name}: a canary needs 2 ready pods, "
                                 f"{len(pods)} ready: no trial on a canary")
            token = self.mint.for_body(body)
            targets = [self._pick_canary(pods)] if canary else pods
            try:
                self.admin.put_all(targets, new, token, self.name)
            finally:  # a PUT that failed may have been taken all the same
                self.memory.forget([str(p["metadata"].get("uid")) for p in targets],
                                   CONFIG_PATH)
            if canary:
                return str(targets[0]["metadata"]["name"])  # a trial: nothing recorded
            self._canary = None  # every replica runs the same config again
            # A trial on every replica is recorded as a trial's, as vLLM's are: recorded
            # as committed, another daemon's trial became the spec's config, which each
            # sync sent the pods and the ConfigMap rendered for every restarted one.
            self.tuned.record(body, tuned_record(body, new.to_dict(), trial=trial),
                         holds=self.holds)
            return None
        if canary:
            log.info("%s: vLLM cannot reconfigure one replica; rolling all of them",
                     self.name)
        # Recorded as the pods run it: vLLM is given at most the budget's sequences.
        new = dataclasses.replace(new, max_num_seqs=vllm_max_num_seqs(new))
        self.tuned.record(body, tuned_record(body, new.to_dict(), trial=trial), holds=self.holds)
        return None

    def sync_config(self, *, trial: Mapping[str, Any] | None = None,
                    trial_on: str | None = None, holds: Holds | None = None) -> ConfigSync:
        """Bring every ready pod to the config it should run, where its knobs differ: the
        spec's, or on the pod a running ``trial`` measures (``trial_on``; None: every
        pod) the trial's knobs over it, as ``apply_config`` sent them (a canary that
        restarted mid-trial came back on the ConfigMap's). First, unless a canary
        trial runs, ``status.tunedConfig`` is put right (``TunedStatus.sync``: the
        committed config where a trial's is recorded and no ``trial`` runs, the running
        trial's where another's is), only while ``holds`` (NotHeld: nothing recorded,
        no pod sent anything); the pods are then sent the config it renders
        (``ConfigSyncer.sync``: each read first, side by side, within one deadline). vLLM's
        knobs are arguments that a rollout sets: no pod is asked.
        ApplyError, with nothing sent, for a spec the reconcile refuses.
        """
        body = self.body()
        spec = self._accepted(body)
        # A canary trial is not recorded: its config is the canary's alone, and put in
        # the record it would be rendered to every replica.
        whole = spec.backend is not Backend.BUILTIN or trial is None or trial_on is None
        if whole and self.tuned.sync(body, spec.backend, trial,
                                     holds if holds is not None else self.holds):
            body = self.body()  # the pods are sent the config now recorded
            spec = self._accepted(body)
        if spec.backend is not Backend.BUILTIN:
            return ConfigSync()
        return self.syncer.sync(body, spec, self._own_pods(body), self.mint.for_body(body),
                                trial=trial, trial_on=trial_on)

    def take_back(self, config: Mapping[str, Any], backend: str) -> list[str]:
        """Every ready pod that runs other knobs sent ``config``, a whole engine config
        from the operator's own record (an episode's, kept under a spec it accepted),
        where it cannot be recorded now (a refused spec, a status that takes no write):
        a trial's config the operator put on the pods is taken off them, and nothing of
        the refused spec is sent, nor recorded (``status.tunedConfig`` is put right by
        the first sync of a spec it accepts). ``backend`` is the one the pods run, from
        that same record: the refused spec's is not read (one naming vLLM while the
        reconcile, refusing it, left the built-in pods as they were, said there was
        nothing to take back). On vLLM, whose knobs are arguments no pod takes, the
        Deployment's are patched, and stamped so that no reconcile renders the trial's
        record again (vllm_take_back.py). What was sent the config: pods, or the
        Deployment (none where all ran it already). ApplyError naming each pod that did
        not take it, or why the Deployment was not patched; ConfigError for a config
        the engine refuses."""
        if backend == Backend.VLLM.value:
            body = self.body()
            with self.guard():  # the reconciles' lock: a repair renders after, not during
                rolled = vllm_take_back.take_back(self.kube, self.namespace, self.name,
                                                  self._uid(), config, body.get("status"),
                                                  self.mint)
            return [f"Deployment/{self.name}"] if rolled else []
        body = self.body()
        engine = EngineConfig().with_overrides(config)
        want, token = engine.to_dict(), self.mint.for_body(body)
        # The refused spec's replica bound is not read: the most any spec may ask.
        found = owned_pods(self.kube, self.namespace, self.name,
                           body["metadata"].get("uid"), max_replicas=MAX_REPLICAS)
        pods = [p for p in found.pods if ready(p) and self._runs_other(p, token, want)]
        if pods:
            self.admin.put_all(pods, engine, token, self.name)
        return [str(p["metadata"]["name"]) for p in pods]

    def _runs_other(self, pod: Mapping[str, Any], token: str, want: Mapping[str, Any]
                    ) -> bool:
        """Whether ``pod`` runs other knobs than ``want`` (or did not say)."""
        try:
            runs = self.admin.get(pod, token)
        except ApplyError:
            return True
        return not isinstance(runs, dict) or any(runs.get(k) != v for k, v in want.items())

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


def _asked(dep: Mapping[str, Any]) -> int:
    """The replicas ``dep`` asks for."""
    return int((dep.get("spec") or {}).get("replicas", 1))
