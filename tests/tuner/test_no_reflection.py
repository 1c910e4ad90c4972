"""Nothing from a Prometheus answer's body reaches an error message (status, events, logs).

A tenant picks the Prometheus URL; were a body copied into the error, pointing the URL at
any internal service would read that service's answer back into the CR's status (SSRF
with reflection). Messages carry the status code and the content type only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from slopilot.tuner.prometheus.alerts import AlertSource, parse_alert_series
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.waits import HANG_GUARD_S

SECRET = "TOP-SECRET-7f3a"
# (status, content type, body): what an internal service might answer instead.
ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "json-200": (200, "application/json", json.dumps({"token": SECRET}).encode()),
    "json-error": (200, "application/json",
                   json.dumps({"status": "error", "error": SECRET}).encode()),
    "html-404": (404, "text/html", f"<h1>{SECRET}</h1>".encode()),
    "text-500": (500, "text/plain", SECRET.encode()),
    "not-json": (200, "application/json", SECRET.encode()),
    "wrong-shape": (200, "application/json", json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1, SECRET]}]}}).encode()),
    "le-label": (200, "application/json", json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"le": SECRET}, "value": [1, "1"]}]}}).encode()),
}


class _Leaky(BaseHTTPRequestHandler):
    answer: tuple[int, str, bytes] = (200, "text/plain", b"")

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        status, ctype, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status, SECRET)  # the reason phrase is the peer's text too
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def leaky() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Leaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_alert_errors_name_the_status_and_content_type_only(
        leaky: ThreadingHTTPServer, kind: str) -> None:
    leaky.answer = ANSWERS[kind]  # type: ignore[attr-defined]
    source = AlertSource(url_of(leaky), "chat", timeout_s=HANG_GUARD_S)
    try:
        alerts = source.firing()
    except PrometheusUnavailable as exc:
        message = str(exc)
        assert SECRET not in message
        assert f"HTTP {ANSWERS[kind][0]}" in message and ANSWERS[kind][1] in message
    else:  # a well-formed answer with nothing of this deployment: nothing fires
        assert alerts == []
    finally:
        source.close()


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_query_errors_name_the_status_and_content_type_only(
        leaky: ThreadingHTTPServer, kind: str) -> None:
    leaky.answer = ANSWERS[kind]  # type: ignore[attr-defined]
    query = query_at(url_of(leaky), timeout_s=HANG_GUARD_S)
    with pytest.raises(PrometheusUnavailable) as info:
        query("up", None)
    assert SECRET not in str(info.value)
    assert f"HTTP {ANSWERS[kind][0]}" in str(info.value)


@pytest.mark.parametrize("bad", [{"status": "error", "error": SECRET}, {"token": SECRET},
                                 SECRET, [{"metric": SECRET, "value": SECRET}]])
def test_parse_alert_series_never_quotes_the_answer(bad: Any) -> None:
    try:
        got = parse_alert_series(bad, "chat")
    except PrometheusUnavailable as exc:
        assert SECRET not in str(exc)
    else:
        assert got == []


def test_alert_labels_a_foreign_server_makes_up_never_become_alerts() -> None:
    # A Prometheus-shaped answer from anywhere the URL points: only the rules' own alert
    # names, severities and classes are read; anything else would carry the peer's text
    # into lastAction and the Tuning condition.
    def alert(**labels: str) -> list[dict[str, Any]]:
        base = {"alertname": "SlopilotTTFTP99High", "action": "retune",
                "severity": "critical", "priority_class": "p0",
                "slopilot_deployment": "chat", "slopilot_namespace": "team", **labels}
        return [{"metric": {"__name__": "ALERTS", "alertstate": "firing", **base},
                 "value": [0, "1"]},
                {"metric": {"__name__": "ALERTS_FOR_STATE", **base}, "value": [0, SECRET]}]
    result = [*alert(alertname=SECRET), *alert(severity=SECRET),
              *alert(priority_class=SECRET), *alert()]
    got = parse_alert_series(result, "chat", "team")
    assert [(a.name, a.severity, a.priority_class) for a in got] == [
        ("SlopilotTTFTP99High", "critical", "p0")]
    assert SECRET not in repr(got)
