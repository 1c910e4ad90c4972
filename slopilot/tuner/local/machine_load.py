"""How busy the demo's machine was while it ran, from /proc: the demo's CPU and others'.

The simulated replicas pace a GPU's steps on this machine's CPUs: on a busy machine a
step wakes late, which reads as a slow GPU, in the latencies, the alerts and the twin's
step-time error (the twin's cost model is fixed; the lateness is not its error). A run
whose retunes answered another process's load looked like any other. So the demo
samples, every ``interval_s``, the CPU time of the whole machine (``/proc/stat``) and of
its own process tree (itself, the replicas, Prometheus, the simulator worker:
``/proc/PID/stat``), and says when other processes took a share that matters.

An interval is busy when other processes used ``OTHERS_BUSY_CPUS`` or more, or every
CPU was at least ``SATURATED`` busy (the demo's own processes can starve each other
too). Without /proc (not Linux) nothing is measured, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OTHERS_BUSY_CPUS = 0.5
SATURATED = 0.9


@dataclass(frozen=True)
class LoadInterval:
    start_s: float
    end_s: float
    cpus: int
    busy_cpus: float
    """CPUs' worth of time every process used (1.5: one and a half CPUs busy)."""
    own_cpus: float
    """The demo's process tree's share of that."""

    @property
    def others_cpus(self) -> float:
        return max(0.0, self.busy_cpus - self.own_cpus)

    @property
    def busy(self) -> bool:
        return self.others_cpus >= OTHERS_BUSY_CPUS or \
            self.busy_cpus >= SATURATED * self.cpus

    def describe(self) -> str:
        return (f"other processes used {self.others_cpus:.1f} of {self.cpus} CPUs, the "
                f"demo's {self.own_cpus:.1f}, over t+{self.start_s:.1f}s to "
                f"t+{self.end_s:.1f}s")


@dataclass(frozen=True)
class _Times:
    total: int
    idle: int
    own: int
    cpus: int


class MachineLoad:
    """Samples the machine's and the demo's CPU time; see the module docstring."""

    def __init__(self, root_pid: int, *, proc: Path = Path("/proc"),
                 interval_s: float = 5.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: expected seconds > 0")
        self.root_pid, self.proc, self.interval_s = root_pid, proc, interval_s
        self.intervals: list[LoadInterval] = []
        self._last: tuple[float, _Times] | None = None
        self.available = True

    def sample(self, at_s: float) -> LoadInterval | None:
        """Read the counters when an interval is due; the interval that ended, if any."""
        if not self.available or (self._last is not None
                                  and at_s - self._last[0] < self.interval_s):
            return None
        try:
            now = self._read()
        except (OSError, ValueError, IndexError):
            self.available = False  # no /proc (or not Linux's): the report says so
            return None
        last, self._last = self._last, (at_s, now)
        if last is None:
            return None
        then_s, then = last
        total = now.total - then.total
        if total <= 0:
            return None
        share = now.cpus / total  # jiffies -> CPUs' worth over the interval
        busy = (total - (now.idle - then.idle)) * share
        # A process of the tree that ended unreaped by it took its time along: never
        # below 0, and never above the machine's.
        own = min(busy, max(0, now.own - then.own) * share)
        interval = LoadInterval(then_s, at_s, now.cpus, busy, own)
        self.intervals.append(interval)
        return interval

    def _read(self) -> _Times:
        lines = (self.proc / "stat").read_text().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
        cpus = sum(1 for line in lines[1:] if line.startswith("cpu")
                   and line[3:4].isdigit())
        # user nice system idle iowait irq softirq steal (guest is inside user)
        total, idle = sum(fields[:8]), fields[3] + fields[4]
        return _Times(total, idle, self._own(), max(1, cpus))

    def _own(self) -> int:
        """CPU time of the root process and every process under it, their reaped
        children's included (cutime, cstime)."""
        parents: dict[int, int] = {}
        times: dict[int, int] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue  # ended between the listing and the read
            rest = text[text.rindex(")") + 2:].split()
            pid = int(entry.name)
            parents[pid] = int(rest[1])
            times[pid] = sum(int(v) for v in rest[11:15])
        tree, frontier = {self.root_pid}, [self.root_pid]
        while frontier:
            parent = frontier.pop()
            for pid, ppid in parents.items():
                if ppid == parent and pid not in tree:
                    tree.add(pid)
                    frontier.append(pid)
        return sum(times.get(pid, 0) for pid in tree)

    def busy_spans(self) -> list[tuple[float, float]]:
        """The busy intervals, neighbours merged."""
        spans: list[tuple[float, float]] = []
        for i in self.intervals:
            if not i.busy:
                continue
            if spans and spans[-1][1] >= i.start_s:
                spans[-1] = (spans[-1][0], i.end_s)
            else:
                spans.append((i.start_s, i.end_s))
        return spans

    def lines(self) -> list[str]:
        """What the run's machine was like, for the summary and the report."""
        if not self.intervals:
            why = ("no /proc here" if not self.available
                   else "the run was shorter than one interval")
            return [f"machine: load not measured ({why})"]
        n = len(self.intervals)
        cpus = self.intervals[-1].cpus
        # An interval lasts from one due sample to the next tick's: on a busy machine a
        # tick ran 40 s where 5 were asked, so each counts by its length, and the line
        # says the lengths rather than the interval asked for.
        lengths = [i.end_s - i.start_s for i in self.intervals]
        total_s = sum(lengths)

        def mean(values: list[float]) -> float:
            return sum(v * s for v, s in zip(values, lengths, strict=True)) / total_s

        own = [i.own_cpus for i in self.intervals]
        others = [i.others_cpus for i in self.intervals]
        short, long = min(lengths), max(lengths)
        each = (f"{short:.0f} s each" if round(short) == round(long)
                else f"{short:.0f}-{long:.0f} s each")
        text = (f"machine: {cpus} CPUs; the demo's processes used {mean(own):.1f} of them "
                f"on average (peak {max(own):.1f}), other processes {mean(others):.1f} "
                f"(peak {max(others):.1f}), in {n} interval{'' if n == 1 else 's'} over "
                f"{total_s:.0f} s from t+{self.intervals[0].start_s:.1f}s ({each})")
        spans = self.busy_spans()
        rule = (f"other processes on {OTHERS_BUSY_CPUS:g} CPU or more, or every CPU "
                f"{SATURATED:.0%} busy")
        if not spans:
            return [f"{text}: quiet (no interval had {rule})"]
        busy = sum(1 for i in self.intervals if i.busy)
        busy_s = sum(b - a for a, b in spans)
        where = ", ".join(f"t+{a:.1f}s to t+{b:.1f}s" for a, b in spans)
        return [f"{text}: BUSY in {busy} of them, {busy_s:.0f} s of the {total_s:.0f} "
                f"({where}; {rule}). The simulated GPUs "
                "pace their steps on these CPUs, and a late step reads as a slow GPU: an "
                "alert, a trial's verdict or the twin's step-time error in those spans may "
                "be the machine's load, not the workload's"]
