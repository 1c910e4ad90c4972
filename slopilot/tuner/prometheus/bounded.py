"""Read one Prometheus answer within a byte cap and a total deadline.

The Prometheus URL may be a tenant's (``spec.prometheus.url``), and with
``SLOPILOT_ALLOWED_PROMETHEUS`` unset or broad it may point at a server they run. httpx
bounds each wait for bytes (its read timeout restarts with every chunk), never a whole
answer: an endless body would fill the operator's memory, and one that drips a byte now
and then would hold a controller's tick forever. ``read_answer`` is the one place the
tuner reads a Prometheus answer, and it bounds both: past ``MAX_ANSWER_BYTES`` or the
deadline it raises ``PrometheusUnavailable``, naming the bound and never the body.

Each reader's cap is what its queries can really return (``ALERTS_ANSWER_BYTES``,
``answer_cap``), not one size for all: the operator parses an answer with ``json.loads``,
which holds the GIL to its end (a valid 7.9 MiB vector: 0.3 s of every thread's time and
55 MiB at its peak), so a tenant's server answering at a cap far above its queries' stalled
every namespace's steps. ``charge`` lets the caller count the bytes read as they come
(``answer_budget``: a namespace's answers a minute).
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
"""The most bytes of one answer read (decoded, as JSON text) by any reader: the ceiling of
``answer_cap``, and the cap of a reader not given its own (the CLI's, a test's)."""

ALERTS_ANSWER_BYTES = 256 * 1024
"""The cap of one deployment's alerts answer (``alerts.alerts_query``), and the part of
every query's cap that does not grow with replicas. That answer holds, at most, each of
the alert table's 14 rules firing (``ALERTS``), its ``ALERTS_FOR_STATE`` and its
evaluation time, even were each to fire for all 4 classes (p0-p2 and all): 168 series,
and the 9 recorded figures (per deployment, not per replica) of 4 classes: 36; 204 series
of at most ``SERIES_LABEL_BYTES`` each = 204 KiB (at real labels' 300 B, 60 KiB). The
aggregated queries of the windows are smaller still: ``sum by (le, priority_class)`` is
a histogram's edges (vLLM's TTFT has 20-odd) by 4 classes, about 100 series of a few
labels; ``sum by (kind, feature)`` a dozen."""

SERIES_LABEL_BYTES = 1024
"""One series' labels as JSON, at most: the dozen a ServiceMonitor puts on (namespace,
pod, instance, job, service, endpoint, container, slopilot_*) with Kubernetes names of up
to 63 characters, and the metric's own."""
SAMPLE_BYTES = 40
"""One raw sample as JSON: ``[1733600000.123,"123456789"],``, 30 bytes, and room for a
float's 17 digits."""
SCRAPE_INTERVAL_S = 15
"""The scrape interval the operator's ServiceMonitor sets (``pod_layout``'s), which a raw
read's sample count follows; a Prometheus scraping more often fills a raw read's cap
sooner (its callers then leave what it measures unmeasured)."""
RAW_SPAN_S = 900
"""The shortest span a raw range read covers: ``scrape_interval.LOOKBACK_S`` (``up`` over
15 minutes); the arrivals' raw samples (``profiling.raw_arrivals``) cover the window or
``burstiness.BURST_WINDOW_S`` (600 s), whichever is longer."""
SERIES_PER_REPLICA = 8
"""The series one replica adds to a raw read: the arrivals counter of 3 classes and the
unclassed, twice where the pod was replaced inside the span (a new ``pod`` label)."""

ANSWER_DEADLINE_S = 30.0
"""The longest one request may take, from connecting to the last byte. A healthy
Prometheus answers these instant queries in well under a second; 30 s leaves room for
one under load, while a controller held by a slow or dripping server misses a few 5 s
ticks, not all of them."""

_MIB = 1024 * 1024


def answer_cap(max_replicas: int, window_s: float) -> int:
    """The cap of one answer to a deployment's window, probe and scrape-interval queries.

    Their largest real answers are the raw range reads (an instant query of ``x[span]``:
    every sample of every series): ``SERIES_PER_REPLICA`` series for each of
    ``max_replicas`` (the CR's ``spec.replicas.max``), each its labels and a sample per
    ``SCRAPE_INTERVAL_S`` over the longer of ``window_s`` and ``RAW_SPAN_S``, on top of
    ``ALERTS_ANSWER_BYTES`` for the aggregated ones; never above ``MAX_ANSWER_BYTES``.
    At the default 2-minute window: 61 samples, 8 x (1 KiB + 61 x 40 B) = 27 KiB a
    replica, so 283 KiB for 1 replica and 2.0 MiB for 64 (``spec.MAX_REPLICAS``); an
    hour's window 85 KiB a replica (5.6 MiB for 64). A read past its cap is refused as
    Prometheus unavailable (a raw read's caller then leaves the burstiness or the
    scrape interval unmeasured, as for a Prometheus scraping every second).
    """
    if max_replicas < 1 or not window_s > 0:
        raise ValueError(f"max_replicas={max_replicas!r}, window_s={window_s!r}: expected "
                         "replicas >= 1 and seconds > 0")
    samples = int(max(window_s, RAW_SPAN_S) // SCRAPE_INTERVAL_S) + 1
    per_replica = SERIES_PER_REPLICA * (SERIES_LABEL_BYTES + samples * SAMPLE_BYTES)
    return min(MAX_ANSWER_BYTES, ALERTS_ANSWER_BYTES + max_replicas * per_replica)


Charge = Callable[[int], None]
"""Counts bytes of an answer as they are read; raises ``PrometheusUnavailable`` to stop
the read (``answer_budget``: the namespace's budget is spent)."""
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
                max_bytes: int = MAX_ANSWER_BYTES, charge: Charge | None = None) -> Answer:
    """``GET base + path``: its status, content type and (for a 200) body.

    Unreachable, a certificate that fails verification, past ``max_bytes`` or past
    ``deadline_s`` -> ``PrometheusUnavailable``; so too whatever ``charge`` raises, which
    is given each chunk's size as it is read (the declared size first, where there is
    one: a budget refuses an answer it cannot pay for before reading any of it).
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
            declared = _declared_size(resp, base, max_bytes)
            if charge is not None and declared is not None:
                charge(declared)
            body = b"".join(_capped(resp.iter_bytes(), deadline, base, max_bytes,
                                    None if declared is not None else charge))
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


def _declared_size(resp: httpx.Response, base: str, max_bytes: int) -> int | None:
    """The body's Content-Length where it declares one (refused over ``max_bytes``).

    The body read is then never longer: httpx ends it at the length it declared. Not a
    compressed one's: httpx decodes it, and the cap and charge count decoded bytes."""
    declared = resp.headers.get("content-length", "")
    if not declared.isdigit():
        return None
    if int(declared) > max_bytes:
        raise PrometheusUnavailable(_too_large(base, max_bytes))
    encoded = resp.headers.get("content-encoding", "identity").strip().lower()
    return int(declared) if encoded in ("", "identity") else None


def _capped(chunks: Iterator[bytes], deadline: Deadline, base: str,
            max_bytes: int, charge: Charge | None) -> Iterator[bytes]:
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise PrometheusUnavailable(_too_large(base, max_bytes))
        _check(deadline, base)
        if charge is not None:
            charge(len(chunk))
        yield chunk


def _too_large(base: str, max_bytes: int) -> str:
    size = (f"{max_bytes // _MIB} MiB" if max_bytes % _MIB == 0 else
            f"{max_bytes // 1024} KiB" if max_bytes % 1024 == 0 else f"{max_bytes} bytes")
    return (f"Prometheus at {base} sent an answer over the {size} cap for this query "
            "(bounded.answer_cap); no real answer to it is that large: check that "
            "spec.prometheus.url is a Prometheus")


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
