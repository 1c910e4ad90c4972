"""The meter's own part of /metrics (its verdicts, client-side histograms and replays),
rendered on the event loop that relays every stream's chunks: byte for byte what
prometheus_client's generate_latest writes for the same state, at a fraction of its work
(``engine/metrics_text.py``, as the built-in engine's server renders its own)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from slopilot.engine.meter.proxy import Meter
from tests.engine.meter.test_meter import (
    DONE,
    STREAM,
    VLLM_METRICS,
    Client,
    Upstream,
    event,
    meter_for,
    run,
)
from tests.support.call_count import calls


def streamed(tmp_path: Path) -> tuple[Meter, list[float]]:
    """A meter that judged one stream (every series of its part fed) and counted a
    replay."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a"), event(text="b"), event(text="c", finish="stop"),
                     DONE])

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=[10.25, 10.3125, 10.6875, 10.75])

    run(go)
    meter.replays += 1
    return meter, now


def test_the_meters_part_is_byte_for_byte_generate_latest_on_the_same_state(
        tmp_path: Path) -> None:
    meter, now = streamed(tmp_path)
    assert meter.latency.ttft.count == 1 and meter.latency.gaps.count == 2
    meter.latency.gaps.counts[-1] += 1_500_000  # Go's exponent form: "1.500002e+06"
    expected = generate_latest(meter.registry)
    assert b"e+06" in expected and b'model_name="llama"' in expected
    assert meter.render() == expected
    assert meter.render() == expected  # again, from the histograms' kept text

    async def scrape() -> bytes:
        return (await Client(meter, now).request("GET", "/metrics"))[2]

    assert run(scrape) == VLLM_METRICS + expected


def test_the_histograms_are_rendered_under_the_model_name_the_streams_gave(
        tmp_path: Path) -> None:
    """Before its first stream the meter knows no model name (its series are exported
    under ""); each name the streams give is the one its next render writes."""
    upstream, now = Upstream(), [10.0]
    meter = meter_for(tmp_path, upstream, now)
    assert meter.render() == generate_latest(meter.registry)
    assert b'model_name=""' in meter.render()
    for name in ("llama", 'tiny "quoted" \\ model', "llama"):
        meter.model_name = name
        meter.latency.first_token(0.5)
        assert meter.render() == generate_latest(meter.registry)


def test_a_histogram_observed_after_a_render_is_rendered_anew(tmp_path: Path) -> None:
    meter, _ = streamed(tmp_path)
    meter.render()
    meter.latency.token_gap(0.0123)
    meter.latency.token_gap(0.5)
    assert meter.render() == generate_latest(meter.registry)
    meter.latency.first_token(0.0123)
    assert meter.render() == generate_latest(meter.registry)


def test_a_render_does_a_fraction_of_prometheus_client_s_work_on_the_same_state(
        tmp_path: Path) -> None:
    """Each scrape's render holds every stream's next chunk. prometheus_client's encoder
    makes a Sample, a label dict and a check and escape of each label for each of the
    histograms' 274 lines (the dense token-latency edges); here a series' lines are
    written from text formatted once, and not again until its counts change."""
    meter, _ = streamed(tmp_path)
    meter.render()
    meter.latency.token_gap(0.0123)  # one of the two histograms changed since
    generic = calls(lambda: generate_latest(meter.registry))
    assert calls(meter.render) * 5 < generic


def test_the_meter_exports_the_series_it_lists(tmp_path: Path) -> None:
    """``meter_series`` is what the vLLM dashboard's panels are held to: every name of
    the meter's part, none more."""
    from slopilot.engine.connection_cap import ConnectionCap
    from slopilot.engine.meter.exposition import meter_series

    meter, _ = streamed(tmp_path)
    meter.count_connections(ConnectionCap(8))  # as served: its server's cap counted
    names = {line.split("{")[0].split(" ")[0] for line in meter.render().decode().splitlines()
             if line and not line.startswith("#")}
    assert names == meter_series()


def test_the_meter_says_when_it_started(tmp_path: Path) -> None:
    """A meter restarted in place (its container, the pod kept) began its client-side
    histograms again at 0: its start moved is how a trial window tells it."""
    import re
    import time

    before = time.time()
    meter, _ = streamed(tmp_path)
    said = re.search(rb"^slopilot_meter_start_time_seconds (\S+)$", meter.render(), re.M)
    assert said is not None and before <= float(said.group(1)) <= time.time()
