"""Progress of a long run on stderr: a bar on a terminal, a line now and then otherwise.

``slopilot simulate`` reports virtual seconds simulated, ``slopilot tune`` simulations
run; both say the elapsed time and an estimate of what is left. On a terminal it is a
rich progress bar (transient: the result replaces it); when stderr is a file or a pipe
(CI, ``nohup``, a log collector) it prints one plain line every ``every_s`` seconds and a
last one at the end, so a long run is never silent there either. stdout is left alone:
``--json`` output stays one clean object.

The clock is injectable so that tests drive it; nothing here sleeps.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

Clock = Callable[[], float]


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``: a person's reading of a duration."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressReport:
    """``update(done)`` as work proceeds towards ``total`` (in ``unit``); ``close()`` ends it.

    ``rate_unit`` names the speed (``sim-s/s``: virtual seconds per wall second); the
    estimate of the time left assumes the rate so far holds.
    """

    def __init__(self, label: str, total: float, unit: str, *, stream: TextIO | None = None,
                 tty: bool | None = None, every_s: float = 10.0, clock: Clock = time.monotonic,
                 rate_unit: str | None = None) -> None:
        if not total > 0:
            raise ValueError(f"total={total!r}: expected a positive amount of work")
        self.label, self.total, self.unit, self.rate_unit = label, float(total), unit, rate_unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s, self.clock = every_s, clock
        self.started = clock()
        self.done = 0.0
        self.status = ""
        self._last_line = self.started
        self._bar: Any = None
        self._task: Any = None
        if self.tty:
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn(f"[bold]{self.label}[/]"), BarColumn(), TaskProgressColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + self.unit),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(file=self.stream), transient=True)
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=self.total, status="")

    # ------------------------------------------------------------------ figures
    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def rate(self) -> float | None:
        """Work per wall second so far; None before any work or time."""
        elapsed = self.elapsed_s
        return self.done / elapsed if self.done > 0 and elapsed > 0 else None

    def eta_s(self) -> float | None:
        rate = self.rate()
        return None if rate is None else max(0.0, self.total - self.done) / rate

    def line(self) -> str:
        """The plain progress line (also the bar's text outside a terminal)."""
        share = min(1.0, self.done / self.total)
        parts = [f"{self.label}: {self.done:,.0f}/{self.total:,.0f} {self.unit} ({share:.0%})",
                 f"{duration_text(self.elapsed_s)} elapsed"]
        eta = self.eta_s()
        if eta is not None and share < 1.0:
            parts.append(f"ETA {duration_text(eta)}")
        rate = self.rate()
        if rate is not None and self.rate_unit:
            parts.append(f"{rate:,.1f} {self.rate_unit}")
        if self.status:
            parts.append(self.status)
        return ", ".join(parts)

    # ------------------------------------------------------------------ updates
    def update(self, done: float, status: str | None = None) -> None:
        self.done = min(float(done), self.total)
        if status is not None:
            self.status = status
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, status=self.status)
            return
        now = self.clock()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            print(self.line(), file=self.stream, flush=True)

    def extend(self, more: float) -> None:
        """More work than ``total`` said (a step past the one planned): the total grows."""
        if not more >= 0:
            raise ValueError(f"more={more!r}: expected an amount of work >= 0")
        self.total += float(more)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def resize(self, total: float) -> None:
        """The work left is now known to be ``total - done`` (a step planned from the
        start ran shorter, another is about to begin): the total set to it."""
        if not total >= self.done or not total > 0:
            raise ValueError(f"total={total!r}: expected at least the work done, "
                             f"{self.done!r}, and above 0")
        self.total = float(total)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def finish(self) -> None:
        """The work turned out smaller than ``total`` (a run that ended early): what was
        done is the whole of it, so the last line reads 100 % at the true rate."""
        if self.done > 0:
            self.total = self.done
            if self._bar is not None:
                self._bar.update(self._task, total=self.total, completed=self.done)

    def note(self, text: str) -> None:
        """A message above the bar (or a line of its own)."""
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        else:
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> ProgressReport:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
