"""What a long wait counts as progress in a process tree: its simulator workers' CPU."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import cpu_ticks, descendants, spawned_workers_cpu_ticks
from tests.support.waits import wait_for

# A parent that runs a spawned pool worker (as SimWorker does) busy until a file appears.
POOL_PARENT = """
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor

def spin(stop):
    while not os.path.exists(stop):
        pass

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(spin, sys.argv[1]).result()
"""

# A parent whose busy child is a plain subprocess (as a replica is), not a pool worker.
PLAIN_PARENT = """
import subprocess, sys
busy = "import os, sys\\nwhile not os.path.exists(sys.argv[1]): pass"
subprocess.run([sys.executable, "-c", busy, sys.argv[1]], check=True)
"""


@pytest.fixture
def stop_file(tmp_path: Path) -> Iterator[Path]:
    stop = tmp_path / "stop"
    yield stop
    stop.touch()


def _run(script: str, stop: Path) -> subprocess.Popen[bytes]:
    # From a file, not ``-c``: a spawned worker imports its parent's ``__main__`` by path
    # to find ``spin`` (from ``-c`` it died at once, and only a poll that caught its
    # start-up's CPU passed).
    path = stop.with_name("parent.py")
    path.write_text(script, encoding="utf-8")
    return subprocess.Popen([sys.executable, str(path), str(stop)])


def test_a_spawned_pool_workers_cpu_is_counted(stop_file: Path) -> None:
    parent = _run(POOL_PARENT, stop_file)
    try:
        # Two readings apart, both moved: the worker computes on, not only started.
        first = wait_for(lambda: spawned_workers_cpu_ticks(parent.pid),
                         "the pool worker's CPU time to show", interval_s=0.1)
        wait_for(lambda: spawned_workers_cpu_ticks(parent.pid) > first,
                 "the pool worker's CPU time to grow", interval_s=0.1)
        assert parent.poll() is None  # its worker spins: nothing failed
    finally:
        stop_file.touch()
        parent.wait()


def test_a_plain_childs_cpu_is_not_and_a_gone_process_reads_0(stop_file: Path) -> None:
    parent = _run(PLAIN_PARENT, stop_file)
    try:
        wait_for(lambda: sum(cpu_ticks(p) for p in descendants(parent.pid)) > 0,
                 "the plain child's CPU time to show", interval_s=0.1)
        assert spawned_workers_cpu_ticks(parent.pid) == 0
    finally:
        stop_file.touch()
        parent.wait()
    assert spawned_workers_cpu_ticks(parent.pid) == 0
    assert cpu_ticks(parent.pid) == 0
