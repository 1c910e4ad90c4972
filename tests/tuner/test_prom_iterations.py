"""The twin check's iteration series read from Prometheus, by kind and feature."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.engine.sim.correction import WindowSample, window_samples
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.shape import FEATURES
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.twin import with_profile
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.prometheus.iterations import PrometheusIterations
from slopilot.tuner.prometheus.rules import RuleOptions
from tests.support.profiles import make_profile
from tests.support.prometheus import serve_metrics


def _answers(samples: list[WindowSample], asked: list[tuple[str, float | None]]) -> Any:
    """A Prometheus that answers the three sums from ``samples`` (and records the asks)."""
    def run(expr: str, at: float | None = None) -> list[dict[str, Any]]:
        asked.append((expr, at))
        if "seconds_sum" in expr:
            return [{"metric": {"kind": s.kind}, "value": [at, str(s.seconds)]}
                    for s in samples]
        if "seconds_count" in expr:
            return [{"metric": {"kind": s.kind}, "value": [at, str(s.iterations)]}
                    for s in samples] + [{"metric": {"kind": "swap"}, "value": [at, "NaN"]}]
        return [{"metric": {"kind": s.kind, "feature": f}, "value": [at, str(v)]}
                for s in samples for f, v in zip(FEATURES, s.shape.vector(), strict=True)]
    return run


def _engine_metrics() -> str:
    run = simulate(with_profile(load_scenario("tiny-cpu"), make_profile()), duration_s=10,
                   with_metrics=True)
    return run.metrics[0].decode()


def test_the_window_is_read_by_kind_at_its_end_over_its_length() -> None:
    expected = window_samples("", _engine_metrics())
    asked: list[tuple[str, float | None]] = []
    source = PrometheusIterations(_answers(expected, asked), {"slopilot_deployment": "chat"})
    got = source.iterations(100.0, 160.0)
    assert [s.kind for s in got] == [s.kind for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.iterations == b.iterations and a.seconds == pytest.approx(b.seconds)
        assert a.shape.vector() == pytest.approx(b.shape.vector())
    assert len(asked) == 3 and all(at == 160.0 for _, at in asked)
    assert all('{slopilot_deployment="chat"}[60s]' in expr for expr, _ in asked)


def test_a_window_too_short_to_rate_asks_nothing() -> None:
    asked: list[tuple[str, float | None]] = []
    assert PrometheusIterations(_answers([], asked), {}).iterations(10.0, 11.0) == []
    assert asked == []


def test_the_demos_direct_scrape_gives_the_same_increases() -> None:
    text = _engine_metrics()
    pages = iter(["", text])
    with serve_metrics(lambda: next(pages).encode()) as address:
        scrape = DirectScrape(lambda: [f"http://{address}"], load_scenario("tiny-cpu").slo,
                              RuleOptions(interval_s=10, alert_for_s=0))
        scrape.poll(now=100.0)
        scrape.poll(now=110.0)
        got = scrape.iterations(100.0, 110.0)
        scrape.stop()
    expected = window_samples("", text)
    assert [s.kind for s in got] == [s.kind for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert (a.iterations, a.seconds) == pytest.approx((b.iterations, b.seconds))
        assert a.shape.vector() == pytest.approx(b.shape.vector())
