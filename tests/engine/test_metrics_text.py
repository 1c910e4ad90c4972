"""metrics_text: the /metrics text rendered on the server's event loop, byte for byte
what prometheus_client's generate_latest writes for the same state, at a fraction of
its work."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from slopilot.engine.clients import ClientClasses, Refusal
from slopilot.engine.config import EngineConfig
from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_text import HistogramText, TextRegistry, render
from slopilot.engine.request import Priority
from slopilot.engine.server.client_counts import ClientCounts
from slopilot.engine.server.gc_pauses import GCPauses
from slopilot.engine.sim.shape import IterationShape
from slopilot.engine.slo import SLOSpec
from tests.support.call_count import calls


def _step(m: EngineMetrics, now: float) -> None:
    m.on_step(now=now, elapsed_s=0.004, num_running=3, num_waiting=2, num_swapped=1,
              kv_usage=0.625, iteration_tokens=96, num_preempted_recompute=1,
              num_preempted_swap=0, swap_s=0.001, prefix_queries=64, prefix_hits=32)


def populated(registry: CollectorRegistry | None = None) -> EngineMetrics:
    """An engine's metrics with every series it exports fed, as a server's are, with the
    server's own collectors beside it on its registry (gc pauses, client counts)."""
    now = [100.0]
    m = EngineMetrics("tiny \"quoted\" \\ model", registry, clock=lambda: now[0],
                      info={"executor": "simulated", "gpu": "A100"})
    m.set_config(EngineConfig())
    slo = SLOSpec.from_profile("standard")
    m.set_slo(slo)
    for i in range(1, 400):
        p = Priority(i % 3)
        _step(m, now[0] + i * 0.01)
        m.on_iteration(IterationShape(iteration=1, tokens=i, decode_seqs=i % 7), 0.01, 0.008)
        m.observe_ttft(p, 0.0007 * i)
        m.observe_token_gap(p, 0.00011 * i)
        m.on_decode_gap(p, 0.0001 * i, now[0] + i * 0.01)
        m.on_first_token(p, None, tokens=0)
        m.observe_delivered(p, 0.03 * i, i, "length" if i % 2 else "stop")
        m.observe_request_outputs(p, i)
        m.on_finished(p, e2e_s=None, queue_s=0.001 * i, prompt_tokens=3 * i,
                      generation_tokens=None, finish_reason=None, prefill_s=0.002 * i,
                      decode_s=0.02 * i, inference_s=0.025 * i)
        m.count_delivered(1)
        if i % 50 == 0:
            m.count_refused(p, slo)
            m.count_refused(p, slo, retry=True)
            m.count_retry_admitted(p)
            m.count_send_timeout()
        m.observe_verdict(p, slo.class_slo(p), met=i % 4 != 0, tokens=i)
    # A bucket past a million: Go's exponent form ("1.5e+06"), as prometheus_client writes.
    m.iterations.observe(IterationShape(tokens=1), 1.5, 1.0)
    m._itl[Priority.P1].counts[-1] += 1_500_000
    now[0] += 5.0
    gc_pauses = GCPauses()
    for generation, pause in ((0, 0.0003), (1, 0.004), (2, 0.3)):
        gc_pauses.recorders[generation].observe(pause)
    m.registry.register(gc_pauses)
    counts = ClientCounts("tiny")
    counts.set_clients(ClientClasses.from_dict({"anonymous": {"maxClass": "p1"}}))
    counts.count_served("anonymous", Priority.P1)
    counts.count_refused("anonymous", Refusal.CLASS_NOT_ALLOWED)
    m.registry.register(counts)
    return m


def test_the_render_is_byte_for_byte_generate_latest_on_the_same_state() -> None:
    m = populated()
    assert isinstance(m.registry, TextRegistry)
    expected = generate_latest(m.registry)
    assert b"e+06" in expected and b'\\"quoted\\" \\\\ model' in expected
    assert m.render() == expected
    assert m.render() == expected  # again, from the histograms' kept text


def test_a_histogram_observed_after_a_render_is_rendered_anew() -> None:
    m = populated()
    m.render()
    m.observe_token_gap(Priority.P2, 0.0123)
    m.on_finished(Priority.P0, e2e_s=1.0, queue_s=0.5, prompt_tokens=7,
                  generation_tokens=3, finish_reason="stop")
    m.iterations.observe(IterationShape(tokens=2), 0.02, 0.01)
    assert m.render() == generate_latest(m.registry)


def test_a_collector_unregistered_leaves_the_text() -> None:
    m = populated()
    assert isinstance(m.registry, TextRegistry)
    gc_pauses = next(c for c in m.registry.collectors if isinstance(c, GCPauses))
    m.registry.unregister(gc_pauses)
    text = m.render()
    assert text == generate_latest(m.registry)
    assert b"slopilot_gc_pause_seconds" not in text


def test_another_registry_is_rendered_by_prometheus_client_whole() -> None:
    registry = CollectorRegistry()
    m = populated(registry)
    assert m.render() == generate_latest(registry) == render(registry)


def test_a_render_does_a_fraction_of_prometheus_client_s_work_on_the_same_state() -> None:
    """Each scrape's render holds every stream's next chunk. prometheus_client's encoder
    makes about 60 calls for each line of one engine's text (a Sample, a label dict,
    each label checked and escaped), 1,650 of its 1,775 lines histogram buckets. Here a
    histogram series' lines are formatted without a call each, and not again until its
    counts change: what remains is mostly the small families, still encoded by
    prometheus_client."""
    m = populated()
    m.render()
    m.observe_token_gap(Priority.P1, 0.0123)  # one series changed since the last render
    m.observe_ttft(Priority.P0, 0.0123)
    generic = calls(lambda: generate_latest(m.registry))
    assert calls(m.render) * 5 < generic


@pytest.mark.parametrize("count", [0, 1, 999_999, 1_000_000, 1_234_567, 2 ** 53 + 1])
def test_a_count_reads_as_prometheus_client_writes_it(count: int) -> None:
    rec = HistogramRecorder((1.0,))
    rec.counts[0] = count
    text = HistogramText("h", "d", [], [([], rec)]).text()
    assert f'h_bucket{{le="1.0"}} {floatToGoString(count)}\n' in text


def test_a_histogram_refuses_labels_it_cannot_name_and_negative_edges() -> None:
    with pytest.raises(ValueError, match="one value per label"):
        HistogramText("h", "d", ["a", "b"], [(["x"], HistogramRecorder((1.0,)))])
    with pytest.raises(ValueError, match=r"first edge -1\.0 is negative"):
        HistogramText("h", "d", [], [([], HistogramRecorder((-1.0, 1.0)))])


class _ObservedDuringRead(list[int]):
    """Bucket counts whose reading lets the engine's thread observe once, midway: a
    render on the event loop read the counts and then the sum while the engine thread
    observed between the two (the GIL switches threads at any bytecode)."""

    def __init__(self, counts: list[int], at: int) -> None:
        super().__init__(counts)
        self.at = at % len(counts)
        self.observe: Callable[[], None] | None = None

    def __iter__(self) -> Iterator[int]:
        for i, n in enumerate(super().__iter__()):
            if i == self.at and self.observe is not None:
                observe, self.observe = self.observe, None
                observe()
            yield n


@pytest.mark.parametrize("at", [0, -1])  # before or after the bucket it counts in
@pytest.mark.parametrize("render", ["text", "family"])
def test_a_histogram_read_while_observed_renders_one_snapshot(render: str, at: int) -> None:
    """A profile's mean output length read 12.63 where every request asked for 12
    (tests/tuner/test_profiling.py, on a busy machine): one scrape's _sum held an
    observation its _count did not. Its buckets, _count and _sum are one snapshot."""
    recorder = HistogramRecorder([1.0, 10.0, 100.0])
    for _ in range(19):
        recorder.observe(12.0)
    counts = _ObservedDuringRead(recorder.counts, at)
    recorder.counts = counts
    hist = HistogramText("tokens", "Tokens.", ["model_name"], [(["m"], recorder)])
    for _ in range(3):  # each render, the engine observes once while it reads
        counts.observe = lambda: recorder.observe(12.0)
        if render == "text":
            samples = {s.name: s.value for f in text_string_to_metric_families(hist.text())
                       for s in f.samples}
        else:
            samples = {s.name: s.value for s in hist.family().samples}
        assert samples["tokens_sum"] == 12.0 * samples["tokens_count"]
        assert samples["tokens_bucket"] == samples["tokens_count"]  # the last: +Inf
