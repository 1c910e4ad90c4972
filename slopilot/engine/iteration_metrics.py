"""Iteration time with the batch's shape: what a twin needs to check itself live.

Per kind of iteration (``decode``, ``prefill``, ``mixed``, ``swap``) the engine exports

    slopilot_iteration_seconds{kind}                  histogram of the step time (the
                                                      token gap: scheduling, executor,
                                                      bookkeeping; ``LLMEngine.last_step_s``)
    slopilot_iteration_executor_seconds_total{kind}   the executor's part alone
    slopilot_iteration_shape_total{kind, feature}     the shape features of
                                                      ``slopilot.engine.sim.shape``, summed

Over any window, ``increase(slopilot_iteration_seconds_sum)`` and
``increase(slopilot_iteration_shape_total)`` obey the calibrated cost model's equation
(seconds = coefficients . features) exactly as one iteration does, because the model is
linear in its features: the predicted time of the window is the profile's coefficients
dotted with the feature increases, and a least-squares fit over several windows (three
kinds each) refits the coefficients. The server and the simulator feed these from the
same observer, so a simulated run exports the twin's own prediction.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily

from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.metrics_text import HistogramText, Part
from slopilot.engine.sim.shape import FEATURES, KINDS, IterationShape

ITERATION_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)

ITERATION_SERIES: frozenset[str] = frozenset({
    "slopilot_iteration_seconds", "slopilot_iteration_executor_seconds_total",
    "slopilot_iteration_shape_total"})
ITERATION_HISTOGRAMS: frozenset[str] = frozenset({"slopilot_iteration_seconds"})


class IterationMetrics:
    """Plain per-kind sums, turned into metric families on scrape."""

    def __init__(self) -> None:
        self._seconds = {k: HistogramRecorder(ITERATION_BUCKETS) for k in KINDS}
        self._executor = dict.fromkeys(KINDS, 0.0)
        # Summed in place (one list per kind), not a new IterationShape per iteration.
        self._shape = {k: [0.0] * len(FEATURES) for k in KINDS}
        # Built on the first render, when the engine's model name is known.
        self._seconds_text: HistogramText | None = None
        self._seconds_text_model = ""

    def observe(self, shape: IterationShape, step_s: float, executor_s: float) -> None:
        kind = shape.kind
        self._seconds[kind].observe(step_s)
        self._executor[kind] += executor_s
        sums = self._shape[kind]
        for i, value in enumerate(shape.vector()):
            sums[i] += value

    def totals(self, kind: str) -> tuple[int, float, float, IterationShape]:
        """(iterations, step seconds, executor seconds, summed shape) of one kind."""
        rec = self._seconds[kind]
        return rec.count, rec.total, self._executor[kind], IterationShape(*self._shape[kind])

    def parts(self, model_name: str) -> Iterator[Part]:
        """The step-time histogram's text, then the executor and shape families."""
        if self._seconds_text is None or self._seconds_text_model != model_name:
            self._seconds_text_model = model_name
            self._seconds_text = HistogramText(
                "slopilot_iteration_seconds",
                "Step time of an iteration (previous end to this end: the token gap), by "
                "kind.", ["model_name", "kind"],
                [([model_name, kind], self._seconds[kind]) for kind in KINDS])
        yield self._seconds_text
        executor = CounterMetricFamily(
            "slopilot_iteration_executor_seconds",
            "Executor time (forward pass, sampling, swaps) of iterations, by kind.",
            labels=["model_name", "kind"])
        shape = CounterMetricFamily(
            "slopilot_iteration_shape",
            "Shape features of iterations summed, by kind (see docs/twin.md): tokens, "
            "decode_seqs, prefill_seqs, context tokens read, attention pairs, ...",
            labels=["model_name", "kind", "feature"])
        for kind in KINDS:
            executor.add_metric([model_name, kind], self._executor[kind])
            for name, value in zip(FEATURES, self._shape[kind], strict=True):
                shape.add_metric([model_name, kind, name], value)
        yield executor
        yield shape
