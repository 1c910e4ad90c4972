"""HTTP stand-ins on 127.0.0.1 for the operator's controller tests, and the test factory.

- ``PrometheusStandIn`` answers the alerts query (``/api/v1/query``) with the alerts a
  test sets, as the ``ALERTS`` and ``ALERTS_FOR_STATE`` series Prometheus keeps.
- ``PodStandIn`` is an engine pod's admin endpoint: it records each ``PUT /admin/config``
  with its Authorization header and refuses a wrong token with 401, like the server; with
  a ``config`` (the one it started with), ``GET /admin/config`` answers it, and an
  accepted PUT replaces it, as the engine does; ``/admin/slo`` likewise with ``slo``.
- ``build_controller`` is a ``$SLOPILOT_CONTROLLER_FACTORY``: the real Controller over the
  real KubeDeploymentHandle and the real AlertSource (HTTP to the stand-in); the study,
  windows, workload and capacity ports are the tuner's test fakes (their own job is
  tested in tests/tuner), with a planner that always asks for two more replicas so a
  second scale would show.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slopilot.engine.window_summary import WindowSummary
from slopilot.operator.daemon import DaemonContext
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.prometheus.alerts import AlertSource
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import GOOD, FakeProbe, FakeStudy

# 150 of 160 output tokens/s within the SLO.
# On 200 requests a class: past the trials' floor (min_class_requests, 100 by default),
# so a window is judged where it is read, as a busy deployment's is.
HOLDS = window({"p0": figures(40.0, 8.0, 50.0, throughput=55.0, finished=200),
                "p1": figures(200.0, 40.0, 50.0, throughput=55.0, finished=200),
                "p2": figures(300.0, 50.0, 50.0, finished=200)})


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.standin = self  # type: ignore[attr-defined]
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # quiet test output
        pass

    def reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class PrometheusStandIn(_Server):
    """``raw_answer`` (status, content type, body) replaces every answer, for a service
    that is not a Prometheus; ``requests`` counts what was asked, ``queries`` keeps the
    PromQL. Every alert set is in every answer: the reader must match its own."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.raw_answer: tuple[int, str, bytes] | None = None
        self.requests = 0
        self.queries: list[str] = []
        super().__init__(_PromHandler)

    def series(self) -> list[dict[str, Any]]:
        """The alerts set, as the ALERTS and ALERTS_FOR_STATE samples of a query."""
        out = []
        for alert in self.alerts:
            labels, state = alert["labels"], alert["state"]
            active_at = datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00"))
            out.append({"metric": {"__name__": "ALERTS", "alertstate": state, **labels},
                        "value": [0, "1"]})
            out.append({"metric": {"__name__": "ALERTS_FOR_STATE", **labels},
                        "value": [0, str(int(active_at.timestamp()))]})
        return out

    def fire(self, name: str, action: str, deployment: str, namespace: str,
             *more_namespaces: str) -> None:
        """One alert for ``deployment`` per namespace given, labelled as the rules do."""
        labels = {"alertname": name, "action": action, "severity": "critical",
                  "priority_class": "p0", "slopilot_deployment": deployment}
        self.alerts = [{"labels": {**labels, "slopilot_namespace": ns}, "state": "firing",
                        "activeAt": "2026-01-01T00:00:00Z", "value": "1"}
                       for ns in (namespace, *more_namespaces)]


class _PromHandler(_Handler):
    def do_GET(self) -> None:
        standin: PrometheusStandIn = self.server.standin  # type: ignore[attr-defined]
        standin.requests += 1
        if standin.raw_answer is not None:
            status, ctype, data = standin.raw_answer
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path.startswith("/api/v1/query?"):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            standin.queries += query.get("query", [])
            self.reply(200, {"status": "success",
                             "data": {"resultType": "vector", "result": standin.series()}})
        else:
            self.reply(404, {"status": "error", "error": f"not served: {self.path}"})


class PodStandIn(_Server):
    """``token``: the one it accepts (set it once the operator has minted it);
    ``config``: what it runs (None: it serves no GET, 404)."""

    def __init__(self, token: str = "", config: Mapping[str, Any] | None = None,
                 slo: Mapping[str, Any] | None = None, *, serves_slo: bool = True) -> None:
        self.token = token
        self.serves_slo = serves_slo  # False: an image from before /admin/slo
        self.config = None if config is None else dict(config)
        self.slo = None if slo is None else dict(slo)  # what GET /admin/slo answers
        self.puts: list[tuple[dict[str, Any], str]] = []  # (body, Authorization header)
        self.slo_puts: list[dict[str, Any]] = []
        self.gets = 0
        # path -> (status, content type, body) answering a GET of it: an image that is
        # not the engine, or a hostile one.
        self.raw_gets: dict[str, tuple[int, str, bytes]] = {}
        self.raw_headers: dict[str, str] = {}  # sent with each of those answers too
        # Bytes of padding every PUT is answered with (0: none), a hostile image's huge
        # body; ``answer_cut`` is set once the client closed before it was all sent, and
        # ``answer_sent`` once it was.
        self.put_answer_bytes = 0
        # Seconds between the bytes of every answer (0: sent at once): a hostile image
        # that sends each byte just inside any read timeout, forever.
        self.drip_s = 0.0
        self.drip_methods = frozenset({"GET", "PUT"})
        self.answer_cut, self.answer_sent = threading.Event(), threading.Event()
        self.drip_begun = threading.Event()  # set once a dripping answer's first byte is out
        # Called with (method, path) as each request arrives, before it is answered: a
        # test's clock can take the time a slow image would.
        self.on_request: Callable[[str, str], None] | None = None
        self.lock = threading.Lock()
        super().__init__(_PodHandler)

    def put_bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [b for b, _ in self.puts]


class _PodHandler(_Handler):
    def drip(self, standin: PodStandIn) -> bool:
        """Answer one header byte at a time until the client hangs up; whether it did."""
        if not standin.drip_s or self.command not in standin.drip_methods:
            return False
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            while True:
                self.wfile.write(b"X")
                self.wfile.flush()
                standin.drip_begun.set()
                time.sleep(standin.drip_s)
        except OSError:
            standin.answer_cut.set()
        return True

    def do_GET(self) -> None:
        standin: PodStandIn = self.server.standin  # type: ignore[attr-defined]
        if standin.on_request is not None:
            standin.on_request("GET", self.path)
        if self.drip(standin):
            return
        with standin.lock:
            standin.gets += self.path == "/admin/config"
            config = None if standin.config is None else dict(standin.config)
            slo = standin.slo
            raw = standin.raw_gets.get(self.path)
        if raw is not None:
            status, ctype, data = raw
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for header, value in standin.raw_headers.items():
                self.send_header(header, value)
            self.end_headers()
            self.wfile.write(data)
        elif self.headers.get("Authorization", "") != f"Bearer {standin.token}":
            self.reply(401, {"error": {"message": "missing or wrong admin token"}})
        elif config is None or self.path not in ("/admin/config", "/admin/slo") or (
                self.path == "/admin/slo" and not standin.serves_slo):
            self.reply(404, {"error": {"message": f"not served: {self.path}"}})
        else:
            self.reply(200, config if self.path == "/admin/config" else slo)

    def do_PUT(self) -> None:
        standin: PodStandIn = self.server.standin  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        auth = self.headers.get("Authorization", "")
        if standin.on_request is not None:
            standin.on_request("PUT", self.path)
        if self.drip(standin):
            return
        if standin.put_answer_bytes:
            self.pad(standin)
            return
        if self.path == "/admin/slo" and standin.config is not None and standin.serves_slo:
            if auth != f"Bearer {standin.token}":
                self.reply(401, {"error": {"message": "missing or wrong admin token"}})
                return
            with standin.lock:
                standin.slo_puts.append(body)
                standin.slo = body
            self.reply(200, body)
            return
        with standin.lock:
            standin.puts.append((body, auth))
            if auth == f"Bearer {standin.token}" and standin.config is not None:
                standin.config = {**standin.config, **body}
        if auth != f"Bearer {standin.token}":
            self.reply(401, {"error": {"message": "missing or wrong admin token"}})
        else:
            self.reply(200, body)

    def pad(self, standin: PodStandIn) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(standin.put_answer_bytes))
        self.end_headers()
        block = b" " * 65536
        try:
            for _ in range(standin.put_answer_bytes // len(block)):
                self.wfile.write(block)
        except OSError:
            standin.answer_cut.set()
            return
        standin.answer_sent.set()


@contextmanager
def serving(*servers: _Server) -> Iterator[None]:
    try:
        yield
    finally:
        for s in servers:
            s.close()


class MoreReplicas:
    """A capacity planner that always wants two more replicas than there are now."""

    def __init__(self, ctx: DaemonContext) -> None:
        self.handle = ctx.handle

    def search(self, scenario: Any, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0) -> CapacityAnswer:
        return CapacityAnswer(replicas=min(self.handle.replicas() + 2, hi))


class HoldingWindows:
    """Every window holds the SLO (the Prometheus evaluator has its own tests)."""

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        return HOLDS


def build_study_controller(ctx: DaemonContext) -> Controller:
    """``build_controller`` with the real study: Optuna in ``spec.tuning.storage``."""
    from slopilot.operator.daemon import open_deployment_study
    from slopilot.tuner.study.live import ResumableTuner
    from slopilot.tuner.study.space import SearchSpace

    space = SearchSpace.from_bounds(base=ctx.spec.engine)
    study = open_deployment_study(ctx, space)  # the daemon's own: a successor where due
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    return Controller(settings, ctx.handle, AlertSource(ctx.spec.prometheus_url, ctx.name),
                      HoldingWindows(), ResumableTuner(study, space),
                      FakeProbe(), MoreReplicas(ctx), state=ctx.state)


def build_controller(ctx: DaemonContext) -> Controller:
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    alerts = AlertSource(ctx.spec.prometheus_url, ctx.name, namespace=ctx.namespace,
                         verify=ctx.prometheus_tls)
    return Controller(settings, ctx.handle, alerts,
                      HoldingWindows(), FakeStudy(queue=[dict(GOOD)]), FakeProbe(),
                      MoreReplicas(ctx), state=ctx.state)


class StalledAlerts:
    """An alert source that answers only once released: a tick that lasts (a slow
    Prometheus, a study waiting minutes for a simulator worker). ``entered`` is set
    once a tick is inside it."""

    entered = threading.Event()
    release = threading.Event()

    def firing(self) -> list[Any]:
        StalledAlerts.entered.set()
        StalledAlerts.release.wait()
        return []


def build_stalled_controller(ctx: DaemonContext) -> Controller:
    """``build_controller`` whose every tick waits in ``StalledAlerts``."""
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    return Controller(settings, ctx.handle, StalledAlerts(),  # type: ignore[arg-type]
                      HoldingWindows(), FakeStudy(queue=[dict(GOOD)]), FakeProbe(),
                      MoreReplicas(ctx), state=ctx.state)


def build_quick_controller(ctx: DaemonContext) -> Controller:
    """``build_controller`` with a 1 s cooldown and 2 s for a scale's replicas to serve
    (``replica_ready_s``): a scale's wait and its end within a test."""
    settings = dataclasses.replace(ctx.settings, cooldown_s=1.0, replica_ready_s=2.0)
    alerts = AlertSource(ctx.spec.prometheus_url, ctx.name, namespace=ctx.namespace,
                         verify=ctx.prometheus_tls)
    return Controller(settings, ctx.handle, alerts,
                      HoldingWindows(), FakeStudy(queue=[dict(GOOD)]), FakeProbe(),
                      MoreReplicas(ctx), state=ctx.state)
