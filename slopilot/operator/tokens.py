"""Each deployment's admin token: minted by the operator, so it never reads a tenant's Secret.

The token of LLMDeployment ``ns/name`` (uid ``u``) is HMAC-SHA256(key, "ns/name/u"), with
one random key the operator keeps in its own namespace (Secret
``slopilot-operator-token-key``, created at first start). The operator *creates* the
Secret the engine pods read it from (``<name>-admin-<uid prefix>``, owned by the CR, so
the garbage collector removes it with the CR) and computes the token again whenever it
calls a pod: it needs no ``get`` on any Secret outside its own namespace, and a CR author
cannot make it read, mount or send any other Secret. The uid in the name and in the
MAC means that a deleted and re-created CR of the same name gets a new token, and never
the old Secret the garbage collector is about to delete.
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

from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
KEY_SECRET = "slopilot-operator-token-key"
KEY_FIELD = "key"
TOKEN_FIELD = "token"
MIN_KEY_BYTES = 32


class TokenKeyError(RuntimeError):
    """The operator's token key is missing or malformed; the message says how to fix it."""


def admin_secret_name(body: Mapping[str, Any]) -> str:
    meta = body["metadata"]
    return f"{meta['name']}-admin-{str(meta['uid'])[:8]}"


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
