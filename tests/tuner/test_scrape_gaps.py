"""The direct scrape's increases when a scrape is missed, a replica restarts, comes or
goes within the window: what ``increase()`` reads of the same samples, no replica's
lifetime read as the window's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.prometheus.rules import RuleOptions

DEMO = load_scenario("demo")
TIMEOUT, BUSY = "timeout", "503"
Answer = bytes | str


def page(finished: int, slow: int = 0, *, preempted: int = 0, waiting: int = 0) -> bytes:
    """One replica's counters: ``finished`` P1 requests, each 100 tokens in 10 decode
    steps, ``slow`` of them with a 1 s first token and the rest 50 ms; its preemptions
    and its queue."""
    fast = finished - slow
    return "".join([
        f'vllm:e2e_request_latency_seconds_count{{priority_class="p1"}} {finished}\n',
        f'vllm:request_generation_tokens_sum{{priority_class="p1"}} {100 * finished}\n',
        f'vllm:time_to_first_token_seconds_bucket{{priority_class="p1",le="0.1"}} {fast}\n',
        f'vllm:time_to_first_token_seconds_bucket{{priority_class="p1",le="2.0"}} '
        f'{finished}\n',
        f'vllm:time_to_first_token_seconds_bucket{{priority_class="p1",le="+Inf"}} '
        f'{finished}\n',
        f'vllm:request_prompt_tokens_count{{priority_class="p1"}} {finished}\n',
        f'slopilot_iteration_seconds_count{{kind="decode"}} {10 * finished}\n',
        f'slopilot_iteration_seconds_sum{{kind="decode"}} {0.1 * finished}\n',
        f"vllm:num_preemptions_total {preempted}\n",
        f"vllm:num_requests_running 4\nvllm:num_requests_waiting {waiting}\n",
    ]).encode()


class Replicas:
    """Each replica's answers to its scrapes in turn, by host: a page, a timeout (a busy
    replica) or an error status."""

    def __init__(self, answers: dict[str, list[Answer]]) -> None:
        self.answers: dict[str, Iterator[Answer]] = {h: iter(a) for h, a in answers.items()}

    def handle(self, request: httpx.Request) -> httpx.Response:
        answer = next(self.answers[request.url.host])
        if answer == TIMEOUT:
            raise httpx.ReadTimeout("the replica is busy", request=request)
        if answer == BUSY:
            return httpx.Response(503, text="Service Unavailable")
        assert isinstance(answer, bytes)
        return httpx.Response(200, content=answer)


def scraped(listed: list[tuple[float, list[str]]], answers: dict[str, list[Answer]]
            ) -> DirectScrape:
    """A scrape polled at each time of ``listed`` with the replicas then deployed."""
    urls: list[str] = []
    client = httpx.Client(transport=httpx.MockTransport(Replicas(answers).handle))
    scrape = DirectScrape(lambda: [f"http://{h}" for h in urls], DEMO.slo, RuleOptions(),
                          min_requests=1, client=client)
    for t, hosts in listed:
        urls[:] = hosts
        scrape.poll(now=t)
    return scrape


def window(scrape: DirectScrape) -> WindowSummary:
    return scrape.measure(100.0, 160.0, canary=False)


def test_a_replica_that_missed_the_windows_first_scrape_counts_from_its_next() -> None:
    # 1,000 requests before the window, 500 of them slow; 30 fast ones in it. The scrape
    # at the window's start timed out: read from zero, the window held 1,030 requests
    # and a 2 s P99; from the scrape before it, 35; from its next scrape on, 25.
    s = scraped([(90.0, ["a"]), (100.0, ["a"]), (110.0, ["a"]), (160.0, ["a"])],
                {"a": [page(995, 500), TIMEOUT, page(1005, 500), page(1030, 500)]})
    got = window(s)
    assert got.classes[Priority.P1].requests_finished == 25
    assert got.classes[Priority.P1].ttft_p99_ms < 100
    assert s.workload(100.0, 160.0).finished == {"p1": 25}
    assert [(i.kind, i.iterations) for i in s.iterations(100.0, 160.0)] == [("decode", 250)]
    s.stop()


def test_a_replica_that_missed_the_windows_last_scrape_counts_to_its_last_answer() -> None:
    s = scraped([(100.0, ["a", "b"]), (150.0, ["a", "b"]), (160.0, ["a", "b"])],
                {"a": [page(1000), page(1020), TIMEOUT], "b": [page(0), page(5), page(10)]})
    assert window(s).classes[Priority.P1].requests_finished == 30
    s.stop()


def test_a_replica_gone_within_the_window_counts_what_it_served_in_it() -> None:
    s = scraped([(100.0, ["a", "b"]), (130.0, ["a", "b"]), (160.0, ["b"])],
                {"a": [page(1000), page(1015)], "b": [page(0), page(5), page(10)]})
    assert window(s).classes[Priority.P1].requests_finished == 25
    s.stop()


def test_a_replica_new_within_the_window_counts_from_zero() -> None:
    s = scraped([(100.0, ["a"]), (130.0, ["a", "b"]), (160.0, ["a", "b"])],
                {"a": [page(1000), page(1005), page(1010)], "b": [page(4), page(12)]})
    assert window(s).classes[Priority.P1].requests_finished == 22
    s.stop()


def test_a_replica_restarted_within_the_window_counts_both_lives() -> None:
    # 20 fast requests, then a restart, then 8, 4 of them slow. A series that fell is a
    # restart for the whole replica: its preemptions (2 before, 5 since) count 5, not
    # the 3 by which that one series rose; and no life is clamped away.
    s = scraped([(100.0, ["a"]), (130.0, ["a"]), (160.0, ["a"])],
                {"a": [page(1000, preempted=2), page(1020, preempted=2),
                       page(8, 4, preempted=5)]})
    got = window(s)
    assert got.classes[Priority.P1].requests_finished == 28
    assert got.preemptions_per_min == pytest.approx(5.0)
    assert got.classes[Priority.P1].ttft_p99_ms > 100  # 4 of 28 slow
    s.stop()


def test_the_queue_growth_of_a_replica_that_missed_the_first_scrape_is_its_change() -> None:
    # Its queue grew from 10 to 12 in the window; read from zero it grew by 16.
    s = scraped([(90.0, ["a"]), (100.0, ["a"]), (110.0, ["a"]), (160.0, ["a"])],
                {"a": [page(995, waiting=9), TIMEOUT, page(1005, waiting=10),
                       page(1030, waiting=12)]})
    assert s.workload(100.0, 160.0).queue_growth == 2
    s.stop()


def test_an_error_page_is_a_missed_scrape_not_a_stopped_scrape() -> None:
    # Parsed as metrics, a 503's body raised out of poll and ended the scrape's thread.
    s = scraped([(100.0, ["a"]), (110.0, ["a"]), (160.0, ["a"])],
                {"a": [BUSY, page(1005), page(1030)]})
    assert window(s).classes[Priority.P1].requests_finished == 25
    s.stop()
