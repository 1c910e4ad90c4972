"""Each deployment's admin token: minted by the operator, and no Secret of a tenant's holds it.

The token of LLMDeployment ``ns/name`` (uid ``u``) is HMAC-SHA256(key, "ns/name/u"), with
one random key the operator keeps in its own namespace (Secret
``slopilot-operator-token-key``, created at first start). The engine pods get only the
token's SHA-256 (``SLOPILOT_ADMIN_TOKEN_SHA256`` in the pod template), which admits the
token and reveals nothing of it, and the operator computes the token again whenever it
calls a pod. So the operator creates no Secret in a tenant's namespace and reads none:
its RBAC touches Secrets in its own namespace only (cluster-wide ``create``, which RBAC
cannot narrow by name, would let it write a service-account-token Secret into any
namespace). The uid in the MAC means that a deleted and re-created CR of the same name
gets a new token; a new key (its Secret deleted, the operator restarted) changes every
digest, and with it every pod template, so the pods roll onto it.

The same key seals what the operator leaves where a tenant can write (``seal``): an
annotation on a tenant's Deployment is anyone's with patch rights on it, and a digest
of what the tenant can read, anyone's to compute. A seal is HMAC-SHA256(key,
"purpose\nmessage"): no token's message ("ns/name/uid": a namespace has no newline) is
one, so no seal a tenant reads is a token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from slopilot.engine.server.admin_credential import token_sha256
from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
KEY_SECRET = "slopilot-operator-token-key"
KEY_FIELD = "key"
MIN_KEY_BYTES = 32


class TokenKeyError(RuntimeError):
    """The operator's token key is missing or malformed; the message says how to fix it."""


class TokenMint:
    """Derives each deployment's admin token from the operator's key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise TokenKeyError(f"token key has {len(key)} bytes; need {MIN_KEY_BYTES}")
        self._key = key

    def token(self, namespace: str, name: str, uid: str) -> str:
        message = f"{namespace}/{name}/{uid}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def for_body(self, body: Mapping[str, Any]) -> str:
        meta = body["metadata"]
        return self.token(meta["namespace"], meta["name"], str(meta["uid"]))

    def sha256_for_body(self, body: Mapping[str, Any]) -> str:
        """What the pods of ``body`` get: the digest that admits its token."""
        return token_sha256(self.for_body(body))

    def seal(self, purpose: str, message: str) -> str:
        """The operator's MAC of ``message`` for ``purpose`` (module docstring)."""
        return hmac.new(self._key, f"{purpose}\n{message}".encode(),
                        hashlib.sha256).hexdigest()

    def sealed(self, purpose: str, message: str, seal: Any) -> bool:
        """Whether ``seal`` (as read from a tenant's object: any value) is this key's
        seal of ``message``; compared in constant time."""
        return isinstance(seal, str) and hmac.compare_digest(
            seal.encode("utf-8", "replace"), self.seal(purpose, message).encode())

    def __repr__(self) -> str:  # never the key, in a traceback or a log line
        return "TokenMint(<key>)"


def _decode(secret: Mapping[str, Any], namespace: str) -> bytes:
    raw = (secret.get("data") or {}).get(KEY_FIELD)
    try:
        key = base64.b64decode(str(raw), validate=True) if raw is not None else b""
    except binascii.Error:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise TokenKeyError(
            f"Secret {namespace}/{KEY_SECRET} has no usable '{KEY_FIELD}' (need "
            f"{MIN_KEY_BYTES} random bytes); delete it and restart the operator to make a "
            "new one (every deployment then gets a new token at its next restart)")
    return key


def load_or_create(kube: Kube, namespace: str) -> TokenMint:
    """The key from the operator's namespace, created there (randomly) at first start."""
    secret = kube.get("v1", "secrets", namespace, KEY_SECRET)
    if secret is None:
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": KEY_SECRET, "namespace": namespace, "labels": {
                    "app.kubernetes.io/name": "slopilot-operator",
                    "app.kubernetes.io/part-of": "slopilot"}},
                "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(32)).decode()}}
        try:
            secret = kube.create("v1", "secrets", namespace, body)
            log.info("created the admin-token key Secret %s/%s", namespace, KEY_SECRET)
        except ApiError as exc:
            if exc.reason != "AlreadyExists":  # another replica was first
                raise
            secret = kube.get("v1", "secrets", namespace, KEY_SECRET) or {}
    return TokenMint(_decode(secret, namespace))
