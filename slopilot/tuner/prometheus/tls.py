"""How an ``https`` Prometheus's certificate is checked: plain data, read by ``bounded``.

Every number the control loop acts on (windows, alerts, workload, iterations) is read
from Prometheus; an answer from a server whose certificate is not checked could come
from anyone on the path, and retune or scale the deployment. So a certificate is
verified by default (httpx's trust: the certifi bundle, or ``SSL_CERT_FILE``); a CA
bundle replaces that trust (an in-cluster Prometheus is usually signed by a private CA);
turning verification off is the operator's administrator's choice alone, never a CR's.

A CA bundle is followed on disk (``CABundle``): cert-manager renews a CA, or the kubelet
swaps the Secret or ConfigMap volume it is mounted from, while the operator runs, and
every controller built before then must verify against the new one at its next read, not
after a restart. A rewrite that cannot be used (half-written, garbage, gone) keeps the
bundle trusted before, with a warning: refusing every read would stop every loop, and
verifying nothing would let anyone on the path feed them.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from slopilot.engine.watched_file import WatchedFile

log = logging.getLogger(__name__)

TRUST_FIX = ("trust the CA that signed its certificate: the operator's "
             "SLOPILOT_PROMETHEUS_CA_FILE (a PEM bundle)")
"""The fix a failed verification names (the operator's variable: settings.py reads it)."""


class CAFileError(ValueError):
    """The CA bundle cannot be used; the message names the file and why, not the fix
    (the caller knows where the path came from)."""


class CABundle:
    """The client context of the CA bundle at ``path`` as the file is now
    (``WatchedFile``: looked at, a stat, at every call; parsed again only when it
    changed; a version that cannot be used keeps the one before, warned of once).
    Thread-safe: every deployment's controller shares the policy's one bundle.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: WatchedFile[ssl.SSLContext] | None = None

    def context(self) -> ssl.SSLContext:
        """The context of the file as it is now. CAFileError only while no version of
        it was ever usable; a later unusable one keeps the last usable."""
        with self._lock:
            if self._file is None:
                self._file = WatchedFile(
                    Path(self.path), _read_ca, "Prometheus CA bundle "
                    "(SLOPILOT_PROMETHEUS_CA_FILE)", (CAFileError,), logger=log,
                    fix="write the whole PEM bundle of the CA that signs Prometheus's "
                    "certificate there")
            return self._file.current()


def _read_ca(path: Path) -> ssl.SSLContext:
    return ca_context(str(path))


@dataclass(frozen=True, slots=True)
class TLSVerify:
    """How a Prometheus server's certificate is checked on an ``https`` URL."""

    enabled: bool = True
    """False: any certificate is accepted (an administrator's explicit choice)."""
    ca_file: str | None = None
    """A PEM bundle of the CAs to trust instead of the default ones; None: the default."""
    bundle: CABundle | None = field(init=False, default=None, repr=False, compare=False)
    """``ca_file`` followed on disk, one per TLSVerify: the policy's is every controller's."""

    def __post_init__(self) -> None:
        if not self.enabled and self.ca_file is not None:
            raise ValueError(f"ca_file={self.ca_file!r} with verification off: a CA to "
                             "trust means verifying; keep one or the other")
        if self.ca_file is not None:
            object.__setattr__(self, "bundle", CABundle(self.ca_file))

    def context(self) -> ssl.SSLContext | bool:
        """What httpx's ``verify`` takes: the bundle's context as the file is now (the
        same object while it is unchanged), or True/False.

        CAFileError while no version of the bundle was usable: missing, unreadable or
        without a PEM certificate at the first read.
        """
        if not self.enabled:
            return False
        if self.bundle is None:
            return True
        return self.bundle.context()


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
