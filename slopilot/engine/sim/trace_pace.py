"""What a replay's pace says of its trace: where its requests are spread so thin that a
window holds under one on average, the span and the rate in words.

Milliseconds cannot be told from seconds by their values (docs/traces.md): a trace of
millisecond offsets read as seconds spans a thousand times its real length. 1,530
requests over 747,074 s, 8.6 days at 0.002 req/s, held on one replica with no more than
a "few requests" note, a verdict on next to no load that nothing tied to the time unit.
``simulate`` and ``tune`` print this beside their figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.workload_spec import TraceSpec

WINDOW_S = 60.0
"""The window a thin trace is judged against: ``tune``'s default window length, and the
minute ``simulate``'s busiest-minute figures count."""
_MS_SCALE = 0.001


@dataclass(frozen=True, slots=True)
class Thin:
    """A replay whose requests average under one a window."""

    requests: int
    span_s: float
    window_s: float
    fix: str | None
    """The flag that replays the trace's times as milliseconds, where that is a fix the
    user has not already given (no ``--target-rate``, a format read in seconds)."""

    @property
    def rate(self) -> float:
        return self.requests / self.span_s

    def text(self) -> str:
        out = (f"the replayed trace is {self.requests:,} requests over {span_words(self.span_s)} "
               f"({self.span_s:,.0f} s) at {self.rate:.2g} req/s, under one request a "
               f"{self.window_s:g} s window on average: what it holds is next to no load")
        if self.fix is not None:
            out += f"; if its times are milliseconds, give {self.fix} (docs/traces.md)"
        return out


def thin(spec: TraceSpec, records: list[TraceRecord], window_s: float = WINDOW_S,
         fmt: str | None = None) -> Thin | None:
    """``records`` (``spec``'s replay) where they average under one request a
    ``window_s`` window; None where they hold more, or span no time."""
    if len(records) < 2:
        return None
    span = records[-1].arrival_time - records[0].arrival_time
    if span <= 0 or len(records) / span * window_s >= 1:
        return None
    fix = None
    if spec.target_rate is None and (fmt or spec.fmt) != "mooncake":
        scale = (spec.time_scale or 1.0) * _MS_SCALE
        fix = f"--time-scale {scale:g}"
    return Thin(len(records), span, window_s, fix)


def span_words(seconds: float) -> str:
    """A span as a person says it: ``8.6 days``, ``5.2 hours``, ``40 minutes``."""
    for unit, size in (("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.0f} s"
