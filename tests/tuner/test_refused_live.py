"""Requests turned away for load, end to end: a live engine answers 429 (or, at its
connection cap, 503), a real Prometheus scrapes it with the deployment's rules, and every
TTFT reader sees a first token never given: the recorded P99, the alert, and the loop's
window."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from slopilot.engine.http_deadlines import Deadlines
from slopilot.engine.request import Priority
from slopilot.engine.sim.stats import REFUSED_TTFT_S
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.rules import RuleOptions, render_rules_yaml
from slopilot.tuner.study.evaluator import WindowRejected
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.prometheus import PrometheusServer, ScrapeTarget
from tests.support.waits import HANG_GUARD_S, wait_for

SLO = SLOSpec.from_profile("standard")
SELECTOR = {"slopilot_deployment": "refusing"}
P1 = 'priority_class="p1"'


@contextlib.contextmanager
def _clients(srv: LiveServer, n: int) -> Iterator[None]:
    """``n`` clients posting P1 completions back to back: more than one running and one
    waiting request can hold, so most are turned away."""
    stop = threading.Event()

    def post() -> None:
        with httpx.Client(timeout=HANG_GUARD_S) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.post(srv.url + "/v1/completions", json={
                        "prompt": "hello " * 8, "max_tokens": 4, "priority": 1,
                        "ignore_eos": True})

    threads = [threading.Thread(target=post, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(HANG_GUARD_S)


def _values(prom: PrometheusServer, expr: str) -> list[float]:
    answer = prom.query(expr)
    assert answer["status"] == "success", answer
    return [float(s["value"][1]) for s in answer["data"]["result"]]


def _scraping(factory: Callable[..., PrometheusServer], srv: LiveServer,
              tmp_path: Path) -> PrometheusServer:
    """A Prometheus scraping ``srv`` with the SLO's rules, on short windows and holds:
    the scrape, the rules and the alert settle in seconds."""
    opts = RuleOptions(interval_s=1, rate_window_s=5, alert_for_s=1, tbt_periods=1,
                       breach_window_s=5)
    rules = tmp_path / "rules.yaml"
    rules.write_text(render_rules_yaml(SLO, SELECTOR["slopilot_deployment"], options=opts))
    return factory(targets=[ScrapeTarget(
        "engine", [srv.url.removeprefix("http://")], SELECTOR)], rule_files=[rules])


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_live_engine_turning_clients_away_reads_as_missing_its_ttft_slo(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        tmp_path: Path) -> None:
    backend = build_backend(knobs={"max_num_seqs": 1, "max_waiting": 1})
    backend.metrics.set_slo(SLO)
    srv = start_server(backend)
    try:
        prom = _scraping(prometheus_factory, srv, tmp_path)
        with _clients(srv, 4):
            wait_for(lambda: _values(prom, f"slopilot_requests_refused_total{{{P1}}} > 0"),
                     what="Prometheus to hold requests turned away")

            def refusals_decide_the_p99() -> bool:
                # The served requests alone read a P99 far under 300 s: the recorded one
                # is 300 s only because the refused rate joined the +Inf bucket.
                served = _values(prom, "histogram_quantile(0.99, sum by (le) (rate("
                                 f"vllm:time_to_first_token_seconds_bucket{{{P1}}}[5s])))")
                recorded = _values(prom, f"slopilot:ttft_seconds:p99{{{P1}}}")
                return bool(served and math.isfinite(served[0]) and served[0] < 10
                            and recorded == [REFUSED_TTFT_S])

            wait_for(refusals_decide_the_p99, what="P1's recorded TTFT P99 at 300 s")

            def firing() -> list[dict[str, Any]]:
                return [a for a in prom.alerts()
                        if a["labels"]["alertname"] == "SlopilotTTFTP99High"
                        and a["labels"]["priority_class"] == "p1"
                        and a["labels"]["severity"] == "critical" and a["state"] == "firing"]

            assert wait_for(firing, what="SlopilotTTFTP99High firing for P1")[0][
                "labels"]["action"] == "retune"

            windows = PrometheusWindows(query_at(prom.url), SELECTOR, SLO, min_requests=1)

            def measured() -> bool:
                end = time.time()
                s = windows.measure(end - 5, end, canary=False)
                return (s.classes[Priority.P1].ttft_p99_ms == REFUSED_TTFT_S * 1000.0
                        and s.overall.ttft_p99_ms == REFUSED_TTFT_S * 1000.0)

            # A window may start before the load did (a load shift): read the next one.
            wait_for(measured, what="the loop's window to read P1's TTFT P99 at 300 s",
                     tolerate=(WindowRejected,))
        refused = backend.metrics.refused()
        assert refused[Priority.P1] > 0 and refused[Priority.P0] == refused[Priority.P2] == 0
    finally:
        srv.stop()


@pytest.mark.prometheus
@pytest.mark.slow
def test_p0_refused_at_the_connection_cap_reads_as_missing_its_ttft_slo(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        tmp_path: Path) -> None:
    """The reviewer's case, live: idle keep-alive clients hold every slot of
    ``--max-connections``, and every P0 request (the priority header) is a 503 at the
    cap. Counted in ``slopilot_connections_refused_total`` alone, P0 read no arrival and
    no refusal and fired nothing; now its recorded TTFT P99 is the last edge and its
    alert fires, while Prometheus' scrape still gets in past the cap."""
    backend = build_backend()
    backend.metrics.set_slo(SLO)
    cap = 2
    # The idle clients' connections kept for the test's length (the keep-alive of
    # clients that poll within it).
    srv = start_server(backend, max_connections=cap,
                       deadlines=Deadlines(keep_alive_s=3600.0))
    p0 = 'priority_class="p0"'
    try:
        prom = _scraping(prometheus_factory, srv, tmp_path)
        with contextlib.ExitStack() as stack:
            for _ in range(cap):  # idle keep-alive clients, each holding a slot
                idle = stack.enter_context(httpx.Client(timeout=HANG_GUARD_S))
                assert idle.get(srv.url + "/v1/models").status_code == 200
            stop = threading.Event()

            def post() -> None:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError), \
                            httpx.Client(timeout=HANG_GUARD_S) as client:
                        client.post(srv.url + "/v1/completions", json={
                            "prompt": "hello", "max_tokens": 4},
                            headers={"x-slopilot-priority": "p0"})

            thread = threading.Thread(target=post, daemon=True)
            thread.start()
            stack.callback(thread.join, HANG_GUARD_S)
            stack.callback(stop.set)
            wait_for(lambda: _values(prom, f"slopilot_requests_refused_total{{{p0}}} > 0"),
                     what="Prometheus to hold P0 refused at the cap")
            wait_for(lambda: _values(prom, f"slopilot:ttft_seconds:p99{{{p0}}}")
                     == [REFUSED_TTFT_S], what="P0's recorded TTFT P99 at 300 s")
            wait_for(lambda: [a for a in prom.alerts()
                              if a["labels"]["alertname"] == "SlopilotTTFTP99High"
                              and a["labels"]["priority_class"] == "p0"
                              and a["state"] == "firing"],
                     what="SlopilotTTFTP99High firing for P0")
        assert backend.metrics.refused()[Priority.P0] > 0
        assert backend.metrics.arrived()[Priority.P0] == backend.metrics.refused()[Priority.P0]
    finally:
        srv.stop()
