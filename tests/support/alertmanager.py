"""Run the real Alertmanager for tests: a temp config, 127.0.0.1, a free port, no cluster.

Debian's ``prometheus-alertmanager`` package gives /usr/bin/prometheus-alertmanager (the
upstream tarball calls it ``alertmanager``) and /usr/bin/amtool; the environment
variables SLOPILOT_ALERTMANAGER_BIN and SLOPILOT_AMTOOL_BIN point elsewhere. The package
may also start a system service on 9093/9094: each server here listens on a port of its
own and gossips with no peer, so it neither meets that one nor another test's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.local_server import LocalServer, start_ready


class AlertmanagerError(RuntimeError):
    """Alertmanager did not start, or answered an API call with an error."""


@dataclass(frozen=True)
class AlertmanagerBinaries:
    alertmanager: Path
    amtool: Path


def find_binaries() -> AlertmanagerBinaries | None:
    """The alertmanager and amtool binaries, or None when either is missing."""
    server = (os.environ.get("SLOPILOT_ALERTMANAGER_BIN")
              or shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"))
    tool = os.environ.get("SLOPILOT_AMTOOL_BIN") or shutil.which("amtool")
    if not server or not tool or not Path(server).is_file() or not Path(tool).is_file():
        return None
    return AlertmanagerBinaries(Path(server), Path(tool))


def null_route_config(inhibit_rules: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An ``alertmanager.yml`` that notifies nobody and holds ``inhibit_rules``: the
    least a config needs (one route, its receiver) around the rules under test."""
    return {"route": {"receiver": "null"}, "receivers": [{"name": "null"}],
            "inhibit_rules": [dict(r) for r in inhibit_rules]}


class AlertmanagerServer(LocalServer):
    """A running Alertmanager; ``stop()`` (or the fixture) ends it."""

    LOG = "alertmanager.log"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            # A bound for a call that hangs, not a guess at speed (tests/support/waits.py).
            with urllib.request.urlopen(request, timeout=60) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise AlertmanagerError(f"{method} {path}: HTTP {exc.code}: "
                                    f"{exc.read()[:500]!r}") from None
        return json.loads(raw) if raw.strip() else None

    def post_alerts(self, labelsets: Sequence[Mapping[str, str]]) -> None:
        """POST firing alerts (no ``endsAt``: Alertmanager holds them for its
        ``resolve_timeout``, 5 m, as it does those a Prometheus sends)."""
        self._call("POST", "/api/v2/alerts", [{"labels": dict(ls)} for ls in labelsets])

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: every alert with its ``fingerprint`` and ``status``
        (``state``, ``inhibitedBy``, ``silencedBy``), judged as it is read."""
        answer: list[dict[str, Any]] = self._call("GET", "/api/v2/alerts")
        return answer


def start_alertmanager(binaries: AlertmanagerBinaries, workdir: Path,
                       config: Mapping[str, Any], *, attempts: int = 3) -> AlertmanagerServer:
    """Start Alertmanager on 127.0.0.1 with ``config`` and wait for /-/ready; retried on
    a port race."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def argv(port: int) -> list[str]:
        return [str(binaries.alertmanager), f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                # Empty: no gossip listener, so no fixed 9094 to collide on.
                "--cluster.listen-address=", "--log.level=warn"]
    try:
        return start_ready(AlertmanagerServer, "Alertmanager", argv, workdir,
                           attempts=attempts, port_race_only=True)
    except RuntimeError as exc:
        raise AlertmanagerError(str(exc)) from None


def amtool(binaries: AlertmanagerBinaries, *args: str | Path,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run amtool; the caller checks returncode (stdout and stderr are kept)."""
    return subprocess.run([str(binaries.amtool), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=cwd, check=False)
