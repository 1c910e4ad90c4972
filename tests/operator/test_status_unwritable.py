"""A status the API server never takes (an admission webhook on llmdeployments/status
that fails every PATCH): the loop cannot record a step, so it does not tick (its pods'
sync goes on), and a trial on the pods would serve unwatched for as long as the webhook
fails. It is said (a warning on the CR's logger, which kopf posts as an event, and a
counter), and after ``give_up_after`` the trial's window of failed writes (at most
``STATUS_GIVE_UP_S``) the trial is ended and the pods put back."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from slopilot.operator import deployment_loop
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.daemon import operator_metrics
from slopilot.operator.decision_events import STATUS_UNWRITABLE
from slopilot.operator.deployment_loop import (
    CONFIG_SYNC_S,
    STATUS_GIVE_UP_S,
    DeploymentLoop,
    give_up_after,
)
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, NAMESPACE_LABEL
from tests.operator.operator_support import (
    NS,
    Cluster,
    add_pod,
    daemon_loop,
    llmd,
    operator,
    operator_mint,
    wait_for,
    wait_steady,
)
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.operator.test_live_config import running, spec_config
from tests.operator.test_unbuilt_trial import _as_operator, _trials
from tests.support.kube_server import RunningEmulator

HOUR_S = 3600.0


class Webhook(Kube):
    """A validating webhook on llmdeployments/status that fails (500) while ``on``."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.client)
        self.on = False

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if self.on and method in ("PATCH", "PUT") and path.endswith("/status"):
            raise ApiError(500, "InternalError", 'Internal error occurred: failed calling '
                           'webhook "status.guard.example": context deadline exceeded')
        return super().request(method, path, **kw)


def _loop(cluster: Cluster, body: dict[str, Any], policy: Any, kube: Kube,
          monkeypatch: pytest.MonkeyPatch, now: list[float],
          posted: list[str] | None = None) -> DeploymentLoop:
    """The CR's daemon loop on the test's clock ``now[0]``; each ``StatusUnwritable``
    event's message goes to ``posted`` (kopf's posting needs its running context: the
    last test here sees it posted as kopf posts it)."""
    monkeypatch.setattr(deployment_loop, "post_decision", lambda *a, **kw: None)
    monkeypatch.setattr(deployment_loop, "post_status_unwritable",
                        lambda ns, name, uid, message: (posted if posted is not None
                                                        else []).append(message))
    loop = DeploymentLoop(kube, NS, "chat", str(body["metadata"]["uid"]),
                          mint=operator_mint(cluster), policy=policy, factory=_as_operator,
                          locks=LockTable(), logger=logging.getLogger("test.chat"))
    loop.clock = lambda: now[0]
    return loop


def _failures() -> float:
    value = operator_metrics(NS).registry.get_sample_value(
        "slopilot_status_write_failures_total", {NAMESPACE_LABEL: NS, DEPLOYMENT_LABEL: "chat"})
    return value or 0.0


def test_a_status_never_written_ends_the_trial_and_puts_the_pods_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    hook, now, posted = Webhook(cluster.kube), [1_000_000.0], []
    loop = _loop(cluster, body, policy, hook, monkeypatch, now, posted)
    failed_before = _failures()
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        before = spec_config(cluster)
        assert loop.step()
        trial = cluster.status()["controller"]["trial"]
        assert running(pod)["max_num_seqs"] == trial["config"]["max_num_seqs"]
        hook.on = True
        caplog.set_level(logging.WARNING, logger="test.chat")
        now[0] += 60.0
        assert loop.step()
        assert loop.step()  # the retry of the same decision
        assert _failures() - failed_before == 2
        said = [r.getMessage() for r in caplog.records if r.name == "test.chat"]
        assert any("status" in m and "500" in m for m in said)
        assert len(posted) == 1 and "500" in posted[0]  # at the first failure alone
        assert running(pod)["max_num_seqs"] == trial["config"]["max_num_seqs"]  # not yet
        now[0] += STATUS_GIVE_UP_S
        assert loop.step()
        assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
        ended = _trials(body, storage)[0]
        assert ended.state is TrialState.FAIL
        assert ended.user_attrs["fail_reason"].startswith("status_unwritable")
        assert any("trial 0" in r.getMessage() for r in caplog.records
                   if r.name == "test.chat")
        assert len(posted) == 2 and posted[1].startswith("status_unwritable: trial 0 ended")
        hook.on = False  # the webhook is fixed: the ended episode goes on record
        now[0] += 60.0
        assert loop.step()
        saved = cluster.status()["controller"]
        assert saved.get("trial") is None and saved["reason"].startswith("status_unwritable")


def test_a_restarted_operator_does_not_judge_the_trial_the_old_one_ended_unrecorded(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The status still has the trial on record, its config no longer on the pods: the
    next operator must not measure it, nor commit it over its study's FAIL."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        before = spec_config(cluster)
        assert loop.step()
        hook.on = True
        now[0] += 60.0
        assert loop.step()
        now[0] += STATUS_GIVE_UP_S
        assert loop.step()
        loop.close()  # the operator restarts; the webhook is gone with the old one
        assert cluster.status()["controller"]["trial"]["number"] == 0
        second = daemon_loop(cluster, body, monkeypatch, factory=_as_operator, policy=policy)
        second.clock = lambda: now[0]
        now[0] += 60.0
        assert second.step()
        assert cluster.status()["controller"].get("trial") is None
        assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
        for _ in range(3):
            now[0] += 2 * HOUR_S
            assert second.step()
            assert "trial 0 holds" not in cluster.status()["controller"]["reason"]
    assert _trials(body, storage)[0].state is TrialState.FAIL


def _canary_cr(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
               tmp_path: Path, window: str = "1h"
               ) -> tuple[dict[str, Any], OperatorPolicy, list[PodStandIn]]:
    """``tuning_cr`` on two replicas, trials on a canary: the CR, the policy, its pods."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    kube.install(crd_manifest())
    body = cluster.create(llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                               tuning={"window": window, "storage": storage, "canary": True}))
    mint = operator_mint(cluster)
    assert reconcile(cluster.kube, body, policy=policy, mint=mint).valid
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    token = mint.for_body(cluster.get())
    return body, policy, [PodStandIn(token, spec_config(cluster)) for _ in range(2)]


def _runs(pod: PodStandIn, config: dict[str, Any]) -> None:
    """``pod`` runs ``config`` now (an engine restarted on a ConfigMap, a hand's PUT)."""
    with pod.lock:
        pod.config = dict(config)


def test_the_pods_follow_the_spec_while_the_status_takes_no_write(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The sync needs no write of the decision held: while the writes fail, a pod that
    drifts is brought back, the canary to the trial it runs while the trial is live, and
    to the spec's once the trial is given up."""
    body, policy, pods = _canary_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        assert loop.step()
        assert cluster.status()["controller"]["trial"]["canary_replica"] == "chat-pod-0"
        spec, on_trial = spec_config(cluster), running(pods[0])
        assert on_trial != spec and running(pods[1]) == spec
        hook.on = True
        now[0] += 10.0
        assert loop.step()
        assert loop.unwritten is not None  # the decision is held, not on record
        # The canary restarts on the ConfigMap's config, the other pod is sent other knobs.
        _runs(pods[0], spec)
        _runs(pods[1], {**spec, "token_budget": spec["token_budget"] // 2})
        now[0] += CONFIG_SYNC_S
        assert loop.step()
        assert running(pods[0]) == on_trial  # the trial goes on: it is measured on it
        assert running(pods[1]) == spec
        # An edit of a knob the trial sets: the other pod runs it at once (a new
        # generation), the canary keeps the trial's.
        trial = loop.controller.loop.trial
        assert trial is not None and "token_budget" in trial.config
        cluster.patch("chat", {"spec": {"engine": {"tokenBudget": spec["token_budget"] * 2}}})
        spec = spec_config(cluster)
        now[0] += 1.0
        assert loop.step()
        assert running(pods[0]) == on_trial and running(pods[1]) == spec
        assert loop.unwritten is not None
        # Given up: the canary is the spec's, and the sync does not put the trial back.
        now[0] += STATUS_GIVE_UP_S
        assert loop.step()
        assert loop.controller.loop.trial is None
        assert [running(p) for p in pods] == [spec, spec]
        now[0] += CONFIG_SYNC_S
        assert loop.step()
        assert [running(p) for p in pods] == [spec, spec]


def test_a_trial_is_given_up_after_one_window_where_that_is_shorter(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A one-minute trial would have been judged within its minute: it is not left to
    serve five of them unjudged (``give_up_after``)."""
    body, policy, pods = _canary_cr(kube, cluster, prom, tmp_path, window="1m")
    assert give_up_after(60.0) == 60.0 < STATUS_GIVE_UP_S
    assert give_up_after(3600.0) == STATUS_GIVE_UP_S
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    with serving(*pods):
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod.port)
        assert loop.step()
        spec, on_trial = spec_config(cluster), running(pods[0])
        assert on_trial != spec
        hook.on = True
        now[0] += 10.0  # before the trial's early look: its tick holds it, unwritten
        assert loop.step()
        since = loop.unwritten_since
        assert since == now[0] and loop.controller.loop.trial is not None
        now[0] = since + 59.0
        assert loop.step()
        assert loop.controller.loop.trial is not None and running(pods[0]) == on_trial
        now[0] = since + 60.0
        assert loop.step()
        assert loop.controller.loop.trial is None
        assert [running(p) for p in pods] == [spec, spec]
    ended = _trials(body, policy.allowed_storage[0])[0]
    assert ended.state is TrialState.FAIL
    assert ended.user_attrs["fail_reason"].startswith("status_unwritable")


def test_the_failed_write_is_said_by_kopf_as_a_warning_event_on_the_cr(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    """The operator as it runs (kopf, its settings): the warning is posted by kopf's own
    event queue to the events API, which takes writes while the CR's status takes none,
    on the CR by name and uid. Said on the CR's logger alone it was never posted: kopf
    posts a logger's lines only under ``settings.posting.loggers``, off here."""
    with operator(kube_login):
        uid = cluster.create(llmd(prometheus={"url": prom.url}))["metadata"]["uid"]
        wait_steady(cluster)
        # Every tick writes its status: the next one fails, until the webhook is fixed.
        kube_login.emulator.fail("PATCH", "llmdeployments", subresource="status",
                                 times=1_000_000)
        # kopf posts events from a queue of its own: waited for, not read at once.
        said = wait_for(lambda: [e for e in cluster.events(STATUS_UNWRITABLE)
                                 if "status write failed" in (e.message or "")],
                        what="the failed write's event")
        kube_login.emulator.heal()
    event = said[0]
    assert event.type == "Warning"
    assert "500" in event.message and "injected failure" in event.message
    ref = event.involved_object
    assert (ref.kind, ref.name, ref.namespace, ref.uid) == ("LLMDeployment", "chat", NS, uid)


def test_a_forged_trial_study_of_another_cr_is_not_read(tmp_path: Path) -> None:
    """``end_told`` read whatever study ``status.controller.trial.study`` named: a tenant
    who can write its status named another CR's study in the shared default storage and
    got that study's failure reason written into its own status and the operator's log
    (and whether its trial exists). Only this CR's own studies are read, as
    ``fail_left_trial`` reads only them."""
    from slopilot.operator.trial_ends import end_told
    from slopilot.tuner.loop.state import LoopState
    from slopilot.tuner.study.storage import open_study

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    for name in ("team-b/chat/1111-bbbb", "team-a/evil/2222-aaaa"):
        study = open_study(url, name)
        trial = study.ask()
        trial.set_user_attr("fail_reason", f"private to {name}")
        study.tell(trial.number, state=TrialState.FAIL)
    body = {"metadata": {"namespace": "team-a", "name": "evil", "uid": "2222-aaaa"},
            "spec": {}}

    def told(study: str) -> LoopState:
        state = LoopState.from_dict({"state": "tuning", "trial": {
            "number": 0, "config": {}, "started_at": 0.0, "canary": False, "study": study}})
        end_told(state, body, OperatorPolicy(default_storage=url), url)
        return state

    forged = told("team-b/chat/1111-bbbb")
    assert forged.trial is not None and "private" not in (forged.reason or "")
    own = told("team-a/evil/2222-aaaa")  # its own study: read, the trial ended
    assert own.trial is None and "private to team-a/evil/2222-aaaa" in (own.reason or "")
