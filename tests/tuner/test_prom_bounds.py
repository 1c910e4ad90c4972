"""Every Prometheus answer is read within a byte cap and a total deadline.

The URL may point at a server a tenant runs. httpx's read timeout restarts with every
chunk, so without these bounds an endless body filled the operator's memory and a body
(or header) sent a byte at a time held a controller's tick forever. Both readers of
Prometheus, ``query_at`` (windows, workload, iterations) and ``AlertSource``, go through
``bounded.read_answer``.

The drip tests do not depend on the machine's speed: the stand-in drips forever, and the
read timeout is far above the deadline, so only the deadline can end the request.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.bounded import ALERTS_ANSWER_BYTES, MAX_ANSWER_BYTES
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.study.evaluator import PrometheusUnavailable

SECRET = b"TOP-SECRET-5d1e"
# The stand-in's pace between dripped bytes: far inside any read timeout, so each read
# gets a byte; the outcome does not depend on it (the deadline ends the request anyway).
DRIP_PAUSE_S = 0.01
# A read timeout no drip reaches: only the deadline can end a dripping request.
READ_TIMEOUT_S = 600.0
TINY_DEADLINE_S = 0.2
NO_DEADLINE_S = 3600.0  # a cap test ends on the cap; this only keeps the deadline out of it


class _Misbehaving(BaseHTTPRequestHandler):
    """Answers as the server's ``mode`` says, until the client hangs up or the test ends."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        mode: str = self.server.mode  # type: ignore[attr-defined]
        stop: threading.Event = self.server.stop  # type: ignore[attr-defined]
        # The client hanging up is what the test wants: the write that finds it ends here.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            getattr(self, f"_{mode.replace('-', '_')}")(stop)

    def _head(self, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _endless(self, stop: threading.Event) -> None:
        self._head()  # no length: the body ends when the connection does
        while not stop.is_set():
            self.wfile.write(SECRET * 4096)

    def _declared(self, stop: threading.Event) -> None:
        self._head(MAX_ANSWER_BYTES + 1)
        while not stop.is_set():
            self.wfile.write(SECRET * 4096)

    def _drip(self, stop: threading.Event, length: int | None = ALERTS_ANSWER_BYTES) -> None:
        self._head(length)  # within every reader's cap: only the deadline can refuse it
        while not stop.wait(DRIP_PAUSE_S):
            self.wfile.write(SECRET[:1])
            self.wfile.flush()

    def _drip_unsized(self, stop: threading.Event) -> None:
        # No length: a socket the deadline shuts ends this body as if it were complete.
        self._drip(stop, length=None)

    def _header_drip(self, stop: threading.Event) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        while not stop.wait(DRIP_PAUSE_S):
            self.wfile.write(b"a")
            self.wfile.flush()


@pytest.fixture
def misbehaving() -> Iterator[Callable[[str], str]]:
    """``serve(mode)`` -> the URL of a stand-in answering that way."""
    servers: list[ThreadingHTTPServer] = []

    def serve(mode: str) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
        server.mode = mode  # type: ignore[attr-defined]
        server.stop = threading.Event()  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.stop.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def read_alerts(url: str, **bounds: Any) -> None:
    source = AlertSource(url, "chat", namespace="team", timeout_s=READ_TIMEOUT_S, **bounds)
    try:
        source.firing()
    finally:
        source.close()


def read_query(url: str, **bounds: Any) -> None:
    query_at(url, timeout_s=READ_TIMEOUT_S, **bounds)("up", None)


READERS = {"alerts": read_alerts, "query": read_query}


def _refused(read: Callable[..., None], url: str, **bounds: Any) -> str:
    with pytest.raises(PrometheusUnavailable) as info:
        read(url, **bounds)
    message = str(info.value)
    assert SECRET.decode() not in message and "aaaa" not in message
    return message


@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_endless_body_stops_at_the_cap(misbehaving: Callable[[str], str],
                                          reader: str) -> None:
    message = _refused(READERS[reader], misbehaving("endless"), max_bytes=256 * 1024,
                       deadline_s=NO_DEADLINE_S)
    assert "over the 256 KiB cap for this query (bounded.answer_cap)" in message


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_declared_size_over_the_cap_is_refused_before_reading(
        misbehaving: Callable[[str], str], reader: str) -> None:
    message = _refused(READERS[reader], misbehaving("declared"))  # the shipped bounds
    # Each reader's own: one deployment's alerts are far smaller than a raw read.
    cap = "256 KiB" if reader == "alerts" else f"{MAX_ANSWER_BYTES // 2**20} MiB"
    assert ALERTS_ANSWER_BYTES == 256 * 1024
    assert f"over the {cap} cap for this query (bounded.answer_cap)" in message


@pytest.mark.parametrize("mode", ["drip", "drip-unsized", "header-drip"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_dripping_answer_ends_at_the_deadline(misbehaving: Callable[[str], str],
                                                reader: str, mode: str) -> None:
    message = _refused(READERS[reader], misbehaving(mode), deadline_s=TINY_DEADLINE_S)
    assert f"within the {TINY_DEADLINE_S:g} s deadline per request (ANSWER_DEADLINE_S)" \
        in message


@pytest.mark.parametrize("bounds", [{"deadline_s": 0.0}, {"max_bytes": 0}])
def test_bounds_that_admit_nothing_are_refused(misbehaving: Callable[[str], str],
                                               bounds: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="expected seconds > 0 and bytes >= 1"):
        read_query(misbehaving("endless"), **bounds)
