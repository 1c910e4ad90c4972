"""A cap on the connections ``slopilot serve`` and ``slopilot meter`` hold for their
clients (``--max-connections``), on uvicorn's h11 (the server) and httptools (the meter)
protocols.

Without it every connection was taken: a client reading about 1.1 KiB per send deadline
keeps its connection for as long as it likes (http_deadlines: it is taking bytes), and
a few hundred of them held a descriptor each, and each its answer's buffers, until
``ulimit -n`` ran out. Then no connection was accepted at all: the kubelet's probe
failed, and the pod was killed for being merely full, its streams with it.

What is capped: connections that sent a request. A connection takes a slot with its
first request's head and gives it back when it closes, idle keep-alive time included,
since the descriptor, the protocol's buffers and the answer's are the connection's, not
the request's (an idle one gives its slot back within ``--keep-alive-timeout``). A cap
on requests in flight would leave idle and slow-reading connections uncounted; a cap on
every accepted connection would let connections that send nothing, or half a head,
take the slots of clients that do (those are the head deadline's: ``--head-timeout``).

Past the cap a request is answered at once, 503 in the OpenAI error shape with a
``Retry-After`` (the SDKs retry a 503 after it, and a Service's next connection may land
on another replica), and its connection closed, its descriptor the process's again;
counted in ``slopilot_connections_refused_total`` (no class: every path's). A request
for generation refused so is a client owed a first token and given none, and the app
counts it too (``CountRefusal``), in the series its SLO is judged on, as a 429 of a full
queue: ``slopilot serve`` as an arrival, a refusal and a miss of its class
(``server/cap_refusals.py``), the meter as those of its one class, ``--priority-class``
(``Meter.count_cap_refusal``). The body is not read here, so on ``slopilot serve`` its
class is the priority header's, else the class a request naming none is served in: one
named in the body alone is counted as that one. /v1/models and the like count in none.
uvicorn's own ``limit_concurrency`` answers a plain-text 503 to every path, the probes'
too, and counts connections from their accept; nginx's ``limit_conn`` answers 503 too
(its default status). The probes' and the scrape's paths (``EXEMPT_PATHS``) are answered
past the cap, on a connection closed after the answer, so the kubelet does not kill a
pod that is full, and Prometheus sees it full; so are connections to ``slopilot
serve``'s admin port, where the operator applies a trial's knobs. A request body unread
past the cap may make the close a reset the client sees instead of the 503, as with any
server refusing before the body.
"""

from __future__ import annotations

import json
import logging
import resource
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slopilot.engine.openai_errors import error_body

if TYPE_CHECKING:
    # uvicorn loads with the server, not with the names below (metric_names reads them).
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_CEILING = 1024
"""The most connections a default cap allows, however many descriptors the pod has:
each holds an answer's buffers (http_deadlines' send-ahead and the kernel's), and a
replica streams far fewer answers at once than that at any useful speed."""

RESERVED_FDS = 64
"""Descriptors a cap given by hand leaves the process beyond its connections: the
listening sockets, the log, the model's and the config's files, the probes' and the
scrape's connections and those not yet holding a slot."""

MAX_CONNECTIONS = 1_000_000
"""The largest value the flag parses (``ulimit -n``'s usual hard limit)."""

RETRY_AFTER_S = 1
"""A refused client's wait: slots free as soon as any client goes, and the retry is a
new connection, which a Service may send to another replica."""

EXEMPT_PATHS = frozenset({"/health", "/ping", "/metrics"})
"""Answered past the cap: the kubelet's probes (serve's and vLLM's /health, vLLM's
/ping) and Prometheus' scrape."""

SCOPE_KEY = "slopilot.connection_slot"
"""Whether the request's connection holds a slot of the cap (absent: no cap)."""

CONNECTIONS_REFUSED = "slopilot_connections_refused_total"
CONNECTIONS_HELD = "slopilot_connections_held"
CONNECTIONS_MAX = "slopilot_connections_max"
SERIES = frozenset({CONNECTIONS_REFUSED, CONNECTIONS_HELD, CONNECTIONS_MAX})
"""The cap's series, by the name Prometheus stores (metric_names' catalog reads them)."""

CountRefusal = Callable[["Scope"], None]
"""What an app counts of a request the cap refused (its probes' and scrape's are not
refused), beside ``CONNECTIONS_REFUSED``: a request for generation, in its class's
series the SLO is judged on. Given the scope alone (the body is unread), on the loop."""

log = logging.getLogger(__name__)

P = TypeVar("P", "H11Protocol", "HttpToolsProtocol")


class ConnectionCapError(ValueError):
    """A cap this process cannot hold: names the flag, the value and the fix."""


def open_files_limit() -> int:
    """The process's soft ``ulimit -n`` (a large number where it is unlimited), raised
    first to its hard limit (``raise_open_files_limit``)."""
    soft = raise_open_files_limit()
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else soft


def raise_open_files_limit() -> int:
    """The soft ``ulimit -n`` raised to the hard one (at most ``MAX_CONNECTIONS``), as Go's
    runtime does at every start; the soft limit in force after it.

    containerd 2 starts a container at soft 1024 and hard 524288: read from the soft
    limit, the meter's default cap was 256 connections, fewer than the sequences a vLLM
    replica runs, where the higher limit was the process's own to take. A raise the
    kernel refuses (a hard limit past ``fs.nr_open``) leaves the soft limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_CONNECTIONS if hard == resource.RLIM_INFINITY else min(hard, MAX_CONNECTIONS)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.info("ulimit -n stays at %d (the hard limit %s not taken: %s)", soft,
                     hard, exc)
            return soft
        return want
    return soft


def default_max_connections(fds_per_connection: int, open_files: int) -> int:
    """Half the descriptors for connections holding a slot, the other half for those
    not yet (their heads under way, bounded by ``--head-timeout``), the refusals being
    written, the probes, the scrape and the process's own files; at most
    ``DEFAULT_CEILING``. ``ulimit -n`` 1024: 512 for the server, 256 for the meter (two
    descriptors a connection: its client's and vLLM's)."""
    return max(1, min(DEFAULT_CEILING, open_files // (2 * fds_per_connection)))


def check_max_connections(value: int, fds_per_connection: int, open_files: int) -> int:
    """``value`` if the process can hold that many connections with ``RESERVED_FDS``
    left, else the error saying what the most is and how to get more."""
    most = (open_files - RESERVED_FDS) // fds_per_connection
    if value > most:
        each = "" if fds_per_connection == 1 else \
            f", {fds_per_connection} descriptors a connection"
        raise ConnectionCapError(
            f"--max-connections {value}: this process may open {open_files} descriptors "
            f"(ulimit -n){each}, {RESERVED_FDS} kept for its own files, its probes and "
            f"connections not yet served; give at most {max(most, 0)}, or raise ulimit -n "
            "(the container runtime's nofile limit)")
    return value


class ConnectionCap(Collector):
    """The slots and their counts, a Prometheus collector. Event loop only."""

    def __init__(self, limit: int, exempt_ports: frozenset[int] = frozenset()) -> None:
        if limit < 1:
            raise ConnectionCapError(f"--max-connections {limit}: expected at least 1")
        self.limit = limit
        self.exempt_ports = exempt_ports
        """Local ports whose connections the cap leaves alone: ``slopilot serve``'s admin
        port, through which the operator applies a trial's knobs to a full pod."""
        self.held = 0
        """Connections holding a slot now."""
        self.refused = 0
        """Requests refused for want of a slot."""

    def take(self) -> bool:
        if self.held >= self.limit:
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held -= 1

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            CONNECTIONS_REFUSED, "Requests answered 503 because --max-connections "
            "connections held every slot; their connections were closed.")
        refused.add_metric([], self.refused)
        yield refused
        held = GaugeMetricFamily(CONNECTIONS_HELD, "Connections holding a slot of "
                                 "--max-connections: those that sent a request, until "
                                 "they close.")
        held.add_metric([], self.held)
        yield held
        most = GaugeMetricFamily(CONNECTIONS_MAX, "The connection cap, --max-connections.")
        most.add_metric([], self.limit)
        yield most

    def describe(self) -> list[Metric]:
        return list(self.collect())


def with_connection_cap(base: type[P], cap: ConnectionCap) -> type[P]:
    """``base``, each connection taking a slot of ``cap`` with its first request's
    head and giving it back when it closes; each request's scope says whether its
    connection holds one (``CapGate`` answers those that do not)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    mixin: type = _H11Capped if issubclass(base, H11Protocol) else _HttpToolsCapped

    class Capped(mixin, base):  # type: ignore[misc, valid-type]
        pass

    Capped.cap = cap
    return Capped


class _Capped:
    cap: ConnectionCap
    _holds = False
    cycle: Any

    server: tuple[str, int] | None

    def _on_request(self) -> None:
        if self.server is not None and self.server[1] in self.cap.exempt_ports:
            return  # no slot, and no refusal: the gate lets it through
        if not self._holds:
            self._holds = self.cap.take()
        # Read by the cycle's task, which is created with the cycle but starts later.
        self.cycle.scope[SCOPE_KEY] = self._holds

    def connection_lost(self, exc: Exception | None) -> None:
        if self._holds:
            self._holds = False
            self.cap.give_back()
        super().connection_lost(exc)  # type: ignore[misc]


class _H11Capped(_Capped):
    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()  # type: ignore[misc]
        if self.cycle is not before and self.cycle is not None:
            self._on_request()


class _HttpToolsCapped(_Capped):
    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()  # type: ignore[misc]
        if self.cycle is not before and self.cycle is not None:
            self._on_request()


class CapGate:
    """ASGI, outermost: a request on a connection without a slot is refused (503),
    unless it is a probe's or the scrape's, answered on a connection then closed."""

    def __init__(self, app: ASGIApp, cap: ConnectionCap,
                 count: CountRefusal | None = None) -> None:
        self.app, self.cap, self.count = app, cap, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get(SCOPE_KEY, True):
            await self.app(scope, receive, send)
            return
        if scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, _closing(send))
            return
        self.cap.refused += 1
        if self.count is not None:
            self.count(scope)
        if self.cap.refused == 1 or self.cap.refused % 1000 == 0:
            log.warning("%d connections hold every slot (--max-connections): %d requests "
                        "refused (503) so far", self.cap.limit, self.cap.refused)
        await _refuse(self.cap.limit, send)


def _closing(send: Send) -> Send:
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", [])
                       if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)
    return closing


async def _refuse(limit: int, send: Send) -> None:
    body = json.dumps(error_body(
        503, f"the server holds as many connections as it may (--max-connections "
        f"{limit}); retry on a new connection after Retry-After seconds",
        code="too_many_connections")).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"%d" % RETRY_AFTER_S), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
