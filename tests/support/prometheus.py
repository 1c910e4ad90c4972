"""Run the real Prometheus binary for tests: a temp config, 127.0.0.1, a free port.

Debian's ``prometheus`` package gives /usr/bin/prometheus and /usr/bin/promtool; the
environment variables SLOPILOT_PROMETHEUS_BIN and SLOPILOT_PROMTOOL_BIN point elsewhere.
Nothing here relies on a system service: each server is started and stopped by its test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import yaml

from tests.support.local_server import LocalServer, start_ready


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered an API call with an error."""


@dataclass(frozen=True)
class PrometheusBinaries:
    prometheus: Path
    promtool: Path


def find_binaries() -> PrometheusBinaries | None:
    """The prometheus and promtool binaries, or None when either is missing."""
    prom = os.environ.get("SLOPILOT_PROMETHEUS_BIN") or shutil.which("prometheus")
    tool = os.environ.get("SLOPILOT_PROMTOOL_BIN") or shutil.which("promtool")
    if not prom or not tool or not Path(prom).is_file() or not Path(tool).is_file():
        return None
    return PrometheusBinaries(Path(prom), Path(tool))


@dataclass(frozen=True)
class ScrapeTarget:
    """One scrape job: ``host:port`` addresses and labels attached to every series; a
    ``__meta_*`` label there is what service discovery would have said of the target,
    for ``relabel_configs`` to read, and gone after them as a discovered one is."""

    job: str
    targets: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"
    metric_relabel_configs: Sequence[Mapping[str, Any]] = ()
    relabel_configs: Sequence[Mapping[str, Any]] = ()
    sample_limit: int = 0
    """The job's ``sample_limit`` (0: none), as a ServiceMonitor's ``sampleLimit``."""


def write_config(path: Path, *, targets: Sequence[ScrapeTarget], rule_files: Sequence[Path],
                 scrape_interval_s: int, evaluation_interval_s: int) -> None:
    config = {
        "global": {"scrape_interval": f"{scrape_interval_s}s",
                   "scrape_timeout": f"{scrape_interval_s}s",
                   "evaluation_interval": f"{evaluation_interval_s}s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": t.job, "metrics_path": t.metrics_path,
             "static_configs": [{"targets": list(t.targets), "labels": dict(t.labels)}],
             **({"relabel_configs": [dict(r) for r in t.relabel_configs]}
                if t.relabel_configs else {}),
             **({"metric_relabel_configs": [dict(r) for r in t.metric_relabel_configs]}
                if t.metric_relabel_configs else {}),
             **({"sample_limit": t.sample_limit} if t.sample_limit else {})}
            for t in targets],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


class PrometheusServer(LocalServer):
    """A running Prometheus; ``stop()`` (or the fixture) ends it."""

    LOG = "prometheus.log"

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            # A bound for a read that hangs, not a guess at speed: a busy machine's
            # slow answer is progress, and the waits that poll here have no other bound.
            with urllib.request.urlopen(url, timeout=60) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            # The API answers 400/422 with a JSON body that says what was wrong.
            body = exc.read()
            try:
                return json.loads(body)
            except ValueError:
                raise PrometheusError(f"GET {path}: HTTP {exc.code}: {body[:200]!r}") from None

    def query(self, expr: str) -> Any:
        """The raw /api/v1/query answer (status, data or errorType/error)."""
        return self.get("/api/v1/query", {"query": expr})

    def alerts(self) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/alerts")
        if answer.get("status") != "success":
            raise PrometheusError(f"/api/v1/alerts: {answer}")
        alerts: list[dict[str, Any]] = answer["data"]["alerts"]
        return alerts


def start_prometheus(binaries: PrometheusBinaries, workdir: Path, *,
                     targets: Sequence[ScrapeTarget] = (), rule_files: Sequence[Path] = (),
                     scrape_interval_s: int = 1, evaluation_interval_s: int = 1,
                     attempts: int = 3) -> PrometheusServer:
    """Start Prometheus on 127.0.0.1 and wait for /-/ready; retried on a port race."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    write_config(config, targets=targets, rule_files=rule_files,
                 scrape_interval_s=scrape_interval_s,
                 evaluation_interval_s=evaluation_interval_s)

    def argv(port: int) -> list[str]:
        return [str(binaries.prometheus), f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
                "--log.level=warn"]
    try:
        # An exit is most likely the port taken meanwhile: each try another.
        return start_ready(PrometheusServer, "Prometheus", argv, workdir, attempts=attempts)
    except RuntimeError as exc:
        raise PrometheusError(f"{exc} ({attempts} tries)") from None


def promtool(binaries: PrometheusBinaries, *args: str | Path,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; the caller checks returncode (stdout and stderr are kept)."""
    return subprocess.run([str(binaries.promtool), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=cwd, check=False)


@contextmanager
def serve_metrics(render: Callable[[], bytes]) -> Iterator[str]:
    """``render()`` served as a classic-text /metrics by a plain thread; yields host:port."""
    with serve_negotiated(lambda accept: (render(),
                                          "text/plain; version=0.0.4; charset=utf-8")) as at:
        yield at


@contextmanager
def serve_negotiated(answer: Callable[[str], tuple[bytes, str]]) -> Iterator[str]:
    """Every GET answered ``answer(Accept header)``: (body, content type), by a plain
    thread; yields host:port. A target that picks its format as the scraper asks."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = answer(self.headers.get("Accept", ""))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
