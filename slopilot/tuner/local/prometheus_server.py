"""A local Prometheus process: scrapes a ``file_sd`` targets file, evaluates rule files.

For ``slopilot demo`` and the live-loop tests: the real binary (``prometheus`` on PATH or
``$SLOPILOT_PROMETHEUS_BIN``) on 127.0.0.1. ``stop()`` then ``start()`` brings it back on
the same port and data directory, as a restarted Prometheus would be: the port is held
(``held_port``) until ``close()``. On Linux it also ends when the process that started
it dies (``die_with_parent.py``), a SIGKILL too.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import yaml

from slopilot.tuner.local.die_with_parent import die_with_parent
from slopilot.tuner.local.held_port import HeldPort

BIN_ENV = "SLOPILOT_PROMETHEUS_BIN"
READY_TIMEOUT_S = 30.0
"""How long a starting Prometheus may take to answer /-/ready by default."""


class PrometheusStartError(RuntimeError):
    """The binary is missing, or Prometheus did not become ready; the message says why."""


def find_prometheus() -> Path | None:
    found = os.environ.get(BIN_ENV) or shutil.which("prometheus")
    return Path(found) if found and Path(found).is_file() else None


class LocalPrometheus:
    def __init__(self, workdir: Path, targets_file: Path, rule_files: Sequence[Path] = (), *,
                 scrape_interval_s: int = 1, evaluation_interval_s: int = 1,
                 binary: Path | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        if not 0 < ready_timeout_s < math.inf:
            raise ValueError(f"ready_timeout_s={ready_timeout_s!r}: expected seconds > 0 "
                             "(how long a starting Prometheus may take to answer /-/ready), "
                             f"e.g. {READY_TIMEOUT_S:g}")
        found = binary or find_prometheus()
        if found is None:
            raise PrometheusStartError(
                f"no prometheus binary: install it (apt-get install prometheus) or set {BIN_ENV}")
        # Absolute: Prometheus runs in workdir and would read a relative path from there.
        self.binary, self.workdir = found, Path(workdir).resolve()
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{scrape_interval_s}s",
                       "scrape_timeout": f"{scrape_interval_s}s",
                       "evaluation_interval": f"{evaluation_interval_s}s"},
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": [{
                "job_name": "slopilot",
                "file_sd_configs": [{"files": [str(Path(targets_file).resolve())],
                                     "refresh_interval": "1s"}]}],
        }, sort_keys=False))
        # Held from here to close(): before the first start and while stop()ped, no
        # other process's socket takes the port start() promises to come back on.
        self._held = HeldPort()
        self.port = self._held.port
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self) -> LocalPrometheus:
        if self.process is not None and self.process.poll() is None:
            return self
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                # A SIGKILLed demo runs no stop(): Prometheus ends with it all the same.
                preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.ready():
            # An exited process fails at once, however long the start may take.
            code = self.process.poll()
            if code is not None:
                raise PrometheusStartError(f"Prometheus on port {self.port} exited with "
                                           f"{code} at start:\n{self._tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusStartError(
                    f"Prometheus on port {self.port} not ready within "
                    f"{self.ready_timeout_s:g} s (ready_timeout_s; on a slow or busy machine "
                    f"give more, `slopilot demo --ready-timeout`):\n{self._tail()}")
            time.sleep(0.1)
        return self

    def _tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/-/ready", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        p = self.process
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def close(self) -> None:
        """Stop it for good: its port is let go."""
        self.stop()
        self._held.release()

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
