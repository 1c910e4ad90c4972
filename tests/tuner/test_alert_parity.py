"""One alert table, two evaluators: promtool and the Python conditions agree, ``for`` included.

The same synthetic timeline of the figures the alerts read (P99s per class, preemptions
per minute, utilization, waiting requests, prefix hit ratio) goes through

* promtool: as input series of the recorded series the rendered alert rules read, one
  sample per evaluation, an absent figure as a stale marker; and through
* ``SummaryAlerts``: as one window summary per evaluation.

The Python verdicts at every evaluation are written as promtool's expected alerts, so
promtool passes exactly when both evaluators fire the same alerts at the same evaluations.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.prometheus.alert_table import Figure
from slopilot.tuner.prometheus.alerts import SummaryAlerts
from slopilot.tuner.prometheus.rules import RuleOptions, identity_labels, render_rule_groups
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool
from tests.support.summaries import partial_summary

SLO = SLOSpec.from_dict({"profile": "standard", "prefix_hit_min": 0.95})
NAMESPACE, DEPLOYMENT = "team-a", "chat"
IDENTITY = identity_labels(DEPLOYMENT, NAMESPACE)

# Timeline key -> (the recorded series, its class label, where a summary holds it, scale).
FIGURES: dict[str, tuple[Figure, dict[str, str], tuple[str, ...], float]] = {
    **{f"ttft_{p.label}": (Figure.TTFT_P99, {"priority_class": p.label},
                           ("classes", p.label, "ttft_p99_ms"), 1000.0) for p in Priority},
    **{f"tbt_{p.label}": (Figure.TBT_P99, {"priority_class": p.label},
                          ("classes", p.label, "tbt_p99_ms"), 1000.0) for p in Priority},
    "preemptions": (Figure.PREEMPTIONS_PER_MIN, {}, ("preemptions_per_min",), 1.0),
    "utilization": (Figure.UTILIZATION, {}, ("gpu_utilization",), 1.0),
    "waiting": (Figure.REQUESTS_WAITING, {}, ("requests_waiting",), 1.0),
    "prefix": (Figure.PREFIX_HIT_RATIO, {}, ("prefix_cache_hit_ratio",), 1.0),
    "stalled": (Figure.STALLED_REPLICAS, {}, ("stalled_replicas",), 1.0),
    "down": (Figure.TARGETS_DOWN, {}, ("targets_down",), 1.0),
}
# The sustained-breach rows' P99s over the long window: in the long window's summary.
LONG_FIGURES: dict[str, tuple[Figure, dict[str, str], tuple[str, ...], float]] = {
    **{f"ttft_long_{p.label}": (Figure.TTFT_P99_LONG, {"priority_class": p.label},
                                ("classes", p.label, "ttft_p99_ms"), 1000.0) for p in Priority},
    **{f"tbt_long_{p.label}": (Figure.TBT_P99_LONG, {"priority_class": p.label},
                               ("classes", p.label, "tbt_p99_ms"), 1000.0) for p in Priority},
}
Timeline = dict[str, list[float | None]]
Verdicts = list[set[tuple[str, ...]]]  # per evaluation: (alert, severity, action, class)


def _run(values: Sequence[tuple[float | None, int]]) -> list[float | None]:
    out: list[float | None] = []
    for value, count in values:
        out += [value] * count
    return out


def boundary_timeline() -> Timeline:
    """Hand-written: every threshold just above, exactly at, just below; runs of each length.

    Standard profile: P1 TBT scales above 2 x 100 ms = 0.2 s for 3 evaluations; P1 TTFT
    warns above 0.5 s and retunes above 1 s, and retunes above 0.5 s over the long window,
    as P0 TBT above 20 ms does; preemptions above 10/min; utilization under
    0.6 while more than 100 wait; prefix hits under 0.95. 30 evaluations.
    """
    n = 30
    quiet: Timeline = {key: [None] * n for key in {**FIGURES, **LONG_FIGURES}}
    quiet.update({"ttft_p0": [0.05] * n, "tbt_p0": [0.01] * n, "ttft_p2": [9.0] * n,
                  "tbt_p2": [9.0] * n})
    quiet["tbt_p1"] = _run([(0.1, 1), (0.2, 1), (0.2001, 2), (0.1, 1),  # 2 over: no fire
                            (0.25, 3), (0.3, 2), (0.2, 1),  # 3 over: fires on the 3rd
                            (0.25, 2), (None, 1), (0.25, 3),  # stale resets the count
                            (math.nan, 1), (0.21, 4), (0.1, 9)])
    quiet["ttft_p1"] = _run([(0.8, 8), (1.0, 4), (1.01, 6), (0.4, 2), (0.5, 2),
                             (0.5001, 5), (0.1, 3)])
    quiet["preemptions"] = _run([(10.0, 6), (10.5, 6), (0.0, 2), (10.01, 4), (9.99, 12)])
    quiet["utilization"] = _run([(0.6, 6), (0.59, 12), (0.2, 6), (0.61, 6)])
    quiet["waiting"] = _run([(101.0, 6), (100.0, 6), (101.0, 12), (500.0, 6)])
    quiet["prefix"] = _run([(0.95, 6), (0.949, 7), (1.0, 2), (0.5, 6), (None, 2), (0.9, 7)])
    # A replica stalled (1 or 2) for runs of each length; 0 and no data between.
    quiet["stalled"] = _run([(0.0, 3), (1.0, 4), (0.0, 1), (2.0, 6), (None, 1), (1.0, 5),
                             (0.0, 10)])
    quiet["down"] = _run([(0.0, 5), (1.0, 5), (math.nan, 1), (1.0, 7), (0.0, 2), (3.0, 5),
                          (0.0, 5)])
    # Over the long window: P1 TTFT over its 0.5 s SLO, P0 TBT over its 20 ms, runs of
    # each length.
    quiet["ttft_long_p1"] = _run([(0.5, 5), (0.5001, 4), (0.4, 1), (0.6, 6), (None, 2),
                                  (0.7, 8), (0.1, 4)])
    quiet["tbt_long_p0"] = _run([(0.02, 3), (0.0201, 5), (math.nan, 1), (0.03, 7),
                                 (0.01, 14)])
    return quiet


def random_timeline(seed: int, n: int = 60) -> Timeline:
    """Sticky random walks around each threshold: long runs over and under, some gaps."""
    rng = random.Random(seed)
    around = {"ttft_p0": 0.1, "tbt_p0": 0.04, "ttft_p1": 1.0, "tbt_p1": 0.2,
              "ttft_p2": 1.0, "tbt_p2": 0.2, "preemptions": 10.0, "utilization": 0.6,
              "waiting": 100.0, "prefix": 0.95, "stalled": 0.0, "down": 0.0,
              "ttft_long_p0": 0.1, "tbt_long_p0": 0.02,
              "ttft_long_p1": 0.5, "tbt_long_p1": 0.1, "ttft_long_p2": 1.0,
              "tbt_long_p2": 0.2}
    out: Timeline = {}
    for key, mid in around.items():
        level, series = rng.choice((0.9, 1.1)), []
        for _ in range(n):
            if rng.random() < 0.2:
                level = rng.choice((0.5, 0.99, 1.0, 1.01, 1.5, 2.0, 2.01))
            roll = rng.random()
            series.append(None if roll < 0.03 else math.nan if roll < 0.05 else mid * level)
        series[0] = mid
        out[key] = series
    for key in ("stalled", "down"):  # counts: runs of 0 and of replicas stalled or down
        level, counts = 0.0, []
        for _ in range(n):
            if rng.random() < 0.15:
                level = rng.choice((0.0, 0.0, 1.0, 2.0))
            roll = rng.random()
            counts.append(None if roll < 0.03 else math.nan if roll < 0.05 else level)
        out[key] = counts
    return out


def long_summary_at(timeline: Timeline, k: int) -> WindowSummary:
    summary: dict[str, Any] = {"classes": {p.label: {} for p in Priority}}
    for key, (_, _, (_, label, field), scale) in LONG_FIGURES.items():
        value = timeline[key][k]
        summary["classes"][label][field] = None if value is None else value * scale
    return partial_summary(summary)


def summary_at(timeline: Timeline, k: int) -> WindowSummary:
    summary: dict[str, Any] = {"classes": {p.label: {} for p in Priority}}
    for key, (_, _, path, scale) in FIGURES.items():
        value = timeline[key][k]
        node = summary
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = None if value is None else value * scale
    # The busy ratio only counts where no GPU utilization is reported (the rule's "or").
    gpu = summary["gpu_utilization"]
    summary["busy_ratio"] = None if gpu is None else 1.0 - gpu
    if k % 7 == 3:  # now and then no DCGM: the busy ratio stands in, as the rule's "or"
        summary["gpu_utilization"], summary["busy_ratio"] = None, gpu
    return partial_summary(summary)


def python_verdicts(timeline: Timeline, options: RuleOptions) -> Verdicts:
    alerts = SummaryAlerts(SLO, options)
    n = len(next(iter(timeline.values())))
    return [{(a.name, a.severity, a.action.value, a.priority_class)
             for a in alerts.evaluate(summary_at(timeline, k), k * options.interval_s,
                                      long_summary_at(timeline, k))}
            for k in range(n)]


def _text(value: float | None) -> str:
    if value is None:
        return "stale"
    return "NaN" if math.isnan(value) else repr(value)


def promtool_files(timeline: Timeline, options: RuleOptions, verdicts: Verdicts,
                   workdir: Path) -> Path:
    group = render_rule_groups(SLO, DEPLOYMENT, namespace=NAMESPACE,
                               options=options)["groups"][0]
    alerts = [{k: v for k, v in r.items() if k != "annotations"}
              for r in group["rules"] if "alert" in r]
    (workdir / "alerts.yaml").write_text(yaml.safe_dump(
        {"groups": [{**group, "rules": alerts}]}, sort_keys=False))
    names = sorted({r["alert"] for r in alerts})
    series = []
    for key, (figure, labels, _, _) in {**FIGURES, **LONG_FIGURES}.items():
        selector = ",".join(f'{k}="{v}"' for k, v in {**IDENTITY, **labels}.items())
        series.append({"series": f"{figure.value}{{{selector}}}",
                       "values": " ".join(_text(v) for v in timeline[key])})
    checks = []
    for k, fired in enumerate(verdicts):
        for name in names:
            checks.append({"eval_time": f"{k * options.interval_s}s", "alertname": name,
                           "exp_alerts": [
                               {"exp_labels": {"severity": sev, "action": action,
                                               "priority_class": cls, **IDENTITY}}
                               for n, sev, action, cls in sorted(fired) if n == name]})
    test = {"rule_files": ["alerts.yaml"],
            "evaluation_interval": f"{options.interval_s}s",
            "tests": [{"interval": f"{options.interval_s}s", "input_series": series,
                       "alert_rule_test": checks}]}
    path = workdir / "parity.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return path


def assert_parity(binaries: PrometheusBinaries, timeline: Timeline, options: RuleOptions,
                  workdir: Path) -> Verdicts:
    verdicts = python_verdicts(timeline, options)
    path = promtool_files(timeline, options, verdicts, workdir)
    result = promtool(binaries, "test", "rules", path.name, cwd=workdir)
    assert result.returncode == 0, (
        "promtool and SummaryAlerts disagree (exp: Python, got: promtool):\n"
        + (result.stdout + result.stderr)[-6000:])
    return verdicts


def firing_at(verdicts: Verdicts, name: str,
                 severity: str | None = None) -> list[int]:
    return [k for k, fired in enumerate(verdicts)
            if any(n == name and (severity is None or s == severity) for n, s, _, _ in fired)]


# When each alert fires on the boundary timeline (evaluation indices), by the semantics of
# alert_table: with the defaults (30 s, for 2m) the 5th evaluation holding, TBT the 3rd;
# at 10 s with for 45s the 6th, TBT with one period at once.
EXPECTED_FIRST = {
    "defaults": {("SlopilotTBTP99High", "critical"): [7, 8, 9, 16, 20, 21],
                 ("SlopilotTTFTP99High", "warning"): [*range(4, 18), 26],
                 ("SlopilotTTFTP99High", "critical"): [16, 17],
                 ("SlopilotPreemptionStorm", "warning"): [10, 11],
                 ("SlopilotBatchingUnderused", "warning"): list(range(16, 24)),
                 ("SlopilotPrefixCacheHitLow", "info"): [10, 11, 12, 19, 20, 27, 28, 29],
                 # 5 min to hold: no run on the long window is that long here.
                 ("SlopilotTTFTP99Sustained", "warning"): [],
                 ("SlopilotTBTP99Sustained", "warning"): [],
                 # Held 2 min: the 5th evaluation of a run, none for the 4-long one.
                 ("SlopilotEngineStalled", "critical"): [12, 13, 19],
                 ("SlopilotTargetsDown", "critical"): [9, 15, 16, 17, 24]},
    # A 2 min breach window: held 2 min, the 5th evaluation.
    "breach2m": {("SlopilotTTFTP99Sustained", "warning"): [14, 15, 22, 23, 24, 25],
                 ("SlopilotTBTP99Sustained", "warning"): [7, 13, 14, 15],
                 ("SlopilotTTFTP99High", "warning"): [*range(4, 18), 26]},
    "interval10-for45-tbt1": {
        ("SlopilotTBTP99High", "critical"): [2, 3, *range(5, 10), 11, 12, 14, 15, 16,
                                             *range(18, 22)],
        ("SlopilotTTFTP99High", "warning"): list(range(5, 18)),
        ("SlopilotTTFTP99High", "critical"): [17],
        ("SlopilotPreemptionStorm", "warning"): [11],
        ("SlopilotBatchingUnderused", "warning"): list(range(17, 24)),
        ("SlopilotPrefixCacheHitLow", "info"): [11, 12, 20, 28, 29],
        ("SlopilotTTFTP99Sustained", "warning"): [],
        ("SlopilotTBTP99Sustained", "warning"): []},
}
OPTIONS = {"defaults": RuleOptions(), "breach2m": RuleOptions(breach_window_s=120),
           "interval10-for45-tbt1": RuleOptions(interval_s=10, rate_window_s=60,
                                                alert_for_s=45, tbt_periods=1)}


@pytest.mark.prometheus
@pytest.mark.parametrize("case", list(OPTIONS))
def test_boundary_timeline_gives_the_same_verdicts(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        case: str) -> None:
    verdicts = assert_parity(prometheus_binaries, boundary_timeline(), OPTIONS[case], tmp_path)
    for (name, severity), when in EXPECTED_FIRST[case].items():
        assert firing_at(verdicts, name, severity) == when, (name, severity)


@pytest.mark.prometheus
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_timelines_give_the_same_verdicts(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        seed: int) -> None:
    assert_parity(prometheus_binaries, random_timeline(seed), RuleOptions(), tmp_path)

