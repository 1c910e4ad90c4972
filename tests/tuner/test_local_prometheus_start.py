"""LocalPrometheus' start: a process that exits fails it at once; one that never
answers fails it at the ``ready_timeout_s`` it was given (no real Prometheus needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slopilot.tuner.local.prometheus_server import LocalPrometheus, PrometheusStartError
from tests.support.waits import HANG_GUARD_S


def _binary(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-prometheus"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _prometheus(tmp_path: Path, binary: Path, ready_timeout_s: float) -> LocalPrometheus:
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    return LocalPrometheus(tmp_path / "prometheus", targets, binary=binary,
                           ready_timeout_s=ready_timeout_s)


def test_a_prometheus_that_exits_fails_the_start_at_once(tmp_path: Path) -> None:
    # However long it may take to answer: "exited with", not the timeout's message.
    prom = _prometheus(tmp_path, _binary(tmp_path, "echo bad flag; exit 3"), HANG_GUARD_S)
    with pytest.raises(PrometheusStartError, match=r"exited with 3 at start:\nbad flag"):
        prom.start()
    prom.close()


def test_a_prometheus_that_never_answers_fails_at_its_ready_timeout(tmp_path: Path) -> None:
    prom = _prometheus(tmp_path, _binary(tmp_path, "exec sleep 3600"), 0.01)
    with pytest.raises(PrometheusStartError,
                       match=r"not ready within 0.01 s \(ready_timeout_s"):
        prom.start()
    assert prom.process is not None and prom.process.poll() is not None  # stopped
    prom.close()


@pytest.mark.parametrize("ready", [0.0, -5.0, math.inf, math.nan])
def test_a_bad_ready_timeout_is_refused_naming_it(tmp_path: Path, ready: float) -> None:
    with pytest.raises(ValueError, match=r"ready_timeout_s=.*: expected seconds > 0"):
        _prometheus(tmp_path, _binary(tmp_path, "exit 0"), ready)
