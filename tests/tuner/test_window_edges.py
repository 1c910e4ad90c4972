"""Replicas that come or go inside a trial's window, read from a real Prometheus.

A review's backfilled histories (15 s scrapes, a 300 s window): a canary whose target
went away 50 s before the window's end was accepted, its rates divided by the whole
window (it read 16 % low); one whose scrapes failed (``up`` 0) for the last 60 s read
21 % low, and the deployment's figures 10 % low. A pod that joined 10 s before the end
(or left 10 s after the start), one sample in the window, rejected the whole
deployment's window, saying a window must span two scrape intervals: a 300 s window does.
And the deployment's busy ratio was the replicas' last readings averaged alike: one of
three come up 85 s before the end (idler, as a new pod is) weighed as much as the two
there all along and read 15 % low; one gone 95 s into the window, its last reading from
then, 17 % low.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slopilot.engine.metric_window import SlidingSum
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.study.evaluator import WindowRejected
from tests.support.backfill import backfill, steady_scrapes
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, start_prometheus

SLO = load_scenario("demo").slo
SCRAPE_S = 15
SPAN_S = 900
WINDOW_S = 300
A, B, C = (f"10.0.0.{n}:8000" for n in (1, 2, 3))


@dataclass(frozen=True)
class History:
    url: str
    end: float
    """The window's end: 5 s after a scrape, so that neither edge falls on one."""


def replica(deployment: str, instance: str, *, first_s: int = 0, last_s: int = SPAN_S,
            up_until_s: int | None = None, busy: float = 0.5, t0: float) -> list[str]:
    """One replica's scrapes from ``first_s`` to ``last_s`` (seconds into the history),
    its executor running ``busy`` of each second; from ``up_until_s`` on its scrapes
    fail: ``up`` 0 and no engine series."""
    labels = f'instance="{instance}",slopilot_deployment="{deployment}",job="j"'
    lines = steady_scrapes(SLO, t0=t0 + first_s, end_s=last_s - first_s, scrape_s=SCRAPE_S,
                           per_class_rate=1, ttft_s=lambda _: 0.3, labels=labels, busy=busy)
    if up_until_s is None:
        return lines
    cut = t0 + up_until_s
    kept = [line for line in lines if float(line.rsplit(" ", 1)[1]) < cut]
    kept += [f"up{{{labels}}} 0 {t0 + s:.3f}"
             for s in range(up_until_s, last_s + 1, SCRAPE_S)]
    return kept


@pytest.fixture(scope="module")
def history(prometheus_binaries: PrometheusBinaries,  # noqa: F811 - the fixture
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    workdir = tmp_path_factory.mktemp("prom-edges")
    t0 = float(int(time.time()) - SPAN_S) // SCRAPE_S * SCRAPE_S
    start = SPAN_S - WINDOW_S
    lines: list[str] = []
    for name, others in (
            # B's target gone 50 s before the window's end (scaled away, or its pod lost).
            ("gone", {"last_s": SPAN_S - 60}),
            # B's scrapes fail (up 0) for the window's last 60 s.
            ("failing", {"up_until_s": SPAN_S - 60}),
            # B left 10 s into the window (one sample in it), C took its place.
            ("early", {"last_s": start + 10}),
            # B's scrapes fail (up 0) from 100 s before the end; its target goes 50 s
            # later (the pod deleted, C its replacement): it served on, unseen, meanwhile.
            ("failgone", {"up_until_s": SPAN_S - 100, "last_s": SPAN_S - 50}),
            # B's last scrape failed as it shut down, then its target went.
            ("drained", {"up_until_s": SPAN_S - 60, "last_s": SPAN_S - 60}),
            # The two replicas all the window.
            ("steady", {})):
        lines += replica(name, A, t0=t0) + replica(name, B, t0=t0, **others)
    lines += replica("early", C, t0=t0, first_s=start + 15)
    lines += replica("failgone", C, t0=t0, first_s=SPAN_S - 45)
    # B came up 100 s into the window, A went then (a rollout, one replica at a time).
    lines += replica("joined", A, t0=t0, last_s=start + 100)
    lines += replica("joined", B, t0=t0, first_s=start + 100)
    # Beside two replicas all the window, C came up 15 s before its end: one sample.
    lines += replica("late", A, t0=t0) + replica("late", B, t0=t0)
    lines += replica("late", C, t0=t0, first_s=SPAN_S - 20, last_s=SPAN_S - 20)
    # Two replicas busy 90 % all the window; a third, busy 30 %, came up 70 % into it
    # (scaled up: a new pod gets less of the traffic at first), or went 30 % into it,
    # busy 20 % (scaled down: it drained first).
    for name, others in (("scaledup", {"first_s": start + 210, "busy": 0.3}),
                         ("scaleddown", {"last_s": start + 90, "busy": 0.2})):
        lines += replica(name, A, t0=t0, busy=0.9) + replica(name, B, t0=t0, busy=0.9)
        lines += replica(name, C, t0=t0, **others)
    backfill(prometheus_binaries, lines, workdir / "data")
    server = start_prometheus(prometheus_binaries, workdir)
    yield History(server.url, t0 + SPAN_S - 5)
    server.stop()


def measure(history: History, deployment: str, canary: str | None = None,
            window_s: int = WINDOW_S) -> WindowSummary:
    windows = PrometheusWindows(history.url, {"slopilot_deployment": deployment}, SLO,
                                canary_labels={"instance": canary or A})
    return windows.measure(history.end - window_s, history.end, canary=canary is not None)


def requests(summary: WindowSummary) -> float:
    return sum(c.requests_finished for c in summary.classes.values())


@pytest.mark.prometheus
def test_a_steady_deployment_reads_its_requests(history: History) -> None:
    # Two replicas, a request of each of two classes a second: 1,200 in 300 s.
    assert requests(measure(history, "steady")) == pytest.approx(1200, rel=0.03)
    assert requests(measure(history, "steady", canary=B)) == pytest.approx(600, rel=0.03)


@pytest.mark.prometheus
def test_a_canary_gone_before_the_windows_end_is_rejected(history: History) -> None:
    # Its rates over the whole window spread what it served in 250 s over 300 s.
    with pytest.raises(WindowRejected, match=r"the canary replica 10\.0\.0\.2:8000 left no "
                                             r"engine sample in the last \d+ s"):
        measure(history, "gone", canary=B)


@pytest.mark.prometheus
def test_a_canary_whose_scrapes_fail_at_the_windows_end_is_rejected(
        history: History) -> None:
    with pytest.raises(WindowRejected, match=r"the canary replica 10\.0\.0\.2:8000 left no "
                                             r"engine sample"):
        measure(history, "failing", canary=B)


@pytest.mark.prometheus
def test_a_replica_whose_scrapes_fail_at_the_windows_end_rejects_the_deployments(
        history: History) -> None:
    # Its target still there (up 0): it served on, and its last minute is in no figure.
    with pytest.raises(WindowRejected, match=r"replica\(s\) 10\.0\.0\.2:8000 left no engine "
                                             r"sample in the last \d+ s.*scrapes fail since"):
        measure(history, "failing")


@pytest.mark.prometheus
def test_a_replica_scaled_away_counts_for_the_time_it_served(history: History) -> None:
    # A's 600 and the 500 or so B served before its target went: the deployment's.
    assert requests(measure(history, "gone")) == pytest.approx(1100, rel=0.03)


@pytest.mark.prometheus
def test_a_replica_whose_scrapes_failed_before_it_went_rejects_the_deployments(
        history: History) -> None:
    # Not scaled away: it served on while its scrapes failed, and that is in no figure
    # (the deployment's read about 8 % low, and passed every other check).
    with pytest.raises(WindowRejected, match=r"replica\(s\) 10\.0\.0\.2:8000 .*scrapes "
                                             r"failed before its target went"):
        measure(history, "failgone")


@pytest.mark.prometheus
def test_a_replica_whose_one_last_scrape_failed_as_it_went_counts_for_the_time_it_served(
        history: History) -> None:
    # A pod shutting down may refuse its last scrape: what it served since its last good
    # one is under a scrape's worth, as a pod at the window's edge (left out, not rejected).
    assert requests(measure(history, "drained")) == pytest.approx(1075, rel=0.03)


@pytest.mark.prometheus
def test_a_canary_that_came_up_inside_the_window_is_rejected(history: History) -> None:
    # Its rates over the whole window spread what it served in 200 s over 300 s: a third low.
    with pytest.raises(WindowRejected, match=r"the canary replica 10\.0\.0\.2:8000 left no "
                                             r"engine sample in the first \d+ s"):
        measure(history, "joined", canary=B)


@pytest.mark.prometheus
def test_a_replica_come_up_inside_the_window_counts_for_the_time_it_served(
        history: History) -> None:
    # A's 200 before it went and B's 400 from its start: the deployment's.
    assert requests(measure(history, "joined")) == pytest.approx(600, rel=0.03)


@pytest.mark.prometheus
@pytest.mark.parametrize("deployment", ["late", "early"])
def test_a_pod_at_the_windows_edge_is_left_out_of_a_long_window(
        history: History, deployment: str) -> None:
    # One sample in the window: what it served there (under two scrapes) is in no
    # figure, a small share of the deployment's; the rest of the window stands.
    assert requests(measure(history, deployment)) == pytest.approx(1200, rel=0.05)


@pytest.mark.prometheus
def test_a_canary_at_the_windows_edge_says_so_not_the_windows_span(
        history: History) -> None:
    with pytest.raises(WindowRejected) as found:
        measure(history, "late", canary=C)
    message = str(found.value)
    assert "10.0.0.3:8000 left 1 sample" in message
    assert "joined or left" in message and "at least two of Prometheus's" not in message


@pytest.mark.prometheus
def test_a_short_window_still_says_its_span(history: History) -> None:
    # 40 s over 15 s scrapes: under four scrapes, the window itself is too short.
    with pytest.raises(WindowRejected, match=r"left 1 sample.*span at least"):
        measure(history, "late", window_s=40)


def gauge(busy: float) -> float:
    """What the engine's busy ratio reads, steady, of an executor running ``busy`` of each
    second (its sliding window fed as ``steady_scrapes`` feeds it)."""
    window = SlidingSum(30.0)
    for second in range(60):
        window.add(busy, float(second))
    return window.ratio(59.0)


@pytest.mark.prometheus
@pytest.mark.parametrize(("deployment", "third"), [
    # C's first sample 90 s before the history's end: 85 s of the window.
    ("scaledup", (0.3, 85)),
    # C's last sample 210 s before the history's end: the window's first 95 s.
    ("scaleddown", (0.2, 95))])
def test_the_deployments_busy_ratio_weighs_each_replica_by_its_time_in_the_window(
        history: History, deployment: str, third: tuple[float, int]) -> None:
    # The share of the window the engines ran: every replica's busy time over every
    # replica's time there, as the simulator's is (the two there all along, and C).
    present = [(0.9, WINDOW_S), (0.9, WINDOW_S), third]
    true = sum(gauge(busy) * s for busy, s in present) / sum(s for _, s in present)
    summary = measure(history, deployment)
    assert summary.busy_ratio == pytest.approx(true, rel=0.03)
    assert summary.busy_ratio_max == pytest.approx(gauge(0.9), rel=0.03)


@pytest.mark.prometheus
def test_a_pod_left_out_at_the_windows_edge_is_left_out_of_the_busy_ratio_too(
        history: History) -> None:
    # C's one sample, its first, reads its busy over the half second it had run: 100 %.
    # Left out of the deployment's rates, it made the busiest replica's share and a third
    # of the mean.
    summary = measure(history, "late")
    assert summary.busy_ratio == pytest.approx(gauge(0.5), rel=0.03)
    assert summary.busy_ratio_max == pytest.approx(gauge(0.5), rel=0.03)
