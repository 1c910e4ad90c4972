"""The virtual-time cluster the closed-loop benchmark runs the controller against."""

from __future__ import annotations

import pytest

from slopilot.engine.config import ConfigError
from slopilot.engine.request import Priority
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.stats import REFUSED_TTFT_S
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.adapters import SimAlerts, SimDeployment, SimProbe, SimWindows

SCENARIO = load_scenario("tiny-cpu")


def test_windows_scaling_and_canary_config() -> None:
    cluster = SimCluster(SCENARIO, dict(SCENARIO.engine), replicas=1, seed=0, duration_s=40)
    dep = SimDeployment(cluster)
    cluster.advance(10.0)
    dep.scale(2)
    dep.apply_config({"token_budget": 512, "chunk_size": 256}, canary=True)
    assert dep.current_config()["token_budget"] == 2048
    cluster.advance(25.0)  # the engine swaps a new config in at its next iteration
    assert cluster.reps[0].engine.config.token_budget == 512
    assert cluster.reps[1].engine.config.token_budget == 2048
    whole, canary = cluster.summary(0, 25), cluster.summary(10, 25, canary=True)
    assert 0 < canary.overall.requests_finished < whole.overall.requests_finished
    assert whole.request_rate == pytest.approx(3.0, rel=0.5)
    # The canary's own arrivals, as its selected series read live (the whole cluster's
    # were read): two replicas share the load from t=10 s.
    assert canary.request_rate is not None and whole.request_rate is not None
    assert canary.request_rate < 0.8 * cluster.summary(10, 25).request_rate
    dep.scale(1)
    cluster.advance(40.0)
    assert dep.replicas() == 1 and len(cluster.retired) == 1
    with pytest.raises(ConfigError):
        dep.apply_config({"chunk_size": 99999}, canary=False)


def test_alerts_hold_for_their_for_time_and_windows_reject_thin_data() -> None:
    cluster = SimCluster(SCENARIO, {"token_budget": 8192, "chunk_size": 8192}, replicas=1,
                         seed=0, duration_s=60)
    alerts = SimAlerts(cluster, RuleOptions(interval_s=5, rate_window_s=20, alert_for_s=10))
    fired = []
    for t in range(5, 61, 5):
        cluster.advance(float(t))
        fired.append({a.name for a in alerts.firing()})
    assert "SlopilotTTFTP99High" in set().union(*fired)
    first = next(i for i, f in enumerate(fired) if f)
    assert first >= 2  # held for alert_for_s before firing
    with pytest.raises(Exception, match="need 1000"):
        SimWindows(cluster, min_requests=1000).measure(0, 60, canary=False)
    probe = SimProbe(cluster, window_s=20).measure(60.0)
    assert probe.slo == SCENARIO.slo and probe.duration_s == 120.0


def test_iteration_samples_are_the_plants_own_series() -> None:
    from slopilot.engine.sim.correction import twin_error
    from slopilot.engine.sim.twin import with_profile
    from tests.support.profiles import make_profile

    profile = make_profile()
    cluster = SimCluster(with_profile(load_scenario("tiny-cpu"), profile), {}, replicas=2,
                         seed=0)
    cluster.advance(40.0)
    whole = cluster.iteration_samples(0.0, 40.0)
    halves = cluster.iteration_samples(0.0, 20.0) + cluster.iteration_samples(20.0, 40.0)
    assert {s.kind for s in whole} >= {"decode", "mixed"}
    for kind in {s.kind for s in whole}:
        a = next(s for s in whole if s.kind == kind)
        b = [s for s in halves if s.kind == kind]
        assert a.iterations == sum(s.iterations for s in b)
        assert a.seconds == pytest.approx(sum(s.seconds for s in b))
    # The profile the plant runs on predicts its step times exactly.
    assert twin_error(profile, whole) == pytest.approx(0.0, abs=1e-9)
    canary = cluster.iteration_samples(0.0, 40.0, canary=True)
    assert sum(s.iterations for s in canary) < sum(s.iterations for s in whole)


def test_requests_turned_away_for_load_read_as_first_tokens_never_given() -> None:
    """A full waiting queue turns requests away: in the window's TTFT P99 each is a first
    token never given, as in ``simulate`` and the live rules; left out, the P99 was the
    few served requests' and the loop saw an SLO held."""
    knobs = {**SCENARIO.engine, "max_num_seqs": 2, "max_waiting": 2}
    cluster = SimCluster(SCENARIO, knobs, replicas=1, seed=0, duration_s=20)
    cluster.advance(20.0)
    assert cluster.reps[0].recorder.ev.refused
    s = cluster.summary(0, 20)
    assert s.overall.ttft_p99_ms == REFUSED_TTFT_S * 1000.0
    # Misses in the attainment too, by finish time and by arrival.
    refused = sum(1 for _, c, _ in cluster.reps[0].recorder.ev.refused if c == Priority.P1)
    met = sum(ok for _, c, ok, _, _ in cluster.reps[0].recorder.ev.finished
              if c == Priority.P1)
    assert refused and s.classes[Priority.P1].slo_attainment is not None
    assert s.classes[Priority.P1].slo_attainment <= met / (met + refused)
    by_arrival = cluster.attainment_by_arrival(0, 20, Priority.P1)
    assert by_arrival is not None and by_arrival <= met / (met + refused)


def test_the_windows_read_the_queue_a_trial_inherits_and_its_drain() -> None:
    """What a trial's backlog wait reads on the cluster (``loop/backlog_wait.py``): two
    sequences at a time leave requests waiting; the scenario's own config, applied as a
    trial, works them off, and the arrivals read are the scenario's ~3/s either way."""
    cluster = SimCluster(SCENARIO, {"token_budget": 512, "chunk_size": 256,
                                    "max_num_seqs": 2}, replicas=1, seed=0, duration_s=80)
    windows = SimWindows(cluster)
    cluster.advance(60.0)
    queued = windows.queue(60.0, canary=False)
    assert queued is not None and queued.waiting >= 10
    assert queued.arrivals_per_s == pytest.approx(3.0, rel=0.3)
    SimDeployment(cluster).apply_config(dict(SCENARIO.engine), canary=False, trial=True)
    cluster.advance(70.0)
    drained = windows.queue(70.0, canary=False)
    assert drained is not None and drained.waiting <= 1
    assert drained.arrivals_per_s == pytest.approx(3.0, rel=0.3)


def test_a_windows_rows_are_found_by_time_as_a_scan_finds_them() -> None:
    """``summary`` bisects each replica's rows by time: they must be written in time
    order (retired replicas', refusals' and a scaled cluster's too), and a window's rows
    are then the ones a scan of every row keeps."""
    knobs = {**SCENARIO.engine, "max_num_seqs": 2, "max_waiting": 2}
    cluster = SimCluster(SCENARIO, knobs, replicas=2, seed=0, duration_s=30)
    dep = SimDeployment(cluster)
    cluster.advance(10.0)
    dep.scale(3)
    cluster.advance(20.0)
    dep.scale(1)
    cluster.advance(30.0)
    reps = cluster.reps + cluster.retired
    assert cluster.retired and any(rep.recorder.ev.refused for rep in reps)
    for rep in reps:
        ev = rep.recorder.ev
        for name in ("ttft", "gaps", "finished", "steps", "refused", "iterations"):
            times = [row[0] for row in getattr(ev, name)]
            assert times == sorted(times), name
        assert ev.arrived == sorted(ev.arrived)
    for start, end in [(0.0, 30.0), (5.0, 12.5), (12.5, 12.6), (29.0, 45.0)]:
        s = cluster.summary(start, end)
        ttft = [r for rep in reps for r in rep.recorder.ev.ttft if start <= r[0] < end]
        done = [r for rep in reps for r in rep.recorder.ev.finished if start <= r[0] < end]
        refused = [r for rep in reps for r in rep.recorder.ev.refused if start <= r[0] < end]
        arrived = [t for rep in reps for t in rep.recorder.ev.arrived if start <= t < end]
        assert s.overall.requests_finished == len(done)
        assert s.overall.requests_refused == len(refused)
        assert s.overall.ttft_samples == len(ttft) + len(refused)
        assert s.request_rate == len(arrived) / (end - start)
