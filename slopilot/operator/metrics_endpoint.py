"""``slopilot operator --metrics HOST:PORT``: the controllers' series over HTTP.

The controllers run in the operator process and record there (``TunerMetrics``: trials,
actions, replicas asked for, state, the twin's check and correction), so the operator
serves them itself; ``manifests/monitoring/operator-podmonitor.yaml`` has Prometheus scrape them.
Only the peering leader runs controllers: a waiting replica serves an empty page.

The page is served by uvicorn on one event loop of its own, on one thread, whatever
the connections. prometheus_client's own server gave each connection a thread with no read
deadline: 300 idle connections took the operator to 199 threads, and under a pod's pids
limit its pod syncs could then start none. Here each connection has the deadlines of
``METRICS_DEADLINES`` (http_deadlines.py: a silent one is closed, a half head refused
with 408), and at most ``MAX_CONNECTIONS`` are open: a connection past them displaces the
oldest one that is not being answered (one waiting for its head, or idle between
requests), or is closed at once when all are. A scrape, which sends its head as it
connects, so gets in past any number of idle connections. Not kopf's loop: a page for
many deployments is rendered in one go, and would hold every handler, timer and peering
heartbeat for that long.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import re
import socket
import threading

import uvicorn
from prometheus_client import make_asgi_app
from prometheus_client.registry import Collector
from uvicorn.protocols.http.h11_impl import H11Protocol

from slopilot.engine.http_deadlines import CallLater, Deadlines, with_deadlines
from slopilot.operator.daemon import operator_metrics

log = logging.getLogger(__name__)

_ADDRESS = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")

MAX_CONNECTIONS = 16
"""Connections open at once. Prometheus holds one per scrape of a target (two for a pair
of Prometheus replicas); the rest is room for curl and a second monitoring system."""
METRICS_DEADLINES = Deadlines(head_s=5.0, body_idle_s=5.0, send_s=10.0, keep_alive_s=5.0)
"""A scraper sends its head, a few hundred bytes, as it connects, and takes the page
within Prometheus' default scrape timeout (10 s); nothing else is owed."""


def metrics_address(text: str) -> tuple[str, int]:
    """argparse type: ``HOST:PORT`` (``[::]:PORT`` for IPv6)."""
    match = _ADDRESS.fullmatch(text)
    port = int(match["port"]) if match else -1
    if match is None or not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"--metrics {text!r}: expected HOST:PORT, e.g. --metrics 0.0.0.0:8081 "
            "([::]:8081 for IPv6)")
    return (match["v6"] or match["host"], port)


class MetricsServer:
    """The endpoint, served on its own thread (``serve_metrics``)."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket) -> None:
        self._server = server
        self.server_port: int = sock.getsockname()[1]
        """The port bound (the one picked where port 0 was asked for)."""
        self._thread = threading.Thread(target=self._run, args=(sock,),
                                        name="operator-metrics", daemon=True)
        self._thread.start()

    def _run(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except (Exception, SystemExit):  # uvicorn exits with SystemExit where it cannot start
            log.exception("slopilot operator: the --metrics endpoint stopped")
        finally:
            sock.close()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop serving: every connection closed, the thread ended (within ``timeout_s``
        where given). Closing twice is closing once."""
        self._server.should_exit = True
        self._thread.join(timeout_s)


def capped(base: type[H11Protocol], max_connections: int) -> type[H11Protocol]:
    """``base`` holding at most ``max_connections`` open at once on one server: past them,
    the oldest connection not being answered is closed for the new one, or the new one
    where every other is being answered."""
    numbers = itertools.count()

    class Capped(base):  # type: ignore[valid-type, misc]
        opened = 0
        """The order the connection came in (the lowest is the oldest)."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            self.opened = next(numbers)
            super().connection_made(transport)  # now in ``self.connections``
            # One closed here stays in ``connections`` until the loop's next turn.
            live = [c for c in self.connections if not c.transport.is_closing()]
            if len(live) <= max_connections:
                return
            idle = [c for c in live if c is not self and _unanswered(c)]
            if idle:
                min(idle, key=lambda c: c.opened).transport.close()
            else:
                transport.close()

    return Capped


def _unanswered(protocol: H11Protocol) -> bool:
    """Whether no request of ``protocol``'s is being answered: it waits for a head."""
    return protocol.cycle is None or protocol.cycle.response_complete


def serve_metrics(address: tuple[str, int], *, registry: Collector | None = None,
                  deadlines: Deadlines = METRICS_DEADLINES,
                  max_connections: int = MAX_CONNECTIONS,
                  call_later: CallLater | None = None) -> MetricsServer:
    """Serve ``registry`` (the controllers' series) at ``address`` on a thread of its own
    (module docstring), the ``deadlines`` timed on ``call_later`` (the loop's unless
    given: a test's own clock). Bound and listening on return: OSError where the port is
    taken."""
    if max_connections < 1:
        raise ValueError(f"max_connections={max_connections!r}: expected at least 1 "
                         f"connection, e.g. {MAX_CONNECTIONS}")
    host, port = address
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening before the loop starts: a connection waits in the backlog meanwhile.
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    app = make_asgi_app(operator_metrics("").registry if registry is None else registry)
    config = uvicorn.Config(
        app, http=capped(with_deadlines(H11Protocol, deadlines, call_later), max_connections),
        loop="asyncio", ws="none", lifespan="off", interface="asgi3",
        # kopf's logging stays as it is; uvicorn says only what goes wrong, and no scrape.
        log_config=None, log_level="warning", access_log=False, backlog=128,
        timeout_graceful_shutdown=int(deadlines.send_s) + 1)
    return MetricsServer(uvicorn.Server(config), sock)
