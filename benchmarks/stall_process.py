"""A loaded host, as a test sees it: the command's process tree stopped (SIGSTOP) for
``--stop-s`` at a time and let run for ``--run-s`` in between, until it exits.

A busy loop shares the CPU fairly and seldom holds one thread back for long; a host
that stops a process outright for a second is what a wall-clock deadline in a test
trips on. docs/benchmarks.md, "The test suite on a busy machine", has its findings.

    .venv/bin/python benchmarks/stall_process.py --stop-s 1.1 --run-s 0.03 -- \\
        .venv/bin/python -m pytest -q tests/engine/server/test_request_deadlines.py

Exits with the command's exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux: /proc's children lists)."""
    tree = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:  # gone meanwhile
        return tree
    for child in children:
        tree += process_tree(int(child))
    return tree


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stop-s", type=float, required=True, help="seconds stopped")
    parser.add_argument("--run-s", type=float, required=True, help="seconds running")
    parser.add_argument("--after-s", type=float, default=0.0,
                        help="seconds to let the command run first (its collection)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.stop_s <= 0 or args.run_s <= 0:
        parser.error("give --stop-s and --run-s above 0, then -- and the command")
    child = subprocess.Popen(command)
    stopped: list[int] = []
    try:
        time.sleep(args.after_s)
        while child.poll() is None:
            stopped = process_tree(child.pid)
            signal_all(stopped, signal.SIGSTOP)
            time.sleep(args.stop_s)
            signal_all(stopped, signal.SIGCONT)
            stopped = []
            time.sleep(args.run_s)
    finally:
        # Never leave a process stopped behind (Ctrl-C included).
        signal_all(stopped, signal.SIGCONT)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
