"""IterationSource over Prometheus: the engines' ``slopilot_iteration_*`` increases.

The twin check (``loop/twin_check.py``) needs, per kind of iteration, the step seconds,
the iteration count and the summed shape features of a window on every replica::

    sum by (kind) (increase(slopilot_iteration_seconds_sum{sel}[W]))
    sum by (kind) (increase(slopilot_iteration_seconds_count{sel}[W]))
    sum by (kind, feature) (increase(slopilot_iteration_shape_total{sel}[W]))

evaluated at the window's end, as ``PrometheusWindows`` reads its figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.sim.shape import FEATURES, KINDS, IterationShape
from slopilot.tuner.prometheus.query import QueryAt, query_at
from slopilot.tuner.prometheus.rules import render_selector


class PrometheusIterations:
    def __init__(self, query: QueryAt | str, selector: Mapping[str, str]) -> None:
        self.query = query_at(query) if isinstance(query, str) else query
        self.selector = render_selector(dict(selector))

    def iterations(self, start: float, end: float) -> list[WindowSample]:
        w = int(end - start)
        if not (math.isfinite(start) and math.isfinite(end)) or w < 2:
            return []  # too short for an increase over 1 s scrapes
        sel, rng = self.selector, f"[{w}s]"
        seconds = self._by(f"sum by (kind) (increase(slopilot_iteration_seconds_sum{sel}"
                           f"{rng}))", end, ("kind",))
        counts = self._by(f"sum by (kind) (increase(slopilot_iteration_seconds_count{sel}"
                          f"{rng}))", end, ("kind",))
        shapes = self._by(f"sum by (kind, feature) (increase(slopilot_iteration_shape_total"
                          f"{sel}{rng}))", end, ("kind", "feature"))
        out = []
        for kind in KINDS:
            n = counts.get((kind,), 0.0)
            if n <= 0:
                continue
            shape = IterationShape(*(shapes.get((kind, f), 0.0) for f in FEATURES))
            out.append(WindowSample(kind, n, seconds.get((kind,), 0.0), shape))
        return out

    def _by(self, expr: str, at: float, labels: tuple[str, ...]
            ) -> dict[tuple[str, ...], float]:
        values: dict[tuple[str, ...], float] = {}
        for row in self.query(expr, at):
            metric: dict[str, Any] = row.get("metric") or {}
            try:
                value = float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                values[tuple(str(metric.get(k, "")) for k in labels)] = value
        return values
