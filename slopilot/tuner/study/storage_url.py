"""Study storage URLs in messages: never the password.

A storage URL may carry a database password; errors reach the terminal, the operator's
log and a CR's status, so every message shows the URL through ``shown`` and any driver
error through ``redacted``.
"""

from __future__ import annotations

import json
import re
import shlex
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


_QUERY_SECRETS = ("password", "sslpassword")
"""The query keys libpq reads as secrets (``?password=PASS``: the URL's own password
field is not the only place one is given)."""
_QUERY_SECRET = re.compile(r"(?<=[?&])((?:ssl)?password=)[^&#]*", re.I)


def shown(url: str) -> str:
    """``url`` fit for a message, a log or a status: the password replaced by ***, the
    user's and the query's (``password=``, ``sslpassword=``)."""
    parsed = parse_storage_url(url)
    if parsed is None:  # no URL to parse: hide whatever stands before an @
        host = url.rpartition("@")[2]
        return _QUERY_SECRET.sub(r"\1***", ("***@" if "@" in url else "") + host[:80])
    return _QUERY_SECRET.sub(r"\1***", parsed.render_as_string(hide_password=True))


def _secrets(parsed: URL) -> list[str]:
    """The URL's password and its query's secret values, as the driver was given them."""
    found = [str(parsed.password)] if parsed.password else []
    for key, value in parsed.query.items():
        if key.lower() in _QUERY_SECRETS:
            found += [v for v in ((value,) if isinstance(value, str) else value) if v]
    return found


# A token this long equal to the password is the password far likelier than a word of
# the driver's: hiding it costs that word, showing it leaks the password.
_ALONE_MIN = 5


def redacted(text: str, url: str) -> str:
    """``text`` (e.g. a driver's error, or a command holding ``url``) with ``url``'s
    password and its query's ``password``/``sslpassword``, if any, blotted out where
    each stands as a password: the URL as given (or shell-quoted), ``user:PASS@`` and
    ``password=PASS``; and one of ``_ALONE_MIN`` characters or more wherever it stands
    alone, not inside a longer word (a driver's dict repr, a quoted echo). Not every
    occurrence: a short password (``p``) would blot the driver's own words
    ("***syco***g") out with it."""
    out = text
    if shlex.quote(url) != url:  # first: the quoted form may hold the URL as given
        out = out.replace(shlex.quote(url), shlex.quote(shown(url)))
    out = out.replace(url, shown(url))
    parsed = parse_storage_url(url)
    secrets = _secrets(parsed) if parsed is not None else []
    # As given, URL-quoted, and escaped as a dict's repr or JSON writes it (a quote, a
    # backslash, a tab): each of them gives the password back.
    forms = {form for secret in secrets for form in
             (secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret),
              repr(secret)[1:-1], json.dumps(secret)[1:-1],
              json.dumps(secret, ensure_ascii=False)[1:-1])}
    for form in sorted(forms, key=len, reverse=True):
        found = re.escape(form)
        out = re.sub(rf"(?<=:){found}(?=@)", "***", out)
        # libpq's DSN: password=PASS or password='PASS' (its quoting of spaces), up to a
        # space, a quote or the end, so "password=px" does not hide the p of "px".
        out = re.sub(rf"(?<=password=){found}(?=[\s;&,)]|$)", "***", out, flags=re.I)
        out = re.sub(rf"(?<=password='){found}(?=')", "***", out, flags=re.I)
        if len(form) >= _ALONE_MIN:
            out = re.sub(rf"(?<![^\W_]){found}(?![^\W_])", "***", out)
    return out
