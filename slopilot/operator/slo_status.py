"""The deployment's measured SLO figures for its status, once a window.

``status.ttftP99Ms`` and ``status.tbtP99Ms`` (the P99 of every class together over the
last window, the figures the printer columns show) and ``status.sloAttainment``: the share of
the window's output tokens whose requests met their class's SLO (goodput over
throughput, the token-weighted attainment the tuner maximizes). They come from the
controller's own window evaluator (the deployment's recording rules in Prometheus, all
replicas), so they are what the alerts and the trials see.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from slopilot.engine.window_summary import ClassFigures, WindowSummary
from slopilot.tuner.loop.ports import WindowEvaluator
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected

log = logging.getLogger(__name__)


def _p99(summary: WindowSummary, key: str) -> float | None:
    """Every class together; where a source has no overall figure, the worst class's."""
    top = getattr(summary.overall, key)
    if top is not None:
        return float(top)
    present = [v for c in summary.classes.values() if (v := getattr(c, key)) is not None]
    return max(present) if present else None


FIGURES = ("ttftP99Ms", "tbtP99Ms", "sloAttainment")


def figures_of(summary: WindowSummary) -> dict[str, Any]:
    """The status fields a window summary gives; absent ones left out."""
    out: dict[str, Any] = {}
    for key, field in (("ttft_p99_ms", "ttftP99Ms"), ("tbt_p99_ms", "tbtP99Ms")):
        if (value := _p99(summary, key)) is not None:
            out[field] = round(value, 3)
    if (attainment := token_attainment(summary.overall)) is not None:
        out["sloAttainment"] = round(attainment, 4)
    return out


def token_attainment(figures: ClassFigures) -> float | None:
    """The share of the window's output tokens whose requests met their SLO, a request
    turned away for load (never served) counting at the window's mean output length of
    the served ones: without them, a deployment that refused most of its clients read
    1.0. None with nothing served and nobody turned away."""
    throughput, finished = figures.throughput_tok_s, figures.requests_finished
    if figures.requests_refused > 0 and (finished <= 0 or throughput <= 0):
        return 0.0  # every client turned away, or served nothing
    if throughput <= 0:
        return None
    refused = figures.requests_refused
    offered = throughput * (1.0 + refused / finished) if refused > 0 else throughput
    return min(max(figures.goodput_tok_s / offered, 0.0), 1.0)


def rfc3339(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WindowFigures:
    """Measures ``[last end, now]`` once ``window_s`` has passed; ``due`` says what to write."""

    def __init__(self, evaluator: WindowEvaluator, window_s: float, start: float) -> None:
        self.evaluator, self.window_s, self.since = evaluator, float(window_s), start

    def due(self, now: float) -> dict[str, Any]:
        """The status fields of the window that just ended, a figure it lacks as None;
        {} before it ends, or when the window does not count (too few samples,
        Prometheus down) or gives no figure: the last figures stay, with their
        ``measuredAt``, and the next window is tried a full window later."""
        if now < self.since:  # the clock stepped back: the window starts again here
            self.since = now
        if now - self.since < self.window_s:
            return {}
        start, self.since = self.since, now
        try:
            summary = self.evaluator.measure(start, now, canary=False)
        except (WindowRejected, PrometheusUnavailable) as exc:
            log.debug("window [%.0f, %.0f] not measured: %s", start, now, exc)
            return {}
        fields = figures_of(summary)
        if not fields:
            return {}
        # The window counted: a figure it lacks is null (gone, in the merge patch), not
        # an earlier window's shown under this window's measuredAt.
        return {**dict.fromkeys(FIGURES), **fields, "measuredAt": rfc3339(now)}
