"""Per-request verdicts against a class's SLO, counted and exported for the goodput rule.

A request is good when ``ClassSLO.met`` says so of its TTFT and its own token gaps; the
counts, by class, by the objectives judged (``ClassSLO.label``) and by verdict, are what
the recording rules' goodput reads replica by replica (``tuner/prometheus/rules.py``),
where histograms of first tokens and of gaps can only multiply shares. The built-in
engine's metrics (``metrics.EngineMetrics``) and the meter beside a vLLM engine
(``meter/``) both count with this one type, so the two backends export one shape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from slopilot.engine.request import Priority
from slopilot.engine.slo import ClassSLO, SLOSpec

# Per-request verdicts against the class's SLO (``ClassSLO.met``), labelled by the
# objectives judged (``slo``: ``ClassSLO.label``) and the verdict (``met``: true/false).
SLO_REQUESTS = "slopilot_slo_requests_total"
SLO_TOKENS = "slopilot_slo_generation_tokens_total"

Key = tuple[Priority, str, bool]
"""(class, objectives judged, met)."""


class Verdicts:
    """The verdicts counted so far, and the SLO requests are judged by from now on.
    Fed from one thread only (the server's event loop, or the simulator's engine)."""

    def __init__(self) -> None:
        self._slo: SLOSpec | None = None
        self._counts: dict[Key, list[int]] = {}

    @property
    def slo(self) -> SLOSpec | None:
        return self._slo

    def set_slo(self, slo: SLOSpec | None) -> None:
        """The objectives requests are judged by from now on (None: none are judged).

        Every class's series under the new objectives are exported from now on, at 0
        until counted. Those under objectives no longer judged are dropped: no rule reads
        them, and kept they would grow with every edit of the SLO (a series per edit in
        the Prometheus every tenant shares). One that comes back restarts from 0, which
        ``rate()`` reads as a counter reset. A request still in flight is judged by the
        objectives of its arrival, and counted under them even if they were just dropped.
        """
        self._slo = slo
        current = set() if slo is None else {(p, c.label) for p, c in slo.classes().items()}
        self._counts = {k: v for k, v in self._counts.items() if k[:2] in current}
        for p, label in current:
            for met in (True, False):
                self._counts.setdefault((p, label, met), [0, 0])

    def observe(self, priority: Priority, slo: ClassSLO, *, met: bool, tokens: int,
                requests: int = 1) -> None:
        """One finished request's verdict against ``slo``, with the output tokens its
        client got; or ``requests`` judged alike, their tokens together."""
        counts = self._counts.setdefault((priority, slo.label, met), [0, 0])
        counts[0] += requests
        counts[1] += tokens

    def counts(self) -> dict[Key, tuple[int, int]]:
        """(class, objectives, met) -> (requests, output tokens) counted so far."""
        return {k: (v[0], v[1]) for k, v in self._counts.items()}

    def families(self, model_name: str) -> Iterator[Metric]:
        """The two counter families (none before any SLO or verdict)."""
        if not self._counts:
            return
        labels = ["model_name", "priority_class", "slo", "met"]
        requests = CounterMetricFamily(
            SLO_REQUESTS, "Finished requests judged against their class's SLO: TTFT "
            "within its target and at most 1 % of their token gaps over the TBT target.",
            labels=labels)
        tokens = CounterMetricFamily(
            SLO_TOKENS, "Output tokens of the requests judged (goodput: met=\"true\").",
            labels=labels)
        for (p, slo, met), (count, toks) in sorted(self._counts.items()):
            values = [model_name, p.label, slo, "true" if met else "false"]
            requests.add_metric(values, count)
            tokens.add_metric(values, toks)
        yield requests
        yield tokens
