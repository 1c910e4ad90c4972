"""``KubeDeploymentHandle``: the tuner controller's DeploymentHandle over Kubernetes.

- ``scale(n)`` patches the Deployment's replicas, kept within the spec's min and max.
- ``apply_config`` for the built-in engine is a live ``PUT /admin/config`` on each ready
  pod (the canary alone, or all of them), with the bearer token read from the deployment's
  Secret. For vLLM, which has no live reconfiguration, it is a rollout: the new knobs
  change the container's arguments and the pod template's checksum annotation.
- Every config applied to all replicas is recorded in ``status.tunedConfig`` (with a hash
  of the spec it was tuned from) and rendered into the owned objects, so a restarted pod
  starts with it and a later reconcile keeps it instead of reverting to the spec.

Everything is read fresh from the API on each call: the handle holds no cache that an
operator restart or a user edit could make stale. Only the parse of the spec is reused
while the object's ``resourceVersion`` is the same (one tick reads it several times).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.kubeapi import Kube
from slopilot.operator.reconcile import effective_spec, engine_checksum, reconcile
from slopilot.operator.render import PORT, selector
from slopilot.operator.spec import Backend, LLMDeploymentSpec

log = logging.getLogger(__name__)
# Where a pod serves /admin/config when not on the rendered port (local test servers,
# port-mapped sidecars); absent on the pods the operator renders.
PORT_ANNOTATION = "slopilot.dev/port"
HTTP_TIMEOUT_S = 5.0


class ApplyError(RuntimeError):
    """A replica did not take a config (unreachable, or an error other than a refusal)."""


def ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    return conditions.get("Ready", "True") == "True"


class KubeDeploymentHandle:
    """The replicas of LLMDeployment ``namespace/name`` (see the module docstring)."""

    def __init__(self, kube: Kube, namespace: str, name: str, *,
                 http: httpx.Client | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.http = http or httpx.Client(timeout=HTTP_TIMEOUT_S)
        self._parsed: tuple[str, LLMDeploymentSpec] | None = None

    # ------------------------------------------------------------------ reads
    def body(self) -> dict[str, Any]:
        body = self.kube.get(API_VERSION, PLURAL, self.namespace, self.name)
        if body is None:
            raise ApplyError(f"LLMDeployment {self.namespace}/{self.name} is gone")
        return body

    def spec(self) -> LLMDeploymentSpec:
        return self._spec_of(self.body())

    def _spec_of(self, body: Mapping[str, Any]) -> LLMDeploymentSpec:
        """``effective_spec(body)``, parsed once per version of the object: any change to
        its spec or status (``tunedConfig``) gives it a new ``resourceVersion``."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and self._parsed is not None and self._parsed[0] == str(version):
            return self._parsed[1]
        spec = effective_spec(body)
        if version is not None:
            self._parsed = (str(version), spec)
        return spec

    def replicas(self) -> int:
        dep = self.kube.get("apps/v1", "deployments", self.namespace, self.name)
        return 0 if dep is None else int((dep.get("spec") or {}).get("replicas", 1))

    def current_config(self) -> dict[str, Any]:
        return self.spec().engine.to_dict()

    def pods(self) -> list[dict[str, Any]]:
        """Ready engine pods, by name: the first is the canary."""
        sel = ",".join(f"{k}={v}" for k, v in selector(self.name).items())
        pods = self.kube.list("v1", "pods", self.namespace, label_selector=sel)
        return sorted((p for p in pods if ready(p)), key=lambda p: p["metadata"]["name"])

    def endpoints(self) -> list[str]:
        return [self._url(p) for p in self.pods()]

    @staticmethod
    def _url(pod: Mapping[str, Any]) -> str:
        port = (pod["metadata"].get("annotations") or {}).get(PORT_ANNOTATION, PORT)
        return f"http://{pod['status']['podIP']}:{int(port)}"

    def admin_token(self, spec: LLMDeploymentSpec) -> str:
        name = spec.admin_secret or f"{self.name}-admin"
        secret = self.kube.get("v1", "secrets", self.namespace, name)
        if secret is None:
            raise ApplyError(f"Secret {self.namespace}/{name} with the admin token is missing")
        raw = (secret.get("data") or {}).get(spec.admin_secret_key)
        if raw is None:
            raise ApplyError(f"Secret {name} has no key {spec.admin_secret_key!r}")
        try:
            return base64.b64decode(raw, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ApplyError(f"Secret {name} key {spec.admin_secret_key}: not base64 text: "
                             f"{exc}") from None

    # ------------------------------------------------------------------ actions
    def scale(self, n: int) -> None:
        spec = self.spec()
        target = min(max(int(n), spec.min_replicas), spec.max_replicas)
        if target != n:
            log.info("%s: scale to %d kept within [%d, %d]: %d", self.name, n,
                     spec.min_replicas, spec.max_replicas, target)
        self.kube.patch("apps/v1", "deployments", self.namespace, self.name,
                        {"spec": {"replicas": target}})

    def apply_config(self, config: Mapping[str, Any], *, canary: bool) -> None:
        body = self.body()
        spec = self._spec_of(body)
        # Judged whole before any replica sees it (raises ConfigError, named by field).
        new = spec.engine.with_overrides(config, live_only=spec.backend is Backend.BUILTIN)
        if spec.backend is Backend.BUILTIN:
            pods = self.pods()
            if not pods:
                raise ApplyError(f"{self.name}: no ready pod to reconfigure")
            token = self.admin_token(spec)
            for pod in pods[:1] if canary else pods:
                self._put(pod, new, token)
            if canary:
                return  # a trial: the other replicas and the records stay as they are
        elif canary:
            log.info("%s: vLLM cannot reconfigure one replica; rolling all of them", self.name)
        self._record(body, new)

    def _put(self, pod: Mapping[str, Any], config: EngineConfig, token: str) -> None:
        url = self._url(pod) + "/admin/config"
        try:
            resp = self.http.put(url, json=config.to_dict(),
                                 headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            raise ApplyError(f"{pod['metadata']['name']} at {url}: {exc}") from exc
        if resp.status_code == 400:
            raise ConfigError(f"{pod['metadata']['name']} refused the config: {resp.text[:300]}")
        if resp.status_code >= 300:
            raise ApplyError(f"{pod['metadata']['name']} at {url}: HTTP {resp.status_code} "
                             f"{resp.text[:300]}")

    def _record(self, body: Mapping[str, Any], config: EngineConfig) -> None:
        """Persist the config every replica runs, then render it (ConfigMap, vLLM args)."""
        tuned = {"engine": config.to_dict(), "base": engine_checksum(body)}
        updated = self.kube.patch(API_VERSION, PLURAL, self.namespace, self.name,
                                  {"status": {"tunedConfig": tuned}}, subresource="status")
        outcome = reconcile(self.kube, updated)
        if not outcome.valid:
            raise ApplyError(f"{self.name}: the spec became invalid: {outcome.problems}")
