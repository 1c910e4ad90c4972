"""Replicas that come or go inside a trial's window: which the window stands, which not.

A review's backfilled histories (15 s scrapes, a 300 s window):

- A replica whose engine samples stop before the window's end has its rates divided by
  the whole window. Its target gone (scaled down, replaced) and the deployment's
  figures read: the sum of its increases is what it served while it was there, as a
  deployment's rate over the window should count it. The canary's figures are its own,
  though: gone 50 s before the end, it read 16 % low. And a target whose scrapes fail
  (``up`` 0) for the last minute served on unseen: the canary read 21 % low, the
  deployment 10 %. One whose scrapes failed and whose pod was then deleted (its
  replacement beside it) left the deployment's figures 10 % low too, and passed the
  75 %-answered check. So a canary that stops, or a replica whose last scrapes in the
  window failed (still a target, or two or more before it went: a pod shutting down may
  refuse one), rejects the window (``stopped``, ``Ending``).
- Its mirror: a canary whose samples start after the window's start (scaled up, a
  rollout's new pod) read 50 % low over the whole window, and a P99 of its few samples.
  It rejects the window (``started``); a replica the deployment gained counts for the
  time it served, as one it lost; and in the busy ratio too (``adapters.busy_window``:
  the mean of every replica's readings, not of each one's last, which weighed a replica
  there for 85 s of 300 as one there all along and read 15 % low).
- A pod that joined or left inside the window holds one sample there, which no rate
  reads. Its requests are in no figure, but where the window spans many scrapes they are
  under two scrapes' worth of one replica: a small share of the deployment's, left out
  (``EDGE_SHARE_MAX``) rather than rejecting a 300 s window with advice about the window's
  span that was wrong for it. The canary's window is the canary's alone: rejected, saying
  why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from slopilot.tuner.prometheus.alert_table import MIN_RATE_SCRAPES
from slopilot.tuner.prometheus.query import QueryAt
from slopilot.tuner.prometheus.rules import REPLICA_LABEL, duration
from slopilot.tuner.prometheus.scrape_interval import SLACK, ScrapeInterval

ENGINE_GAUGE = "vllm:num_requests_running"
"""The series that says a replica's engine was scraped: both backends export it from
their start, idle or not (as the unreported and thin checks read it)."""
TAIL_SCRAPES = 2.5
"""A replica with no engine sample in the window's last this many scrape intervals
stopped before its end: one failed or late scrape at the end leaves one within two."""
FAILED_SCRAPES_MIN = 2
"""Failed scrapes (``up`` 0) in the window, its last among them, that say a replica gone
before the end served on unseen: a pod shutting down may refuse its last one."""
EDGE_SHARE_MAX = 0.1
"""The share of the deployment's replica-window that replicas joining or leaving inside it
may leave out (one sample there each: at most two scrapes each served in it)."""


class Ending(Enum):
    """How a replica that stopped before the window's end ended."""

    GONE = "gone"
    """Its target went with its last scrape good (scaled away): the deployment's figures
    count what it served while there."""
    FAILING = "failing"
    """Still a target, its scrapes failing (``up`` 0): it serves on, in no figure."""
    FAILED_THEN_GONE = "failed then gone"
    """Its last ``FAILED_SCRAPES_MIN`` or more scrapes failed, then its target went (a
    pod deleted while unreachable to Prometheus, not to its clients): what it served
    meanwhile is in no figure."""

    @property
    def unseen(self) -> bool:
        """Whether it served requests no figure counts."""
        return self is not Ending.GONE


@dataclass
class WindowEdges:
    """The replicas of one window (``selector``: ``{...}`` text, over ``window_s`` to
    ``end``) at its edges. ``least_interval_s``: the longest scrape interval the rules
    read (``RuleOptions.max_scrape_interval_s``); ``measured``: the interval Prometheus
    really scrapes at, asked only where a replica is suspect, and used where longer."""

    query: QueryAt
    selector: str
    window_s: int
    end: float
    least_interval_s: float
    measured: Callable[[], ScrapeInterval | None]
    _interval_s: float | None = field(default=None, init=False)

    def interval_s(self) -> float:
        if self._interval_s is None:
            found = self.measured()
            slower = found is not None and math.isfinite(found.interval_s) \
                and found.interval_s > self.least_interval_s * SLACK
            self._interval_s = found.interval_s if slower and found is not None \
                else self.least_interval_s
        return self._interval_s

    def spans_scrapes(self) -> bool:
        """Whether the window spans ``MIN_RATE_SCRAPES`` scrapes: a replica there all
        along holds several samples, so one that holds one came or went inside it."""
        return self.window_s >= MIN_RATE_SCRAPES * self.interval_s()

    def edge_share(self, thin: Sequence[str]) -> float:
        """The most ``thin`` replicas (one sample each) may have served inside the window,
        as a share of the deployment's replica-window: two scrapes each, over every
        replica's window."""
        answer = self.query(f"count(group by ({REPLICA_LABEL}) (last_over_time("
                            f"{ENGINE_GAUGE}{self.selector}[{duration(self.window_s)}])))",
                            self.end)
        replicas = float(answer[0]["value"][1]) if answer else 0.0
        if replicas <= 0:
            return math.inf
        return len(thin) * 2 * self.interval_s() / (self.window_s * replicas)

    def thin_left_out(self, thin: Sequence[str]) -> bool:
        """Whether the deployment's window stands without ``thin`` (one sample each)."""
        return self.spans_scrapes() and self.edge_share(thin) <= EDGE_SHARE_MAX

    def thin_reason(self, thin: Sequence[str], canary: bool) -> str:
        """Why ``thin`` replicas reject the window, and the fix."""
        if not self.spans_scrapes():
            return ("a window must span at least two of Prometheus's scrape intervals, "
                    f"{MIN_RATE_SCRAPES} to be safe (it is scraped every "
                    f"{self.interval_s():.0f} s)")
        if canary:
            return ("the canary joined or left inside the window (under two scrapes before "
                    "its edge): its figures would be of that moment alone; the next "
                    "window, with the canary there all along, reads")
        return (f"they joined or left inside it, and what they served there is up to "
                f"{self.edge_share(thin) * 100:.0f} % of the deployment's, over the "
                f"{EDGE_SHARE_MAX * 100:g} % a window may leave out")

    def tail_s(self) -> int:
        return math.ceil(TAIL_SCRAPES * self.interval_s())

    def stopped(self) -> list[tuple[str, Ending]]:
        """The replicas with engine samples in the window and none in its last
        ``tail_s``, each with how it ended (``Ending``); none where the window is no
        longer than the tail (the thin check judges those)."""
        names = self._at_edge(self._stopped_expr)
        if not names:
            return []
        w, tail = duration(self.window_s), duration(self.tail_s())
        up = f"up{self.selector}"
        targeted = self._names(f"group by ({REPLICA_LABEL}) (last_over_time({up}[{tail}]))")
        # Its last scrapes in the window failed: it served on until its target went, and
        # what it served since its last good scrape is in no figure. One failed scrape is
        # a pod refusing it as it shuts down: under a scrape's worth, as a pod at the
        # window's edge, so it takes FAILED_SCRAPES_MIN.
        failed = self._names(
            f"group by ({REPLICA_LABEL}) ((last_over_time({up}[{w}]) == 0) and on "
            f"({REPLICA_LABEL}) (count_over_time({up}[{w}]) - sum_over_time({up}[{w}]) "
            f">= {FAILED_SCRAPES_MIN}))")
        return [(name, Ending.FAILING if name in targeted else
                 Ending.FAILED_THEN_GONE if name in failed else Ending.GONE)
                for name in names]

    def started(self) -> list[str]:
        """The replicas with engine samples in the window and none in its first
        ``tail_s`` (scaled up, or a rollout's new pod): rates over the whole window spread
        what each served over all of it. None where the window is no longer than that."""
        return self._at_edge(self._started_expr)

    def _at_edge(self, expr: Callable[[int], str]) -> list[str]:
        # Over the rules' interval first; Prometheus's own is asked only where a replica
        # reads missing at the edge, and where it is longer, the edge's span is too.
        first = math.ceil(TAIL_SCRAPES * self.least_interval_s)
        if self.window_s <= first or not (found := self._names(expr(first))):
            return []
        if (tail := self.tail_s()) == first:
            return found
        return self._names(expr(tail)) if self.window_s > tail else []

    def _names(self, expr: str) -> list[str]:
        return sorted(r["metric"].get(REPLICA_LABEL, "?") for r in self.query(expr, self.end))

    def _seen(self) -> str:
        return (f"group by ({REPLICA_LABEL}) (last_over_time({ENGINE_GAUGE}{self.selector}"
                f"[{duration(self.window_s)}]))")

    def _stopped_expr(self, tail_s: int) -> str:
        recent = (f"group by ({REPLICA_LABEL}) (last_over_time({ENGINE_GAUGE}{self.selector}"
                  f"[{duration(tail_s)}]))")
        return f"{self._seen()} unless on ({REPLICA_LABEL}) {recent}"

    def _started_expr(self, head_s: int) -> str:
        early = (f"group by ({REPLICA_LABEL}) (last_over_time({ENGINE_GAUGE}{self.selector}"
                 f"[{duration(head_s)}] offset {duration(self.window_s - head_s)}))")
        return f"{self._seen()} unless on ({REPLICA_LABEL}) {early}"
