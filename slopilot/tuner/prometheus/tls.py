"""How an ``https`` Prometheus's certificate is checked: plain data, read by ``bounded``.

Every number the control loop acts on (windows, alerts, workload, iterations) is read
from Prometheus; an answer from a server whose certificate is not checked could come
from anyone on the path, and retune or scale the deployment. So a certificate is
verified by default (httpx's trust: the certifi bundle, or ``SSL_CERT_FILE``); a CA
bundle replaces that trust (an in-cluster Prometheus is usually signed by a private CA);
turning verification off is the operator's administrator's choice alone, never a CR's.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

TRUST_FIX = ("trust the CA that signed its certificate: the operator's "
             "SLOPILOT_PROMETHEUS_CA_FILE (a PEM bundle)")
"""The fix a failed verification names (the operator's variable: settings.py reads it)."""


class CAFileError(ValueError):
    """The CA bundle cannot be used; the message names the file and why, not the fix
    (the caller knows where the path came from)."""


@dataclass(frozen=True, slots=True)
class TLSVerify:
    """How a Prometheus server's certificate is checked on an ``https`` URL."""

    enabled: bool = True
    """False: any certificate is accepted (an administrator's explicit choice)."""
    ca_file: str | None = None
    """A PEM bundle of the CAs to trust instead of the default ones; None: the default."""

    def __post_init__(self) -> None:
        if not self.enabled and self.ca_file is not None:
            raise ValueError(f"ca_file={self.ca_file!r} with verification off: a CA to "
                             "trust means verifying; keep one or the other")

    def context(self) -> ssl.SSLContext | bool:
        """What httpx's ``verify`` takes: the bundle's context, or True/False.

        The bundle is read here, at each call (a client's construction): CAFileError
        when it is missing, unreadable or holds no PEM certificate.
        """
        if not self.enabled:
            return False
        if self.ca_file is None:
            return True
        return ca_context(self.ca_file)


VERIFIED = TLSVerify()
"""The default: certificates verified against httpx's trust."""


def ca_context(ca_file: str) -> ssl.SSLContext:
    """A client context that trusts only the CAs in ``ca_file`` (hostnames checked)."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError:  # before OSError: it is one
        raise CAFileError(f"{ca_file!r} holds no PEM certificate (expected "
                          "-----BEGIN CERTIFICATE----- blocks)") from None
    except OSError as exc:
        raise CAFileError(f"{ca_file!r} cannot be read: "
                          f"{exc.strerror or type(exc).__name__}") from None
