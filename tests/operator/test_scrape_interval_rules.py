"""The rules' rate window holds four scrapes (``spec.alerts.scrapeInterval``).

A review's promtool runs: at 30 s scrapes the rules' 60 s rates held two samples, so one
failed scrape cleared the 60 s alerts (a P0 TTFT alert gap of 3.5 minutes), and with one
failed every 180 s ``SlopilotTTFTP99High`` and ``SlopilotPreemptionStorm`` never fired in
15 minutes while ``SlopilotTBTP99High`` flapped; at 15 s all fired. A deployment that
says it is scraped every 30 s gets 2m rates, and the same series fire as at 15 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.prometheus.alert_table import MIN_RATE_SCRAPES, rate_window_for
from tests.operator.test_alert_rules import admitted, body, rule_of
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool

STEP_S = 5
"""The promtool series' step; a scrape is every ``scrape_s / STEP_S`` of its points."""
PHASE_S = 10
"""The first scrape, off the evaluations' grid (as a real target's is)."""
SPAN_S = 1200
FAILED = (130, 310, 490, 670, 850, 1030)
"""A failed scrape every 180 s: Prometheus marks the target's series stale there."""
IDENT = ('slopilot_namespace="team-a",slopilot_deployment="chat",'
         'instance="10.0.0.1:8000",pod="chat-0"')


def scraped(per_scrape: float, scrape_s: int) -> str:
    """A counter growing ``per_scrape`` a scrape, scraped every ``scrape_s`` from
    ``PHASE_S``, stale at each of ``FAILED``; ``_`` between scrapes."""
    out = []
    for t in range(0, SPAN_S + 1, STEP_S):
        if t < PHASE_S or (t - PHASE_S) % scrape_s:
            out.append("_")
        else:
            scrapes = (t - PHASE_S) // scrape_s
            out.append("stale" if t in FAILED else f"{per_scrape * scrapes:g}")
    return " ".join(out)


def histogram(metric: str, counts: dict[str, float], scrape_s: int) -> list[dict[str, str]]:
    labels = f'{IDENT},priority_class="p0"'
    return [{"series": f'{metric}_bucket{{{labels},le="{le}"}}',
             "values": scraped(n, scrape_s)} for le, n in counts.items()]


def ttft_slow(scrape_s: int) -> list[dict[str, str]]:
    # Every P0 first token in (0.2, 0.5] s: over 2 x the 100 ms SLO (critical).
    return histogram("vllm:time_to_first_token_seconds",
                     {"0.1": 0, "0.2": 0, "0.5": 100, "+Inf": 100}, scrape_s)


def tbt_slow(scrape_s: int) -> list[dict[str, str]]:
    # Every P0 gap in (0.04, 0.1] s: over 2 x the 20 ms SLO.
    return histogram("vllm:inter_token_latency_seconds",
                     {"0.02": 0, "0.04": 0, "0.1": 100, "+Inf": 100}, scrape_s)


def preempting(scrape_s: int) -> list[dict[str, str]]:
    # 20 preemptions a minute, over the limit of 10.
    return [{"series": f"vllm:num_preemptions_total{{{IDENT}}}",
             "values": scraped(scrape_s / 3, scrape_s)}]


CASES = {"SlopilotTTFTP99High": (ttft_slow, 'priority_class="p0",severity="critical"'),
         "SlopilotTBTP99High": (tbt_slow, 'priority_class="p0"'),
         "SlopilotPreemptionStorm": (preempting, "")}


def firing(binaries: PrometheusBinaries, tmp_path: Path, alerts: dict[str, Any],
           alertname: str, scrape_s: int, from_s: int) -> str:
    """promtool's output where ``alertname`` does not fire at every evaluation from
    ``from_s`` to 15 minutes (empty where it does), the rules rendered for a CR with
    ``spec.alerts`` = ``alerts``."""
    series, matchers = CASES[alertname]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_of(body(alerts=alerts))))
    selector = f'alertname="{alertname}",alertstate="firing"' + \
        (f",{matchers}" if matchers else "")
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": [{
        "interval": f"{STEP_S}s", "input_series": series(scrape_s),
        "promql_expr_test": [{"expr": f"count(ALERTS{{{selector}}})", "eval_time": f"{t}s",
                              "exp_samples": [{"labels": "{}", "value": 1}]}
                             for t in range(from_s, 900, 30)]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    return "" if result.returncode == 0 else result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("alertname", list(CASES))
def test_failed_scrapes_at_30s_fire_as_at_15s(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        alertname: str) -> None:
    # From 5 minutes on, every evaluation: the holds (2 minutes; 3 evaluations for TBT)
    # are long past, and one failed scrape in the window drops nothing.
    assert firing(prometheus_binaries, tmp_path, {}, alertname, 15, 300) == ""
    assert firing(prometheus_binaries, tmp_path, {"scrapeInterval": "30s"},
                  alertname, 30, 300) == ""


@pytest.mark.prometheus
def test_the_60s_rates_of_30s_scrapes_are_what_failed(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Without the field the rules read 60 s rates, and 30 s scrapes with failures read
    as the review found: this test's series tell the two apart."""
    assert firing(prometheus_binaries, tmp_path, {}, "SlopilotTTFTP99High", 30, 300) != ""


def test_the_rate_window_holds_four_scrapes() -> None:
    assert MIN_RATE_SCRAPES == 4
    for given, window_s in ((None, 60), ("15s", 60), ("10s", 60), ("30s", 120),
                            ("1m", 240)):
        alerts = {} if given is None else {"scrapeInterval": given}
        options = parse_spec(body(alerts=alerts)).alerts
        assert options.rate_window_s == window_s, given
        assert options.max_scrape_interval_s == window_s / 4
    assert rate_window_for(30) == 120
    # The sustained rows read a window at least as long as the others.
    long = parse_spec(body(alerts={"scrapeInterval": "2m"})).alerts
    assert long.rate_window_s == 480 and long.breach_window_s == 480


def test_a_sustained_window_under_the_rate_window_names_both_fields() -> None:
    with pytest.raises(SpecError, match=r"spec.alerts.sustainedBreachWindow=.*"
                                        r"spec.alerts.scrapeInterval"):
        parse_spec(body(alerts={"scrapeInterval": "2m", "sustainedBreachWindow": "6m"}))


@pytest.mark.parametrize(("given", "breach_s"), [("60s", 300), ("75s", 300), ("76s", 304),
                                                  ("1m30s", 360), ("2m", 480)])
def test_a_long_interval_as_the_api_server_stores_it_parses(given: str, breach_s: int
                                                            ) -> None:
    """The CR as admitted (the schema's defaults filled): the breach window left out is
    the operator's to raise to the rate window, so the schema stores none."""
    stored = admitted(body(alerts={"scrapeInterval": given}))
    assert "sustainedBreachWindow" not in stored["spec"]["alerts"]
    options = parse_spec(stored).alerts
    assert options.breach_window_s == breach_s == max(300, options.rate_window_s)


def test_a_breach_window_stored_by_the_old_schema_default_is_raised_with_a_warning(
        ) -> None:
    """Before, the CRD stored 5m in every CR: a CR stored then with a long interval
    cannot say whether its 5m was written; it is read as the old default (raised to the
    rate window), and a warning says to remove it."""
    spec = parse_spec(body(alerts={"scrapeInterval": "2m", "sustainedBreachWindow": "5m"}))
    assert spec.alerts.breach_window_s == spec.alerts.rate_window_s == 480
    said = [w for w in spec.warnings if "sustainedBreachWindow" in w]
    assert len(said) == 1 and "8m" in said[0] and "remove" in said[0], spec.warnings


def test_the_rules_at_15s_are_todays() -> None:
    """The ServiceMonitor's 15 s (the default) renders the very rules of before."""
    assert rule_of(body(alerts={"scrapeInterval": "15s"})) == rule_of(body())
    text = yaml.safe_dump(rule_of(body()))
    assert "[1m]" in text and "[2m]" not in text
