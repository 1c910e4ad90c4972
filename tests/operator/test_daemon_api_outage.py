"""An API server that blips between a tick's decision and its status write.

A trial asked and applied whose status write failed (a 504 from etcd) is kept in the
daemon's ``DeploymentLoop`` and written before its next tick. The outage that failed the
write also failed the next step's first read (a 503): that raised out of the daemon,
kopf started it again 10 s later with a new loop, and the unwritten trial was lost: the
new loop asked a second trial beside the first, which stayed RUNNING on no record until
its heartbeat went stale, missing from the episode's trial count and the hourly cap.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import asyncio
import datetime
import logging
import sqlite3
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import optuna
import pytest
import urllib3

from slopilot.operator import api_reach, deployment_loop, tuning_daemon
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.daemon_ends import DaemonEnds
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.settings import RETRY_BACKOFF_S
from slopilot.operator.tuning_pool import TuningPool
from slopilot.tuner.study.heartbeat import GRACE_S
from tests.operator.operator_support import NS, Cluster, add_pod, daemon_loop, operator_mint
from tests.operator.standins import PrometheusStandIn, build_study_controller, serving
from tests.operator.test_daemon_heartbeat import Stopped, tuning_cr
from tests.support.kube_server import RunningEmulator

TICK_S = 0.01


class Outage(Kube):
    """The cluster's API, which fails the first write of ``status.controller`` with
    ``error`` and every call after it until ``end()``."""

    def __init__(self, kube: Kube, error: Exception) -> None:
        super().__init__(kube.client)
        self.error = error
        self.began = self.over = False

    def end(self) -> None:
        self.over = True

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if self.began and not self.over:
            raise self.error
        if not self.began and method == "PATCH" and path.endswith("/status") \
                and "controller" in (kw.get("body") or {}).get("status", {}):
            self.began = True
            raise self.error
        return super().request(method, path, **kw)


def run_as_kopf(daemon: Callable[..., Any], stopped: Stopped, backoff: Callable[[], None],
                **kwargs: Any) -> list[str]:
    """The daemon run as kopf runs it: one that raised is started again after kopf's
    backoff (``backoff()``), a new call with a new loop, until one returns. What each
    raised, in order."""
    raised: list[str] = []
    for _ in range(5):
        try:
            asyncio.run(daemon(stopped, **kwargs))
        except Exception as exc:
            raised.append(f"{type(exc).__name__}: {exc}")
            backoff()
            continue
        return raised
    raise AssertionError(f"the daemon raised every time: {raised}")


def daemon_memo(cluster: Cluster, kube: Kube, policy: Any) -> Any:
    return types.SimpleNamespace(kube=kube, tokens=operator_mint(cluster), policy=policy,
                                 locks=LockTable(), tuning_pool=TuningPool(),
                                 tuning_daemons=DaemonEnds())


def study_trials(body: dict[str, Any], storage: str) -> list[tuple[int, str]]:
    study = optuna.load_study(study_name=f"{NS}/chat/{body['metadata']['uid']}",
                              storage=storage)
    return [(t.number, t.state.name) for t in study.trials]


@pytest.mark.parametrize("error", [
    ApiError(503, "ServiceUnavailable", "apiserver restarting"),
    ApiError(504, "Timeout", "etcdserver: request timed out"),
    ApiError(429, "TooManyRequests", "the server has received too many requests"),
    urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out."),  # type: ignore[arg-type]
    urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104)),
    ConnectionResetError(104, "Connection reset by peer"),
], ids=["503", "504", "429", "read-timeout", "connection-aborted", "connection-reset"])
def test_an_api_outage_after_an_unwritten_trial_writes_that_trial_not_a_second(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception) -> None:
    """The daemon keeps its loop, and the trial it has not written, across steps the
    outage fails, backing off from the tick interval, doubling; the first step after it
    writes trial 0, and no second trial is asked."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    outage = Outage(cluster.kube, error)
    waits: list[float] = []

    def waited(seconds: float) -> None:
        waits.append(seconds)
        if outage.began and len(waits) == 4:  # the step after the write's and two more
            outage.end()

    async def pause(stopped: Any, seconds: float) -> None:  # no real sleep
        waited(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(tuning_daemon, "pause", pause)
    monkeypatch.setattr(tuning_daemon, "load_factory", lambda: build_study_controller)
    monkeypatch.setattr(deployment_loop, "post_decision", lambda *a, **kw: None)
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", str(TICK_S))
    stopped = Stopped(lambda: bool((cluster.status().get("controller") or {}).get("trial")),
                      kopf.DaemonStoppingReason.OPERATOR_EXITING)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        raised = run_as_kopf(tuning_daemon.run_controller, stopped,
                             lambda: waited(RETRY_BACKOFF_S), name="chat",
                             namespace=NS, uid=body["metadata"]["uid"],
                             memo=daemon_memo(cluster, outage, policy),
                             logger=logging.getLogger("test"))
    assert outage.began and outage.over
    assert study_trials(body, storage) == [(0, "RUNNING")]
    assert cluster.status()["controller"]["trial"]["number"] == 0
    assert raised == []  # kopf never saw it: the loop and its unwritten trial lived on
    first = api_reach.FIRST_RETRY_S
    assert waits[:4] == [TICK_S, first, 2 * first, 4 * first]


def test_a_daemon_backs_off_no_longer_than_the_api_reach_cap() -> None:
    """The waits after failed steps double from the first retry (or the tick interval,
    if longer) to ``MAX_RETRY_S``, and a step that ends resets them."""
    backoff = tuning_daemon.StepBackoff(interval=5.0)
    waits = [backoff.failed() for _ in range(8)]
    assert waits == [5.0, 10.0, 20.0, 30.0, 30.0, 30.0, 30.0, 30.0]
    assert backoff.ended() == 5.0 and backoff.failed() == 5.0
    quick = tuning_daemon.StepBackoff(interval=0.01)
    assert [quick.failed() for _ in range(3)] == [1.0, 2.0, 4.0]
    slow = tuning_daemon.StepBackoff(interval=60.0)
    assert [slow.failed() for _ in range(2)] == [60.0, 60.0]


@pytest.mark.parametrize("error", [
    ApiError(403, "Forbidden", "llmdeployments.slopilot.dev is forbidden"),
    ApiError(422, "Invalid", "status.controller: Invalid value"),
    ApiError(400, "BadRequest", "the body of the request was in an unknown format"),
], ids=["403", "422", "400"])
def test_an_api_refusal_still_raises_out_of_the_daemon(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: ApiError) -> None:
    """The API's word, not its absence: kopf retries the daemon (and logs it) as before."""
    body, policy, _ = tuning_cr(kube, cluster, prom, tmp_path)

    class Refusing(Kube):
        def request(self, method: str, path: str, **kw: Any) -> Any:
            raise error

    monkeypatch.setattr(tuning_daemon, "load_factory", lambda: build_study_controller)
    stopped = Stopped(lambda: False, kopf.DaemonStoppingReason.OPERATOR_EXITING)
    with pytest.raises(ApiError) as raised:
        asyncio.run(tuning_daemon.run_controller(  # type: ignore[call-arg]
            stopped, name="chat", namespace=NS, uid=body["metadata"]["uid"],
            memo=daemon_memo(cluster, Refusing(cluster.kube.client), policy),
            logger=logging.getLogger("test")))
    assert raised.value is error


@pytest.mark.parametrize("error, transient", [
    (ApiError(500, "InternalError", "etcdserver: leader changed"), True),
    (ApiError(503, "", "an answer that is not JSON: '<html>'"), True),
    (ApiError(429, "TooManyRequests", "slow down"), True),
    (urllib3.exceptions.MaxRetryError(None, "/apis", "refused"), True),  # type: ignore[arg-type]
    (ConnectionRefusedError(111, "Connection refused"), True),
    (TimeoutError("timed out"), True),
    (ApiError(403, "Forbidden", "no"), False),
    (ApiError(404, "NotFound", "gone"), False),
    (ApiError(409, "Conflict", "changed"), False),
    (ApiError(422, "Invalid", "bad"), False),
    (ValueError("a bug"), False),
])
def test_transient_api_errors_are_no_answer_not_ready_or_too_many(
        error: BaseException, transient: bool) -> None:
    assert api_reach.transient(error) is transient


def died_unrecorded(cluster: Cluster, body: dict[str, Any],
                    monkeypatch: pytest.MonkeyPatch, policy: OperatorPolicy) -> None:
    """A daemon that asks and applies a trial, then dies before any status write takes
    (each times out): the trial is in the study and on the pods, on no record."""

    def unwritten(*_: Any, **__: Any) -> Any:
        raise ApiError(504, "Timeout", "etcdserver: request timed out")

    dead = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                       policy=policy)
    with monkeypatch.context() as m:
        m.setattr(deployment_loop, "write_status", unwritten)
        assert dead.step()
    assert dead.unwritten is not None and not cluster.status().get("controller")
    dead.close()


def test_a_trial_a_dead_daemon_asked_and_never_recorded_is_failed_as_stale(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The process died between the ask and its write: the trial is on no record, and no
    one beats for it. The next controller to open the study once the grace period has
    passed (a restarted operator's) fails it as stale, rather than leave it RUNNING."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        died_unrecorded(cluster, body, monkeypatch, policy)  # nothing beats for trial 0
        # The grace period passes (the heartbeat's row made as old as it would be then).
        old = datetime.datetime.now() - datetime.timedelta(seconds=GRACE_S + 60)
        with sqlite3.connect(tmp_path / "study.db") as db:
            assert db.execute("UPDATE trial_heartbeats SET heartbeat = ?",
                              (old.isoformat(" "),)).rowcount == 1
        restarted = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                                policy=policy)
        assert restarted.step()
        restarted.close()
    assert study_trials(body, storage) == [(0, "FAIL"), (1, "RUNNING")]
    assert cluster.status()["controller"]["trial"]["number"] == 1


@pytest.mark.parametrize("reason", [kopf.DaemonStoppingReason.OPERATOR_EXITING,
                                    kopf.DaemonStoppingReason.OPERATOR_PAUSING],
                         ids=lambda r: r.name.lower())
def test_a_daemon_stopped_with_a_trial_not_on_record_writes_it_on_its_way_out(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        reason: kopf.DaemonStoppingReason) -> None:
    """The operator exits (or pauses for the other replica) after a status write failed:
    the trial is left for the next operator to resume, which it can only do once it is on
    record. Left unwritten, the next one asked a second trial beside it."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    outage = Outage(cluster.kube, ApiError(504, "Timeout", "etcdserver: request timed out"))

    async def pause(stopped: Any, seconds: float) -> None:
        if outage.began:  # the API is back as the operator is told to stop
            outage.end()
        await asyncio.sleep(0)

    monkeypatch.setattr(tuning_daemon, "pause", pause)
    monkeypatch.setattr(tuning_daemon, "load_factory", lambda: build_study_controller)
    monkeypatch.setattr(deployment_loop, "post_decision", lambda *a, **kw: None)
    stopped = Stopped(lambda: outage.over, reason)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        asyncio.run(tuning_daemon.run_controller(  # type: ignore[call-arg]
            stopped, name="chat", namespace=NS, uid=body["metadata"]["uid"],
            memo=daemon_memo(cluster, outage, policy), logger=logging.getLogger("test")))
        assert outage.over
        assert cluster.status()["controller"]["trial"]["number"] == 0
        restarted = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                                policy=policy)
        assert restarted.step()
        restarted.close()
    assert cluster.status()["controller"]["trial"]["number"] == 0  # resumed, not a second
    assert study_trials(body, storage) == [(0, "RUNNING")]
