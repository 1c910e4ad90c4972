"""The demo's machine load, read from a /proc written here: the demo's CPU time against
everything else's, and the intervals in which the machine was busy."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.tuner.local.machine_load import MachineLoad

DEMO, REPLICA, WORKER, HOG = 100, 101, 102, 200


class FakeProc:
    """/proc with a 2-CPU /proc/stat and one stat file per process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()

    def machine(self, busy: int, idle: int) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice
        line = f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0"
        (self.root / "stat").write_text(
            f"{line}\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 1 2\n")

    def process(self, pid: int, ppid: int, utime: int, stime: int = 0, cutime: int = 0,
                name: str = "python3") -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        # cmajflt utime stime cutime cstime ...; a name with spaces and parens too
        (self.root / str(pid) / "stat").write_text(
            f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} 0 "
            "20 0 1 0 0 0 0\n")

    def end(self, pid: int) -> None:
        (self.root / str(pid) / "stat").unlink()
        (self.root / str(pid)).rmdir()


def test_other_processes_cpu_is_told_apart_from_the_demos(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.machine(busy=0, idle=0)
    for pid, ppid in ((DEMO, 1), (REPLICA, DEMO), (WORKER, REPLICA), (HOG, 1)):
        proc.process(pid, ppid, 0, name="a (b) c" if pid == WORKER else "python3")
    load = MachineLoad(DEMO, proc=proc.root, interval_s=5.0)
    assert load.sample(0.0) is None  # the baseline
    # 5 s on 2 CPUs at 100 jiffies a second: 1000 jiffies, 900 of them busy; the demo's
    # tree 300 (itself 100, a reaped child's 50, the replica 100, the worker 50).
    proc.machine(busy=900, idle=100)
    proc.process(DEMO, 1, 60, 40, cutime=50)
    proc.process(REPLICA, DEMO, 100)
    proc.process(WORKER, REPLICA, 50, name="a (b) c")
    proc.process(HOG, 1, 600)
    assert load.sample(3.0) is None  # not due yet
    interval = load.sample(5.0)
    assert interval is not None
    assert (interval.cpus, interval.busy_cpus, interval.own_cpus) == (2, 1.8, 0.6)
    assert interval.others_cpus == pytest.approx(1.2) and interval.busy
    # A quiet interval: the demo alone, half a CPU.
    proc.machine(busy=1150, idle=850)
    proc.process(DEMO, 1, 310, 40, cutime=50)
    quiet = load.sample(10.0)
    assert quiet is not None and not quiet.busy
    assert quiet.others_cpus == pytest.approx(0.0)
    assert load.busy_spans() == [(0.0, 5.0)]
    [line] = load.lines()
    assert line.startswith("machine: 2 CPUs; the demo's processes used 0.6 of them on "
                           "average (peak 0.6), other processes 0.6 (peak 1.2), in 2 "
                           "intervals over 10 s from t+0.0s (5 s each): BUSY in 1 of "
                           "them, 5 s of the 10 (t+0.0s to t+5.0s;")
    assert "may be the machine's load, not the workload's" in line


def test_a_machine_whose_cpus_are_all_busy_is_busy_whoever_uses_them(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.machine(busy=0, idle=0)
    proc.process(DEMO, 1, 0)
    load = MachineLoad(DEMO, proc=proc.root, interval_s=5.0)
    load.sample(0.0)
    proc.machine(busy=950, idle=50)
    proc.process(DEMO, 1, 950)  # the demo's own processes starve each other
    interval = load.sample(5.0)
    assert interval is not None and interval.busy and interval.others_cpus == 0.0
    proc.machine(busy=1200, idle=800)
    proc.process(DEMO, 1, 1200)
    proc.process(REPLICA, DEMO, 0)
    load.sample(10.0)
    proc.machine(busy=1400, idle=1600)
    proc.process(DEMO, 1, 1400)
    proc.end(REPLICA)  # a replica stopped between two samples
    load.sample(15.0)
    assert [i.busy for i in load.intervals] == [True, False, False]
    assert "quiet" not in load.lines()[0]


def test_without_proc_nothing_is_measured_and_the_lines_say_so(tmp_path: Path) -> None:
    load = MachineLoad(DEMO, proc=tmp_path / "none")
    assert load.sample(0.0) is None and load.sample(10.0) is None
    assert load.lines() == ["machine: load not measured (no /proc here)"]


def test_intervals_of_unequal_lengths_are_told_and_weighted_by_time(tmp_path: Path) -> None:
    """A tick that ran 40 s (a busy machine) made one interval 8 times another: the line
    said "9 intervals of 5 s" and averaged them as equals."""
    proc = FakeProc(tmp_path / "proc")
    proc.machine(busy=0, idle=0)
    proc.process(DEMO, 1, 0)
    proc.process(HOG, 1, 0)
    load = MachineLoad(DEMO, proc=proc.root, interval_s=5.0)
    load.sample(10.0)
    # 5 s: the demo 0.6 CPU, the hog 1.2 (busy).
    proc.machine(busy=900, idle=100)
    proc.process(DEMO, 1, 300)
    proc.process(HOG, 1, 600)
    load.sample(15.0)
    # 40 s: the demo alone on half a CPU (8000 jiffies, 2000 busy).
    proc.machine(busy=2900, idle=6100)
    proc.process(DEMO, 1, 2300)
    load.sample(55.0)
    [line] = load.lines()
    # Time-weighted: own (0.6*5 + 0.5*40) / 45 = 0.51, others 1.2*5 / 45 = 0.13.
    assert line.startswith("machine: 2 CPUs; the demo's processes used 0.5 of them on "
                           "average (peak 0.6), other processes 0.1 (peak 1.2), in 2 "
                           "intervals over 45 s from t+10.0s (5-40 s each): BUSY in 1 of "
                           "them, 5 s of the 45 (t+10.0s to t+15.0s;"), line
