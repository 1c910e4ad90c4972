"""What a replay's pace says of its trace: where its requests are spread so thin that a
window holds under one on average, the span and the rate in words.

Milliseconds cannot be told from seconds by their values (docs/traces.md): a trace of
millisecond offsets read as seconds spans a thousand times its real length. 1,530
requests over 747,074 s, 8.6 days at 0.002 req/s, held on one replica with no more than
a "few requests" note, a verdict on next to no load that nothing tied to the time unit.
``simulate`` and ``tune`` print this beside their figures.

The other way round, a Mooncake file converted to seconds (0.013, 0.506, 1.076) read as
Mooncake's milliseconds replays 1000 times too fast: 60 requests over 0.03 s, and tune
sized 5 replicas for what 1 held. Its sign is in the file: Mooncake's timestamps are
whole milliseconds, and most of these have a fraction (``fractional``). A warning, not a
refusal: a trace of the user's own in Mooncake's form may time requests finer than a
millisecond, and a fleet's may be that busy; the two together are said, with the fix.
Under that rate the fractions are a sign still: a quiet service's file in seconds (one
request every 30 s) read as milliseconds replays at 33 req/s, a plausible pace, and was
said nothing; it is said softly, both readings named.
Beside both, what the file as read repeats (``trace_repeats.py``): ``doubts``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from slopilot.engine.sim.distribution_spec import read_cached
from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.trace_public import Fractions
from slopilot.engine.sim.workload_spec import TraceSpec

WINDOW_S = 60.0
"""The window a thin trace is judged against: ``tune``'s default window length, and the
minute ``simulate``'s busiest-minute figures count."""
_MS_SCALE = 0.001
FAST_RATE = 100.0
"""Requests per second, above which a Mooncake trace of mostly fractional milliseconds
is said to look like seconds replayed 1000 times too fast: tens of replicas' load, while
a seconds file of one request every 10 s reads as milliseconds at 100 (Mooncake's own
traces: 3-7 req/s). Under it the same sign is said softly (``Fractional``)."""


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


@dataclass(frozen=True, slots=True)
class Fractional:
    """A Mooncake replay whose timestamps are mostly fractional milliseconds, unlike
    Mooncake's own: seconds, perhaps. Past ``FAST_RATE`` that is said as a replay 1000
    times too fast (``fast``); under it, softly, both readings named: a quiet service's
    file in seconds (one request every 30 s, read as milliseconds at 33 req/s) looks
    like a trace of the user's own timed finer than a millisecond."""

    label: str
    requests: int
    span_s: float
    rows: int
    """The rows read, of which ``fractions.count`` have a fraction."""
    fractions: Fractions
    scale: float
    """The ``--time-scale`` that replays them as seconds."""

    @property
    def rate(self) -> float:
        return self.requests / self.span_s

    @property
    def fast(self) -> bool:
        """At a rate no fleet of Mooncake's sees: the seconds reading all but certain."""
        return self.rate >= FAST_RATE

    def text(self) -> str:
        f = self.fractions
        out = Path(self.label).with_suffix(".ms.jsonl")
        convert = (f"jq -c '.timestamp |= (. * 1000 | round)' {shlex.quote(self.label)} > "
                   f"{shlex.quote(str(out))}")
        found = (f"{self.label}: {f.count:,} of its {self.rows:,} timestamps are fractional "
                 f"milliseconds (line {f.line:,}: timestamp={f.value})")
        replay = (f"the replayed trace is {self.requests:,} requests over "
                  f"{self.span_s:,.3g} s at {self.rate:,.0f} req/s")
        fix = (f"give --time-scale {self.scale:g}, or convert them ({convert}) and give "
               "that file")
        if self.fast:
            return (f"{found}, and read as Mooncake's milliseconds {replay}: Mooncake's "
                    "timestamps are whole milliseconds, so these look like seconds, "
                    f"replayed 1000 times too fast; if they are, {fix} (docs/traces.md)")
        return (f"{found}, where Mooncake's timestamps are whole milliseconds; read as "
                f"milliseconds {replay}, a plausible pace: if they are seconds (a pace 1000 "
                f"times slower), {fix}; if they are milliseconds finer than Mooncake's, "
                "nothing is amiss (docs/traces.md)")


def fractional(spec: TraceSpec, records: list[TraceRecord]) -> Fractional | None:
    """``records`` (``spec``'s replay) where ``spec`` is a Mooncake trace whose timestamps
    are mostly fractional, at any rate past ``FAST_RATE`` and, under it, where no
    ``--time-scale`` says the unit was thought of; None otherwise, and where a
    ``--target-rate`` sets the pace (whatever the unit, the gaps are scaled to it)."""
    if spec.target_rate is not None or len(records) < 2:
        return None
    trace = read_cached(spec.trace, spec.fmt, spec.model)
    f = trace.fractions
    if f is None or 2 * f.count <= len(trace.records):
        return None
    span = records[-1].arrival_time - records[0].arrival_time
    if span <= 0:
        return None
    out = Fractional(spec.trace, len(records), span, len(trace.records), f,
                     (spec.time_scale or 1.0) * 1000)
    return out if out.fast or spec.time_scale is None else None


def doubts(spec: TraceSpec, records: list[TraceRecord]) -> list[str]:
    """What ``simulate`` and ``tune`` warn of a trace as read: a Mooncake file that may
    be in seconds (``fractional``), rows that repeat another (``trace_repeats.py``)."""
    unit = fractional(spec, records)
    repeated = read_cached(spec.trace, spec.fmt, spec.model).repeats
    return [d.text() for d in (unit, repeated) if d is not None]
