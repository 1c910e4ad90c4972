"""A deployment's own SLO thresholds are edges of the histograms its processes export.

``slopilot serve`` and ``slopilot meter`` start with the deployment's SLO; its TTFT and
token-gap targets, and twice each, become edges of their TTFT and gap histograms beside
the fixed grid (``latency_buckets.slo_edges``), so a P99 just over a custom target
(800 ms, inside the grid's (790, 860] ms) reads over it. A few edges at most, whatever
the SLO holds.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.latency_buckets import (
    MAX_SLO_EDGES,
    TOKEN_LATENCY_BUCKETS,
    slo_edges,
    token_latency_buckets,
)
from slopilot.engine.meter.client_latency import CLIENT_TBT, CLIENT_TTFT, ClientLatency
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.slo import ClassSLO, SLOError, SLOSpec

CUSTOM = SLOSpec.from_dict({"profile": "standard", "classes": {
    "p0": {"ttftP99Ms": 800, "tbtP99Ms": 23}, "p1": {"ttftP99Ms": 1234.5}}})
TTFT, TBT = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"


def edges_of(text: str, name: str, cls: str) -> list[float]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sorted(float(s.labels["le"]) for s in family.samples
                          if s.name.endswith("_bucket") and s.labels["priority_class"] == cls
                          and s.labels["le"] != "+Inf")
    raise AssertionError(f"{name} not exported")


def test_the_slos_targets_and_twice_them_are_edges_the_grid_lacked() -> None:
    # 800 ms and 1,234.5 ms are off the grid, twice them (1.6 s on it, 2.469 s off);
    # 23 ms off, 46 ms on.
    assert slo_edges(CUSTOM, ttft=True) == (0.8, 1.2345, 2.469)
    assert slo_edges(CUSTOM, ttft=False) == (0.023,)
    assert slo_edges(SLOSpec.from_profile("standard"), ttft=True) == ()
    assert slo_edges(None, ttft=True) == ()
    assert token_latency_buckets(None, ttft=True) is TOKEN_LATENCY_BUCKETS


def test_every_class_of_the_engine_exports_every_edge_of_the_slo_it_started_with() -> None:
    m = EngineMetrics("m")
    m.export_slo_edges(CUSTOM)
    text = m.render().decode()
    for p in Priority:
        # One set of edges for every class: the overall P99 sums them.
        assert edges_of(text, TTFT, p.label) == sorted({*TOKEN_LATENCY_BUCKETS, 0.8, 1.2345,
                                                        2.469})
        assert edges_of(text, TBT, p.label) == sorted({*TOKEN_LATENCY_BUCKETS, 0.023})
    assert 'le="0.8"' in text and 'le="1.2345"' in text  # the text a rule selects


def test_an_observation_on_the_new_edge_counts_under_it() -> None:
    m = EngineMetrics("m")
    m.export_slo_edges(CUSTOM)
    m.observe_ttft(Priority.P0, 0.8)
    m.observe_ttft(Priority.P0, 0.85)
    samples = {s.labels["le"]: s.value for f in text_string_to_metric_families(
        m.render().decode()) if f.name == TTFT for s in f.samples
        if s.name.endswith("_bucket") and s.labels["priority_class"] == "p0"}
    assert (samples["0.79"], samples["0.8"], samples["0.86"]) == (0, 1, 2)


def test_the_edges_are_fixed_once_the_engine_has_observed() -> None:
    # A bucket already counted cannot be split: an SLO that comes later judges requests
    # (set_slo) and leaves the edges, which the rules then read judged.
    m = EngineMetrics("m")
    m.observe_token_gap(Priority.P1, 0.01)
    with pytest.raises(RuntimeError, match="before serving"):
        m.export_slo_edges(CUSTOM)
    m.set_slo(CUSTOM)
    assert 0.8 not in edges_of(m.render().decode(), TTFT, "p0")


def test_the_meter_exports_the_edges_of_the_slo_it_started_with() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    latency = ClientLatency(Priority.P0, CUSTOM)

    class _F:
        def collect(self) -> Any:
            return latency.families("m")

    registry = CollectorRegistry()
    registry.register(_F())
    text = generate_latest(registry).decode()
    assert edges_of(text, CLIENT_TTFT, "p0") == sorted({*TOKEN_LATENCY_BUCKETS, 0.8, 1.2345,
                                                         2.469})
    assert edges_of(text, CLIENT_TBT, "p0") == sorted({*TOKEN_LATENCY_BUCKETS, 0.023})
    assert ClientLatency(Priority.P0).ttft.edges == TOKEN_LATENCY_BUCKETS


@pytest.mark.parametrize("ms", [1e300, 300_000.0, 0.5, 1e-300])
def test_a_target_off_the_grids_ends_adds_no_edge(ms: float) -> None:
    # At or past 300 s (what a first token never given reads) or under 1 ms: no edge,
    # read judged as before; the histogram's last finite edge stays 300 s.
    slo = SLOSpec.from_dict({"classes": {"p0": {"ttftP99Ms": ms, "tbtP99Ms": ms}}})
    for ttft in (True, False):
        edges = token_latency_buckets(slo, ttft=ttft)
        assert edges[0] == TOKEN_LATENCY_BUCKETS[0] and edges[-1] == TOKEN_LATENCY_BUCKETS[-1]
        assert all(TOKEN_LATENCY_BUCKETS[0] <= e < TOKEN_LATENCY_BUCKETS[-1]
                   for e in slo_edges(slo, ttft=ttft))


def test_no_slo_adds_more_than_two_edges_a_class_at_the_seeds_factors() -> None:
    # Every class with its own odd targets: 3 classes x (target, twice it) at most.
    odd = SLOSpec.from_dict({"classes": {p.label: {"ttftP99Ms": 701 + 3 * p.value,
                                                   "tbtP99Ms": 21.7 + p.value}
                                         for p in Priority}})
    for ttft in (True, False):
        extra = slo_edges(odd, ttft=ttft)
        assert len(extra) == 6 < MAX_SLO_EDGES
        assert len(token_latency_buckets(odd, ttft=ttft)) == len(TOKEN_LATENCY_BUCKETS) + 6


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0, True, "800"])
def test_a_target_that_is_no_positive_number_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(SLOError, match="ttft_p99_ms"):
        SLOSpec.from_dict({"classes": {"p0": {"ttftP99Ms": bad}}})
    # A spec built around the check (object.__setattr__ on a frozen one) still cannot
    # give an edge that is not a number.
    target = ClassSLO(ttft_p99_ms=100)
    object.__setattr__(target, "ttft_p99_ms", bad)
    spec = SLOSpec(target, ClassSLO(), ClassSLO())
    with pytest.raises(ValueError, match=r"classes.p0.ttft_p99_ms=.*positive"):
        slo_edges(spec, ttft=True)


def test_serve_exports_the_edges_of_the_slo_file_it_started_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.engine.server import commands
    from slopilot.engine.slo import SLO_FILE_ENV

    (tmp_path / "slo.json").write_text(json.dumps(CUSTOM.to_dict()))
    monkeypatch.setenv(SLO_FILE_ENV, str(tmp_path / "slo.json"))
    seen: list[str] = []
    monkeypatch.setattr("slopilot.engine.server.uvicorn_runner.serve_forever",
                        lambda backend, **kw: seen.append(backend.metrics.render().decode())
                        or 0)
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--executor", "simulated"])
    assert args.func(args) == 0
    assert 0.8 in edges_of(seen[0], TTFT, "p0") and 0.023 in edges_of(seen[0], TBT, "p2")


def test_the_meter_command_exports_the_edges_of_its_slo_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from slopilot.cli import main

    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps(CUSTOM.to_dict()))
    apps: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: apps.append(self.config.app))
    # It binds before it runs: a port of its own, not 0.0.0.0:8000, which may be another's.
    main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
          "--host", "127.0.0.1", "--port", "0"])
    meter = apps[0]
    while not hasattr(meter, "latency"):  # under the server's wrappers
        meter = meter.app
    assert 0.8 in meter.latency.ttft.edges and 0.023 in meter.latency.gaps.edges


def test_a_quantile_read_as_the_engine_exports_it_reads_the_slos_edge() -> None:
    # The twin reads its P99s through the plant's buckets (``twin_predict``): the fixed
    # ones spread 850 ms over (790, 860], the engine started with the SLO over (800, 860].
    from slopilot.engine.histogram_quantiles import latency_quantile

    ttfts = [0.5] * 980 + [0.85] * 20
    assert latency_quantile(0.99, ttfts) == pytest.approx(0.825)
    assert latency_quantile(0.99, ttfts, edges=token_latency_buckets(CUSTOM, ttft=True)) \
        == pytest.approx(0.83)


def test_an_alert_factors_thresholds_are_edges_too() -> None:
    # spec.alerts' retune at 1.37 x 800 ms: 1.096 s, inside the grid's (1.0, 1.1] s, is
    # an edge, the double the alert table's threshold is (factor * ms / 1000).
    from slopilot.engine.alert_factors import AlertFactors

    slo = SLOSpec.from_dict({"classes": {"p0": {"ttftP99Ms": 800}}})
    factors = AlertFactors(ttft_warning=1.0, ttft_retune=1.37, tbt_scale=2.0)
    assert 1.37 * 800 / 1000 in slo_edges(slo, ttft=True, factors=factors)
    assert slo_edges(slo, ttft=True) == (0.8,)  # the seeds' factors: as before
    # Twice P1's 1,234.5 ms (2.469 s, off the grid) is judged by no row at these
    # factors: no edge.
    assert 2.469 in slo_edges(CUSTOM, ttft=True)
    assert 2.469 not in slo_edges(CUSTOM, ttft=True, factors=factors)


def test_no_slo_and_factors_add_more_than_three_edges_a_class() -> None:
    # Every class with its own odd targets, every factor odd: 3 classes x (target,
    # warning, retune) on a TTFT histogram, x (target, scale) on a gap one.
    from slopilot.engine.alert_factors import MAX_FACTORS, AlertFactors

    odd = SLOSpec.from_dict({"classes": {p.label: {"ttftP99Ms": 701 + 3 * p.value,
                                                   "tbtP99Ms": 21.7 + p.value}
                                         for p in Priority}})
    factors = AlertFactors(ttft_warning=1.13, ttft_retune=1.71, tbt_scale=2.9)
    assert len(slo_edges(odd, ttft=True, factors=factors)) == MAX_SLO_EDGES == 9
    assert MAX_FACTORS * len(Priority) == MAX_SLO_EDGES
    assert len(slo_edges(odd, ttft=False, factors=factors)) == 6
    for ttft in (True, False):
        assert len(token_latency_buckets(odd, ttft=ttft, factors=factors)) \
            == len(TOKEN_LATENCY_BUCKETS) + len(slo_edges(odd, ttft=ttft, factors=factors))


def test_the_engine_and_the_meter_export_the_edges_of_their_factors() -> None:
    from slopilot.engine.alert_factors import AlertFactors

    factors = AlertFactors(ttft_retune=1.37, tbt_scale=2.5)
    m = EngineMetrics("m")
    m.export_slo_edges(CUSTOM, factors)
    text = m.render().decode()
    for p in Priority:
        assert 1.37 * 800 / 1000 in edges_of(text, TTFT, p.label)
        assert 2.5 * 23 / 1000 in edges_of(text, TBT, p.label)
    assert 'le="1.096"' in text  # the text the rule selects (rules._le)
    latency = ClientLatency(Priority.P0, CUSTOM, factors)
    assert 1.096 in latency.ttft.edges and 0.0575 in latency.gaps.edges


def test_serve_exports_the_edges_of_the_alert_factors_file_it_started_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.engine.alert_factors import ALERTS_FILE_ENV
    from slopilot.engine.server import commands
    from slopilot.engine.slo import SLO_FILE_ENV

    (tmp_path / "slo.json").write_text(json.dumps(CUSTOM.to_dict()))
    (tmp_path / "alerts.json").write_text('{"ttftRetuneFactor": 1.37}')
    monkeypatch.setenv(SLO_FILE_ENV, str(tmp_path / "slo.json"))
    monkeypatch.setenv(ALERTS_FILE_ENV, str(tmp_path / "alerts.json"))
    seen: list[str] = []
    monkeypatch.setattr("slopilot.engine.server.uvicorn_runner.serve_forever",
                        lambda backend, **kw: seen.append(backend.metrics.render().decode())
                        or 0)
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--executor", "simulated"])
    assert args.func(args) == 0
    assert {0.8, 1.096} <= set(edges_of(seen[0], TTFT, "p0"))
    assert 2.469 not in edges_of(seen[0], TTFT, "p0")  # 2 x P1's: no factor of 2 now


def test_serve_refuses_an_alert_factors_file_it_cannot_use_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.engine.alert_factors import ALERTS_FILE_ENV
    from slopilot.engine.server import commands

    (tmp_path / "alerts.json").write_text('{"ttftRetuneFactor": 0.5}')
    monkeypatch.setenv(ALERTS_FILE_ENV, str(tmp_path / "alerts.json"))
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--executor", "simulated"])
    assert args.func(args) != 0
    err = capsys.readouterr().err
    assert ALERTS_FILE_ENV in err and "ttftRetuneFactor=0.5" in err


def test_the_meter_command_exports_the_edges_of_its_alert_factors_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from slopilot.cli import main
    from slopilot.engine.alert_factors import ALERTS_FILE_ENV

    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps(CUSTOM.to_dict()))
    (tmp_path / "alerts.json").write_text('{"ttftRetuneFactor": 1.37, "tbtScaleFactor": 2.5}')
    monkeypatch.setenv(ALERTS_FILE_ENV, str(tmp_path / "alerts.json"))
    apps: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: apps.append(self.config.app))
    main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
          "--host", "127.0.0.1", "--port", "0"])
    meter = apps[0]
    while not hasattr(meter, "latency"):
        meter = meter.app
    assert 1.096 in meter.latency.ttft.edges and 0.0575 in meter.latency.gaps.edges


def test_the_meter_command_refuses_an_alert_factors_file_it_cannot_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main
    from slopilot.engine.alert_factors import ALERTS_FILE_ENV

    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps(CUSTOM.to_dict()))
    monkeypatch.setenv(ALERTS_FILE_ENV, str(tmp_path / "missing.json"))
    code = main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
                 "--host", "127.0.0.1", "--port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert ALERTS_FILE_ENV in err and "no such file" in err
