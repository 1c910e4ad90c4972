"""A live engine under steady load, scraped by a real Prometheus: for evaluator tests.

The server is ``slopilot serve``'s app on the simulated executor in real time (tests/
support/live_server.py); a thread posts completions at a fixed rate across the three
classes; Prometheus scrapes /metrics every second with a deployment label.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.config import ConfigError
from slopilot.engine.slo import SLOSpec
from tests.support.live_server import LiveServer, start_server
from tests.support.prometheus import (
    PrometheusBinaries,
    PrometheusServer,
    ScrapeTarget,
    start_prometheus,
)
from tests.support.waits import HANG_GUARD_S, wait_for

TOKEN = "contract-token"
SELECTOR = {"slopilot_deployment": "contract"}


class LoadGenerator:
    """Posts one short completion every ``1 / rate`` seconds (classes round robin)."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = url
        self.interval = 1.0 / rate
        self.stop_event = threading.Event()
        self.sent = 0
        self.sent_at: list[float] = []  # wall-clock times, to compare with Prometheus'
        self._pool = ThreadPoolExecutor(max_workers=16)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _post(self, priority: str) -> None:
        # A refused request is load the engine did not take; the rate shows it.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(self.url + "/v1/completions", timeout=HANG_GUARD_S, json={
                "prompt": "hello " * 40, "max_tokens": 12, "priority": priority,
                "ignore_eos": True})

    def _run(self) -> None:
        classes = ("p0", "p1", "p1", "p2")
        # The n-th send is due at start + n / rate, not one interval after the previous
        # send woke: on a busy machine each wake-up comes late, and waits measured from
        # it added their lateness up, so the rate sent (and the rate the tests read
        # back) sank with the machine's load. A late wake-up now sends what is due.
        # Event.wait returns at once when stopped.
        start = time.monotonic()
        while not self.stop_event.wait(
                max(0.0, start + (self.sent + 1) * self.interval - time.monotonic())):
            self._pool.submit(self._post, classes[self.sent % len(classes)])
            self.sent_at.append(time.time())
            self.sent += 1

    def sent_between(self, start: float, end: float) -> int:
        """How many requests were sent in ``[start, end]`` (wall-clock seconds)."""
        return sum(start <= t <= end for t in list(self.sent_at))

    def start(self) -> LoadGenerator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(HANG_GUARD_S)
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class LiveStack:
    server: LiveServer
    prometheus: PrometheusServer
    load: LoadGenerator
    applied: list[dict[str, Any]] = field(default_factory=list)

    def apply_config(self, config: Mapping[str, Any]) -> None:
        """What the demo and the operator do: PUT /admin/config with the bearer token; the
        engine judges the config whole and refuses it (400, ConfigError here) whole."""
        resp = httpx.put(self.server.url + "/admin/config", json=dict(config), timeout=HANG_GUARD_S,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        if resp.status_code == 400:
            raise ConfigError(resp.text)
        resp.raise_for_status()
        self.applied.append(dict(config))


    def judge_by(self, slo: SLOSpec) -> None:
        """What the operator does on an edit of spec.slo: PUT /admin/slo, so that the
        engine's verdicts (the goodput the rules read) are under these objectives."""
        resp = httpx.put(self.server.url + "/admin/slo", json=slo.to_dict(), timeout=HANG_GUARD_S,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        resp.raise_for_status()


def _has_finished_requests(prom: PrometheusServer) -> bool:
    answer = prom.query(
        'sum(vllm:e2e_request_latency_seconds_count{slopilot_deployment="contract"})')
    result = answer.get("data", {}).get("result", [])
    return bool(result) and float(result[0]["value"][1]) > 10


@contextmanager
def live_stack(binaries: PrometheusBinaries, workdir: Path, rate: float = 6.0
               ) -> Iterator[LiveStack]:
    server = start_server(admin_token=TOKEN)
    load: LoadGenerator | None = None
    prom: PrometheusServer | None = None
    try:
        host = server.url.removeprefix("http://")
        prom = start_prometheus(binaries, workdir, targets=[
            ScrapeTarget("engine", [host], labels=SELECTOR)], scrape_interval_s=1)
        load = LoadGenerator(server.url, rate).start()
        wait_for(lambda: _has_finished_requests(prom),
                 what="Prometheus to hold finished requests of the live engine")
        yield LiveStack(server, prom, load)
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        server.stop()
