"""The direct scrape reads a stall and a replica it cannot scrape as the rules do.

Where no Prometheus runs (the demo), ``SummaryAlerts`` evaluates the alert table on the
direct scrape's windows: a request whose client left before its first token is a first
token never given in the TTFT P99 (``rules.bucket_rates``), a replica with requests in
flight that made no token is a stalled one, and a replica whose last scrape failed is a
target down, so the same alerts fire as from the rules (``test_stall_alerts``).
"""

from __future__ import annotations

import httpx

from slopilot.engine.metric_names import ABANDONED, AWAITING
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.prometheus.alerts import SummaryAlerts
from slopilot.tuner.prometheus.rules import RuleOptions

DEMO = load_scenario("demo")
TTFT = "vllm:time_to_first_token_seconds_bucket"
TIMEOUT = "timeout"


def page(served: int, abandoned: int, tokens: int, waiting: int) -> bytes:
    """One replica: ``served`` P1 first tokens, all in (0.1, 5] s; ``abandoned`` P1 clients
    gone before theirs; ``tokens`` made; ``waiting`` requests queued."""
    return "".join([
        f'vllm:e2e_request_latency_seconds_count{{priority_class="p1"}} '
        f'{served + abandoned}\n',
        f'{TTFT}{{priority_class="p1",le="0.1"}} 0\n',
        f'{TTFT}{{priority_class="p1",le="5.0"}} {served}\n',
        f'{TTFT}{{priority_class="p1",le="+Inf"}} {served}\n',
        f'{ABANDONED}{{priority_class="p1"}} {abandoned}\n',
        f"vllm:generation_tokens_total {tokens}\n",
        f"vllm:num_requests_running 8\nvllm:num_requests_waiting {waiting}\n",
    ]).encode()


class Replicas:
    def __init__(self, answers: dict[str, list[bytes | str]]) -> None:
        self.answers = {h: iter(a) for h, a in answers.items()}

    def handle(self, request: httpx.Request) -> httpx.Response:
        answer = next(self.answers[request.url.host])
        if answer == TIMEOUT:
            raise httpx.ReadTimeout("the replica is busy", request=request)
        assert isinstance(answer, bytes)
        return httpx.Response(200, content=answer)


def scraped(times: list[float], answers: dict[str, list[bytes | str]],
            options: RuleOptions) -> DirectScrape:
    client = httpx.Client(transport=httpx.MockTransport(Replicas(answers).handle))
    scrape = DirectScrape(lambda: [f"http://{h}" for h in answers], DEMO.slo, options,
                          min_requests=1, client=client)
    for t in times:
        scrape.poll(now=t)
    return scrape


def test_a_stall_reads_as_first_tokens_never_given_and_a_stalled_replica() -> None:
    # Served until 100 s; from then no first token and no token at all, 400 wait, and
    # 60 clients give up. A healthy replica beside it keeps serving.
    opts = RuleOptions(alert_for_s=0)
    scrape = scraped([100.0, 160.0], {
        "stuck": [page(600, 0, 60_000, 0), page(600, 60, 60_000, 400)],
        "fine": [page(600, 0, 60_000, 0), page(600, 0, 66_000, 2)]}, opts)
    s = scrape.measure(100.0, 160.0, canary=False)
    # 60 never given, none served in the window: the P99 is the highest finite edge.
    assert s.classes[Priority.P1].ttft_p99_ms == 5000.0
    assert (s.stalled_replicas, s.targets_down) == (1, 0)
    fired = {(a.name, a.severity, a.action.value)
             for a in SummaryAlerts(DEMO.slo, opts).evaluate(s, 160.0)}
    assert {("SlopilotTTFTP99High", "critical", "retune"),
            ("SlopilotEngineStalled", "critical", "hold")} <= fired
    assert ("SlopilotTargetsDown", "critical", "hold") not in fired


def test_a_replica_whose_last_scrape_failed_is_a_target_down() -> None:
    opts = RuleOptions(alert_for_s=0)
    scrape = scraped([100.0, 160.0], {
        "a": [page(600, 0, 60_000, 0), page(660, 0, 66_000, 0)],
        "b": [page(600, 0, 60_000, 0), TIMEOUT]}, opts)
    s = scrape.measure(100.0, 160.0, canary=False)
    assert (s.stalled_replicas, s.targets_down) == (0, 1)
    alerts = SummaryAlerts(DEMO.slo, opts)
    # Not at once: a target down waits two rate windows at least, whatever alert_for_s
    # (a scrape or two missed by a busy machine is no outage).
    assert "SlopilotTargetsDown" not in {a.name for a in alerts.evaluate(s, 160.0)}
    fired = {a.name for a in alerts.evaluate(s, 160.0 + 2 * opts.rate_window_s)}
    assert "SlopilotTargetsDown" in fired and "SlopilotEngineStalled" not in fired


def test_no_replica_left_is_a_target_down() -> None:
    scrape = DirectScrape(lambda: [], DEMO.slo, RuleOptions(), min_requests=0,
                          client=httpx.Client(transport=httpx.MockTransport(
                              lambda r: httpx.Response(500))))
    for t in (100.0, 160.0):
        scrape.poll(now=t)
    assert scrape.measure(100.0, 160.0, canary=False).targets_down == 1


def test_clients_gone_within_their_target_are_no_first_tokens_never_given() -> None:
    # As the rules read them: 60 P1 clients left within their TTFT target (their count
    # under within_ttft_target="true"), 1 of 61 past it; 600 served within 5 s.
    def within(served: int, early: int, late: int) -> bytes:
        return page(served, late, 60_000 + served * 10, 0).replace(
            f'{ABANDONED}{{priority_class="p1"}}'.encode(),
            f'{ABANDONED}{{priority_class="p1",within_ttft_target="true"}} {early}\n'
            f'{ABANDONED}{{priority_class="p1",within_ttft_target="false"}}'.encode())
    scrape = scraped([100.0, 160.0], {"one": [within(0, 0, 0), within(600, 60, 1)]},
                     RuleOptions(alert_for_s=0))
    s = scrape.measure(100.0, 160.0, canary=False)
    # Rank 0.99 x 601 of 600 within (0.1, 5] s, not among the one never given.
    p99 = s.classes[Priority.P1].ttft_p99_ms
    assert p99 is not None and p99 < 5000.0


def _starving(served: int, past: int, within: int) -> bytes:
    """A replica serving P0 (``served`` first tokens and requests finished, all under
    100 ms), with P1 given none: ``past`` P1 streams waiting past their TTFT target,
    ``within`` within it (``AWAITING``)."""
    return "".join([
        f'vllm:e2e_request_latency_seconds_count{{priority_class="p0"}} {served}\n',
        f'{TTFT}{{priority_class="p0",le="0.1"}} {served}\n',
        f'{TTFT}{{priority_class="p0",le="+Inf"}} {served}\n',
        f'{TTFT}{{priority_class="p1",le="0.1"}} 0\n',
        f'{TTFT}{{priority_class="p1",le="5.0"}} 0\n',
        f'{TTFT}{{priority_class="p1",le="+Inf"}} 0\n',
        f'{AWAITING}{{priority_class="p1",within_ttft_target="false"}} {past}\n',
        f'{AWAITING}{{priority_class="p1",within_ttft_target="true"}} {within}\n',
        "vllm:generation_tokens_total 0\n",
        "vllm:num_requests_running 8\nvllm:num_requests_waiting 0\n",
    ]).encode()


def test_a_class_starved_of_first_tokens_reads_its_waiters_past_target_as_misses() -> None:
    # P1 had no first token in the window; at its end 40 of its clients have waited past
    # its target and 5 within it: as the rules read the gauge's last scrape, the 40 are
    # first tokens never given (its P99 the top edge), and all 45 are waiting.
    scrape = scraped([100.0, 160.0], {"a": [_starving(100, 0, 3), _starving(400, 40, 5)]},
                     RuleOptions())
    p1 = scrape.measure(100.0, 160.0, canary=False).classes[Priority.P1]
    assert (p1.ttft_p99_ms, p1.ttft_samples, p1.requests_awaiting) == (5000.0, 40.0, 45.0)
