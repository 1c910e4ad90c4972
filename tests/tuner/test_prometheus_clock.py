"""The operator's clock off Prometheus's: windows read on Prometheus's clock
(``prometheus/clock_offset.PrometheusClock``), over a real Prometheus.

The history is a real engine's 15 s scrapes backfilled so that their present is
Prometheus's own now: 2 requests a second of P0 and of P1 throughout, config A (P0 TTFT
1.5 s) until ``APPLY``, config B (0.3 s, within the demo's 800 ms) after it. The trial
started at the apply and is looked at ``ELAPSED`` s later, every time the loop keeps
read on an operator's clock ``skew`` s off Prometheus's. Read as the operator read them
before, a clock 45 s ahead rejected every window as a load shift (its last 45 s lie in
Prometheus's future), and one 30 s behind judged the trial on config A's latencies.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.clock_offset import (
    APPLY_S,
    NOW_EXPR,
    REFRESH_S,
    RETRY_S,
    UNREAD_SAID_AFTER,
    PrometheusClock,
)
from slopilot.tuner.prometheus.profiling import WorkloadProfile, probe_window_s
from slopilot.tuner.prometheus.query import QueryAt, query_at
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected
from tests.support.backfill import backfill, steady_scrapes
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, start_prometheus
from tests.tuner.controller_fakes import (
    GOOD,
    FakeAlerts,
    FakeDeployment,
    FakePlanner,
    FakeProbe,
    FakeStudy,
)

DEMO = load_scenario("demo")
SLO = DEMO.slo
SELECTOR = {"slopilot_deployment": "d"}
APPLY, ELAPSED, SETTLE = 300, 120, 12
ACTIVE_AT = APPLY - 60  # the alert's activeAt, from the history's start
RATE = 4.0  # requests a second, both classes
FINISHED = RATE * (ELAPSED - SETTLE)  # in the trial's window: 432


class ManualMonotonic:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class History:
    url: str
    t0: float
    """Prometheus's clock at the history's start: its present is ``t0 + APPLY + ELAPSED``."""

    @property
    def present(self) -> float:
        return self.t0 + APPLY + ELAPSED

    def answering_time(self, mono: ManualMonotonic) -> QueryAt:
        """The real Prometheus's queries, its ``time()`` answered as the history's present
        (plus ``mono``'s seconds): read over HTTP, the offset was off by up to half a
        round trip, and a busy machine's round trip is no bound a test may lean on
        (``test_a_real_prometheus_answers_its_own_now`` reads the real one)."""
        real = query_at(self.url)

        def query(expr: str, at: float | None = None) -> list[dict[str, Any]]:
            if expr == NOW_EXPR:
                now = self.present + mono.t
                return [{"metric": {}, "value": [now, repr(now)]}]
            return real(expr, at)
        return query

    def operator_clock(self, skew: float, mono: ManualMonotonic | None = None
                       ) -> PrometheusClock:
        """The windows' query on an operator's clock ``skew`` s ahead of Prometheus's
        (both moving with ``mono``)."""
        mono = mono or ManualMonotonic()
        return PrometheusClock(self.answering_time(mono), label="ns/d",
                               clock=lambda: self.present + skew + mono.t, monotonic=mono)

    def window(self, skew: float) -> tuple[float, float]:
        """The trial's window as the loop keeps it: [started_at + settle_s, now], both on
        the operator's clock, ``now`` read as the last scrape landed."""
        return self.t0 + APPLY + skew + SETTLE, self.t0 + APPLY + ELAPSED + skew


@pytest.fixture(scope="module")
def history(prometheus_binaries: PrometheusBinaries,  # noqa: F811 - the fixture
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    workdir = tmp_path_factory.mktemp("prom-clock")
    t0 = float(int(time.time()) - APPLY - ELAPSED)
    lines = steady_scrapes(SLO, t0=t0, end_s=APPLY + ELAPSED, scrape_s=15,
                           per_class_rate=int(RATE / 2),
                           ttft_s=lambda second: 1.5 if second <= APPLY else 0.3,
                           labels='instance="10.0.0.1:8000",slopilot_deployment="d",'
                                  'job="slopilot"')
    # The TTFT alert the trial answers, active since a minute before the apply, as
    # Prometheus's rule evaluations would have written it.
    alert = ('alertname="SlopilotTTFTP99High",severity="warning",priority_class="p0",'
             'action="retune",slopilot_deployment="d"')
    for second in range(APPLY - 60, APPLY + ELAPSED + 1, 15):
        lines.append(f'ALERTS{{{alert},alertstate="firing"}} 1 {t0 + second:.3f}')
        lines.append(f"ALERTS_FOR_STATE{{{alert}}} {t0 + ACTIVE_AT} {t0 + second:.3f}")
    backfill(prometheus_binaries, lines, workdir / "data")
    server = start_prometheus(prometheus_binaries, workdir)
    yield History(server.url, t0)
    server.stop()


def windows(query: QueryAt) -> PrometheusWindows:
    return PrometheusWindows(query, SELECTOR, SLO)


def test_an_operator_45s_ahead_reads_every_request_of_the_window(history: History) -> None:
    start, end = history.window(45.0)
    with pytest.raises(WindowRejected, match="request rate moved from 4/s"):
        windows(query_at(history.url)).measure(start, end, canary=False)  # as before
    aligned = history.operator_clock(45.0)
    summary = windows(aligned).measure(start, end, canary=False)
    assert summary.overall.requests_finished == pytest.approx(FINISHED, rel=0.01)
    assert summary.request_rate == pytest.approx(RATE, rel=0.02)
    assert summary.overall.throughput_tok_s == pytest.approx(10 * RATE, rel=0.02)
    assert aligned.offset_s() == pytest.approx(45.0)


def test_an_operator_30s_behind_reads_the_trials_own_config(history: History) -> None:
    start, end = history.window(-30.0)
    before = windows(query_at(history.url)).measure(start, end, canary=False)
    p0_before = before.classes[Priority.P0].ttft_p99_ms
    assert p0_before is not None and p0_before > 1000.0  # config A's, as before
    after = windows(history.operator_clock(-30.0)).measure(start, end, canary=False)
    p0 = after.classes[Priority.P0].ttft_p99_ms
    assert p0 is not None and 300.0 <= p0 <= 340.0  # config B's ~330 ms
    assert after.overall.requests_finished == pytest.approx(FINISHED, rel=0.01)


def loop_verdict(history: History, query: QueryAt, skew: float
                 ) -> tuple[Decision, FakeStudy]:
    """One tick of a controller whose trial (``GOOD``, on every replica) started at the
    apply, ``ELAPSED`` s ago, every time on the operator's clock."""
    study = FakeStudy()
    apply = history.t0 + APPLY + skew
    trial = RunningTrial(number=0, config=dict(GOOD), started_at=apply, canary=False,
                         began_at=apply)
    settings = ControllerSettings(deployment="d", slo=SLO, trial_settle_s=SETTLE)
    ctl = Controller(settings, FakeDeployment(), FakeAlerts(), windows(query), study,
                     FakeProbe(), FakePlanner(),
                     state=LoopState(state=ControllerState.TUNING, trial=trial))
    return ctl.tick(history.t0 + APPLY + ELAPSED + skew), study


def test_the_loop_judges_a_trial_on_its_own_window_45s_ahead(history: History) -> None:
    decision, study = loop_verdict(history, query_at(history.url), 45.0)
    assert decision.action is Action.REPEAT and "request rate moved" in decision.reason
    decision, study = loop_verdict(history, history.operator_clock(45.0), 45.0)
    assert study.told[0].feasible, decision.reason
    assert not study.failed


def test_the_loop_judges_a_trial_on_its_own_window_30s_behind(history: History) -> None:
    decision, study = loop_verdict(history, query_at(history.url), -30.0)
    assert not study.told[0].feasible and "infeasible: p0.ttft" in decision.reason  # A's
    decision, study = loop_verdict(history, history.operator_clock(-30.0), -30.0)
    assert study.told[0].feasible, decision.reason


def arrivals(query: QueryAt, now: float) -> float:
    """The workload probe's arrival rate (scale-down, capacity) over its window."""
    return WorkloadProfile.measure(lambda expr: query(expr, now), SELECTOR,
                                   probe_window_s(120), now=now).arrival_rate


def test_the_workload_probe_reads_the_load_45s_ahead(history: History) -> None:
    now = history.t0 + APPLY + ELAPSED + 45.0
    assert arrivals(query_at(history.url), now) < 0.85 * RATE  # as before
    assert arrivals(history.operator_clock(45.0), now) == pytest.approx(RATE, rel=0.03)
    reading = windows(history.operator_clock(45.0)).queue(now, canary=False)
    assert reading is not None
    assert reading.arrivals_per_s == pytest.approx(RATE, rel=0.03)


def test_a_real_prometheus_answers_its_own_now(history: History) -> None:
    """``NOW_EXPR`` on the real server: a one-sample vector of its clock, which is this
    machine's (the history's windows are read against it)."""
    before = time.time()
    (sample,) = query_at(history.url)(NOW_EXPR, None)
    assert before - 5.0 <= float(sample["value"][1]) <= time.time() + 5.0
    clock = PrometheusClock(query_at(history.url), clock=lambda: time.time() + 3600.0)
    offset = clock.offset_s()
    assert offset == 0.0 or abs(offset - 3600.0) < 5.0  # 0: a round trip over 2 s


def test_a_large_offset_is_said_once(history: History,
                                     caplog: pytest.LogCaptureFixture) -> None:
    mono = ManualMonotonic()
    clock = history.operator_clock(45.0, mono)
    caplog.set_level(logging.INFO, logger="slopilot.tuner.prometheus.clock_offset")
    for _ in range(3):  # three readings, REFRESH_S apart
        assert clock.offset_s() == pytest.approx(45.0)
        mono.t += REFRESH_S
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1
    assert "ns/d" in said[0].message and "45.0 s ahead of Prometheus" in said[0].message
    assert "NTP" in said[0].message


def test_a_step_of_the_operators_clock_is_read_at_once(history: History) -> None:
    skew = [0.0]
    mono = ManualMonotonic()
    clock = PrometheusClock(history.answering_time(mono),
                            clock=lambda: history.present + skew[0] + mono.t,
                            monotonic=mono)
    assert clock.offset_s() == 0.0  # NTP-close: nothing moved
    skew[0] = -30.0  # the wall clock steps back; the monotonic one does not
    assert clock.offset_s() == pytest.approx(-30.0)


def test_an_offset_under_a_second_moves_nothing(history: History) -> None:
    clock = history.operator_clock(0.6)
    assert clock.offset_s() == 0.0
    assert clock.reading is not None
    assert clock.reading.offset_s == pytest.approx(0.6) and APPLY_S > 0.6


def test_an_unread_clock_leaves_the_times_as_they_are(history: History) -> None:
    asked: list[float | None] = []
    real = query_at(history.url)

    def refusing_time(expr: str, at: float | None = None) -> list[dict[str, object]]:
        if expr == NOW_EXPR:  # a proxy in front of Prometheus that evaluates no time()
            raise PrometheusUnavailable("Prometheus at http://proxy refused the query")
        asked.append(at)
        return real(expr, at)

    clock = PrometheusClock(refusing_time, clock=lambda: history.present + 45.0,
                            monotonic=ManualMonotonic())
    start, end = history.window(45.0)
    with pytest.raises(WindowRejected, match="request rate moved"):
        windows(clock).measure(start, end, canary=False)
    assert asked and all(at is None or math.isclose(at, end) or at < end for at in asked)
    assert end in asked


def test_sample_times_come_back_on_the_operators_clock(history: History) -> None:
    """A raw range's samples (the probe's arrival bins) are binned against the reader's
    ``now``: on Prometheus's clock they fell 45 s before it, out of the last bin."""
    # Read 7 s past the last scrape, as a tick comes between two.
    now = history.present + 45.0 + 7.0
    answer = history.operator_clock(45.0)('up{slopilot_deployment="d"}[60s]', now)
    times = [t for t, _ in answer[0]["values"]]
    assert times == pytest.approx([now - 7 - 15 * i for i in (3, 2, 1, 0)])


def test_an_alerts_since_comes_back_on_the_operators_clock(history: History) -> None:
    """The loop compares an alert's activeAt with its last action's time (an alert from
    before a commit is re-confirmed on a window after it, ``steady.py``): both on the
    operator's clock, 45 s ahead."""
    before = AlertSource(history.url, "d").firing()
    assert [a.since for a in before] == [history.t0 + ACTIVE_AT]  # Prometheus's clock
    clock = history.operator_clock(45.0)
    after = AlertSource(history.url, "d", offset_s=clock.offset_s).firing()
    assert [a.name for a in after] == ["SlopilotTTFTP99High"]
    assert after[0].since == pytest.approx(history.t0 + ACTIVE_AT + 45.0)


def test_a_clock_that_cannot_be_read_is_said_and_asked_again_soon(
        caplog: pytest.LogCaptureFixture) -> None:
    """A Prometheus too slow to answer ``time()`` within ``MAX_ROUND_TRIP_S`` (saturated)
    or one that refuses it left the windows on the operator's clock with a debug line
    only, and asked again a minute on: the correction silently off. Now it is asked again
    sooner, and said once (a warning naming why) after a few tries; a reading taken
    later says so too."""
    mono = ManualMonotonic()
    refusing = [True]
    asked: list[str] = []

    def query(expr: str, at: float | None = None) -> list[dict[str, object]]:
        asked.append(expr)
        if expr == NOW_EXPR and refusing[0]:
            raise PrometheusUnavailable("Prometheus at http://prom answered 503")
        if expr == NOW_EXPR:
            return [{"metric": {}, "value": [1000.0, "1000"]}]
        return []

    clock = PrometheusClock(query, label="ns/d", clock=lambda: 1045.0, monotonic=mono)
    caplog.set_level(logging.INFO, logger="slopilot.tuner.prometheus.clock_offset")
    for _ in range(UNREAD_SAID_AFTER + 2):
        assert clock.offset_s() == 0.0
        mono.t += RETRY_S
    tries = asked.count(NOW_EXPR)
    assert tries == UNREAD_SAID_AFTER + 2 and RETRY_S < REFRESH_S
    said = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1, said
    assert "ns/d" in said[0] and "503" in said[0] and "operator's own clock" in said[0]
    refusing[0] = False
    assert clock.offset_s() == pytest.approx(45.0)
    said = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2 and "45.0 s ahead" in said[1]


def test_the_offset_read_is_a_series_an_administrator_can_alert_on() -> None:
    """The offset was said only in the operator's log, once: an administrator alerting on
    the operator's /metrics never saw that the times it writes are off. Each reading
    taken now sets ``slopilot_prometheus_clock_offset_seconds`` (the operator's clock less
    Prometheus's), the small offsets the windows leave alone included."""
    from slopilot.tuner.loop.metrics import TunerMetrics

    metrics = TunerMetrics(namespace="ns")
    mono = ManualMonotonic()
    skew = [45.0]

    def query(expr: str, at: float | None = None) -> list[dict[str, object]]:
        assert expr == NOW_EXPR
        return [{"metric": {}, "value": [1000.0 + mono.t, "1000"]}]

    clock = PrometheusClock(query, label="ns/d", clock=lambda: 1000.0 + skew[0] + mono.t,
                            monotonic=mono, observe=lambda s: metrics.clock("d", s))

    def read() -> float | None:
        return metrics.registry.get_sample_value(
            "slopilot_prometheus_clock_offset_seconds",
            {"slopilot_namespace": "ns", "slopilot_deployment": "d"})

    assert read() is None  # nothing read yet: no figure, not a 0
    assert clock.offset_s() == pytest.approx(45.0)
    assert read() == pytest.approx(45.0)
    skew[0] = 0.4  # synced again (a step, read at once): the series says so
    assert clock.offset_s() == 0.0
    assert read() == pytest.approx(0.4)
    metrics.forget("d")
    assert read() is None
