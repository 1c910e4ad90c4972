"""The server process's garbage-collector pauses, as a Prometheus histogram.

A collection runs on whichever thread allocated last, the engine's included, and
stalls every running request's next token for its length; the start-up heap is frozen
for that reason (``startup_heap.py``). This histogram shows what collections still cost
while the server serves: ``slopilot_gc_pause_seconds{generation}``.

The callback runs inside the collector, under the GIL, never twice at once: it writes a
lock-free recorder (a lock taken there could be one the interrupted thread holds).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from slopilot.engine.metric_names import GC_PAUSE_SECONDS
from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.metrics_text import HistogramText

# From a young collection's fraction of a millisecond to the oldest generation's walk
# of an unfrozen heap (166 ms on SmolLM2-135M's process), with the SLO thresholds.
EDGES = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GENERATIONS = (0, 1, 2)


class GCPauses:
    """``gc.callbacks`` timing every collection of this process while installed."""

    def __init__(self) -> None:
        self.recorders = {g: HistogramRecorder(EDGES) for g in GENERATIONS}
        self._started = 0.0
        self._text = HistogramText(
            GC_PAUSE_SECONDS, "Garbage-collector pauses of the server process "
            "(every thread, the engine's included, waits them out).", ["generation"],
            [([str(g)], recorder) for g, recorder in self.recorders.items()])

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif (recorder := self.recorders.get(info["generation"])) is not None:
            recorder.observe(time.perf_counter() - self._started)

    def install(self, registry: CollectorRegistry) -> GCPauses:
        gc.callbacks.append(self)
        registry.register(self)
        return self

    def uninstall(self, registry: CollectorRegistry) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        registry.unregister(self)

    def collect(self) -> Iterator[Metric]:
        yield self._text.family()

    def exposition(self) -> str:
        """Its text on a scrape (``metrics_text.TextCollector``)."""
        return self._text.text()

    def describe(self) -> list[Metric]:
        return list(self.collect())
