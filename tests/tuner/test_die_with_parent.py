"""A killed demo leaves nothing running: what it started ends with it, SIGKILL included.

``slopilot demo --help`` promises it; the replicas kept it (PR_SET_PDEATHSIG), but a
``kill -9`` of the demo left Prometheus and the simulator's worker process (and, holding
its pipe open, multiprocessing's resource tracker) running under init. Each test starts
a parent of its own, lists every process under it, kills it with SIGKILL and waits, by
condition, for each of those to end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.waits import HANG_GUARD_S, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(),
                                reason="reads the process tree from /proc")

ROOT = Path(__file__).resolve().parents[2]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent) of a live process; None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return None if state in ("Z", "X") else (state, int(ppid))


def descendants(root: int) -> dict[int, str]:
    """Every live process under ``root``, with its command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[1]
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                found[pid] = cmd.decode(errors="replace").strip()
                frontier.append(pid)
    return found


def _kill_and_wait_for_children(parent: subprocess.Popen[bytes],
                                expected: tuple[str, ...]) -> None:
    children = descendants(parent.pid)
    for part in expected:  # what the test is about is there before the kill
        assert any(part in cmd for cmd in children.values()), (part, children)
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def left() -> dict[int, str]:
        return {pid: cmd for pid, cmd in children.items() if _stat(pid) is not None}

    try:
        wait_for(lambda: not left(), "every process under the killed parent to end",
                 interval_s=0.1, diagnose=lambda: f"still running: {left()}")
    finally:
        for pid in left():  # a failed test still leaves nothing behind
            os.kill(pid, signal.SIGKILL)


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path

    from slopilot.tuner.local.prometheus_server import LocalPrometheus
    from slopilot.tuner.sim.worker import SimWorker

    work = Path(sys.argv[1])
    targets = work / "targets.json"
    targets.write_text("[]")
    worker = SimWorker()
    worker.call(int)  # its process is up and has served a call
    LocalPrometheus(work / "prometheus", targets, ready_timeout_s=float(sys.argv[2])).start()
    (work / "ready").write_text("")
    sys.stdin.read()  # until killed
""")


@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
def test_prometheus_and_the_simulator_worker_end_with_a_killed_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(HANG_GUARD_S)],
                              stdin=subprocess.PIPE, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: (tmp_path / "ready").exists() or parent.poll() is not None,
                 "the parent to start Prometheus and the simulator worker")
        assert parent.poll() is None, "the parent exited before it was killed"
        _kill_and_wait_for_children(parent, ("prometheus", "multiprocessing"))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
def test_a_demo_killed_with_sigkill_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            # A slow start is waited for up to the hang guard, not the demo's 60 s.
            [sys.executable, "-m", "slopilot.cli", "demo", "--duration", "60",
             "--ready-timeout", str(HANG_GUARD_S),
             "--report-dir", str(tmp_path / "report")], stdout=sink,
            stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        # The load line comes after the replicas, Prometheus and the worker are up.
        wait_for(lambda: b"load: Poisson" in out.read_bytes() or demo.poll() is not None,
                 "the demo to start its load", interval_s=0.2)
        assert demo.poll() is None, out.read_text()
        _kill_and_wait_for_children(demo, ("serve", "prometheus", "multiprocessing"))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
