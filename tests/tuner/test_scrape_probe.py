"""The demo's workload probe without Prometheus: the live workload from the direct scrape,
profiled as ``PrometheusProbe`` profiles it from PromQL."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.local.scrape_probe import ScrapeProbe
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.ports import refused_port
from tests.support.prometheus import serve_metrics
from tests.support.served_workload import Pages, finish, phase, prompt_mean, serve, start

DEMO = load_scenario("demo")


def _page(pages: Pages) -> bytes:
    return pages.page


@contextmanager
def scraping(*pages: Pages) -> Iterator[DirectScrape]:
    """A direct scrape of one replica per ``pages``, each serving its page as taken."""
    with contextlib.ExitStack() as stack:
        urls = [f"http://{stack.enter_context(serve_metrics(functools.partial(_page, p)))}"
                for p in pages]
        scrape = DirectScrape(lambda: urls, DEMO.slo, RuleOptions(), min_requests=1)
        try:
            yield scrape
        finally:
            scrape.stop()


def test_the_probe_measures_the_windows_prompts_not_the_base_scenarios() -> None:
    """After the demo's shift the twin check compares the window's P99s with the twin's:
    on the base scenario's first seconds it simulated ~512-token prompts against a
    window of ~2048-token ones."""
    metrics, pages = EngineMetrics("demo"), Pages()
    serve(metrics, 300, 512)  # before the window: the old workload
    with scraping(pages) as scrape:
        pages.take(metrics)
        scrape.poll(now=100.0)
        serve(metrics, 40, 2048, classes=(Priority.P0, Priority.P0, Priority.P1), seed=1)
        metrics.count_refused(Priority.P1, None)
        metrics.count_refused(Priority.P1, None)
        metrics.num_running, metrics.num_waiting = 3, 5
        pages.take(metrics)
        scrape.poll(now=110.0)
        probe = ScrapeProbe(scrape, DEMO, window_s=10, duration_s=30.0)
        measured = probe.measure(110.0)
    assert measured is not DEMO
    assert measured.duration_s == 30.0
    assert (measured.gpu, measured.model, measured.slo) == (DEMO.gpu, DEMO.model, DEMO.slo)
    assert prompt_mean(measured) == pytest.approx(2048, rel=0.25)
    # 40 finished, 2 turned away and 8 more in the engine than at the window's start.
    assert phase(measured).arrivals.mean_rate == pytest.approx((40 + 2 + 8) / 10)
    mix = phase(measured).classes
    assert mix.shares[Priority.P0] == pytest.approx(27 / 42, abs=1e-3)
    assert mix.shares[Priority.P1] == pytest.approx(15 / 42, abs=1e-3)


def test_a_quiet_window_plans_for_the_base_scenario() -> None:
    metrics, pages = EngineMetrics("demo"), Pages()
    serve(metrics, 300, 2048)
    with scraping(pages) as scrape:
        pages.take(metrics)
        scrape.poll(now=100.0)
        serve(metrics, 5, 2048)  # under the probe's 10
        pages.take(metrics)
        scrape.poll(now=110.0)
        probe = ScrapeProbe(scrape, DEMO, window_s=10)
        assert probe.measure(110.0) is DEMO
        # A window reaching back before the first scrape holds too little to profile.
        assert ScrapeProbe(scrape, DEMO, window_s=60).measure(110.0) is DEMO


@pytest.mark.parametrize(("extra", "message"), [
    (b'vllm:request_prompt_tokens_sum{priority_class="p1"} +Inf\n', "_sum read inf"),
    (b"vllm:num_requests_waiting +Inf\n", "queue's growth read inf"),
    # The queue grew by 1e12 in 10 s: 1e11 requests a second for the twin to simulate.
    (b"vllm:num_requests_waiting 1e12\n", r"1e\+11 requests a second"),
])
def test_a_workload_no_engine_can_export_plans_for_the_base(
        extra: bytes, message: str, caplog: pytest.LogCaptureFixture) -> None:
    """The same checks as from PromQL: a hostile /metrics is no profile, not an error
    out of the probe (a rollback at each tick) nor a workload the twin cannot run."""
    metrics, pages = EngineMetrics("demo"), Pages()
    with scraping(pages) as scrape:
        pages.take(metrics)
        scrape.poll(now=100.0)
        serve(metrics, 40, 2048)
        pages.take(metrics, extra)
        scrape.poll(now=110.0)
        with caplog.at_level(logging.WARNING):
            assert ScrapeProbe(scrape, DEMO, window_s=10).measure(110.0) is DEMO
    assert any(("not profiled" in r.getMessage() and "/metrics" in r.getMessage()
                and re.search(message, r.getMessage()))
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_no_replica_answering_is_no_evidence_not_a_quiet_deployment() -> None:
    """As ``PrometheusProbe`` with no series: the designed load is no plan for a
    deployment whose metrics stopped reaching the scrape."""
    scrape = DirectScrape(lambda: [f"http://127.0.0.1:{refused_port()}"], DEMO.slo,
                          RuleOptions())
    try:
        scrape.poll(now=100.0)
        scrape.poll(now=110.0)
        with pytest.raises(PrometheusUnavailable, match="no replica answered"):
            ScrapeProbe(scrape, DEMO, window_s=10).measure(110.0)
    finally:
        scrape.stop()


@pytest.mark.parametrize(("kw", "message"), [
    ({"window_s": 1}, "window_s=1"), ({"window_s": 2.5}, "window_s=2.5"),
    ({"duration_s": 0}, "duration_s=0")])
def test_bad_probe_settings_say_what_to_fix(kw: dict[str, float], message: str) -> None:
    scrape = DirectScrape(lambda: [], DEMO.slo, RuleOptions())
    with pytest.raises(ValueError, match=message):
        ScrapeProbe(scrape, DEMO, **kw)  # type: ignore[arg-type]


def test_right_after_a_shift_the_probe_measures_the_prompts_that_started() -> None:
    """The requests that finished in the window right after a shift to long prompts are
    the old ones; those that got their first token in it are the new ones, and they are
    what the twin check holds against the window's P99s."""
    metrics, pages = EngineMetrics("demo"), Pages()
    old = start(metrics, 40, 512)
    with scraping(pages) as scrape:
        pages.take(metrics)
        scrape.poll(now=100.0)
        finish(metrics, old)  # the old prompts end in the window ...
        start(metrics, 40, 2048, seed=1)  # ... while the new ones start, still running
        metrics.num_running = 40
        pages.take(metrics)
        scrape.poll(now=110.0)
        measured = ScrapeProbe(scrape, DEMO, window_s=10, duration_s=30.0).measure(110.0)
    assert prompt_mean(measured) == pytest.approx(2048, rel=0.25)


ARRIVALS = "slopilot_meter_arrivals_total"
INVALID = "slopilot_meter_invalid_total"


def _arrived(count: int, invalid: int | None = None) -> bytes:
    """A meter's counts of p0 arrivals, and of those refused as invalid (None: a meter
    of an image that counts no such thing)."""
    labels = '{model_name="m",priority_class="p0"}'
    return (f"{ARRIVALS}{labels} {count}\n" +
            (f"{INVALID}{labels} {invalid}\n" if invalid is not None else "")).encode()


def test_a_replica_whose_meter_counts_its_arrivals_is_read_by_them() -> None:
    """vLLM counts a request whose client gave up in none of its series, and the meter in
    front of it counts each as it arrives: replica a's meter saw 55 arrive where its
    engine finished 40 (and turned 2 away, counted by the meter as they came: not
    again); replica b has no meter's count, and is estimated as before (20 finished, 1
    turned away, its queue 4 longer)."""
    metered, plain = EngineMetrics("demo"), EngineMetrics("demo")
    a, b = Pages(), Pages()
    with scraping(a, b) as scrape:
        a.take(metered, _arrived(0))
        b.take(plain)
        scrape.poll(now=100.0)
        serve(metered, 40, 2048, classes=(Priority.P0,))
        metered.count_refused(Priority.P0, None)
        metered.count_refused(Priority.P0, None)
        metered.num_running = 3
        serve(plain, 20, 2048, classes=(Priority.P1,), seed=1)
        plain.count_refused(Priority.P1, None)
        plain.num_running = 4
        a.take(metered, _arrived(55))
        b.take(plain)
        scrape.poll(now=110.0)
        measured = ScrapeProbe(scrape, DEMO, window_s=10, duration_s=30.0).measure(110.0)
    assert phase(measured).arrivals.mean_rate == pytest.approx((55 + 20 + 1 + 4) / 10)
    mix = phase(measured).classes
    assert mix.shares[Priority.P0] == pytest.approx(55 / 76, abs=1e-3)
    assert mix.shares[Priority.P1] == pytest.approx(21 / 76, abs=1e-3)


def test_a_flood_of_requests_refused_as_invalid_is_no_load() -> None:
    """A client retries a prompt past the context in a loop, each answered 400 at once:
    replica a's meter counts 500 of them as they came (and as invalid once answered)
    besides the 55 its engine took on (of which it finished 40, turned 2 away for load,
    and holds 3 more than at the window's start: counted as they came). The load is the
    55. Replica b's meter took on nothing in the
    window, and a request that came before it was answered 400 inside it: its 3 invalid
    are none of a's arrivals (each replica's own, not below 0)."""
    engine, idle = EngineMetrics("demo"), EngineMetrics("demo")
    a, b = Pages(), Pages()
    with scraping(a, b) as scrape:
        a.take(engine, _arrived(0, 0))
        b.take(idle, _arrived(7, 0))
        scrape.poll(now=100.0)
        serve(engine, 40, 2048, classes=(Priority.P0,))
        engine.count_refused(Priority.P0, None)
        engine.count_refused(Priority.P0, None)
        engine.num_running = 3
        a.take(engine, _arrived(555, 500))
        b.take(idle, _arrived(7, 3))
        scrape.poll(now=110.0)
        measured = ScrapeProbe(scrape, DEMO, window_s=10, duration_s=30.0).measure(110.0)
    assert phase(measured).arrivals.mean_rate == pytest.approx(55 / 10)
