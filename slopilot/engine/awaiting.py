"""The requests still waiting for their first token, as a gauge read at each scrape.

A request served no first token is in no TTFT histogram until it gets one: a class the
config starves (queued behind another for the whole window) left its TTFT P99 read from
a few lucky requests, or from none, and an empty class reads as meeting its SLO. The
simulator ranks such a request at the run's end with the time it had waited (a censored
TTFT: ``sim/stats.py``); a live engine exports them per class at each scrape, apart by
whether each has waited past its class's TTFT target (``slo.WITHIN_TTFT_TARGET``, by
``ClassSLO.left_within_ttft``, the rule of the clients gone before a first token). The
rules read those past it at a window's end as first tokens never given, in the TTFT's
+Inf (``rules.bucket_rates``), and every one as a class that was sent traffic
(``ClassFigures.requests_awaiting``): the one rule, in the simulator and live alike,
that a request waiting past its target when the window ends is a TTFT miss.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from slopilot.engine.request import Priority
from slopilot.engine.slo import ClassSLO


def past_target(slo: ClassSLO | None, waited_s: float) -> bool:
    """Whether a request given no first token after ``waited_s`` has missed its TTFT
    target (``ClassSLO.left_within_ttft``'s contrary). Without a target (no SLO known,
    a best-effort class) a request still waiting has missed nothing yet: a class whose
    queue is its normal state (P2 under load) would read its P99, and every class's
    together, as the histogram's last edge."""
    return slo is not None and slo.ttft_p99_ms is not None \
        and not slo.left_within_ttft(waited_s)


@dataclass(frozen=True, slots=True)
class _Waiting:
    priority: Priority
    slo: ClassSLO | None
    since: float
    clock: Callable[[], float]


class AwaitingFirstToken:
    """The requests given no first token yet, each from its arrival until its first token
    reached the client or it ended. Touched on one thread only (the server's event loop)
    and read at scrape on it."""

    def __init__(self) -> None:
        self._open: dict[Hashable, _Waiting] = {}

    def arrived(self, key: Hashable, priority: Priority, slo: ClassSLO | None,
                since: float, clock: Callable[[], float]) -> None:
        """``key`` came at ``since`` on ``clock`` (the clock its arrival was stamped on)
        and waits for its first token, judged by ``slo`` (its class's, None: none)."""
        self._open[key] = _Waiting(priority, slo, since, clock)

    def settled(self, key: Hashable) -> None:
        """``key``'s first token reached its client, or it ended without one (counted
        elsewhere then: refused, abandoned). A key not waiting is no error."""
        self._open.pop(key, None)

    def counts(self) -> dict[tuple[Priority, bool], int]:
        """(class, within its TTFT target) -> requests waiting now, every pair present."""
        out = {(p, within): 0 for p in Priority for within in (False, True)}
        for w in self._open.values():
            out[w.priority, not past_target(w.slo, w.clock() - w.since)] += 1
        return out
