"""What the admin API checks a bearer token against: the token's SHA-256, never the token.

A server given only the digest (``$SLOPILOT_ADMIN_TOKEN_SHA256``) admits the token but
holds nothing that would let anyone present it: the digest may sit in a pod template,
readable by whoever reads Deployments, where the token itself would need a Secret. The
operator relies on it: it mints each deployment's token and puts only the digest in the
pods (slopilot/operator/tokens.py), so it creates no Secret in a tenant's namespace.
No fastapi here: the operator imports this module.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

ADMIN_TOKEN_ENV = "SLOPILOT_ADMIN_TOKEN"
ADMIN_TOKEN_SHA256_ENV = "SLOPILOT_ADMIN_TOKEN_SHA256"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


def token_sha256(token: str) -> str:
    """The hex digest ``$SLOPILOT_ADMIN_TOKEN_SHA256`` holds for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class AdminCredential:
    """The digest of the one token the admin API admits."""

    sha256: bytes

    @classmethod
    def of_token(cls, token: str) -> AdminCredential:
        return cls(hashlib.sha256(token.encode()).digest())

    @classmethod
    def of_digest(cls, hexdigest: str) -> AdminCredential:
        text = hexdigest.strip().lower()
        if not _HEX_DIGEST.fullmatch(text):
            raise ValueError(f"{ADMIN_TOKEN_SHA256_ENV}: expected the token's SHA-256 as 64 "
                             f"hex digits (got {len(text)} characters); compute it with "
                             "`printf %s TOKEN | sha256sum`")
        if text == _EMPTY_DIGEST:
            # What `printf %s "$TOKEN" | sha256sum` gives with TOKEN unset: it would
            # admit a bearer token of nothing, anyone who reaches the admin port.
            raise ValueError(f"{ADMIN_TOKEN_SHA256_ENV}: the SHA-256 of an empty token (was "
                             "TOKEN unset in `printf %s TOKEN | sha256sum`?); digest the "
                             "token itself")
        return cls(bytes.fromhex(text))

    def admits(self, given: str) -> bool:
        return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), self.sha256)

    def __repr__(self) -> str:  # a digest in a log line helps nobody
        return "AdminCredential(<sha256>)"
