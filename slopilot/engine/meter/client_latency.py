"""The TTFT and token gaps of the streams the meter judges, as their clients saw them.

vLLM's own histograms time what its engine made: TTFT from when its frontend began to
tokenize the request to when it took the engine's first output, and the gaps between the
engine core's steps. Parsing and validating the request before, and detokenizing,
serializing and writing after (with an API server's event loop busy under load, vLLM's
known bottleneck), are left out: they read low against what a client measures. The
meter observes each streamed completion's first token at its write (from the request's
arrival at the meter) and one gap at each later write that brought tokens (``ClientGaps``),
as the built-in engine's server does (``server/responses.py``), on its bucket edges
(``TOKEN_LATENCY_BUCKETS``, with the thresholds of the SLO the meter started with:
``latency_buckets.token_latency_buckets``), so the recording rules read the same figure
on both backends.

Observed as the pieces are written, not at the stream's end: an hour-long stream's gaps
land in the rate windows they were seen in, and a stream cut short keeps what its client
had seen; its choices that had seen no first token are counted (``CLIENT_ABANDONED``): in
no TTFT histogram, vLLM's nor this one, they are what a stall leaves behind (vLLM queues
and answers no 429), apart by whether their client left within its TTFT target (which
missed nothing) or past it (``slo.WITHIN_TTFT_TARGET``). A stream the meter does
not judge (not streamed, an error) observes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from slopilot.engine.alert_factors import DEFAULT_FACTORS, AlertFactors
from slopilot.engine.latency_buckets import token_latency_buckets
from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.metrics_text import HistogramText, families
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec

CLIENT_TTFT = "slopilot_client_time_to_first_token_seconds"
CLIENT_TBT = "slopilot_client_inter_token_latency_seconds"
CLIENT_SERIES: frozenset[str] = frozenset({CLIENT_TTFT, CLIENT_TBT})
"""The meter's histograms, by the name Prometheus stores (base names)."""
CLIENT_ABANDONED = "slopilot_client_requests_abandoned_total"
"""The choices of the streams cut short (the client left, the engine broke off or failed
it) before their first token reached the client: never observed in ``CLIENT_TTFT``, and
read as first tokens never given (``rules.bucket_rates``) where the client had waited past
its TTFT target (``slo.WITHIN_TTFT_TARGET``)."""
CLIENT_AWAITING = "slopilot_client_requests_awaiting_first_token"
"""The choices of the streams running that have had no first token yet, at the scrape, by
whether their client has waited within its TTFT target (``slo.WITHIN_TTFT_TARGET``, by
``awaiting.past_target``): a gauge, read at a window's end as first tokens never given
where past it (``engine/awaiting.py``). Streams only: a body's first token is not seen
apart from its last."""
LABELS = ("model_name", "priority_class")


class ClientLatency:
    """One meter's histograms: its one class, every stream it judges. ``slo``: the SLO
    it started with, whose thresholds (at the deployment's alert ``factors``) are edges
    of both for its life (an edit read live judges streams by the new one; the edges
    stay: docs/operations.md)."""

    def __init__(self, priority: Priority, slo: SLOSpec | None = None,
                 factors: AlertFactors = DEFAULT_FACTORS) -> None:
        self.priority = priority
        self.ttft = HistogramRecorder(token_latency_buckets(slo, ttft=True, factors=factors))
        self.gaps = HistogramRecorder(token_latency_buckets(slo, ttft=False, factors=factors))
        self.abandoned = {False: 0, True: 0}
        """Choices of the streams cut short before their first token (``CLIENT_ABANDONED``),
        by whether their client left within its TTFT target."""
        self._texts: tuple[str, list[HistogramText]] | None = None

    def first_token(self, seconds: float) -> None:
        """A choice's first token reached its client ``seconds`` after the request came."""
        self.ttft.observe(seconds)

    def never_first(self, choices: int, *, within_target: bool) -> None:
        """A stream ended, cut short, with ``choices`` of its choices given no first
        token (``StreamJudge.first_tokens_missed``), ``within_target`` or past it
        (``StreamJudge.left_within_ttft``)."""
        self.abandoned[within_target] += choices

    def token_gap(self, gap: float) -> None:
        """The gap of a written chunk that brought tokens (``ClientGaps.written``)."""
        self.gaps.observe(gap)

    def texts(self, model_name: str) -> list[HistogramText]:
        """Both histograms as their exposition text (``metrics_text``), as the verdicts
        are exported (``Verdicts.families``): from the start, under the model name the
        streams named (none before the first).

        Rendered on the event loop that relays every stream's chunks, each scrape: a
        series' lines are formatted once, and its text kept until its counts change. The
        lines are made again for a name other than the last one's (the first stream's,
        or another name the engine serves the model under), at the cost of a render of
        before, once a change."""
        if self._texts is None or self._texts[0] != model_name:
            values = [model_name, self.priority.label]
            self._texts = (model_name, [HistogramText(name, doc, LABELS, [(values, recorder)])
                                        for name, doc, recorder in self._histograms()])
        return self._texts[1]

    def families(self, model_name: str) -> Iterator[Metric]:
        """Both histograms as prometheus_client families of the same state."""
        return families(self.texts(model_name))

    def _histograms(self) -> tuple[tuple[str, str, HistogramRecorder], ...]:
        return (
            (CLIENT_TTFT, "Time to first token as the client saw it: the request's "
             "arrival at the meter to the write of a choice's first token (streamed "
             "completions).", self.ttft),
            (CLIENT_TBT, "Time between tokens as the client saw them: the time between "
             "the writes of a choice's chunks that bring tokens, one a chunk after the "
             "first however many it brings, as vllm bench serve times them (a count of "
             "chunks, not of tokens).",
             self.gaps))
