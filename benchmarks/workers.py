"""A benchmark engine in a process of its own, driven one command per line.

The worker prints ``READY`` once warm, then answers each command line on stdin with one
``RESULT_JSON {...}`` line on stdout (benchmarks/serving_worker.py describes the
commands); anything else it prints is ignored. Its stderr goes to a log file, which
``stop`` returns (vLLM's start-up warnings are read from it).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import IO, Any

RESULT = "RESULT_JSON "


class WorkerError(RuntimeError):
    """The worker died or answered with an error; the message carries its log's tail."""


class Worker:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / (re.sub(r"\W+", "-", name).strip("-") + ".log")
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("w")
        self._proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      bufsize=1)

    def _fail(self, what: str) -> WorkerError:
        tail = self.log_path.read_text()[-3000:] if self.log_path.exists() else ""
        return WorkerError(f"{self.name}: {what}; last of its log {self.log_path}:\n{tail}")

    def _read_until(self, prefix: str) -> str:
        if self._proc is None or self._proc.stdout is None:
            raise self._fail("not started")
        for line in self._proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):]
        raise self._fail(f"exited with status {self._proc.wait()} before answering")

    def wait_ready(self) -> None:
        self._read_until("READY")

    def call(self, command: str) -> dict[str, Any]:
        if self._proc is None or self._proc.stdin is None:
            raise self._fail("not started")
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        result: dict[str, Any] = json.loads(self._read_until(RESULT))
        if "error" in result:
            raise self._fail(f"answered {command!r} with {result['error']}")
        return result

    def stop(self) -> str:
        """End the worker (politely, then by force) and return its log."""
        if self._proc is not None:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
                self._proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
        return self.log_path.read_text() if self.log_path.exists() else ""
