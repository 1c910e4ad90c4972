"""API keys as client grants hold them (``spec.clients``): by their SHA-256 only."""

from __future__ import annotations

import hashlib


def digest(key: str) -> str:
    """``key``'s hex SHA-256, as ``printf %s KEY | sha256sum`` prints it."""
    return hashlib.sha256(key.encode()).hexdigest()
