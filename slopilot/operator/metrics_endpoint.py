"""``slopilot operator --metrics HOST:PORT``: the controllers' series over HTTP.

The controllers run in the operator process and record there (``TunerMetrics``: trials,
actions, replicas asked for, state, the twin's check and correction), so the operator
serves them itself; ``manifests/monitoring/operator-podmonitor.yaml`` has Prometheus scrape them.
Only the peering leader runs controllers: a waiting replica serves an empty page.
"""

from __future__ import annotations

import argparse
import re
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from slopilot.operator.daemon import operator_metrics

_ADDRESS = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")


def metrics_address(text: str) -> tuple[str, int]:
    """argparse type: ``HOST:PORT`` (``[::]:PORT`` for IPv6)."""
    match = _ADDRESS.fullmatch(text)
    port = int(match["port"]) if match else -1
    if match is None or not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"--metrics {text!r}: expected HOST:PORT, e.g. --metrics 0.0.0.0:8081 "
            "([::]:8081 for IPv6)")
    return (match["v6"] or match["host"], port)


def serve_metrics(address: tuple[str, int]) -> WSGIServer:
    """Serve the controllers' registry at ``address`` on a daemon thread; the server (its
    ``server_port`` is the one bound when ``address`` asks for port 0)."""
    host, port = address
    server, _ = start_http_server(port, addr=host, registry=operator_metrics("").registry)
    return server
