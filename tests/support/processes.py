"""Progress a long wait can read from a process tree it did not write, from /proc.

A demo blocked on its warm-start study prints nothing for minutes on a busy machine,
yet it is working: the study runs in a spawned simulator worker (``SimWorker``, a
``ProcessPoolExecutor`` with the "spawn" context). That worker's CPU time grows only
while it computes, so it tells a slow study from a hang. The replicas' and the load
generator's CPU is left out on purpose: they burn CPU whether or not the demo moves on.
Linux only, as the tests that use it (real replicas, Prometheus) are.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")
# The command line of a process that multiprocessing's "spawn" start method starts.
SPAWNED = b"spawn_main"


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 on), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def cpu_ticks(pid: int) -> int:
    """User plus system clock ticks ``pid`` has run (its own, not its children's);
    0 once it is gone."""
    fields = _stat(pid)
    return 0 if fields is None else int(fields[11]) + int(fields[12])


def descendants(pid: int) -> list[int]:
    """The live processes under ``pid``, at any depth."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def spawned_workers_cpu_ticks(pid: int) -> int:
    """Clock ticks run by ``pid``'s descendants that are spawned pool workers; 0 when
    there are none or ``pid`` is gone."""
    total = 0
    for child in descendants(pid):
        try:
            cmdline = (PROC / str(child) / "cmdline").read_bytes()
        except OSError:
            continue  # ended between the listing and the read: its CPU no longer moves
        if SPAWNED in cmdline:
            total += cpu_ticks(child)
    return total
