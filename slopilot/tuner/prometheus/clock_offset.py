"""Prometheus's clock against the operator's: every time a reader passes, moved onto it.

The loop keeps its times on the operator's clock (a trial's start, ``now``), and the
window, probe and twin readers evaluate their queries *at* those times
(``adapters.py``). Prometheus stamps each sample with its own clock, so a node whose
clock is ahead read a window's last seconds in Prometheus's future (no samples: at +30 s
a 108 s window read 342 of 432 requests; from +45 s every window was rejected as a load
shift), and one behind read a trial's window from before its apply (at -15 s a config
that met an 800 ms P99 read 1364 ms, the config before it). ``PrometheusClock`` wraps
a ``QueryAt``: it reads Prometheus's now (``vector(time())`` with no ``time``, which
Prometheus evaluates at its own now), takes the offset to the operator's clock, and
evaluates every query at ``at - offset``; the sample times it answers with are moved
back by it, so that a reader's arithmetic stays on one clock (and ``AlertSource`` moves
the alerts' activeAt by ``offset_s``). A reading that fails leaves the last offset (none,
or the operator's clock stepped since: every time as it is, as before).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slopilot.tuner.prometheus.query import QueryAt
from slopilot.tuner.study.evaluator import PrometheusUnavailable

log = logging.getLogger(__name__)

NOW_EXPR = "vector(time())"
"""Prometheus's now as a one-sample vector (a bare ``time()`` answers a scalar, which
the query client does not read)."""
APPLY_S = 1.0
"""Offsets under this are read as none: clocks NTP keeps agree within milliseconds, and
one read over HTTP is only as good as its round trip; a second moves a window's ends by
less than one 1 s scrape, where 30 s moved a fifth of a 108 s window's requests out."""
WARN_S = 5.0
"""Offsets from this on are said (once until they fall back under): the windows are
read right either way, but the times the operator writes are not Prometheus's (its
status's, its events': what a person sets beside a dashboard), and five seconds is past
any reading's error (``MAX_ROUND_TRIP_S``) and a third of a default 15 s scrape."""
MAX_ROUND_TRIP_S = 2.0
"""A reading whose query took longer is not taken: the offset is read at the round
trip's middle, so its error is up to half of it."""
REFRESH_S = 60.0
"""How long a reading stands (on the monotonic clock): clocks drift by parts per
million, and a step of the operator's wall clock is seen at once (``_stepped``)."""
RETRY_S = 10.0
"""How soon a try that took no reading is made again: a minute of windows on the
operator's clock for one slow answer was a minute of figures read off by the offset."""
UNREAD_SAID_AFTER = 3
"""Tries in a row that took no reading before it is said (once, until one is taken):
one slow answer is a busy moment, three in a row (half a minute) a Prometheus that
will not tell its time, whose windows are then read on the operator's clock alone."""


@dataclass(frozen=True)
class ClockOffset:
    """One reading of the two clocks."""

    offset_s: float
    """The operator's clock less Prometheus's, in seconds: above 0, the operator's is
    ahead."""
    round_trip_s: float
    """How long the reading's query took (its error is up to half of it)."""
    wall: float
    """The operator's clock at the reading (the round trip's middle)."""
    mono: float
    """The monotonic clock then: a wall clock that moved otherwise stepped."""

    def describe(self) -> str:
        side = "ahead of" if self.offset_s > 0 else "behind"
        return (f"the operator's clock is {abs(self.offset_s):.1f} s {side} Prometheus's "
                f"(read within {self.round_trip_s / 2:.2f} s)")


class PrometheusClock:
    """A ``QueryAt`` on the operator's clock over one on Prometheus's (module docstring).

    ``clock`` is the operator's (what the loop's ``now`` is read from), ``monotonic``
    the clock a step of it is told by; ``label`` names the deployment in the warning.
    """

    def __init__(self, query: QueryAt, *, label: str = "",
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 observe: Callable[[float], None] | None = None) -> None:
        self.query, self.label = query, label
        self.clock, self.monotonic = clock, monotonic
        self.observe = observe
        """Given each reading's offset (the operator's series an alert reads: the log
        says a large one once, and the times the operator writes stay off by it)."""
        self.reading: ClockOffset | None = None
        """The last reading taken (None: none yet; the offset is then 0)."""
        self.tried_at: float | None = None
        """When (monotonic) the clock was last read, taken or not: a server that will
        not answer ``time()`` is asked again a ``REFRESH_S`` later, not at every query."""
        self.warned = False
        self.misses = 0
        """Tries in a row that took no reading (``UNREAD_SAID_AFTER``)."""

    def offset_s(self) -> float:
        """The offset applied now: the last reading's, 0 under ``APPLY_S`` or with none."""
        if self._due():
            self._read()
        kept = self.reading
        return kept.offset_s if kept is not None and abs(kept.offset_s) >= APPLY_S else 0.0

    def __call__(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        if at is None:  # Prometheus's now already
            return self.query(expr, None)
        offset = self.offset_s()
        if offset == 0.0:
            return self.query(expr, at)
        return [_shifted(sample, offset) for sample in self.query(expr, at - offset)]

    def _due(self) -> bool:
        wait = RETRY_S if self.misses else REFRESH_S
        if self.tried_at is None or self.monotonic() - self.tried_at >= wait:
            return True
        return self.reading is not None and self._stepped(self.reading)

    def _stepped(self, kept: ClockOffset) -> bool:
        """Whether the wall clock moved unlike the monotonic one since ``kept``: stepped
        (an NTP step, an administrator's ``date``), so the offset is another now."""
        return abs((self.clock() - kept.wall) - (self.monotonic() - kept.mono)) >= APPLY_S

    def _read(self) -> None:
        if self.reading is not None and self._stepped(self.reading):
            self.reading = None  # another now: none kept, unless this reading is taken
        before, mono = self.clock(), self.monotonic()
        self.tried_at = mono
        try:
            answer = self.query(NOW_EXPR, None)
        except PrometheusUnavailable as exc:
            # The queries that follow say so if Prometheus is down; a server that will
            # not evaluate time() (a proxy) leaves the times as they are, as before.
            self._missed(str(exc))
            return
        after = self.clock()
        theirs = _now_of(answer)
        trip = after - before
        if theirs is None:
            self._missed(f"time() answered {answer!r:.120}, not a time")
            return
        if not 0.0 <= trip <= MAX_ROUND_TRIP_S:
            self._missed(f"time() took {trip:.1f} s to answer (a reading is taken within "
                         f"{MAX_ROUND_TRIP_S:g} s)")
            return
        self.misses = 0
        middle = before + trip / 2.0
        self.reading = ClockOffset(middle - theirs, trip, middle,
                                   mono + (self.monotonic() - mono) / 2.0)
        self._say(self.reading)
        if self.observe is not None:
            self.observe(self.reading.offset_s)

    def _missed(self, why: str) -> None:
        self.misses += 1
        who = f"{self.label}: " if self.label else ""
        log.debug("%sPrometheus's clock not read: %s", who, why)
        if self.misses == UNREAD_SAID_AFTER:
            kept = "" if self.reading is None else \
                f"; the last reading's offset ({self.reading.offset_s:+.1f} s) stands"
            log.warning("%sPrometheus's clock not read %d times in a row (last: %s): "
                        "windows are read on the operator's own clock%s, off by however "
                        "far the two clocks are apart; tried again every %g s",
                        who, self.misses, why, kept, RETRY_S)

    def _say(self, reading: ClockOffset) -> None:
        large = abs(reading.offset_s) >= WARN_S
        who = f"{self.label}: " if self.label else ""
        if large and not self.warned:
            log.warning("%s%s: every window is read on Prometheus's clock (shifted by "
                        "%+.1f s), but times the operator writes are off by as much; sync "
                        "both hosts' clocks (NTP: chrony or systemd-timesyncd)",
                        who, reading.describe(), -reading.offset_s)
        elif not large and self.warned:
            log.info("%s%s: the clocks agree again", who, reading.describe())
        self.warned = large


def _now_of(answer: list[dict[str, Any]]) -> float | None:
    try:
        value = float(answer[0]["value"][1])
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _shifted(sample: dict[str, Any], offset: float) -> dict[str, Any]:
    """``sample`` with its times on the operator's clock: a raw range's samples (the
    probe's arrival bins) are placed against the reader's own ``now``."""
    out = dict(sample)
    if "value" in sample:
        t, v = sample["value"]
        out["value"] = [t + offset, v]
    if "values" in sample:
        out["values"] = [[t + offset, v] for t, v in sample["values"]]
    return out
