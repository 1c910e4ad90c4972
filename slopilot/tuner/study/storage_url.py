"""Study storage URLs in messages: never the password.

A storage URL may carry a database password; errors reach the terminal, the operator's
log and a CR's status, so every message shows the URL through ``shown`` and any driver
error through ``redacted``.
"""

from __future__ import annotations

import urllib.parse

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError


def parse_storage_url(url: str) -> URL | None:
    """The URL as SQLAlchemy reads it; None when it is not a database URL."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return None


def sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:///PATH`` URL names; None for any other storage (in memory,
    PostgreSQL, no URL)."""
    parsed = parse_storage_url(url)
    if parsed is None or parsed.drivername.split("+")[0] != "sqlite":
        return None
    db = parsed.database
    return None if not db or db == ":memory:" else str(db)


def shown(url: str) -> str:
    """``url`` fit for a message, a log or a status: the password replaced by ***."""
    parsed = parse_storage_url(url)
    if parsed is None:  # no URL to parse: hide whatever stands before an @
        host = url.rpartition("@")[2]
        return ("***@" if "@" in url else "") + host[:80]
    return parsed.render_as_string(hide_password=True)


def redacted(text: str, url: str) -> str:
    """``text`` (e.g. a driver's error) with ``url``'s password, if any, blotted out."""
    parsed = parse_storage_url(url)
    secret = parsed.password if parsed is not None else None
    out = text.replace(url, shown(url))
    if secret:
        for form in {str(secret), urllib.parse.quote(str(secret), safe="")}:
            out = out.replace(form, "***")
    return out
