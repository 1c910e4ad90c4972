"""A deployment of local ``slopilot serve`` processes: the controller's DeploymentHandle
on one machine (the demo, and the live-loop tests).

Each replica is a ``slopilot serve`` subprocess on 127.0.0.1 and a free port; the first
is the canary. An admin token is generated per run and reaches the servers through the
environment (never the command line, which ``ps`` shows). Scaling starts or stops
processes (a stop is SIGTERM: the server drains its running requests, then exits). The
replicas are listed in a Prometheus ``file_sd`` targets file with the labels
``slopilot_deployment`` and ``instance_role`` (canary/stable), so a Prometheus watching
that file scrapes new replicas without a reload. ``close()`` (or leaving the ``with``
block, also on an exception) stops every process; on Linux a replica also dies with
the process that started it (``die_with_parent.py``), so a killed parent leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.executors.kernel_modes import KERNEL_CHOICES
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.local.die_with_parent import die_with_parent
from slopilot.tuner.local.held_port import HeldPort
from slopilot.tuner.loop.ports import Replicas, Rollout, Settled
from slopilot.tuner.prometheus.adapters import ROLE_LABEL
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL

ADMIN_TOKEN_ENV = "SLOPILOT_ADMIN_TOKEN"  # what ``slopilot serve`` reads
EXECUTORS = ("simulated", "torch")


class DeploymentError(RuntimeError):
    """A replica did not start, or answered an admin call with an unexpected error."""


@dataclass
class Replica:
    index: int
    held: HeldPort
    """Its port, no other process's from before the replica binds it until it is reaped."""
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def port(self) -> int:
        return self.held.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


READY_TIMEOUT_S = 60.0
"""How long a starting replica may take to answer /health by default: a simulated one
answers in seconds; a slower start (torch, a busy machine) is given more by its caller."""


class LocalDeployment:
    """N local replicas; see the module docstring. Use as a context manager."""

    def __init__(self, name: str, workdir: Path, *, replicas: int = 2, max_replicas: int = 8,
                 scenario: str = "demo", executor: str = "simulated",
                 model: str = "smollm2-135m", knobs: Mapping[str, Any] | None = None,
                 drain_timeout_s: float = 5.0, ready_timeout_s: float = READY_TIMEOUT_S,
                 log_level: str = "warning", cpu_kernels: str = "auto",
                 slo: SLOSpec | None = None) -> None:
        if not name or not name.replace("-", "").isalnum():
            raise ValueError(f"name={name!r}: use letters, digits and dashes")
        if not 1 <= replicas <= max_replicas:
            raise ValueError(f"replicas={replicas} max_replicas={max_replicas}: need "
                             "1 <= replicas <= max_replicas")
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r}: use one of {', '.join(EXECUTORS)}")
        if cpu_kernels not in KERNEL_CHOICES:
            raise ValueError(f"cpu_kernels={cpu_kernels!r}: use one of "
                             f"{', '.join(KERNEL_CHOICES)}")
        if not 0 <= drain_timeout_s < math.inf:
            raise ValueError(f"drain_timeout_s={drain_timeout_s!r}: expected seconds >= 0, "
                             "e.g. 5")
        if not 0 < ready_timeout_s < math.inf:
            raise ValueError(f"ready_timeout_s={ready_timeout_s!r}: expected seconds > 0 "
                             f"(how long a starting replica may take to answer /health), "
                             f"e.g. {READY_TIMEOUT_S:g}")
        # Refuse a bad knob here, before any process starts.
        self._stable = EngineConfig().with_overrides(knobs or {}).to_dict()
        self._committed = dict(self._stable)
        """The last config every replica was given not as a trial's (``committed_config``);
        ``_stable``, what a new replica starts with, follows trials on every replica too."""
        self.name, self.workdir = name, Path(workdir)
        self.max_replicas, self.scenario, self.executor, self.model = (
            max_replicas, scenario, executor, model)
        self.drain_timeout_s, self.ready_timeout_s = drain_timeout_s, ready_timeout_s
        self.log_level, self.cpu_kernels = log_level, cpu_kernels
        self.slo = slo
        """What the replicas judge each request by (``serve --slo``): their verdicts are
        the goodput the demo's scrape and Prometheus' rules read."""
        self.slo_file = self.workdir / "slo.json"
        self.token = secrets.token_urlsafe(24)
        self.targets_file = self.workdir / "targets.json"
        self._initial = replicas
        self._active: list[Replica] = []
        self._stopping: list[Replica] = []
        self._next_index = 0
        self._client = httpx.Client(timeout=10.0,
                                    headers={"Authorization": f"Bearer {self.token}"})
        self.applied: list[tuple[dict[str, Any], bool]] = []
        """Every config applied (and whether to the canary only), in order."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalDeployment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.slo is not None:
            self.slo_file.write_text(json.dumps(self.slo.to_dict()))
        try:
            self._start_replicas(self._initial)
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--executor", self.executor,
               "--port", str(port), "--log-level", self.log_level,
               "--drain-timeout", str(self.drain_timeout_s),
               "--served-model-name", self.name]
        if self.executor == "simulated":
            cmd += ["--scenario", self.scenario]
        else:
            cmd += ["--model", self.model, "--cpu-kernels", self.cpu_kernels]
        for knob, value in self._stable.items():
            cmd += ["--set", f"{knob}={value}"]
        if self.slo is not None:
            cmd += ["--slo", str(self.slo_file)]
        return cmd

    def _spawn(self) -> Replica:
        index, held = self._next_index, HeldPort()
        self._next_index += 1
        log_path = self.workdir / f"replica-{index}.log"
        env = {**os.environ, ADMIN_TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1"}
        try:
            with log_path.open("wb") as log:
                process = subprocess.Popen(self._command(held.port), stdout=log,
                                           stderr=subprocess.STDOUT, env=env,
                                           preexec_fn=die_with_parent)
        except BaseException:
            held.release()
            raise
        return Replica(index, held, process, log_path)

    def _start_replicas(self, n: int) -> None:
        fresh = [self._spawn() for _ in range(n)]
        self._active.extend(fresh)  # listed at once so close() finds them on any error
        deadline = time.monotonic() + self.ready_timeout_s
        for r in fresh:
            self._wait_ready(r, deadline)
        self._write_targets()

    def _wait_ready(self, r: Replica, deadline: float) -> None:
        while True:
            if r.process.poll() is not None:
                raise DeploymentError(f"replica {r.index} (port {r.port}) exited with "
                                      f"{r.process.returncode} at start:\n{self._tail(r)}")
            try:
                if self._client.get(r.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise DeploymentError(f"replica {r.index} (port {r.port}) not healthy within "
                                      f"{self.ready_timeout_s:g} s (ready_timeout_s; on a slow "
                                      f"or busy machine give more, `slopilot demo "
                                      f"--ready-timeout`):\n{self._tail(r)}")
            time.sleep(0.1)

    @staticmethod
    def _tail(r: Replica) -> str:
        try:
            return r.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _stop(self, r: Replica) -> None:
        """Graceful: SIGTERM; the server drains and exits (reaped later or in close())."""
        if r.process.poll() is None:
            r.process.send_signal(signal.SIGTERM)
        self._stopping.append(r)

    def _reap(self, *, wait: bool) -> None:
        left = []
        for r in self._stopping:
            if wait:
                try:
                    r.process.wait(timeout=self.drain_timeout_s + 5.0)
                except subprocess.TimeoutExpired:
                    r.process.kill()
                    r.process.wait(timeout=10)
            if r.process.poll() is None:
                left.append(r)
            else:
                r.held.release()
        self._stopping = left

    def close(self) -> None:
        """Stop every replica (drain, then kill what did not exit); idempotent."""
        while self._active:
            self._stop(self._active.pop())
        self._reap(wait=True)
        with contextlib.suppress(OSError):
            self._write_targets()
        self._client.close()

    def _write_targets(self) -> None:
        groups = []
        for role, members in (("canary", self._active[:1]), ("stable", self._active[1:])):
            if members:
                groups.append({"targets": [r.address for r in members],
                               "labels": {DEPLOYMENT_LABEL: self.name, ROLE_LABEL: role}})
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        tmp.replace(self.targets_file)  # atomic: Prometheus never reads half a file

    # ------------------------------------------------------------------ DeploymentHandle
    def replicas(self) -> int:
        return len(self._active)

    def replica_counts(self) -> Replicas:
        # A local replica joins ``_active`` once it answers: asked is ready.
        return Replicas(len(self._active), len(self._active))

    def endpoints(self) -> list[str]:
        return [r.url for r in self._active]

    def scale(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_replicas:
            raise ValueError(f"scale({n!r}): expected 1 <= n <= max_replicas="
                             f"{self.max_replicas}")
        self._reap(wait=False)
        if n > len(self._active):
            self._start_replicas(n - len(self._active))
        while len(self._active) > n:
            self._stop(self._active.pop())  # never the canary: it is first
        self._write_targets()

    def current_config(self) -> dict[str, Any]:
        """The knobs the stable replicas run, read back from one of them (a trial's on
        every replica included)."""
        if not self._active:
            raise DeploymentError("no replica is running")
        r = self._active[1] if len(self._active) > 1 else self._active[0]
        return self._admin(r, "GET")

    def committed_config(self) -> dict[str, Any]:
        """The last config every replica took not as a trial's, else the one they started
        with: this handle's record, as ``status.tunedConfig`` is the operator's."""
        return dict(self._committed)

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        """PUT the knobs to the canary or to every replica; ConfigError when refused."""
        targets = self._active[:1] if canary else list(self._active)
        if not targets:
            raise DeploymentError("no replica is running")
        for r in targets:
            answer = self._admin(r, "PUT", dict(config))
        if not canary:
            self._stable = answer  # what new replicas start with
            if not trial:
                self._committed = dict(answer)
        self.applied.append((dict(config), canary))

    def settled(self, now: float) -> Rollout:
        """Settled at once: a config is a live PUT, taken when ``apply_config`` returns."""
        return Settled()

    def _admin(self, r: Replica, method: str, body: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        try:
            resp = self._client.request(method, r.url + "/admin/config", json=body)
        except httpx.HTTPError as exc:
            raise DeploymentError(f"replica {r.index} at {r.url} is unreachable: "
                                  f"{type(exc).__name__}: {exc}") from None
        if resp.status_code == 400:
            raise ConfigError(_message(resp))
        if resp.status_code != 200:
            raise DeploymentError(f"{method} {r.url}/admin/config answered "
                                  f"{resp.status_code}: {_message(resp)}")
        data: dict[str, Any] = resp.json()
        return data


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]
