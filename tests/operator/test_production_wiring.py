"""``daemon.prometheus_controller``: the ports the operator runs by default, wired for real.

The daemon tests swap this factory for stand-ins; here it is built as the operator
builds it, against a Prometheus that is not there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.pool import Pool

from slopilot.operator.daemon import (
    BASE_SCENARIO_ENV,
    SIM_WORKERS_ENV,
    SIM_WORKERS_PER_NAMESPACE_ENV,
    DaemonContext,
    controller_settings,
    prometheus_controller,
    sim_worker,
    sim_workers,
    sim_workers_per_namespace,
)
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.spec import parse_spec
from slopilot.operator.tokens import TokenMint
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.adapters import PrometheusProbe, PrometheusWindows, range_s
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.clock_offset import PrometheusClock
from slopilot.tuner.prometheus.iterations import PrometheusIterations
from slopilot.tuner.sim.worker import WorkerOffline, WorkerPlanner, WorkerTwin
from slopilot.tuner.study.bounds import DEFAULT_BOUNDS
from slopilot.tuner.study.storage import storage_of
from slopilot.tuner.study.tuner import Tuner
from tests.support.ports import refused_port


class OneDeployment:
    """The two reads the controller makes of the cluster before it acts."""

    def get(self, api_version: str, plural: str, namespace: str, name: str
            ) -> dict[str, Any] | None:
        if plural == "deployments":  # the CR's own, as the reconcile made it
            return {"metadata": {"ownerReferences": [{
                "apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
                "name": "chat", "uid": "u1", "controller": True,
                "blockOwnerDeletion": True}]}, "spec": {"replicas": 1}}
        return None


def context(tmp_path: Path, backend: str = "builtin", namespace_label: str | None = None,
            prometheus_url: str | None = None, **tuning: Any) -> DaemonContext:
    body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u1"},
            "spec": {"model": {"name": "smollm2-135m"}, "backend": backend,
                     # Nothing listens there: a Prometheus that is down.
                     "prometheus": {"url": prometheus_url
                                    or f"http://127.0.0.1:{refused_port()}"},
                     "tuning": {"storage": f"sqlite:///{tmp_path / 'study.db'}", **tuning}}}
    spec = parse_spec(body)
    kube: Any = OneDeployment()
    handle = KubeDeploymentHandle(kube, "team", "chat", mint=TokenMint(b"k" * 32), uid="u1")
    return DaemonContext(kube, handle, spec, "team", "chat",
                         controller_settings(spec, "team", "chat"), None, spec.tuning.storage,
                         uid="u1", namespace_label=namespace_label)


def test_the_default_wiring_holds_the_config_while_prometheus_is_down(tmp_path: Path) -> None:
    ctl = prometheus_controller(context(tmp_path))
    assert isinstance(ctl.evaluator, PrometheusWindows)
    assert isinstance(ctl.probe, PrometheusProbe)
    # Simulator work goes to the process's one worker, shared by every deployment.
    assert isinstance(ctl.offline, WorkerOffline) and isinstance(ctl.planner, WorkerPlanner)
    assert ctl.offline.worker is ctl.planner.worker is sim_worker()
    # The twin check's window too: in kopf's process it slowed the loop for 1-14 s a check.
    assert isinstance(ctl.twin, WorkerTwin) and ctl.twin.worker is sim_worker()
    # Waiting for it in the namespace's turn, not first come, first served.
    assert ctl.offline.tenant == ctl.planner.tenant == ctl.twin.tenant == "team"
    d = ctl.tick(time.time())
    assert d.prometheus_unavailable and d.action is Action.HOLD, d.line()
    assert ctl.state is ControllerState.STEADY
    assert (tmp_path / "study.db").is_file()  # the study lives where the spec says


def test_alerts_and_windows_are_the_deployments_by_namespace_and_name(tmp_path: Path) -> None:
    ctl = prometheus_controller(context(tmp_path))
    assert isinstance(ctl.alerts, AlertSource) and isinstance(ctl.evaluator, PrometheusWindows)
    assert (ctl.alerts.namespace, ctl.alerts.deployment) == ("team", "chat")
    assert ctl.evaluator.selector == {"slopilot_namespace": "team", "slopilot_deployment": "chat"}
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.probe.selector == ctl.evaluator.selector


def test_windows_workload_and_iterations_are_read_on_prometheuss_clock(
        tmp_path: Path) -> None:
    """The loop's times are the operator's clock; the samples, Prometheus's: an operator
    45 s ahead rejected every window (tests/tuner/test_prometheus_clock.py)."""
    ctl = prometheus_controller(context(tmp_path))
    assert isinstance(ctl.evaluator, PrometheusWindows)
    assert isinstance(ctl.probe, PrometheusProbe)
    assert isinstance(ctl.iterations, PrometheusIterations)
    query = ctl.evaluator.query
    assert isinstance(query, PrometheusClock) and query.label == "team/chat"
    assert ctl.probe.query is query and ctl.iterations.query is query
    # The alerts' activeAt, compared with the loop's last action, moved by the same.
    assert isinstance(ctl.alerts, AlertSource) and ctl.alerts.offset_s == query.offset_s


def test_with_an_enforced_namespace_label_every_read_matches_it(tmp_path: Path) -> None:
    ctl = prometheus_controller(context(tmp_path, namespace_label="namespace"))
    assert isinstance(ctl.alerts, AlertSource) and isinstance(ctl.evaluator, PrometheusWindows)
    assert ctl.evaluator.selector == {"slopilot_namespace": "team", "namespace": "team",
                                      "slopilot_deployment": "chat"}
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.probe.selector == ctl.evaluator.selector
    assert ctl.alerts.namespace_label == "namespace"
    assert 'namespace="team"' in ctl.alerts.expr.replace("slopilot_namespace", "")


def test_the_study_searches_tunes_space_over_the_knobs_the_backend_applies(
        tmp_path: Path) -> None:
    builtin = prometheus_controller(context(tmp_path))
    assert isinstance(builtin.study, Tuner)
    assert builtin.study.space.bounds == DEFAULT_BOUNDS  # `slopilot tune`'s, unwidened
    vllm = prometheus_controller(context(tmp_path, backend="vllm"))
    assert isinstance(vllm.study, Tuner)
    assert set(vllm.study.space.bounds) == {"token_budget", "chunk_size", "max_num_seqs"}
    assert vllm.study.space.bounds["token_budget"] == DEFAULT_BOUNDS["token_budget"]


def test_every_rebuilt_controller_of_a_storage_shares_one_connection_pool(
        tmp_path: Path) -> None:
    """Each build (a spec or twin change, a restarted daemon) opened an RDBStorage of its
    own, whose engine and pool were never disposed: on a shared PostgreSQL, a connection
    held per build until ``max_connections`` ran out."""
    connections: list[object] = []

    def connected(dbapi_connection: object, record: object) -> None:
        connections.append(dbapi_connection)

    event.listen(Pool, "connect", connected)  # every pool's new database connections
    try:
        built = [prometheus_controller(context(tmp_path))]
        first = len(connections)  # the one pool's (Optuna nests a session in a connection)
        built += [prometheus_controller(context(tmp_path)) for _ in range(7)]
    finally:
        event.remove(Pool, "connect", connected)
    assert len(connections) == first  # the rebuilds opened none of their own
    engines = set()
    for ctl in built:
        assert isinstance(ctl.study, Tuner)
        storage = storage_of(ctl.study.study)
        assert isinstance(storage, RDBStorage)
        engines.add(id(storage.engine))
    assert len(engines) == 1


def test_a_bad_base_scenario_names_the_variable(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BASE_SCENARIO_ENV, "no-such-scenario")
    with pytest.raises(ControllerError, match=f"{BASE_SCENARIO_ENV}='no-such-scenario'"):
        prometheus_controller(context(tmp_path))


@pytest.mark.parametrize("raw", ["0", "65", "two", "1.5", "-1", "\u0663", "9" * 400])
def test_a_bad_simulator_process_count_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                          raw: str) -> None:
    monkeypatch.setenv(SIM_WORKERS_ENV, raw)
    with pytest.raises(ControllerError, match=f"{SIM_WORKERS_ENV}=.*1 to 64"):
        sim_workers()


def test_the_simulator_process_count_is_the_operators_to_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert sim_workers() == 1
    monkeypatch.setenv(SIM_WORKERS_ENV, "3")
    assert sim_workers() == 3
    assert sim_workers_per_namespace(3) is None  # unset: no cap
    monkeypatch.setenv(SIM_WORKERS_PER_NAMESPACE_ENV, "2")
    assert sim_workers_per_namespace(3) == 2


@pytest.mark.parametrize("raw", ["0", "4", "two", "-1", "\u0663"])
def test_a_bad_per_namespace_cap_names_the_variable_and_the_process_count(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(SIM_WORKERS_PER_NAMESPACE_ENV, raw)
    with pytest.raises(ControllerError,
                       match=f"{SIM_WORKERS_PER_NAMESPACE_ENV}=.*1 to {SIM_WORKERS_ENV} \\(3\\)"):
        sim_workers_per_namespace(3)


def test_an_unreachable_study_database_names_the_field(tmp_path: Path) -> None:
    ctx = context(tmp_path, storage=f"sqlite:///{tmp_path / 'missing' / 'dir' / 'study.db'}")
    with pytest.raises(ControllerError, match=r"spec\.tuning\.storage"):
        prometheus_controller(ctx)


def test_the_controllers_series_carry_the_labels_the_engine_series_and_dashboards_use(
        tmp_path: Path) -> None:
    # The dashboard's $deployment comes from the engines' series (slopilot_deployment is
    # the CR's name, put there by the ServiceMonitor); the controller's series must say
    # the same, or its Tuning panels select nothing. Its log lines keep namespace/name.
    from slopilot.operator.daemon import _METRICS

    ctl = prometheus_controller(context(tmp_path))
    assert (ctl.settings.namespace, ctl.settings.deployment) == ("team", "chat")
    assert ctl.settings.key == "team/chat"
    ctl.tick(time.time())
    replicas = [s for m in _METRICS.registry.collect() if m.name == "slopilot_replicas"
                for s in m.samples if s.labels["slopilot_namespace"] == "team"]
    assert [s.labels["slopilot_deployment"] for s in replicas] == ["chat"]


def window_queries(tmp_path: Path, backend: str,
                   answers: Callable[[str], bool]) -> list[str]:
    """The queries one trial window of a ``backend`` deployment's controller asks, where
    P0 finished 100 requests and each query ``answers`` says 1 (the others nothing)."""
    ctl = prometheus_controller(context(tmp_path, backend=backend))
    assert isinstance(ctl.evaluator, PrometheusWindows)
    asked: list[str] = []

    def query(expr: str, at: float) -> list[dict[str, Any]]:
        asked.append(expr)
        if "_over_time(up{" in expr or "count_over_time(vllm:num_requests_running" in expr \
                or "changes(process_start_time_seconds" in expr:
            return []  # every replica reported, all window long, none restarted
        if "increase(vllm:e2e_request_latency_seconds_count" in expr:
            return [{"metric": {"priority_class": "p0"}, "value": [at, "100"]}]
        return [{"metric": {}, "value": [at, "1"]}] if answers(expr) else []

    ctl.evaluator.query = query
    ctl.evaluator.measure(0.0, 60.0, canary=False)
    return asked


def test_a_vllm_deployments_windows_read_goodput_on_vllms_bucket_edges(
        tmp_path: Path) -> None:
    """vLLM's inter-token buckets are 0.01, 0.025, ...: the default class (p0) of the
    standard profile has a 20 ms TBT SLO between them. The recording rules read it there,
    but the windows (the trials' objective, status.sloAttainment) rendered the rules on
    the built-in engine's edges and selected le="0.02", which vLLM never exports: P0's
    goodput read nothing, and the deployment's attainment 0, however well it served."""
    from slopilot.engine.verdicts import SLO_TOKENS

    # Only the goodput rule reads something.
    asked = window_queries(tmp_path, "vllm", lambda expr: SLO_TOKENS in expr)
    (goodput,) = [e for e in asked if SLO_TOKENS in e and 'priority_class="p0"' in e]
    assert 'le="0.025"' in goodput
    # le="0.02" is read only where a replica exports it over the whole window, its 0.025
    # bucket renamed in its place where not (vLLM's own; a restart in place since an
    # edit): ``unless`` and ``or`` per replica, before the sum (``rules.judged_rates``).
    reads = re.findall(r'rate\([^()]*le="0\.02"\}\[1m\]\)', goodput)
    assert reads
    for read in reads:
        assert f'({read} unless (label_replace(count_over_time(' in goodput
        assert '"le", "0.02", "le", "0\\\\.025")' in goodput


@pytest.mark.parametrize("backend", ["vllm", "builtin"])
def test_a_deployments_windows_read_the_p99s_its_rules_read(tmp_path: Path,
                                                            backend: str) -> None:
    """On vLLM the meter's client-side histograms (vLLM's own read low), as the
    deployment's recording rules; the built-in engine's own are the client's already."""
    from slopilot.engine.meter.client_latency import CLIENT_TBT, CLIENT_TTFT

    asked = window_queries(tmp_path, backend, lambda expr: True)
    p99s = [e for e in asked if e.startswith(("(histogram_quantile(0.99", "histogram_quantile"
                                              "(0.99"))]
    assert len(p99s) == 4  # TTFT and TBT, per class and of every class together
    for metric in (CLIENT_TTFT, CLIENT_TBT):
        assert sum(metric in e for e in p99s) == (2 if backend == "vllm" else 0)


def test_the_probe_reads_the_whole_seconds_each_window_is_read_over(tmp_path: Path) -> None:
    # The twin check holds the probe's workload against a measured window: both are
    # read over the same PromQL range, as the demo's (``probe_window_s``, one rule).
    ctl = prometheus_controller(context(tmp_path, window="90500ms"))
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.settings.window_s == 90.5
    assert ctl.probe.window_s == range_s(1000.0 - 90.5, 1000.0) == 90


def bodies_mostly(expr: str, at: float | None) -> list[dict[str, Any]]:
    """A vLLM deployment's Prometheus over the probe's 120 s: P0 came at 0.5 req/s, its
    clients asking for whole bodies but for 2 streams (the only P0 requests the meter
    times); P1 at 1 req/s, every one a stream. vLLM's own TTFT histogram saw them all."""
    def by_class(p0: float, p1: float) -> list[dict[str, Any]]:
        return [{"metric": {"priority_class": c}, "value": [at, str(v)]}
                for c, v in (("p0", p0), ("p1", p1))]

    def one(value: float, **labels: str) -> list[dict[str, Any]]:
        return [{"metric": labels, "value": [at, str(value)]}]

    if "count(last_over_time(vllm:num_requests_running" in expr:
        return one(2)
    if "unless" in expr:  # every replica runs the meter: none is estimated
        return []
    if "slopilot_client_time_to_first_token_seconds_count" in expr:
        return by_class(2, 120)
    if "vllm:time_to_first_token_seconds_count" in expr:
        return one(180)
    if "slopilot_meter_arrivals_total" in expr or "request_prompt_tokens_count" in expr:
        return by_class(60, 120)
    if "request_prompt_tokens_bucket" in expr or "request_generation_tokens_bucket" in expr:
        return one(180, le="+Inf") + one(180, le="4096.0")
    if "request_prompt_tokens_sum" in expr or "prompt_tokens_total" in expr:
        return one(180 * 500)
    if "request_generation_tokens_sum" in expr:
        return one(180 * 100)
    if "request_generation_tokens_count" in expr:
        return one(180)
    return []


def test_on_vllm_the_hold_reads_the_streams_the_floor_counts_not_the_arrivals(
        tmp_path: Path) -> None:
    """A trial's floor counts the first tokens its TTFT P99 ranks: on vLLM the meter's
    streams (``ClassFigures.ttft_samples``). P0's 0.5 req/s of whole bodies brings 600
    requests in max_trial_s but 20 streams: every trial ended ``too_little_traffic``
    after 20 minutes, while the hold, reading the arrivals, let each go live."""
    from slopilot.tuner.loop.thin_traffic import class_rates, too_thin

    ctl = prometheus_controller(context(tmp_path, backend="vllm"))
    assert isinstance(ctl.probe, PrometheusProbe) and ctl.probe.window_s == 120
    assert (ctl.settings.min_class_requests, ctl.settings.max_trial_s) == (100, 1200)
    ctl.probe.query = bodies_mostly
    arriving = class_rates(ctl.probe.measure(1000.0))
    assert arriving is not None and arriving["p0"] == pytest.approx(0.5, rel=1e-3)
    held = too_thin(ctl, 1000.0, ["p0"])
    assert held == ("too little traffic to tune: P0 0.017 req/s timed reaches 20 of 100 "
                    "requests in max_trial_s 20 min (at most 60 on the 2 timed requests "
                    "of the probe's 120 s)")
    assert too_thin(ctl, 1000.0, ["p1"]) is None  # every P1 request a stream: 1200


def test_on_the_builtin_engine_the_hold_reads_the_arrivals(tmp_path: Path) -> None:
    """Its own histograms are the client's: each request is timed, the arrivals are
    what the floor counts."""
    from slopilot.tuner.loop.thin_traffic import too_thin

    ctl = prometheus_controller(context(tmp_path))
    assert isinstance(ctl.probe, PrometheusProbe)
    ctl.probe.query = bodies_mostly
    assert too_thin(ctl, 1000.0, ["p0"]) is None


def _answering_prometheus(body: bytes) -> Any:
    """A stand-in Prometheus answering every query with ``body`` (a tenant's own)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _vector_of(size: int) -> bytes:
    import json
    series = [{"metric": {"i": f"{i:07d}", "pad": "x" * 200}, "value": [1.0, "1"]}
              for i in range(size // 266)]
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": series}}).encode()


def test_each_read_is_capped_by_its_query_and_charged_to_the_namespace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's own Prometheus answering at the old one-size 8 MiB cap stalled every
    namespace's steps (json.loads holds the GIL): the alerts read within what alerts can
    be, the windows' within what one replica's raw reads can be, and the namespace's
    answers within its budget a minute."""
    from slopilot.tuner.prometheus import answer_budget
    from slopilot.tuner.prometheus.bounded import ALERTS_ANSWER_BYTES, answer_cap
    from slopilot.tuner.study.evaluator import PrometheusUnavailable

    clock = [0.0]
    budgets = answer_budget.NamespaceBudgets(bytes_per_min=2 * 2**20, clock=lambda: clock[0])
    monkeypatch.setattr(answer_budget, "BUDGETS", budgets)
    body = _vector_of(270 * 1024)
    assert ALERTS_ANSWER_BYTES < len(body) < answer_cap(1, 120.0)
    server = _answering_prometheus(body)
    try:
        ctl = prometheus_controller(context(
            tmp_path, prometheus_url=f"http://127.0.0.1:{server.server_address[1]}"))
        assert isinstance(ctl.evaluator, PrometheusWindows)
        with pytest.raises(PrometheusUnavailable, match="over the 256 KiB cap"):
            ctl.alerts.firing()
        left = budgets.budget("team").left()
        read = 0
        while True:  # the windows' query reads it, out of the namespace's budget
            try:
                ctl.evaluator.query("up", None)
            except PrometheusUnavailable as exc:
                assert "LLMDeployment team/chat" in str(exc), exc
                break
            read += 1
        assert read == int(left // len(body))
        assert budgets.budget("other").left() == 2 * 2**20  # another namespace's is whole
    finally:
        server.shutdown()
        server.server_close()
