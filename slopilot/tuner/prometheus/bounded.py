"""Read one Prometheus answer within a byte cap and a total deadline.

The Prometheus URL may be a tenant's (``spec.prometheus.url``), and with
``SLOPILOT_ALLOWED_PROMETHEUS`` unset or broad it may point at a server they run. httpx
bounds each wait for bytes (its read timeout restarts with every chunk), never a whole
answer: an endless body would fill the operator's memory, and one that drips a byte now
and then would hold a controller's tick forever. ``read_answer`` is the one place the
tuner reads a Prometheus answer, and it bounds both: past ``MAX_ANSWER_BYTES`` or the
deadline it raises ``PrometheusUnavailable``, naming the bound and never the body.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from slopilot.tuner.prometheus.safe_errors import certificate_failure, transport_failure
from slopilot.tuner.prometheus.tls import TRUST_FIX, VERIFIED, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable

MAX_ANSWER_BYTES = 8 * 1024 * 1024
"""The most bytes of one answer read (decoded, as JSON text). Every query the tuner sends
aggregates (``sum by`` class, ``le``, kind) or selects one deployment's alerts, so a real
answer is at most a few hundred series: tens of KiB. 8 MiB is a hundred times that, and
as parsed JSON an answer takes several times its size, so one controller's worst case
stays in tens of MiB however many controllers read at once."""

ANSWER_DEADLINE_S = 30.0
"""The longest one request may take, from connecting to the last byte. A healthy
Prometheus answers these instant queries in well under a second; 30 s leaves room for
one under load, while a controller held by a slow or dripping server misses a few 5 s
ticks, not all of them."""

_MIB = 1024 * 1024
# The trace events whose return value is the request's connection: the TCP one, then
# the TLS one that wraps it (its socket replaces the TCP one's).
_CONNECTED = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete"})


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content_type: str | None
    body: bytes
    """Empty unless the status is 200: no caller reads an error's body."""


def bounded_client(timeout_s: float, *, verify: TLSVerify = VERIFIED,
                   retries: int = 0) -> httpx.Client:
    """An httpx client for ``read_answer``: no redirects, a fresh connection per request,
    an ``https`` server's certificate checked as ``verify`` says (CAFileError: its CA
    bundle cannot be read), against the bundle as it is at each request.

    Keep-alive is off so that every request opens its own connection, whose socket the
    deadline can shut (a reused one reports no connect event to ``read_answer``).
    """
    return httpx.Client(timeout=max(1.0, float(timeout_s)), follow_redirects=False,
                        transport=_TrustFollowing(verify, retries))


def _transport(trust: ssl.SSLContext | bool, retries: int) -> httpx.HTTPTransport:
    return httpx.HTTPTransport(verify=trust, retries=retries,
                               limits=httpx.Limits(max_keepalive_connections=0))


class _TrustFollowing(httpx.BaseTransport):
    """Each request through a transport of the trust ``verify`` gives at that moment.

    httpx fixes a transport's SSL context when it is built, and a client lives as long
    as its controller: without this, a CA rotated on disk would be trusted only by
    clients built after it (the operator's restart). The context is the same object
    while the bundle is unchanged, so the transport is rebuilt only on a change.
    """

    def __init__(self, verify: TLSVerify, retries: int) -> None:
        self._verify, self._retries = verify, retries
        self._lock = threading.Lock()
        self._trust = verify.context()  # CAFileError here, as the client is built
        self._current = _transport(self._trust, retries)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        trust = self._verify.context()
        with self._lock:
            if trust is not self._trust:
                # The old one is left open, not closed: a request on another thread may
                # still be reading through it, and without keep-alive it holds no idle
                # connection to leak.
                self._trust, self._current = trust, _transport(trust, self._retries)
            current = self._current
        return current.handle_request(request)

    def close(self) -> None:
        self._current.close()


def read_answer(client: httpx.Client, base: str, path: str, params: Mapping[str, str], *,
                deadline_s: float = ANSWER_DEADLINE_S,
                max_bytes: int = MAX_ANSWER_BYTES) -> Answer:
    """``GET base + path``: its status, content type and (for a 200) body.

    Unreachable, a certificate that fails verification, past ``max_bytes`` or past
    ``deadline_s`` -> ``PrometheusUnavailable``.
    """
    if not deadline_s > 0 or max_bytes < 1:
        raise ValueError(f"deadline_s={deadline_s!r}, max_bytes={max_bytes!r}: expected "
                         "seconds > 0 and bytes >= 1")
    deadline = Deadline(deadline_s)
    try:
        with client.stream("GET", base + path, params=params,
                           extensions={"trace": deadline.trace}) as resp:
            ctype = resp.headers.get("content-type")
            if resp.status_code != 200:
                return Answer(resp.status_code, ctype, b"")
            _refuse_declared_size(resp, base, max_bytes)
            body = b"".join(_capped(resp.iter_bytes(), deadline, base, max_bytes))
    except httpx.HTTPError as exc:
        if deadline.passed:  # a read the deadline cut short is the deadline's doing
            raise _deadline_error(deadline, base) from None
        if (why := certificate_failure(exc)) is not None:
            raise PrometheusUnavailable(
                f"Prometheus at {base}: certificate verification failed ({why}); "
                f"{TRUST_FIX}") from None
        raise PrometheusUnavailable(
            f"cannot reach Prometheus at {base}: {transport_failure(exc)}; "
            "check the URL and that Prometheus is running") from None
    finally:
        deadline.cancel()
    # A shut socket ends a body without a Content-Length as if it were complete.
    _check(deadline, base)
    return Answer(200, ctype, body)


def _refuse_declared_size(resp: httpx.Response, base: str, max_bytes: int) -> None:
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PrometheusUnavailable(_too_large(base, max_bytes))


def _capped(chunks: Iterator[bytes], deadline: Deadline, base: str,
            max_bytes: int) -> Iterator[bytes]:
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise PrometheusUnavailable(_too_large(base, max_bytes))
        _check(deadline, base)
        yield chunk


def _too_large(base: str, max_bytes: int) -> str:
    size = f"{max_bytes // _MIB} MiB" if max_bytes % _MIB == 0 else f"{max_bytes} bytes"
    return (f"Prometheus at {base} sent an answer over the {size} cap "
            "(MAX_ANSWER_BYTES); no answer to the tuner's queries is that large: check "
            "that spec.prometheus.url is a Prometheus")


class Timer(Protocol):
    def cancel(self) -> None: ...


StartTimer = Callable[[float, Callable[[], None]], Timer]
"""Calls back once some seconds have passed, until cancelled: how a ``Deadline`` is
timed (``thread_timer``; a test fires its own when its condition holds)."""


def thread_timer(delay_s: float, callback: Callable[[], None]) -> Timer:
    """``callback`` on a daemon thread ``delay_s`` seconds from now."""
    timer = threading.Timer(delay_s, callback)
    timer.daemon = True
    timer.start()
    return timer


class Deadline:
    """Shuts the request's socket down once ``deadline_s`` has passed (timed by
    ``start_timer``).

    A timer, not a check between reads: a server that sends a byte just inside each read
    timeout (headers included) never lets a read time out. Shutting the socket wakes the
    read that waits on it, and ``passed`` then says why it ended. Pass ``trace`` as the
    request's ``trace`` extension, on a client without keep-alive (``bounded_client``),
    and ``cancel`` once the request is over.
    """

    def __init__(self, deadline_s: float, start_timer: StartTimer = thread_timer) -> None:
        self.deadline_s = deadline_s
        self.passed = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        # Last: the timer may fire at once, and its callback reads the fields above.
        self._timer = start_timer(deadline_s, self._expire)

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event not in _CONNECTED:
            return
        sock = info["return_value"].get_extra_info("socket")
        with self._lock:
            self._sock = sock
            if self.passed:  # it passed while connecting
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            if self._sock is not None:
                _shut(self._sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _deadline_error(deadline: Deadline, base: str) -> PrometheusUnavailable:
    return PrometheusUnavailable(
        f"Prometheus at {base} did not finish its answer within the "
        f"{deadline.deadline_s:g} s deadline per request (ANSWER_DEADLINE_S); check "
        "that it is healthy and not overloaded")


def _check(deadline: Deadline, base: str) -> None:
    if deadline.passed:
        raise _deadline_error(deadline, base)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: the request is over either way
        sock.shutdown(socket.SHUT_RDWR)
