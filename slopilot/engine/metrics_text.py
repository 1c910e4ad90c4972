"""The /metrics text, rendered without prometheus_client's per-sample encoder.

The server renders its exposition on the event loop that writes every stream's chunks:
while it renders, no stream gets its next token (``benchmarks/scrape_stall.py``).
``generate_latest`` builds a ``Sample`` with a label dict per bucket, then sorts, checks
and escapes every label of every line, on every scrape: 7 of the 8.7 ms one engine's
render took with the dense token-latency edges (1,650 of its 1,775 lines are buckets).
Here a histogram series' lines are formatted once, each line's text up to its value
taken from ``generate_latest`` itself, and its text is kept until its counts change; the
few small families still go through ``generate_latest``. So the text is byte for byte
what ``generate_latest`` writes for the same state (tests/engine/test_metrics_text.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from slopilot.engine.metric_window import HistogramRecorder, cumulative_pairs

# Below this a count's text is its digits and ".0" (Python's repr of the float); from a
# million on floatToGoString writes Go's exponent form ("1e+06"), so it is asked.
_PLAIN_COUNT_BELOW = 1_000_000


def _count_text(n: int) -> str:
    return f"{n}.0" if n < _PLAIN_COUNT_BELOW else floatToGoString(n)


class _Families:
    """A collector of metric families already built, for ``generate_latest``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class _SeriesText:
    """One labelled series of a histogram: its lines' text up to each value, and the
    text of its last counts."""

    __slots__ = ("_buckets", "_count", "_key", "_sum", "_text", "recorder")

    def __init__(self, recorder: HistogramRecorder, lines: Sequence[str]) -> None:
        # ``lines``: generate_latest's lines of this series at zero counts, the buckets
        # (+Inf last), _count and _sum; each ends " 0.0", the value.
        if not all(line.endswith(" 0.0") for line in lines):
            raise ValueError(f"lines {lines[:1]}...: a series at zero ends each with 0.0")
        prefixes = [line[:-len("0.0")] for line in lines]
        self.recorder = recorder
        self._buckets, self._count, self._sum = prefixes[:-2], prefixes[-2], prefixes[-1]
        self._key: tuple[tuple[int, ...], float] | None = None
        self._text = ""

    def text(self) -> str:
        # One snapshot of the counts (another thread may observe meanwhile: the engine's),
        # so the lines agree with each other; a histogram unchanged since the last render
        # (a class with no traffic, most of them) is not formatted again.
        key = self.recorder.snapshot()
        if key != self._key:
            cumulative = list(accumulate(key[0]))
            lines = [prefix + _count_text(n) + "\n"
                     for prefix, n in zip(self._buckets, cumulative, strict=True)]
            lines.append(f"{self._count}{_count_text(cumulative[-1])}\n")
            lines.append(f"{self._sum}{floatToGoString(key[1])}\n")
            self._key, self._text = key, "".join(lines)
        return self._text


class HistogramText:
    """A histogram family of fixed series (label values and recorder each), rendered as
    ``generate_latest`` renders its ``HistogramMetricFamily`` (``family``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 series: Sequence[tuple[Sequence[str], HistogramRecorder]]) -> None:
        for values, recorder in series:
            if len(values) != len(labelnames):
                raise ValueError(f"histogram {name}: label values {list(values)} for labels "
                                 f"{list(labelnames)}; give one value per label")
            if recorder.edges and recorder.edges[0] < 0:
                # prometheus_client leaves _count and _sum out then; nothing here needs it.
                raise ValueError(f"histogram {name}: first edge {recorder.edges[0]} is "
                                 "negative; use edges of 0 or more")
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._values = [tuple(values) for values, _ in series]
        zero = HistogramMetricFamily(name, documentation, labels=list(labelnames))
        for values, recorder in series:
            zero.add_metric(list(values), HistogramRecorder(recorder.edges).cumulative(), 0.0)
        # Split on newlines alone: splitlines() would split a label value at \x1c too.
        lines = generate_latest(_Families([zero])).decode().split("\n")[:-1]
        self._header = "".join(line + "\n" for line in lines[:2])  # HELP and TYPE
        self._series: list[_SeriesText] = []
        at = 2
        for _, recorder in series:
            size = len(recorder.edges) + 3  # its buckets, +Inf, _count and _sum
            self._series.append(_SeriesText(recorder, lines[at:at + size]))
            at += size
        if at != len(lines):
            raise ValueError(f"histogram {name}: prometheus_client wrote {len(lines)} lines "
                             f"where {at} were expected")

    def family(self) -> HistogramMetricFamily:
        """prometheus_client's family of the same state (what ``collect`` yields)."""
        h = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        for values, series in zip(self._values, self._series, strict=True):
            counts, total = series.recorder.snapshot()
            h.add_metric(list(values), cumulative_pairs(series.recorder.edges, counts), total)
        return h

    def text(self) -> str:
        return self._header + "".join(s.text() for s in self._series)


Part = Metric | HistogramText
"""What a collector that renders its own text lists: a family, or a histogram's text."""


def families(parts: Iterable[Part]) -> Iterator[Metric]:
    """The parts as prometheus_client families, for ``collect``."""
    for part in parts:
        yield part.family() if isinstance(part, HistogramText) else part


def parts_text(parts: Iterable[Part]) -> str:
    """The parts' exposition text, byte for byte what ``generate_latest`` writes of
    ``families(parts)``."""
    out: list[str] = []
    pending: list[Metric] = []
    for part in parts:
        if isinstance(part, HistogramText):
            if pending:
                out.append(generate_latest(_Families(pending)).decode())
                pending = []
            out.append(part.text())
        else:
            pending.append(part)
    if pending:
        out.append(generate_latest(_Families(pending)).decode())
    return "".join(out)


@runtime_checkable
class TextCollector(Protocol):
    """A collector that renders its own exposition text (``parts_text``)."""

    def collect(self) -> Iterable[Metric]: ...

    def exposition(self) -> str: ...


class TextRegistry(CollectorRegistry):
    """A registry that keeps its collectors in registration order where ``render`` can
    read them (prometheus_client's own list is private)."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)  # refuses a duplicate series first
        self.collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self.collectors.remove(collector)


def render(registry: CollectorRegistry) -> bytes:
    """``generate_latest(registry)``: each collector's text in registration order, its
    own where it renders it (``TextCollector``). Another registry than a
    ``TextRegistry`` goes through ``generate_latest`` whole."""
    if not isinstance(registry, TextRegistry):
        return generate_latest(registry)
    return "".join(c.exposition() if isinstance(c, TextCollector)
                   else generate_latest(c).decode()
                   for c in list(registry.collectors)).encode()
