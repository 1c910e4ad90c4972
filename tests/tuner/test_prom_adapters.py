"""PrometheusWindows and PrometheusProbe over recorded answers, and query_at on a dead port;
the live path is in test_closed_loop_prometheus. Also the direct-scrape quantile."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.window_summary import Window, WindowSummary
from slopilot.tuner.local.scrape import DirectScrape, quantile
from slopilot.tuner.prometheus.adapters import PrometheusProbe, PrometheusWindows
from slopilot.tuner.prometheus.alerts import SummaryAlerts
from slopilot.tuner.prometheus.latency_sources import VLLM_LATENCY
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.rules import RuleOptions, duration
from slopilot.tuner.study.evaluator import (
    PrometheusUnavailable,
    ReplicaRestarted,
    WindowRejected,
)
from slopilot.tuner.study.sample_floor import shortfall
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.ports import refused_port
from tests.support.prometheus import PrometheusBinaries, promtool, serve_metrics

DEMO = load_scenario("demo")


class Recorded:
    """Answers by the first matching fragment; records every (expr, time) asked."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.asked = answers, []  # type: ignore[var-annotated]

    def __call__(self, expr: str, at: float) -> list[dict[str, Any]]:
        self.asked.append((expr, at))
        for fragment, value in self.answers.items():
            if fragment in expr:
                v = value(at) if callable(value) else value
                if isinstance(v, list):  # whole series, labels and all
                    return v
                if isinstance(v, dict):
                    return [{"metric": {"priority_class": c}, "value": [at, str(x)]}
                            for c, x in v.items()]
                return [{"metric": {}, "value": [at, str(v)]}]
        return []


def answers(rate_now: float = 2.0, rate_before: float = 2.0, finished: float = 20.0
            ) -> dict[str, Any]:
    return {
        # The demo's P0 TTFT SLO (800 ms) lies inside the fixed (790, 860] ms: a replica
        # that does not export it is read judged (rules.judged_buckets), a copy beside
        # each replica's buckets, before the sum.
        "histogram_quantile(0.99, (sum by (le, priority_class) (rate(vllm:time_to_first":
            {"p0": 0.3, "p1": 0.5},
        "histogram_quantile(0.99, sum by (le, priority_class) (rate(vllm:inter_token":
            {"p0": 0.04, "p1": 0.05},
        "increase(vllm:e2e_request_latency_seconds_count": {"p0": finished / 2,
                                                           "p1": finished / 2},
        "sum(rate(vllm:e2e_request_latency_seconds_count":
            lambda at: rate_now if at == 100.0 else rate_before,
        "sum by (priority_class) (rate(vllm:request_generation_tokens_sum": {"p0": 30, "p1": 40},
        "histogram_quantile(0.99, (sum by (le) (rate(vllm:time_to_first": 0.45,
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token": 0.05,
        "vllm:num_preemptions_total": 0.0,
        # Each class's goodput rule (the only expressions that select an slo label).
        'priority_class="p0",slo=': 25.0,
        'priority_class="p1",slo=': 35.0,
    }


def windows(q: Recorded, **kw: Any) -> PrometheusWindows:
    return PrometheusWindows(q, {"slopilot_deployment": "d"}, DEMO.slo, min_requests=10, **kw)


def test_a_window_is_read_at_its_end_over_its_length() -> None:
    q = Recorded(answers())
    s = windows(q).measure(90.0, 100.0, canary=False)
    assert s.classes[Priority.P0].ttft_p99_ms == pytest.approx(300.0)
    assert s.classes[Priority.P1].tbt_p99_ms == pytest.approx(50.0)
    assert s.overall.ttft_p99_ms == pytest.approx(450.0)  # every class's histogram together
    assert s.classes[Priority.P2].ttft_p99_ms is None  # no P2 series: no samples
    assert (s.classes[Priority.P0].goodput_tok_s, s.classes[Priority.P1].goodput_tok_s) == \
        (25.0, 35.0)
    assert s.overall.requests_finished == 20 and s.duration_s == 10
    assert s.window == Window(90.0, 100.0, canary=False, bucketed=True)
    assert all("[10s]" in e for e, _ in q.asked if "[" in e)
    assert {t for _, t in q.asked} == {100.0, 90.0}  # the window, and the one before it
    assert all('instance_role="canary"' not in e for e, _ in q.asked)


def test_a_window_reads_the_replicas_busy_ratio_where_they_export_it() -> None:
    """The demo's report said "busy per replica not measured" while Prometheus scraped
    every replica's slopilot_busy_ratio; vLLM exports none, and its windows still say
    not measured."""
    from slopilot.engine.sim.summary_view import footer

    q = Recorded({"sum(sum_over_time(slopilot_busy_ratio": 0.55,
                  "max(avg_over_time(slopilot_busy_ratio": 0.7, **answers()})
    s = windows(q).measure(90.0, 100.0, canary=False)
    assert (s.busy_ratio, s.busy_ratio_max) == (0.55, 0.7)
    assert "busy per replica 55% mean, 70% max" in footer(s)[0]
    assert any("slopilot_busy_ratio{" in e and "[10s]" in e for e, _ in q.asked)
    vllm = windows(Recorded(answers())).measure(90.0, 100.0, canary=False)
    assert (vllm.busy_ratio, vllm.busy_ratio_max) == (None, None)
    assert "busy per replica not measured" in footer(vllm)[0]


def test_a_window_reads_the_requests_each_class_turned_away() -> None:
    from slopilot.engine.metric_names import REFUSED

    q = Recorded({f"sum by (priority_class) (increase({REFUSED}": {"p1": 30.0}, **answers()})
    s = windows(q).measure(90.0, 100.0, canary=False)
    assert s.classes[Priority.P1].requests_refused == 30.0
    assert s.classes[Priority.P0].requests_refused == 0.0
    assert s.overall.requests_refused == 30.0
    assert windows(Recorded(answers())).measure(90.0, 100.0, canary=False
                                               ).overall.requests_refused == 0.0  # vLLM


def test_a_window_reads_the_requests_each_class_left_waiting_for_a_first_token() -> None:
    """At the window's end, from the engine's gauge (within their target or past it): a
    class the config starves has clients waiting however few first tokens it served."""
    from slopilot.engine.metric_names import AWAITING

    q = Recorded({f'({AWAITING}{{slopilot_deployment="d"}})': {"p1": 111.0, "p0": 2.0},
                  **answers()})
    s = windows(q).measure(90.0, 100.0, canary=False)
    assert [s.classes[p].requests_awaiting for p in Priority] == [2.0, 111.0, None]
    assert s.overall.requests_awaiting == 113.0
    # An image from before the gauge: not read, not zero.
    old = windows(Recorded(answers())).measure(90.0, 100.0, canary=False)
    assert old.classes[Priority.P1].requests_awaiting is None


@pytest.mark.prometheus
def test_waiters_of_a_replica_gone_before_the_windows_end_are_not_read_as_misses(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Replica b (scaled down, evicted) had 30 P1 clients waiting past their target at
    its last scrape, then left (Prometheus marks its series stale): its clients retried
    on a, which served every first token within 50 ms. The window's end read b's last
    gauge over the whole window, and the P99 ranked its 30 as first tokens never given
    (a review: 300 s where every served one took 50 ms); as it is now at the end, b holds
    none."""
    from slopilot.engine.metric_names import AWAITING

    q = windows(Recorded({}))._exprs({"d": "x"}, 300)
    ttft = "vllm:time_to_first_token_seconds"

    def at(instance: str, **more: str) -> str:
        labels = {"d": "x", "instance": instance, "priority_class": "p1", **more}
        return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    series = [{"series": f"{ttft}_bucket{at('a', le=le)}", "values": "0+40x30"}
              for le in ("0.05", "0.5", "300.0", "+Inf")]
    series += [{"series": f"{ttft}_bucket{at('b', le=le)}", "values": "0+10x15 stale"}
               for le in ("0.05", "0.5", "300.0", "+Inf")]
    series += [{"series": f"{AWAITING}{at('a', within_ttft_target=w)}", "values": "0x30"}
               for w in ("true", "false")]
    series += [{"series": f"{AWAITING}{at('b', within_ttft_target='false')}",
                "values": "0x10 30x5 stale"},
               {"series": f"{AWAITING}{at('b', within_ttft_target='true')}",
                "values": "0x15 stale"}]
    p99 = q["slopilot:ttft_seconds:p99"][None]
    test = {"evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series, "promql_expr_test": [
            {"expr": f"round({p99}, 0.0001)", "eval_time": "7m30s",
             "exp_samples": [{"labels": '{priority_class="p1"}', "value": 0.0495}]},
            {"expr": q["awaiting"][None], "eval_time": "7m30s",
             "exp_samples": [{"labels": '{priority_class="p1"}', "value": 0}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_canary_window_selects_the_canary_series() -> None:
    q = Recorded(answers())
    windows(q).measure(90.0, 100.0, canary=True)
    assert all('instance_role="canary"' in e for e, _ in q.asked if "{" in e)
    with pytest.raises(WindowRejected, match="no canary"):
        windows(q, canary_labels=dict).measure(90.0, 100.0, canary=True)


@pytest.mark.parametrize(("kw", "message"), [
    ({"finished": 4}, "only 4 requests finished"),
    ({"rate_now": 4.0, "rate_before": 2.0}, "request rate moved from 2/s to 4/s"),
])
def test_windows_that_do_not_count_are_rejected(kw: dict[str, float], message: str) -> None:
    with pytest.raises(WindowRejected, match=message):
        windows(Recorded(answers(**kw))).measure(90.0, 100.0, canary=False)


@pytest.mark.parametrize(("before", "now", "shifted"), [
    (2.0, 3.8, True), (2.0, 1.0, True),  # 1.9x up, 2x down: both are shifts
    (2.0, 2.8, False), (2.8, 2.0, False),  # 1.4x either way: the same load
    (2.0, 3.0, False), (3.0, 2.0, False),  # 1.5x either way: the tolerance's edge
])
def test_the_load_shift_check_is_the_same_ratio_either_way(before: float, now: float,
                                                            shifted: bool) -> None:
    # A fall flatters a trial as much as a rise condemns it: at half the load a config
    # "holds" and would be committed for the whole load.
    measure = windows(Recorded(answers(rate_now=now, rate_before=before))).measure
    if shifted:
        with pytest.raises(WindowRejected, match="request rate moved"):
            measure(90.0, 100.0, canary=False)
    else:
        assert measure(90.0, 100.0, canary=False).request_rate == now


def scraped_without_series(*instances: str) -> dict[str, Any]:
    """Prometheus's answer naming the targets it scraped (``up``) in the window that have
    no engine series in it."""
    return {"max_over_time(up{": [{"metric": {"instance": i}, "value": [100.0, "0"]}
                                  for i in instances]}


def test_a_window_missing_a_replicas_series_is_not_the_deployments() -> None:
    # Three replicas serve the trial; one's scrapes time out under it, so its series are
    # absent. What the other two report is 2/s against 3/s before, inside the load
    # tolerance: judged as the deployment's, the window of two replicas was committed.
    q = Recorded({**scraped_without_series("10.0.0.3:8000"),
                  **answers(rate_now=2.0, rate_before=3.0)})
    with pytest.raises(WindowRejected, match=r"10\.0\.0\.3:8000.*no series"):
        windows(q).measure(90.0, 100.0, canary=False)
    missing = next(e for e, _ in q.asked if "up{" in e)
    assert 'up{slopilot_deployment="d"}[10s]' in missing
    assert "vllm:num_requests_running" in missing  # both backends export it, idle or not
    # Every target reported: the same window is measured.
    assert windows(Recorded(answers(rate_now=2.0, rate_before=3.0))).measure(
        90.0, 100.0, canary=False).request_rate == 2.0


def test_a_canary_window_whose_canary_reported_nothing_is_rejected() -> None:
    q = Recorded({**scraped_without_series("127.0.0.1:9000"), **answers()})
    with pytest.raises(WindowRejected, match="canary"):
        windows(q).measure(90.0, 100.0, canary=True)
    assert 'instance_role="canary"' in next(e for e, _ in q.asked if "up{" in e)


def test_an_idle_window_before_is_not_a_load_shift() -> None:
    s = windows(Recorded(answers(rate_before=0.0))).measure(90.0, 100.0, canary=False)
    assert s.request_rate == 2.0


def test_bad_settings_and_short_windows_say_what_to_fix() -> None:
    q = Recorded({})
    with pytest.raises(ValueError, match="selector is empty"):
        PrometheusWindows(q, {}, DEMO.slo)
    with pytest.raises(ValueError, match="min_requests=0"):
        PrometheusWindows(q, {"a": "b"}, DEMO.slo, min_requests=0)
    with pytest.raises(ValueError, match="load_tolerance=0"):
        PrometheusWindows(q, {"a": "b"}, DEMO.slo, load_tolerance=0)
    with pytest.raises(WindowRejected, match="shorter than 2 s"):
        windows(q).measure(99.5, 100.0, canary=False)
    with pytest.raises(ValueError, match=r"expected an http\(s\) URL"):
        query_at("localhost:9090")


def test_an_unreachable_prometheus_is_reported_as_unavailable() -> None:
    dead = query_at(f"http://127.0.0.1:{refused_port()}", timeout_s=1)
    with pytest.raises(PrometheusUnavailable, match="cannot reach Prometheus"):
        PrometheusWindows(dead, {"a": "b"}, DEMO.slo).measure(90.0, 100.0, canary=False)


def test_the_probe_falls_back_to_the_base_scenario_without_traffic() -> None:
    # The engines report (the gauge both backends export, idle or not), nothing finished.
    engines = {"vllm:num_requests_running": [{"metric": {"instance": "a"},
                                              "value": [100.0, "0"]}]}
    probe = PrometheusProbe(Recorded(engines), {"a": "b"}, DEMO, window_s=10)
    assert probe.measure(100.0) is DEMO


def test_the_probe_refuses_to_plan_for_a_deployment_whose_series_are_gone() -> None:
    """No series of the deployment's engines at all is not a quiet deployment: the
    scrape broke (a relabelling, a NetworkPolicy, a restarted Prometheus without its
    data). Read as quiet, the probe handed the designed load to the capacity search, and
    after scale_down_after_s the loop scaled a busy deployment down on no evidence."""
    q = Recorded({})
    probe = PrometheusProbe(q, {"a": "b"}, DEMO, window_s=10)
    with pytest.raises(PrometheusUnavailable, match=r"no series of the deployment's engines "
                                                    r"in the last 10s"):
        probe.measure(100.0)
    assert any('vllm:num_requests_running{a="b"}[10s]' in e for e, _ in q.asked)


def test_direct_scrape_quantile_interpolates_like_histogram_quantile() -> None:
    # 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.2], 10 in (0.2, 0.4].
    buckets = {0.1: 50.0, 0.2: 90.0, 0.4: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.99, buckets) == pytest.approx(0.2 + 0.2 * 0.9)
    assert math.isnan(quantile(0.99, {math.inf: 0.0}))


def test_direct_scrape_reads_the_figures_the_batching_and_prefix_alerts_need() -> None:
    # Tokens made in the window: 150 waiting on an engine that still runs is no stall.
    pages = iter([
        "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n"
        "slopilot_busy_ratio 0.9\nvllm:num_requests_waiting 3\n"
        "vllm:generation_tokens_total 0\n"
        "vllm:e2e_request_latency_seconds_count{priority_class=\"p1\"} 0\n",
        "vllm:prefix_cache_hits_total 80\nvllm:prefix_cache_queries_total 100\n"
        "slopilot_busy_ratio 0.4\nvllm:num_requests_waiting 150\n"
        "vllm:generation_tokens_total 600\n"
        "vllm:e2e_request_latency_seconds_count{priority_class=\"p1\"} 12\n",
    ])
    with serve_metrics(lambda: next(pages).encode()) as address:
        scrape = DirectScrape(lambda: [f"http://{address}"], DEMO.slo,
                              RuleOptions(interval_s=10, alert_for_s=0), min_requests=1)
        scrape.poll(now=100.0)
        scrape.poll(now=110.0)
        s = scrape.measure(100.0, 110.0, canary=False)
        assert s.prefix_cache_hit_ratio == pytest.approx(0.8)
        assert (s.busy_ratio, s.busy_ratio_max, s.requests_waiting) == (0.4, 0.4, 150.0)
        scrape.stop()
    fired = SummaryAlerts(DEMO.slo, RuleOptions(alert_for_s=0)).evaluate(s, 110.0)
    assert {a.name for a in fired} == {"SlopilotBatchingUnderused"}


def test_direct_scrape_counts_the_windows_requests_not_the_replicas_lifetime() -> None:
    # 1,000 requests and 500 preemptions before the window, 10 requests and none in it:
    # a client of the window's requests counts 10, and no preemption storm.
    pages = ["vllm:e2e_request_latency_seconds_count{priority_class=\"p1\"} 1000\n"
             "vllm:request_generation_tokens_sum{priority_class=\"p1\"} 50000\n"
             "vllm:num_preemptions_total 500\n",
             "vllm:e2e_request_latency_seconds_count{priority_class=\"p1\"} 1010\n"
             "vllm:request_generation_tokens_sum{priority_class=\"p1\"} 50600\n"
             "vllm:num_preemptions_total 500\n"]
    s = _scraped([page.encode() for page in pages], end=160.0)
    assert s.classes[Priority.P1].requests_finished == 10
    assert s.classes[Priority.P1].throughput_tok_s == pytest.approx(600 / 60)
    assert s.preemptions_per_min == 0


def _page(finished: int, slow_gaps: int) -> bytes:
    """One replica's e2e count and TBT histogram: every gap 10 ms, ``slow_gaps`` at 1 s
    (past the engine's 0.5 s edge: over P1's 300 ms, twice its SLO, for sure)."""
    fast = 100 * finished
    return "".join([
        f'vllm:e2e_request_latency_seconds_count{{priority_class="p1"}} {finished}\n',
        f'vllm:inter_token_latency_seconds_bucket{{priority_class="p1",le="0.01"}} {fast}\n',
        f'vllm:inter_token_latency_seconds_bucket{{priority_class="p1",le="0.5"}} {fast}\n',
        f'vllm:inter_token_latency_seconds_bucket{{priority_class="p1",le="1.0"}} '
        f'{fast + slow_gaps}\n',
        f'vllm:inter_token_latency_seconds_bucket{{priority_class="p1",le="+Inf"}} '
        f'{fast + slow_gaps}\n']).encode()


def test_a_replica_that_becomes_the_canary_counts_only_its_windows_requests() -> None:
    # Replica a served 1,000 requests before the window, with a burst of slow gaps, and
    # 10 fast ones in it; the deployment scales to two in the window (a becomes the
    # canary) and b serves 5. A client of the window's requests counts 15, all fast.
    a_pages = iter([_page(1000, 5000), _page(1010, 5000)])
    with serve_metrics(lambda: next(a_pages)) as a, \
            serve_metrics(lambda: _page(5, 0)) as b:
        urls = [f"http://{a}"]
        scrape = DirectScrape(lambda: list(urls), DEMO.slo, RuleOptions(), min_requests=1)
        scrape.poll(now=100.0)
        urls.append(f"http://{b}")
        scrape.poll(now=160.0)
        s = scrape.measure(100.0, 160.0, canary=False)
        canary = scrape.measure(100.0, 160.0, canary=True)
        scrape.stop()
    assert s.classes[Priority.P1].requests_finished == 15
    assert s.classes[Priority.P1].tbt_p99_ms == pytest.approx(9.9)
    assert canary.classes[Priority.P1].requests_finished == 10


def test_direct_scrape_alerts_read_a_window_with_few_finished_requests() -> None:
    # A stalled deployment: 150 requests wait, the engine is busy 40 % of the time, and
    # only 5 long requests finish in the minute, their gaps all 1 s. Prometheus' rules
    # have no request minimum: the batching and TBT alerts fire; so must the scrape's.
    pages = iter([_page(0, 0), _page(5, 500), _page(5, 500)])
    gauges = b"slopilot_busy_ratio 0.4\nvllm:num_requests_waiting 150\n"
    with serve_metrics(lambda: next(pages) + gauges) as address:
        scrape = DirectScrape(lambda: [f"http://{address}"], DEMO.slo,
                              RuleOptions(interval_s=30, alert_for_s=0, tbt_periods=1),
                              min_requests=8)
        for t in (100.0, 130.0, 160.0):
            scrape.poll(now=t)
        fired = scrape.firing(now=160.0)
        with pytest.raises(WindowRejected, match="only 5 requests"):
            scrape.measure(100.0, 160.0, canary=False)  # a trial's window still needs 8
        scrape.stop()
    assert {(a.name, a.priority_class) for a in fired} >= {
        ("SlopilotBatchingUnderused", "all"), ("SlopilotTBTP99High", "p1")}


def _judged_page(tokens: int, good: int, label: str, judged: int | None = None) -> bytes:
    """P1's tokens, every first token and 99 % of gaps fast (the rest past 0.5 s, over
    P1's SLO for sure), and the engine's verdicts: ``good``
    of the ``judged`` tokens (all ``tokens`` by default) from requests that met their
    SLO as judged under ``label``."""
    from slopilot.engine.verdicts import SLO_TOKENS

    judged = tokens if judged is None else judged
    return "".join([
        'vllm:e2e_request_latency_seconds_count{priority_class="p1"} 20\n',
        f'vllm:request_generation_tokens_sum{{priority_class="p1"}} {tokens}\n',
        'vllm:time_to_first_token_seconds_bucket{priority_class="p1",le="0.1"} 20\n',
        'vllm:time_to_first_token_seconds_bucket{priority_class="p1",le="+Inf"} 20\n',
        'vllm:inter_token_latency_seconds_bucket{priority_class="p1",le="0.01"} 990\n',
        'vllm:inter_token_latency_seconds_bucket{priority_class="p1",le="0.5"} 990\n',
        'vllm:inter_token_latency_seconds_bucket{priority_class="p1",le="1.0"} 1000\n',
        'vllm:inter_token_latency_seconds_bucket{priority_class="p1",le="+Inf"} 1000\n',
        f'{SLO_TOKENS}{{priority_class="p1",slo="{label}",met="true"}} {good}\n',
        f'{SLO_TOKENS}{{priority_class="p1",slo="{label}",met="false"}} {judged - good}\n',
    ]).encode()


def _scraped(pages: list[bytes], end: float = 110.0) -> WindowSummary:
    """The window [100, ``end``] of one replica whose /metrics answers ``pages`` in
    turn, read by the direct scrape."""
    answers = iter(pages)
    with serve_metrics(lambda: next(answers)) as address:
        scrape = DirectScrape(lambda: [f"http://{address}"], DEMO.slo, RuleOptions(),
                              min_requests=1)
        scrape.poll(now=100.0)
        scrape.poll(now=end)
        s = scrape.measure(100.0, end, canary=False)
        scrape.stop()
    return s


@pytest.mark.parametrize("current", [True, False], ids=["this-slo", "an-edited-slo"])
def test_direct_scrape_goodput_is_the_engines_per_request_verdicts(current: bool) -> None:
    """As the rules read them: the tokens of the requests judged to have met this SLO;
    verdicts under other objectives are not this SLO's, and the histograms' product
    (99 % of gaps fast: 99 % good) stands in."""
    label = DEMO.slo.p1.label if current else "ttft_p99_ms=1.0"
    s = _scraped([b"", _judged_page(1000, 400, label)])  # every series from zero
    p1 = s.classes[Priority.P1]
    assert p1.throughput_tok_s == pytest.approx(100.0)
    if current:
        assert p1.goodput_tok_s == pytest.approx(40.0)
    else:  # the product: 99 % of gaps within 10 ms, the rest past 0.5 s
        assert 99.0 <= p1.goodput_tok_s < 100.0


def test_direct_scrape_counts_each_replica_by_its_verdicts_or_else_its_histograms() -> None:
    """As the rules do: a replica that does not judge under this SLO (yet) adds its
    histograms' product; it added nothing once another replica judged."""
    label = DEMO.slo.p1.label
    judged_pages = iter([b"", _judged_page(1000, 400, label)])
    with serve_metrics(lambda: next(judged_pages)) as a, \
            serve_metrics(lambda: _judged_page(1000, 0, "ttft_p99_ms=1.0")) as b:
        urls = [f"http://{a}", f"http://{b}"]
        scrape = DirectScrape(lambda: list(urls), DEMO.slo, RuleOptions(), min_requests=1)
        urls.pop()  # b appears within the window: it counts from zero
        scrape.poll(now=100.0)
        urls.append(f"http://{b}")
        scrape.poll(now=110.0)
        s = scrape.measure(100.0, 110.0, canary=False)
        scrape.stop()
    p1 = s.classes[Priority.P1]
    assert p1.throughput_tok_s == pytest.approx(200.0)
    assert 40.0 + 99.0 <= p1.goodput_tok_s < 40.0 + 100.0  # a's verdicts + b's product


def test_direct_scrape_goodput_of_a_replica_told_its_slo_inside_the_window() -> None:
    """As the rules read it: a replica told this SLO halfway through the window judged
    the 500 tokens of its last requests, 400 of them good, of the 1,000 it served. Its
    met tokens alone read 40 % good where its requests were 80 % good; its share of
    good tokens judged stands for the window's tokens."""
    s = _scraped([b'vllm:request_generation_tokens_sum{priority_class="p1"} 0\n',
                  _judged_page(1000, 400, DEMO.slo.p1.label, judged=500)])
    p1 = s.classes[Priority.P1]
    assert p1.throughput_tok_s == pytest.approx(100.0)
    assert p1.goodput_tok_s == pytest.approx(80.0)


def test_a_class_whose_goodput_reads_no_series_rejects_the_window() -> None:
    """P1 finished requests and tokens, and its goodput read no series at all (a vLLM
    image older than 0.11 exports its gaps as vllm:time_per_output_token_seconds, so the
    rule's product has no factor): the class's goodput read 0, and the trial scored, and
    status.sloAttainment showed, a config whose every request met its SLO as one that
    met none. The window does not count, and says which series it lacked."""
    recorded = answers()
    del recorded['priority_class="p1",slo=']
    q = Recorded(recorded)
    with pytest.raises(WindowRejected, match=r"p1 .*goodput.*vllm:inter_token_latency_seconds"):
        windows(q).measure(90.0, 100.0, canary=False)


@pytest.mark.parametrize(("fragment", "value", "named"), [
    ("sum by (priority_class) (rate(vllm:request_generation_tokens_sum", {"p0": "+Inf",
                                                                        "p1": 40}, "p0"),
    ('priority_class="p1",slo=', "+Inf", "p1"),
    ('priority_class="p0",slo=', -5.0, "p0"),
    ("histogram_quantile(0.99, sum by (le, priority_class) (rate(vllm:inter_token",
     {"p0": "-Inf", "p1": 0.05}, "p0"),
    ("increase(vllm:e2e_request_latency_seconds_count", {"p0": "+Inf", "p1": 10}, "p0"),
    ("vllm:num_preemptions_total", "+Inf", "preemptions"),
])
def test_a_figure_no_engine_can_export_rejects_the_window(fragment: str, value: Any,
                                                          named: str) -> None:
    """A pod's /metrics is its image's to write, and the deployment's series are read as
    it wrote them: an infinite or negative rate (a broken or hostile exporter; no real
    engine's counters give one) made the window's summary raise SummaryError, which the
    loop took for a controller error (a traceback, the trial failed, a rollback, at every
    tick of steady state). The window does not count, and names the figure and class."""
    recorded = answers()
    recorded = {fragment: value, **{k: v for k, v in recorded.items() if k != fragment}}
    with pytest.raises(WindowRejected, match=named) as err:
        windows(Recorded(recorded)).measure(90.0, 100.0, canary=False)
    assert "/metrics" in err.value.reason


@pytest.mark.parametrize(("refused", "p99_ms"), [(0, 99.0), (5, 300_000.0)])
def test_direct_scrape_reads_a_request_turned_away_as_a_first_token_never_given(
        refused: int, p99_ms: float) -> None:
    """As the rules read them (``rules.bucket_rates``): each request the engine turned
    away for load (429) is in the +Inf bucket of its class's TTFT, and of every class's."""
    from slopilot.engine.metric_names import REFUSED

    page = "".join([
        'vllm:e2e_request_latency_seconds_count{priority_class="p1"} 100\n',
        'vllm:time_to_first_token_seconds_bucket{priority_class="p1",le="0.1"} 100\n',
        'vllm:time_to_first_token_seconds_bucket{priority_class="p1",le="300.0"} 100\n',
        'vllm:time_to_first_token_seconds_bucket{priority_class="p1",le="+Inf"} 100\n',
        f'{REFUSED}{{priority_class="p1"}} {refused}\n',
        f'{REFUSED}{{priority_class="p0"}} 0\n']).encode()
    s = _scraped([b"", page])
    assert s.classes[Priority.P1].requests_refused == refused
    assert s.classes[Priority.P1].ttft_p99_ms == pytest.approx(p99_ms)
    assert s.overall.ttft_p99_ms == pytest.approx(p99_ms)


@pytest.mark.prometheus
@pytest.mark.parametrize("refused_per_s", [None, 0, 8])
def test_the_arrival_rate_counts_the_requests_turned_away(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        refused_per_s: int | None) -> None:
    """A request turned away for load (429) arrived: the load-shift check compares
    arrivals so that a bad config reads as a bad trial, not as a load that moved, and a
    config that turns away most of its clients is the worst of them. The simulated
    cluster counts every arrival (``SimCluster.summary``). Left out, 2 served and 8
    turned away a second read as 2 arrivals against a config before it serving all 10:
    a load shift, and the window was thrown away instead of judged."""
    from slopilot.engine.metric_names import REFUSED

    expr = windows(Recorded({}))._exprs({"d": "x"}, 60)["request_rate"][None]
    labels = 'd="x",priority_class="p1"'
    series = [{"series": f"vllm:e2e_request_latency_seconds_count{{{labels}}}",
               "values": "0+120x10"}]  # 2 a second
    series += [{"series": f'{gauge}{{d="x"}}', "values": "3x10"}
               for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
    if refused_per_s is not None:  # None: no such series (vLLM)
        series.append({"series": f"{REFUSED}{{{labels}}}",
                       "values": f"0+{refused_per_s * 60}x10"})
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": f"round(({expr}) * 1000)", "eval_time": "5m",
            "exp_samples": [{"labels": "{}", "value": (2 + (refused_per_s or 0)) * 1000}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("counter", ["engine", "meter"])
def test_a_windows_refusals_take_in_those_the_meter_refused_at_its_cap(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        counter: str) -> None:
    """The refusals a window reads by class (``requests_refused``: the status's
    sloAttainment counts each as output owed): the built-in engine's (429s, and 503s at
    its connection cap), or, on vLLM, those its meter refused at its cap (503). Read from
    the engine's alone, a vLLM deployment whose meter refused most P0 streams read none
    refused."""
    from slopilot.engine.meter.exposition import METER_REFUSED
    from slopilot.engine.metric_names import REFUSED

    expr = windows(Recorded({}))._exprs({"d": "x"}, 60)["refused"][None]
    name = REFUSED if counter == "engine" else METER_REFUSED
    series = [{"series": f'{name}{{d="x",instance="a",priority_class="p0"}}',
               "values": "0+16x10"}]
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": expr, "eval_time": "5m",
            "exp_samples": [{"labels": '{priority_class="p0"}', "value": 16}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_prometheus_names_the_replicas_scraped_without_series_in_the_window(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The query behind the missing-replica rejection, on Prometheus' own engine: a
    target whose scrapes fail all window (``up`` 0, no series) is named; one that
    reported, or stopped being a target half-way (scaled down), is not."""
    expr = windows(Recorded({}))._exprs({"d": "x"}, 300)["unreported"][None]
    series = [{"series": f'up{{d="x",instance="{i}"}}', "values": v}
              for i, v in (("a", "1x10"), ("timing-out", "0x10"), ("gone", "1x3 _x7"))]
    series += [{"series": f'vllm:num_requests_running{{d="x",instance="{i}"}}', "values": v}
               for i, v in (("a", "3x10"), ("gone", "2x3 _x7"))]
    series.append({"series": 'up{d="y",instance="other"}', "values": "0x10"})
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": expr, "eval_time": "5m",
            "exp_samples": [{"labels": '{instance="timing-out"}', "value": 0}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def partly_scraped(share: dict[str, float]) -> dict[str, Any]:
    """Prometheus's answer naming the targets that answered only this share of the
    window's scrapes."""
    return {"avg_over_time(up{": [{"metric": {"instance": i}, "value": [100.0, str(v)]}
                                  for i, v in share.items()]}


def test_a_window_a_replica_answered_only_part_of_is_not_the_deployments() -> None:
    # One replica's scrapes time out for the window's second half: its counters stop at
    # the middle and rate() extrapolates them little, so half its requests are in no
    # figure while the load check sees the rest move by less than its tolerance.
    q = Recorded({**partly_scraped({"10.0.0.3:8000": 0.5}),
                  **answers(rate_now=2.5, rate_before=3.0)})
    with pytest.raises(WindowRejected, match=r"10\.0\.0\.3:8000 answered 50 % of"):
        windows(q).measure(90.0, 100.0, canary=False)
    partly = next(e for e, _ in q.asked if "avg_over_time(up{" in e)
    assert 'up{slopilot_deployment="d"}[10s]' in partly
    q = Recorded({**partly_scraped({"127.0.0.1:9000": 0.25}), **answers()})
    with pytest.raises(WindowRejected, match=r"the canary replica 127\.0\.0\.1:9000 answered 25 %"):
        windows(q).measure(90.0, 100.0, canary=True)


@pytest.mark.prometheus
def test_prometheus_names_the_replicas_that_answered_part_of_the_window(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The query behind the partial rejection, on Prometheus' own engine: a target that
    answered two of the window's five scrapes is named; one that missed one of five, or
    was scaled down part-way (no ``up`` after it, not 0), is not."""
    expr = windows(Recorded({}))._exprs({"d": "x"}, 300)["partly_scraped"][None]
    series = [{"series": f'up{{d="x",instance="{i}"}}', "values": v}
              for i, v in (("a", "1x10"), ("two-of-five", "1x7 0x3"),
                           ("one-miss", "1x7 0 1x2"), ("gone", "1x7 _x3"))]
    series.append({"series": 'up{d="y",instance="other"}', "values": "1x7 0x3"})
    # Which targets, not their share: Prometheus 2 counts the sample at the window's
    # start (two of six), Prometheus 3 does not (two of five).
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": f"count by (instance) ({expr})", "eval_time": "10m",
            "exp_samples": [{"labels": '{instance="two-of-five"}', "value": 1}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def thinly_scraped(samples: dict[str, int]) -> dict[str, Any]:
    """Prometheus's answer naming the targets whose engine series hold this few samples
    in the window."""
    return {"count_over_time(vllm:num_requests_running{": [
        {"metric": {"instance": i}, "value": [100.0, str(n)]} for i, n in samples.items()]}


def test_a_window_holding_one_scrape_of_a_replica_is_not_the_deployments() -> None:
    # A 27 s range over 15 s scrapes: a replica may leave one sample in it, and rate()
    # and increase() of one sample are nothing, so its requests (a slow replica's P99)
    # were in no figure while it passed every other check (its one `up` was 1).
    q = Recorded({**thinly_scraped({"10.0.0.4:8000": 1}), **answers()})
    with pytest.raises(WindowRejected, match=r"10\.0\.0\.4:8000 left 1 sample in the 10 s "
                                             r"window.*at least 2.*scrape interval"):
        windows(q).measure(90.0, 100.0, canary=False)
    q = Recorded({**thinly_scraped({"127.0.0.1:9000": 1}), **answers()})
    with pytest.raises(WindowRejected, match=r"the canary replica 127\.0\.0\.1:9000 left 1"):
        windows(q).measure(90.0, 100.0, canary=True)


@pytest.mark.prometheus
def test_prometheus_names_the_replicas_with_one_sample_in_the_window(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The query behind the one-sample rejection, on Prometheus' own engine: a replica
    whose engine series holds one sample in the range is named; one with two or more, or
    scaled away after two (no samples after it), is not, nor another deployment's."""
    expr = windows(Recorded({}))._exprs({"d": "x"}, 90)["thinly_scraped"][None]
    series = [{"series": f'vllm:num_requests_running{{d="x",instance="{i}"}}', "values": v}
              for i, v in (("a", "3x10"), ("one", "_x8 3"), ("gone", "2x8 _x2"))]
    series.append({"series": 'vllm:num_requests_running{d="y",instance="other"}',
                   "values": "_x8 3"})
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": f"count by (instance) ({expr})", "eval_time": "8m",
            "exp_samples": [{"labels": '{instance="one"}', "value": 1}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def restarted(replicas: list[str]) -> dict[str, Any]:
    """Prometheus's answer naming the targets whose process started again in the window."""
    return {"changes(process_start_time_seconds{": [
        {"metric": {"instance": i}, "value": [100.0, "1"]} for i in replicas]}


def test_a_window_a_replica_restarted_in_is_not_the_deployments() -> None:
    # The engine restarted in place (same pod, same target): its counters began again at
    # 0, and by the next scrape they were past their old values, so Prometheus saw no
    # reset and increase() read the difference: 3 s first tokens read as 0.5 s ones.
    q = Recorded({**restarted(["10.0.0.5:8000"]), **answers()})
    # Typed, so the loop fails the trial rather than measuring it again (trial_window).
    with pytest.raises(ReplicaRestarted, match=r"10\.0\.0\.5:8000 restarted in the 10 s "
                                               r"window.*counters") as raised:
        windows(q).measure(90.0, 100.0, canary=False)
    assert raised.value.replicas == ("10.0.0.5:8000",)
    q = Recorded({**restarted(["127.0.0.1:9000"]), **answers()})
    with pytest.raises(WindowRejected, match=r"the canary replica 127\.0\.0\.1:9000 restarted"):
        windows(q).measure(90.0, 100.0, canary=True)


@pytest.mark.prometheus
def test_prometheus_names_the_replicas_whose_engine_or_meter_restarted_in_the_window(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The query behind the restart rejection, on Prometheus' own engine: a replica whose
    process (the engine's, or a vLLM pod's meter) started again in the range is named
    once; one that kept its start time, restarted before the range, or is another
    deployment's, is not."""
    expr = windows(Recorded({}))._exprs({"d": "x"}, 150)["restarted"][None]
    series = [{"series": f'process_start_time_seconds{{d="x",instance="{i}"}}', "values": v}
              for i, v in (("steady", "100x10"), ("again", "100x8 520x2"),
                           ("before", "100x2 250x8"))]
    series += [{"series": f'slopilot_meter_start_time_seconds{{d="x",instance="{i}"}}',
                "values": v} for i, v in (("again", "100x8 520x2"), ("meter", "100x8 580x2"))]
    series.append({"series": 'process_start_time_seconds{d="y",instance="other"}',
                   "values": "100x8 520x2"})
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": f"count by (instance) ({expr})", "eval_time": "10m",
            "exp_samples": [{"labels": '{instance="again"}', "value": 1},
                            {"labels": '{instance="meter"}', "value": 1}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("span", [120, 301, 1200, 2400])
def test_a_window_longer_than_the_breach_window_is_read_over_its_length(span: int) -> None:
    # A thin class's trial is extended up to max_trial_s (1200 s by default) and read in
    # one range: past the alerts' 300 s breach window, which a window's figures never use.
    q = Recorded(answers())
    s = windows(q).measure(1000.0, 1000.0 + span, canary=False)
    assert s.duration_s == span and s.classes[Priority.P0].ttft_p99_ms == pytest.approx(300.0)
    assert all(f"[{duration(span)}]" in e for e, _ in q.asked if "[" in e)


def test_a_range_past_a_day_is_read_over_its_last_day() -> None:
    # maxTrial is at most a day, and a confirming window's tick a few seconds late asked
    # for 86,403 s, more than the rules read (a day): the trial ended in a RuleError.
    q = Recorded(answers())
    s = windows(q).measure(0.0, 86_403.0, canary=False)
    assert s.duration_s == 86_400
    assert all(f"[{duration(86_400)}]" in e for e, _ in q.asked if "[" in e)


def test_on_vllm_the_floor_counts_the_streams_the_p99_is_read_from() -> None:
    # 100 P0 requests finished, 3 of them streamed: the meter's TTFT P99, of those 3, is
    # what the trial is judged on, and 3 are no P99 (the floor is 100).
    q = Recorded({"increase(slopilot_client_time_to_first_token_seconds_count":
                  {"p0": 3.0, "p1": 100.0},
                  **answers(finished=200.0)})
    s = windows(q, latency=VLLM_LATENCY).measure(90.0, 100.0, canary=False)
    p0 = s.classes[Priority.P0]
    assert p0.requests_finished == 100 and p0.ttft_samples == 3
    short = shortfall(s, DEMO.slo, 100, 10.0)
    assert short is not None and short.label == "p0" and short.requests == 3


def test_the_queue_is_the_waiting_gauge_now_and_the_last_minutes_arrivals() -> None:
    """What a trial's backlog wait reads (``loop/backlog_wait.py``): vLLM's waiting
    requests summed over the replicas measured, at the tick, and their arrival rate over
    the minute before it; nothing where no replica exports the gauge."""
    q = Recorded({"sum(vllm:num_requests_waiting{": 37.0, **answers(rate_now=4.0)})
    reading = windows(q).queue(100.0, canary=True)
    assert reading is not None and (reading.waiting, reading.arrivals_per_s) == (37.0, 4.0)
    assert {t for _, t in q.asked} == {100.0}
    assert all('instance_role="canary"' in e for e, _ in q.asked if "{" in e)
    assert any("[1m]" in e for e, _ in q.asked)
    assert windows(Recorded(answers())).queue(100.0, canary=False) is None
