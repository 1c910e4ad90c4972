"""The interval Prometheus really scrapes a deployment at, read from a real Prometheus
(``prometheus/scrape_interval``): a real engine's scrapes backfilled at 60 s (a plain
job at Prometheus's default), at 15 s (the operator's ServiceMonitor), and a replica
that just started (two 60 s samples). At 60 s the rules' 60 s rates read nothing
(promtool: ``SlopilotTTFTP99High`` never fired), and nothing told the user why."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.operator.conditions import ConditionType
from slopilot.operator.scrape_status import ScrapeCheck
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.clock_offset import PrometheusClock
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.scrape_interval import (
    MAX_SCRAPE_INTERVAL_S,
    ScrapeInterval,
    scrape_interval,
)
from slopilot.tuner.study.evaluator import WindowRejected
from tests.operator.operator_support import Cluster
from tests.support.backfill import backfill, steady_scrapes
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.kube_server import RunningEmulator
from tests.support.prometheus import PrometheusBinaries, start_prometheus

SLO = load_scenario("demo").slo
SPAN = 600


@dataclass(frozen=True)
class History:
    url: str
    now: float
    """The history's last scrape (Prometheus's now, to within the test's start)."""


def labels(deployment: str) -> str:
    return f'instance="10.0.0.1:8000",slopilot_deployment="{deployment}",job="j"'


@pytest.fixture(scope="module")
def history(prometheus_binaries: PrometheusBinaries,  # noqa: F811 - the fixture
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    workdir = tmp_path_factory.mktemp("prom-scrape")
    t0 = float(int(time.time()) - SPAN)
    lines: list[str] = []
    for deployment, scrape_s in (("d60", 60), ("d15", 15)):
        lines += steady_scrapes(SLO, t0=t0, end_s=SPAN, scrape_s=scrape_s,
                                per_class_rate=1, ttft_s=lambda _: 2.0,
                                labels=labels(deployment))
    # A replica that came up a minute ago: two scrapes, 60 s apart.
    lines += [f"up{{{labels('dnew')}}} 1 {t0 + s:.3f}" for s in (SPAN - 60, SPAN)]
    backfill(prometheus_binaries, lines, workdir / "data")
    server = start_prometheus(prometheus_binaries, workdir)
    yield History(server.url, t0 + SPAN)
    server.stop()


def windows(history: History, deployment: str) -> PrometheusWindows:
    query = PrometheusClock(query_at(history.url), label=f"ns/{deployment}")
    return PrometheusWindows(query, {"slopilot_deployment": deployment}, SLO)


def test_targets_scraped_every_60s_are_measured_as_such(history: History) -> None:
    found = scrape_interval(query_at(history.url), {"slopilot_deployment": "d60"},
                            history.now)
    assert found is not None and found.too_long
    assert found.interval_s == pytest.approx(60.0)
    assert found.instance == "10.0.0.1:8000"
    assert MAX_SCRAPE_INTERVAL_S == 15.0


def test_60s_scrapes_are_said_on_the_cr(history: History) -> None:
    check = ScrapeCheck(windows(history, "d60"), every_s=120.0, start=0.0)
    said = check.due(120.0)
    assert said is not None
    assert said["type"] == ConditionType.SCRAPE_INTERVAL.value
    assert said["status"] == "False" and said["reason"] == "TooLong"
    message = said["message"]
    assert "every 60 s" in message and "10.0.0.1:8000" in message
    assert "alerts never fire" in message and "scrape_interval: 15s" in message
    assert check.due(180.0) is None  # read once a window, not every tick


def test_15s_scrapes_say_nothing_wrong(history: History) -> None:
    check = ScrapeCheck(windows(history, "d15"), every_s=120.0, start=0.0)
    said = check.due(120.0)
    assert said is not None and said["status"] == "True", said
    assert "every 15 s" in said["message"]


def test_a_replica_just_started_is_not_judged(history: History) -> None:
    assert scrape_interval(query_at(history.url), {"slopilot_deployment": "dnew"},
                           history.now) is None
    check = ScrapeCheck(windows(history, "dnew"), every_s=120.0, start=0.0)
    assert check.due(120.0) is None


def test_a_thin_window_names_the_measured_interval(history: History) -> None:
    with pytest.raises(WindowRejected, match=r"every 60 s.*scrape_interval: 15s"):
        windows(history, "d60").measure(history.now - 50, history.now, canary=False)


def test_the_daemon_writes_the_condition_and_an_event_once_a_window(
        history: History, kube: RunningEmulator, cluster: Cluster,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CR's own daemon, its windows over the 60 s history: the first step (the
    controller built) says nothing, the step a window later writes the condition and
    posts the event; the next one, still False, posts none."""
    from slopilot.operator import deployment_loop
    from slopilot.operator.crd import crd_manifest
    from slopilot.operator.daemon import DaemonContext
    from slopilot.tuner.loop.controller import Controller
    from slopilot.tuner.prometheus.alerts import AlertSource
    from tests.operator.operator_support import daemon_loop, llmd
    from tests.operator.standins import MoreReplicas
    from tests.tuner.controller_fakes import GOOD, FakeProbe, FakeStudy

    def factory(ctx: DaemonContext) -> Controller:
        alerts = AlertSource(history.url, ctx.name, namespace=ctx.namespace)
        return Controller(ctx.settings, ctx.handle, alerts, windows(history, "d60"),
                          FakeStudy(queue=[dict(GOOD)]), FakeProbe(), MoreReplicas(ctx),
                          state=ctx.state)

    events: list[str] = []
    monkeypatch.setattr(deployment_loop, "scrape_event",
                        lambda body, said: events.append(said["message"]))
    kube.install(crd_manifest())
    body = cluster.create(llmd(prometheus={"url": history.url}))
    loop = daemon_loop(cluster, body, monkeypatch, factory=factory)
    now = [time.time()]
    loop.clock = lambda: now[0]
    assert loop.step() is True and loop.controller is not None
    assert cluster.condition("ScrapeInterval") is None  # not a window yet
    now[0] += loop.controller.settings.window_s
    loop.step()
    said = cluster.condition("ScrapeInterval")
    assert said is not None and said["status"] == "False", said
    assert "every 60 s" in said["message"] and "scrape_interval: 15s" in said["message"]
    assert len(events) == 1
    now[0] += loop.controller.settings.window_s
    loop.step()
    assert len(events) == 1  # said once, while it stays so


@pytest.mark.parametrize("enabled", [True, False])
def test_tuning_turned_off_drops_the_condition(enabled: bool) -> None:
    """No daemon reads the interval while tuning is off: a False condition kept from
    before would say for good that the loop never acts, of a loop that is not running."""
    from slopilot.operator.conditions import condition
    from slopilot.operator.reconcile import Outcome
    from slopilot.operator.spec_status import status_of
    from tests.operator.operator_support import llmd

    body = llmd(tuning={"enabled": enabled})
    body["metadata"]["generation"] = 2
    body["status"] = {"conditions": [condition(
        ConditionType.SCRAPE_INTERVAL, False, "TooLong", "every 60 s", 1)]}
    kept = [c["type"] for c in status_of(body, Outcome())["conditions"]]
    assert (ConditionType.SCRAPE_INTERVAL.value in kept) is enabled


def test_the_advice_names_only_an_interval_the_field_takes() -> None:
    """Past spec.alerts.scrapeInterval's 2m no value of it fits: the advice is the scrape
    job's; within it, the measured interval rounded up."""
    slow = ScrapeInterval("10.0.0.1:8000", 150.0, 5, most_s=30.0).problem()
    assert "set spec.alerts.scrapeInterval to" not in slow
    assert "at most 2m" in slow and "scrape_interval: 15s" in slow
    near = ScrapeInterval("10.0.0.1:8000", 44.6, 5, most_s=30.0).problem()
    assert "set spec.alerts.scrapeInterval to 45s" in near
