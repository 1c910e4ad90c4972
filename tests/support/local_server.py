"""A server binary the tests start themselves (Prometheus, Alertmanager): on 127.0.0.1,
a free port, its log in its work directory, ready by its ``/-/ready``, and stopped by
its test. Each binary's module says what it runs and reads."""

from __future__ import annotations

import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from slopilot.tuner.local.held_port import HeldPort
from tests.support.waits import WaitHung, wait_for


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalServer:
    """A running server process; ``stop()`` (or the fixture) ends it. ``LOG`` names its
    log file in ``workdir``."""

    LOG = "server.log"

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path,
                 held: HeldPort | None = None) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"
        self.held = held
        """Its port, kept from other sockets until ``stop()``."""

    @property
    def log(self) -> str:
        path = self.workdir / self.LOG
        return path.read_text(errors="replace") if path.exists() else ""

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.held is not None:
            self.held.release()


S = TypeVar("S", bound=LocalServer)


def start_ready(kind: type[S], name: str, argv: Callable[[int], list[str]], workdir: Path,
                *, attempts: int, port_race_only: bool = False) -> S:
    """``argv(port)`` started in ``workdir`` on a port held for it (``HeldPort``: no
    other worker's server takes it before the binary binds it, nor answers its
    ``/-/ready``), once ``/-/ready`` answers; started again on another port where it
    exited (with ``port_race_only``, only where its log says the port was taken, as a bad
    config fails on any port). RuntimeError with its log where every try exited."""
    last_log = ""
    for _ in range(attempts):
        held = HeldPort()
        try:
            with (workdir / kind.LOG).open("wb") as log:
                process = subprocess.Popen(argv(held.port), stdout=log,
                                           stderr=subprocess.STDOUT, cwd=workdir)
        except BaseException:
            held.release()
            raise
        server = kind(process, held.port, workdir, held)

        def settled(s: S = server) -> bool:
            return s.ready() or s.process.poll() is not None

        def its_log(s: S = server) -> str:
            return f"its log:\n{s.log[-2000:]}"

        try:
            wait_for(settled, f"{name} ready on port {held.port}", diagnose=its_log)
        except WaitHung:
            server.stop()
            raise
        if server.process.poll() is None:
            return server
        server.stop()  # exited: its port is let go
        last_log = server.log
        if port_race_only and "address already in use" not in last_log:
            break
    raise RuntimeError(f"{name} exited at start:\n{last_log[-2000:]}")
