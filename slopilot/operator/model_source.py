"""Where an LLMDeployment's model comes from: ``spec.model.volume`` and ``spec.model.tokenSecret``.

A tenant's weights come from a PersistentVolumeClaim of the CR's own namespace, mounted
read-only at the fixed directory ``/models``; ``spec.model.path`` names a directory under it.
The mount point is fixed, not derived from the path, so that a claim cannot be laid over
the image's own files (``/opt/venv``, ``/usr``): the image allow-list judges what code a
pod runs, and a tenant's volume over the interpreter would bypass it.

Only a claim, and only by name: a pod's ``persistentVolumeClaim`` and ``secretKeyRef`` have
no namespace field, so the kubelet resolves both in the pod's namespace, which is the CR's.
No hostPath (a tenant must not read a node's files), and no other volume kind: a claim is
what an administrator provisions and grants per namespace; anything else (NFS, CSI inline
volumes) names storage outside the namespace's quota and access control.

The token of a gated model (vLLM downloads from the Hugging Face hub) reaches the engine
container as ``HF_TOKEN`` by ``secretKeyRef``: the operator renders the reference and never
reads the Secret (it has no RBAC for tenants' Secrets).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from slopilot.operator.crd_types import obj, string
from slopilot.operator.validation import MODEL_REF_PATTERN

MODELS_DIR = "/models"
"""Where ``spec.model.volume`` is mounted; ``spec.model.path`` must be this or under it."""
VOLUME_NAME = "model"
TOKEN_ENV = "HF_TOKEN"
"""What huggingface_hub (and so vLLM) reads a hub token from."""
DEFAULT_TOKEN_KEY = "token"
MAX_NAME = 253
MAX_SUB_PATH = 512
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A DNS-1123 subdomain: what a PersistentVolumeClaim's or a Secret's name must be."""
# Relative segments that do not start with a dot: no '..' (a way out of the claim's
# directory, which the kubelet refuses too, but only at pod start) and no '.' or hidden
# directories, which no model layout needs.
SUB_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
# A Secret's data key, not starting with a dot (so never '.' or '..', which Kubernetes
# refuses as keys).
KEY_PATTERN = r"^[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
_NAME, _SUB_PATH, _KEY = (re.compile(p) for p in (NAME_PATTERN, SUB_PATH_PATTERN,
                                                   KEY_PATTERN))

PATH_RULE = (f"!has(self.volume) || (has(self.path) && (self.path == '{MODELS_DIR}' || "
             f"self.path.startsWith('{MODELS_DIR}/')) && "
             "!self.path.matches('(^|/)[.][.](/|$)'))")
PATH_MESSAGE = (f"model.volume is mounted at {MODELS_DIR}: set model.path to {MODELS_DIR} "
                f"or a directory under it without '..', e.g. {MODELS_DIR}/smollm2-135m")
TOKEN_RULE = ("!has(self.model) || !has(self.model.tokenSecret) || "
              "(has(self.backend) && self.backend == 'vllm')")
TOKEN_REFUSAL = ("spec.model.tokenSecret: only vLLM downloads a model; the built-in engine "
                 "loads a registered name (built into the image) or a directory: remove "
                 "model.tokenSecret or use backend: vllm")


@dataclass(frozen=True)
class ModelVolume:
    """``spec.model.volume``: a claim of the CR's namespace, mounted read-only at /models."""

    claim_name: str
    sub_path: str | None = None


@dataclass(frozen=True)
class TokenSecret:
    """``spec.model.tokenSecret``: a Secret of the CR's namespace and the key of the token."""

    name: str
    key: str = DEFAULT_TOKEN_KEY


def model_schema(max_ref: int) -> dict[str, Any]:
    """``spec.model``, ``max_ref`` the longest name or path (validation.MAX_MODEL_REF)."""
    volume = obj({
        "claimName": string(
            "A PersistentVolumeClaim of this LLMDeployment's namespace (a name only: a "
            "pod reaches no other namespace's claims). Every replica mounts it: give a "
            "ReadOnlyMany (or ReadWriteMany) claim, or all replicas must share one node.",
            pattern=NAME_PATTERN, maxLength=MAX_NAME),
        "subPath": string(
            "A directory inside the claim to mount instead of its root, relative, without "
            "'.' or '..' segments.", pattern=SUB_PATH_PATTERN, maxLength=MAX_SUB_PATH),
    }, required=["claimName"], desc=(
        f"Where the weights come from: the claim (or its subPath) is mounted read-only at "
        f"{MODELS_DIR} in the engine container, and model.path names the model's directory "
        f"there ({MODELS_DIR} itself or under it). The files must be readable by UID or GID "
        "10001 (or by all): a read-only mount is not chowned to the pod's fsGroup."))
    token = obj({
        "name": string("A Secret of this LLMDeployment's namespace (a name only); the "
                       "operator never reads it.", pattern=NAME_PATTERN, maxLength=MAX_NAME),
        "key": string("The Secret's data key holding the token.", pattern=KEY_PATTERN,
                      maxLength=MAX_NAME, default=DEFAULT_TOKEN_KEY),
    }, required=["name"], desc=(
        f"backend vllm: the Hugging Face token for a gated model, given to vLLM as "
        f"{TOKEN_ENV}; a missing Secret or key keeps the pods from starting "
        "(CreateContainerConfigError)."))
    model = obj({
        "name": string("Model name, served as the OpenAI model id; what the engine loads "
                       "when path is absent (builtin: a model built into the image, "
                       "smollm2-135m or tiny-random; vllm: a Hugging Face id). No "
                       "leading '-' (the engine would read an option), no whitespace.",
                       minLength=1, maxLength=max_ref, pattern=MODEL_REF_PATTERN),
        "path": string(f"Where the weights are in the engine container: under {MODELS_DIR} "
                       "with a volume, else a directory the image holds. The name is used "
                       "when absent.", maxLength=max_ref, pattern=MODEL_REF_PATTERN),
        "volume": volume,
        "tokenSecret": token,
    }, required=["name"])
    model["x-kubernetes-validations"] = [{"rule": PATH_RULE, "message": PATH_MESSAGE}]
    return model


def _sub_path_problem(where: str, value: str) -> str | None:
    if len(value) > MAX_SUB_PATH or not _SUB_PATH.fullmatch(value):
        return (f"{where}={value[:80]!r}: use a relative directory inside the claim, "
                "segments of letters, digits, '.', '_' and '-' not starting with '.' "
                f"(no '..', no leading '/'), at most {MAX_SUB_PATH} characters, "
                "e.g. smollm2-135m")
    return None


def _name_problem(where: str, value: str, what: str) -> str | None:
    if len(value) > MAX_NAME or not _NAME.fullmatch(value):
        return (f"{where}={value[:80]!r}: use the name of a {what} in this namespace "
                f"(a DNS subdomain: lowercase letters, digits, '-' and '.', at most "
                f"{MAX_NAME} characters)")
    return None


def _fields(raw: Any, where: str, known: tuple[str, ...],
            problems: list[str]) -> Mapping[str, Any] | None:
    """``raw`` as a mapping whose keys are all ``known``; None (a problem said) otherwise.
    The API server prunes unknown fields; an object that came another way is refused, so
    that a ``hostPath`` written there is never read as if it did something."""
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping with {', '.join(known)}")
        return None
    if extra := sorted(str(k) for k in raw if k not in known):
        problems.extend(f"{where}.{k}: not a field of {where}; use only {', '.join(known)}"
                        for k in extra)
        return None
    return raw


def _text(raw: Mapping[str, Any], where: str, key: str, problems: list[str]) -> str | None:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    problems.append(f"{where}.{key}={value!r}: expected a string")
    return None


def _required_name(fields: Mapping[str, Any], where: str, key: str, what: str,
                   holding: str, problems: list[str]) -> str | None:
    """``fields[key]``, the name of a ``what`` of the CR's namespace (a problem said where
    it is missing or no such name)."""
    name = _text(fields, where, key, problems)
    if not name:
        problems.append(f"{where}.{key}: required: name the {what} holding {holding}")
    elif (p := _name_problem(f"{where}.{key}", name, what)):
        problems.append(p)
    return name


def parse_volume(model: Mapping[str, Any], path: str | None,
                 problems: list[str], warnings: list[str]) -> ModelVolume | None:
    """``spec.model.volume`` (None where absent or refused, a problem appended), and the
    rule that ``path`` lies under the mount."""
    raw = model.get("volume")
    if raw is None:
        if path is not None and _under_models(path):
            warnings.append(
                f"spec.model.path={path!r} is under {MODELS_DIR}, where nothing is mounted "
                "without spec.model.volume: the engine will not find it unless the image "
                "holds it; set spec.model.volume.claimName to the claim with the weights")
        return None
    where = "spec.model.volume"
    fields = _fields(raw, where, ("claimName", "subPath"), problems)
    if fields is None:
        return None
    before = len(problems)
    claim = _required_name(fields, where, "claimName", "PersistentVolumeClaim",
                           "the weights", problems)
    sub = _text(fields, where, "subPath", problems)
    if sub is not None and (p := _sub_path_problem(f"{where}.subPath", sub)):
        problems.append(p)
    if path is None or not _under_models(path):
        problems.append(f"spec.model.path={path!r}: {PATH_MESSAGE}")
    return ModelVolume(claim, sub) if claim and len(problems) == before else None


def _under_models(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return parts[:2] == ("/", MODELS_DIR.strip("/")) and ".." not in parts


def parse_token_secret(model: Mapping[str, Any], vllm: bool,
                       problems: list[str]) -> TokenSecret | None:
    """``spec.model.tokenSecret`` (None where absent or refused, a problem appended)."""
    raw = model.get("tokenSecret")
    if raw is None:
        return None
    if not vllm:
        problems.append(TOKEN_REFUSAL)
        return None
    where = "spec.model.tokenSecret"
    fields = _fields(raw, where, ("name", "key"), problems)
    if fields is None:
        return None
    before = len(problems)
    name = _required_name(fields, where, "name", "Secret", "the token", problems)
    key = _text(fields, where, "key", problems) or DEFAULT_TOKEN_KEY
    if len(key) > MAX_NAME or not _KEY.fullmatch(key):
        problems.append(f"{where}.key={key[:80]!r}: use a data key of the Secret (letters, "
                        f"digits, '-', '_' and '.', not starting with '.'), e.g. "
                        f"{DEFAULT_TOKEN_KEY}")
    return TokenSecret(name, key) if name and len(problems) == before else None


def pod_volume(volume: ModelVolume) -> dict[str, Any]:
    # readOnly on the source as well as the mount: the kubelet then attaches it read-only.
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": volume.claim_name,
                                                           "readOnly": True}}


def volume_mount(volume: ModelVolume) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": VOLUME_NAME, "mountPath": MODELS_DIR}
    if volume.sub_path is not None:
        mount["subPath"] = volume.sub_path
    mount["readOnly"] = True
    return mount


def token_env(secret: TokenSecret) -> dict[str, Any]:
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret.name,
                                                               "key": secret.key}}}
