"""Describe a failed Prometheus call without quoting anything the peer sent.

The Prometheus URL comes from a tenant's LLMDeployment, and these messages end up in the
CR's status and events. A message that quoted the answer (its body, its reason phrase, a
header line the HTTP parser choked on) would let a tenant point the URL at any internal
service and read that service's answer back: SSRF with reflection. So a message says only
the status code, the content type (trimmed to a MIME-type's characters) and, for a
connection that never opened, what the operating system said.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable

_MIME = re.compile(r"[^A-Za-z0-9!#$&^_.+\-/;= ]")
MAX_CONTENT_TYPE = 80


def content_type(value: str | None) -> str:
    """The Content-Type header as a short MIME type, or ``no content type``."""
    if not value:
        return "no content type"
    return _MIME.sub("", value)[:MAX_CONTENT_TYPE].strip() or "no content type"


def http_failure(status: int, ctype: str | None, what: str = "") -> str:
    """``HTTP 404 (text/html)``, plus what was wrong with a 200 (``not JSON``)."""
    out = f"HTTP {int(status)} ({content_type(ctype)})"
    return f"{out}, {what}" if what else out


def transport_failure(exc: BaseException) -> str:
    """The exception's type, and the OS's words when a connection could not be opened.

    An OSError raised by the socket layer (refused, unreachable, no such host) carries
    text from this machine only; everything else (a malformed status line, a broken
    chunk) can quote the peer, so only its type name is kept.
    """
    found = _nested(exc, _is_os_error, depth=0, seen=set())
    name = type(exc).__name__
    strerror = found.strerror if isinstance(found, OSError) else None
    return f"{name}: {strerror}" if strerror else name


def certificate_failure(exc: BaseException) -> str | None:
    """Why the peer's certificate was refused, where that ended the call; else None.

    OpenSSL's reason for the verification's error code (``self-signed certificate``,
    ``certificate has expired``) or Python's hostname mismatch, which names the host of
    our own URL: this side's verdict, never the certificate's text.
    """
    found = _nested(exc, lambda e: isinstance(e, ssl.SSLCertVerificationError),
                    depth=0, seen=set())
    if not isinstance(found, ssl.SSLCertVerificationError):
        return None
    return found.verify_message or "no reason given"


def _is_os_error(exc: BaseException) -> bool:
    # Built-in OSErrors only: libraries subclass OSError for their protocol errors.
    return type(exc).__module__ in ("builtins", "socket") and isinstance(exc, OSError)


def _nested(exc: object, match: Callable[[BaseException], bool], *, depth: int,
            seen: set[int]) -> BaseException | None:
    if depth > 8 or id(exc) in seen or not isinstance(exc, BaseException):
        return None
    seen.add(id(exc))
    if match(exc):
        return exc
    nested = [exc.__cause__, exc.__context__, getattr(exc, "reason", None), *exc.args]
    for inner in nested:
        found = _nested(inner, match, depth=depth + 1, seen=seen)
        if found is not None:
            return found
    return None
