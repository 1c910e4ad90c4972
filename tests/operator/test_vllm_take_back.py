"""A vLLM trial the operator ends without a controller's verdict leaves the Deployment.

vLLM's knobs are its container's arguments, rendered from ``status.tunedConfig``: no
pod takes a ``PUT``. A trial ended because the spec is now refused, the study's storage
is unreadable, or the status has taken no write for ``STATUS_GIVE_UP_S`` has its
arguments put back to the episode's config on the Deployment, and no reconcile (a drift
repair, the spec fixed) renders the trial's again (vllm_take_back.py,
deployment_loop.py)."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import logging
import secrets
import shutil
import threading
from pathlib import Path
from typing import Any

import kopf
import pytest

from slopilot.operator import handlers, vllm_take_back
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.deployment_loop import STATUS_GIVE_UP_S, DeploymentLoop
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.scale_stamp import record_digest
from slopilot.operator.tokens import KEY_SECRET, TokenMint
from slopilot.operator.vllm_take_back import TAKEN_BACK_ANNOTATION, rendered_body, stamp
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.operator.standins import PrometheusStandIn
from tests.operator.test_status_unwritable import Webhook, _loop
from tests.operator.test_tuned_config_belongs import arg, vllm_args
from tests.operator.test_unbuilt_trial import _on_clock
from tests.support.kube_server import RunningEmulator
from tests.support.waits import wait_for

KNOB_FLAGS = ("--max-num-batched-tokens", "--long-prefill-token-threshold",
              "--max-num-seqs", "--block-size")


def knob_args(cluster: Cluster) -> dict[str, str]:
    args = vllm_args(cluster.kube.client)
    return {flag: arg(args, flag) for flag in KNOB_FLAGS}


def vllm_cr(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
            tmp_path: Path) -> tuple[dict[str, Any], OperatorPolicy]:
    """A reconciled vLLM CR tuning on a SQLite study, a retune alert firing."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    kube.install(crd_manifest())
    body = cluster.create(llmd(backend="vllm", prometheus={"url": prom.url},
                               tuning={"window": "1h", "storage": storage}))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    return body, policy


def trial_started(loop: DeploymentLoop, cluster: Cluster) -> tuple[dict[str, str], int]:
    """The episode's arguments, then the first step's trial (its arguments differ)."""
    before = knob_args(cluster)
    assert loop.step()
    trial = cluster.status()["controller"]["trial"]
    assert trial is not None and cluster.status()["tunedConfig"].get("trial") is True
    assert knob_args(cluster) != before
    return before, int(trial["config"]["max_num_seqs"])


def template(cluster: Cluster) -> dict[str, Any]:
    return cluster.kube.get("apps/v1", "deployments", NS, "chat")["spec"]["template"]


def repaired(cluster: Cluster, policy: OperatorPolicy) -> None:
    """A drift repair, as any event of the Deployment asks one (handlers.repair)."""
    reconcile(cluster.kube, cluster.get(), policy=policy, mint=operator_mint(cluster))


def taken_back(loop: DeploymentLoop, cluster: Cluster, hook: Webhook,
               now: list[float]) -> dict[str, str]:
    """The first step's trial started, then given up (``given_up``): the episode's
    arguments, back on the Deployment."""
    before, _ = trial_started(loop, cluster)
    given_up(loop, cluster, hook, now, before)
    return before


def given_up(loop: DeploymentLoop, cluster: Cluster, hook: Webhook, now: list[float],
             before: dict[str, str]) -> None:
    """The status refusing every write for ``STATUS_GIVE_UP_S`` of a trial: the episode's
    arguments (``before``), back on the Deployment."""
    hook.on = True
    now[0] += 60.0
    assert loop.step()
    now[0] += STATUS_GIVE_UP_S
    assert loop.step()
    assert knob_args(cluster) == before


def stepped_still_taken_back(loop: DeploymentLoop, cluster: Cluster, policy: OperatorPolicy,
                             now: list[float], before: dict[str, str]) -> None:
    """A minute on, the loop's step with the status still taking no write: the episode's
    arguments on the Deployment (taken back again, stamped), the trial still on record,
    and a repair rendering them too."""
    now[0] += 60.0
    assert loop.step()
    assert knob_args(cluster) == before
    assert cluster.status()["tunedConfig"].get("trial") is True
    repaired(cluster, policy)
    assert knob_args(cluster) == before


def test_a_refused_edit_mid_trial_puts_the_episodes_arguments_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    loop = _on_clock(cluster, body, monkeypatch, policy, now)
    before, value = trial_started(loop, cluster)
    cluster.patch("chat", {"spec": {"tuning": {"bounds": {
        "maxNumSeqs": {"min": value - 20, "max": value + 20}}}}})
    now[0] += 60.0
    assert loop.step()
    assert loop.controller is None
    assert knob_args(cluster) == before
    version = cluster.kube.get("apps/v1", "deployments", NS, "chat")["metadata"][
        "resourceVersion"]
    now[0] += 600.0
    assert loop.step()  # already back: no second patch, no rollout
    assert cluster.kube.get("apps/v1", "deployments", NS, "chat")["metadata"][
        "resourceVersion"] == version
    # Fixed: the spec's reconcile renders the episode's config, not the trial's record,
    # and the template it renders is the one taken back (its checksum too): no rollout.
    taken_back = template(cluster)
    cluster.patch("chat", {"spec": {"tuning": {"bounds": None}}})
    repaired(cluster, policy)
    assert template(cluster) == taken_back
    now[0] += 60.0
    assert loop.step()
    assert knob_args(cluster) == before
    assert (cluster.status().get("tunedConfig") or {}).get("trial") is not True


def test_a_study_unreadable_mid_trial_puts_the_episodes_arguments_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    first = _on_clock(cluster, body, monkeypatch, policy, now)
    before, _ = trial_started(first, cluster)
    first.close()
    db = tmp_path / "study.db"
    shutil.move(db, tmp_path / "saved.db")
    db.write_bytes(b"not a database" * 100)
    second = _on_clock(cluster, body, monkeypatch, policy, now)
    now[0] += 60.0
    assert second.step()
    assert second.controller is None
    assert knob_args(cluster) == before
    repaired(cluster, policy)
    assert knob_args(cluster) == before


def test_a_status_never_written_puts_the_episodes_arguments_back_for_good(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before, _ = trial_started(loop, cluster)
    trial_args = knob_args(cluster)
    hook.on = True
    now[0] += 60.0
    assert loop.step()
    assert knob_args(cluster) == trial_args  # not yet
    now[0] += STATUS_GIVE_UP_S
    assert loop.step()
    assert knob_args(cluster) == before
    # The status still records the trial's config, which a drift repair renders from.
    assert cluster.status()["tunedConfig"].get("trial") is True
    repaired(cluster, policy)
    assert knob_args(cluster) == before
    hook.on = False  # fixed: the ended episode goes on record, the trial's config off it
    now[0] += 60.0
    assert loop.step()
    assert cluster.status()["controller"].get("trial") is None
    assert (cluster.status().get("tunedConfig") or {}).get("trial") is not True
    repaired(cluster, policy)
    assert knob_args(cluster) == before


def test_arguments_not_of_the_operators_render_are_left_and_said(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    loop = _on_clock(cluster, body, monkeypatch, policy, now)
    _, value = trial_started(loop, cluster)
    dep = cluster.kube.get("apps/v1", "deployments", NS, "chat")
    containers = dep["spec"]["template"]["spec"]["containers"]
    engine = next(c for c in containers if c["name"] == "engine")
    engine["args"] = [a for a in engine["args"] if a != "--block-size"]  # a hand edit
    cluster.kube.patch("apps/v1", "deployments", NS, "chat",
                       {"spec": {"template": {"spec": {"containers": containers}}}})
    cluster.patch("chat", {"spec": {"tuning": {"bounds": {
        "maxNumSeqs": {"min": value - 20, "max": value + 20}}}}})
    now[0] += 60.0
    assert loop.step()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("not put back" in m and "--block-size" in m for m in said), said
    assert cluster.status()["controller"]["pending_restore"] is not None  # still owed


def _stamp(cluster: Cluster, value: str | None) -> None:
    """A tenant's edit of the stamp: an annotation is anyone's with patch rights on the
    Deployment."""
    cluster.kube.patch("apps/v1", "deployments", NS, "chat", {"metadata": {"annotations": {
        TAKEN_BACK_ANNOTATION: value}}})


def test_a_stamp_a_tenant_computes_renders_no_trial_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    loop = _on_clock(cluster, body, monkeypatch, policy, now)
    trial_started(loop, cluster)
    trial_args = knob_args(cluster)
    status = cluster.status()
    # Everything a digest of the status could be keyed on is the tenant's to read.
    for forged in (record_digest({"tunedConfig": status.get("tunedConfig"),
                                  "controller": status.get("controller")}),
                   record_digest({"uid": body["metadata"]["uid"],
                                  "tunedConfig": status.get("tunedConfig"),
                                  "controller": status.get("controller")})):
        _stamp(cluster, forged)
        repaired(cluster, policy)
        assert knob_args(cluster) == trial_args  # the trial measures its own config


def test_a_stamp_removed_while_the_status_is_unwritable_is_put_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before = taken_back(loop, cluster, hook, now)
    _stamp(cluster, None)
    repaired(cluster, policy)  # the trial's record rendered again, with no stamp
    stepped_still_taken_back(loop, cluster, policy, now, before)


def test_a_stamp_under_a_replaced_key_counts_only_for_a_trial_its_study_failed(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stamp that does not verify (sealed under another key, or junk) is no stamp while
    the trial runs in its study: the CR renders as its status records it. Once the trial
    was ended there (taken back), one under a replaced key (its Secret deleted, the
    operator restarted) still renders the committed config (docs/operations.md)."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before, _ = trial_started(loop, cluster)
    cr, mint = cluster.get(), operator_mint(cluster)
    other = TokenMint(secrets.token_bytes(32))
    junks = ("", "x" * 64, "\u00e9" * 64)
    for junk in (stamp(other, str(body["metadata"]["uid"]), cr["status"]), *junks):
        _stamp(cluster, junk)
        assert rendered_body(cluster.kube, cr, mint, policy) is cr  # the trial runs
    _stamp(cluster, None)
    given_up(loop, cluster, hook, now, before)
    cr = cluster.get()
    committed = rendered_body(cluster.kube, cr, mint, policy)
    assert committed != cr
    assert rendered_body(cluster.kube, cr, other, policy) == committed
    for junk in junks:
        _stamp(cluster, junk)
        assert rendered_body(cluster.kube, cr, mint, policy) == committed


def _restarted(cluster: Cluster, body: dict[str, Any], policy: OperatorPolicy,
               hook: Webhook, monkeypatch: pytest.MonkeyPatch, now: list[float],
               old: DeploymentLoop, rotate: bool) -> DeploymentLoop:
    """The operator restarted: a new loop over the same cluster, holding nothing of the
    old one's memory; with ``rotate`` its key replaced meanwhile (its Secret deleted, so
    the restarted operator creates a new one, as the rotation in docs/operations.md)."""
    old.close()
    if rotate:
        cluster.kube.delete("v1", "secrets", DEFAULT_OPERATOR_NAMESPACE, KEY_SECRET)
    return _loop(cluster, body, policy, hook, monkeypatch, now)


@pytest.mark.parametrize("rotated", [False, True], ids=["same-key", "key-rotated"])
def test_a_restart_mid_outage_keeps_the_trials_arguments_off(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rotated: bool) -> None:
    """The take-back is the Deployment's record, not the old loop's memory: a restarted
    operator (under a new key too) finds the ended trial still on record and keeps its
    arguments off every pod while the status takes no write (docs/operations.md)."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before = taken_back(loop, cluster, hook, now)
    old_key = operator_mint(cluster)
    loop = _restarted(cluster, body, policy, hook, monkeypatch, now, loop, rotated)
    check = operator_mint(cluster)
    assert (check.seal("x", "y") == old_key.seal("x", "y")) is not rotated
    kept_off_until_written(loop, cluster, policy, hook, now, before, check)


def kept_off_until_written(loop: DeploymentLoop, cluster: Cluster, policy: OperatorPolicy,
                           hook: Webhook, now: list[float], before: dict[str, str],
                           check: TokenMint) -> None:
    """Three steps of the restarted loop with the status still refusing writes, each
    followed by a drift repair under ``check``'s key: the episode's arguments stay on the
    Deployment; then the status writable again, the trial off record, and still them."""
    for _ in range(3):
        now[0] += 60.0
        assert loop.step()
        assert cluster.status()["tunedConfig"].get("trial") is True  # still unwritable
        assert knob_args(cluster) == before
        repaired_with(cluster, policy, check)  # a drift repair by the restarted operator
        assert knob_args(cluster) == before
    hook.on = False  # fixed: the trial goes off record
    now[0] += 60.0
    assert loop.step()
    assert (cluster.status().get("tunedConfig") or {}).get("trial") is not True
    repaired_with(cluster, policy, check)
    assert knob_args(cluster) == before


def repaired_with(cluster: Cluster, policy: OperatorPolicy, mint: TokenMint) -> None:
    """A drift repair by an operator holding ``mint``'s key."""
    reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)


class Died(BaseException):
    """The operator's process killed mid-step (no ``except Exception`` catches it)."""


def _ended_before_its_take_back(loop: DeploymentLoop, cluster: Cluster, hook: Webhook,
                                now: list[float], monkeypatch: pytest.MonkeyPatch,
                                failure: BaseException) -> tuple[dict[str, str], dict[str, str]]:
    """The first step's trial started, the status refusing every write for
    ``STATUS_GIVE_UP_S``, and the step that gives the trial up ending it (told failed in
    its study) but its take-back's patch of the Deployment failing (``failure``): the
    episode's arguments and the trial's, still on the Deployment, unstamped."""
    before, _ = trial_started(loop, cluster)
    trial_args = knob_args(cluster)
    hook.on = True
    now[0] += 60.0
    assert loop.step()
    real = vllm_take_back.take_back

    def fails(*args: Any, **kw: Any) -> bool:
        monkeypatch.setattr(vllm_take_back, "take_back", real)  # once
        raise failure

    monkeypatch.setattr(vllm_take_back, "take_back", fails)
    now[0] += STATUS_GIVE_UP_S
    if isinstance(failure, Exception):
        assert loop.step()
    else:
        with pytest.raises(Died):
            loop.step()
    assert vllm_take_back.take_back is real
    assert loop.controller is not None and loop.controller.loop.trial is None  # ended
    assert knob_args(cluster) == trial_args
    dep = cluster.kube.get("apps/v1", "deployments", NS, "chat")
    assert TAKEN_BACK_ANNOTATION not in (dep["metadata"].get("annotations") or {})
    return before, trial_args


@pytest.mark.parametrize("rotated", [False, True], ids=["same-key", "key-rotated"])
def test_a_restart_after_the_trial_ended_but_before_its_take_back_takes_it_back(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rotated: bool) -> None:
    """The old operator died between telling the study its trial failed and patching the
    Deployment's arguments back (with its stamp, one PATCH): no stamp is left, and the
    restarted operator, which finds the trial failed in its study, takes it back all the
    same while the status takes no write (docs/operations.md)."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before, _ = _ended_before_its_take_back(loop, cluster, hook, now, monkeypatch,
                                            Died())
    loop = _restarted(cluster, body, policy, hook, monkeypatch, now, loop, rotated)
    check = operator_mint(cluster)
    kept_off_until_written(loop, cluster, policy, hook, now, before, check)


def test_a_take_back_the_api_refused_is_made_at_the_next_step(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The trial given up, its take-back's patch refused once (the API server down): the
    next step, the status still refusing writes, takes the trial's arguments off."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before, _ = _ended_before_its_take_back(
        loop, cluster, hook, now, monkeypatch,
        ApplyError("chat: the trial's vLLM arguments not taken off Deployment/chat: 503"))
    stepped_still_taken_back(loop, cluster, policy, now, before)



def test_a_repair_before_a_restarted_loops_first_step_under_a_new_key_rolls_nothing(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The key rotated with the restart: the old stamp no longer verifies, and the
    restarted operator's first reconcile (its resume, any event of the Deployment) comes
    before its loop's first step. The trial it would render is failed in its study: the
    repair renders the committed config, the arguments taken back, not the trial's (the
    new key's own token digest is all that rolls, as it rolls every deployment)."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before = taken_back(loop, cluster, hook, now)
    loop = _restarted(cluster, body, policy, hook, monkeypatch, now, loop, rotate=True)
    check = operator_mint(cluster)
    repaired_with(cluster, policy, check)
    assert knob_args(cluster) == before  # not the trial's: no rollout there and back
    now[0] += 60.0
    assert loop.step()
    assert knob_args(cluster) == before
    repaired_with(cluster, policy, check)
    assert knob_args(cluster) == before


def _held_reads(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every read of a trial's failure in its study held until the event is set: a
    storage slower than the reconcile's deadline (``failed_trials.READ_DEADLINE_S``)."""
    from slopilot.operator import trial_ends
    release = threading.Event()
    real = trial_ends.told_failed

    def held(storage: str, name: str, number: int) -> str | None:
        release.wait()
        return real(storage, name, number)

    monkeypatch.setattr(trial_ends, "told_failed", held)
    return release


def _slow_study_after_a_rotated_restart(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clock: list[float]
        ) -> tuple[dict[str, str], kopf.Memo, threading.Event]:
    """A trial taken back, the operator restarted under a new key (the stamp no longer
    verifies) and its study's reads held past the deadline: the episode's arguments, the
    restarted operator's handler memo, and the event that lets the reads answer."""
    from slopilot.operator.failed_trials import FailedTrials
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    before = taken_back(loop, cluster, hook, now)
    _restarted(cluster, body, policy, hook, monkeypatch, now, loop, rotate=True)
    monkeypatch.setattr(vllm_take_back, "FAILED_TRIALS",
                        FailedTrials(lambda: clock[0], deadline_s=0.01))
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: None)
    memo = kopf.Memo(kube=cluster.kube, locks=LockTable(), policy=policy,
                     tokens=operator_mint(cluster))
    return before, memo, _held_reads(monkeypatch)


def test_a_repair_whose_study_read_is_past_its_deadline_waits_for_its_answer(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The restarted operator's first repair and its resume's reconcile come while the
    study's read has not answered within its deadline: each leaves the Deployment as it
    is (the drift repair says so in ``Reconciled``, its timer looks again; the spec
    handler is retried) rather than render the trial's record, its arguments rolled back
    onto the pods until the loop's first step took them off again. Once the read has
    answered (the trial told failed), a repair renders the committed config: no
    rollout at all."""
    from slopilot.operator.failed_trials import DEFERRED_RETRY_S
    log, clock = logging.getLogger("test"), [0.0]
    before, memo, release = _slow_study_after_a_rotated_restart(
        kube, cluster, prom, monkeypatch, tmp_path, clock)
    handlers.repair(cluster.get(), memo, log)
    assert knob_args(cluster) == before  # not the trial's
    said = cluster.condition("Reconciled")
    assert said is not None and said["status"] == "False", said
    assert said["reason"] == "DriftNotRepaired" and "told failed" in said["message"], said
    with pytest.raises(kopf.TemporaryError) as retry:
        handlers.reconcile_spec(body=cluster.get(), memo=memo, logger=log)
    assert retry.value.delay == DEFERRED_RETRY_S
    assert knob_args(cluster) == before
    release.set()
    wait_for(lambda: not any(t.name == "failed-trials" for t in threading.enumerate()),
             "the study's read to answer")
    handlers.repair(cluster.get(), memo, log)
    assert knob_args(cluster) == before
    said = cluster.condition("Reconciled")
    assert said is not None and said["status"] == "True", said


def test_a_study_that_never_answers_defers_a_repair_for_a_bounded_while(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A storage that holds every read blocks no repair for good: past
    ``UNANSWERED_DEFER_S`` on the answers' clock the question counts as no, and the
    repair renders the status as recorded (the trial's arguments, which the loop's
    first step takes off again), the CR's other objects repaired with it."""
    from slopilot.operator.failed_trials import UNANSWERED_DEFER_S
    log, clock = logging.getLogger("test"), [0.0]
    before, memo, release = _slow_study_after_a_rotated_restart(
        kube, cluster, prom, monkeypatch, tmp_path, clock)
    try:
        handlers.repair(cluster.get(), memo, log)
        assert knob_args(cluster) == before
        clock[0] += UNANSWERED_DEFER_S
        handlers.repair(cluster.get(), memo, log)
        assert knob_args(cluster) != before  # rendered as recorded
        said = cluster.condition("Reconciled")
        assert said is not None and said["status"] == "True", said
    finally:
        release.set()


def _counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every read of a trial's failure in its study (``trial_ends.told_failed``), as
    (study, trial number), the reads still made."""
    from slopilot.operator import trial_ends
    reads: list[tuple[str, int]] = []
    real = trial_ends.told_failed

    def counted(storage: str, name: str, number: int) -> str | None:
        reads.append((name, number))
        return real(storage, name, number)

    monkeypatch.setattr(trial_ends, "told_failed", counted)
    return reads


def forged_mid_trial(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                     ) -> tuple[OperatorPolicy, dict[str, str]]:
    """A trial started on the vLLM CR, and a stamp no key made (a tenant's) on its
    Deployment: the policy, and the trial's arguments on the pods."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    loop = _on_clock(cluster, body, monkeypatch, policy, [1_000_000.0])
    trial_started(loop, cluster)
    trial_args = knob_args(cluster)
    _stamp(cluster, "x" * 64)
    return policy, trial_args


def test_a_forged_stamp_mid_trial_does_not_read_the_study_at_each_reconcile(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stamp that does not verify, which a tenant writes on its own Deployment while a
    trial runs: the reconciles (kopf's handler threads, every tenant's) render the trial
    as recorded, and do not each read the study (a database read; Postgres slow or down
    stalled every one of them)."""
    policy, trial_args = forged_mid_trial(kube, cluster, prom, monkeypatch, tmp_path)
    reads = _counted_reads(monkeypatch)
    for _ in range(5):
        repaired(cluster, policy)
        assert knob_args(cluster) == trial_args  # the trial measures its own config
    assert len(reads) <= 1, reads


def test_a_forged_stamp_with_arguments_a_tenant_edits_reads_the_study_once_a_minute(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The tenant edits the engine's arguments too (a repair would roll them): the study
    is asked, and its no kept for ``NOT_FAILED_KEPT_S`` on the answers' clock, not asked
    again at each edit's repair."""
    from slopilot.operator.failed_trials import NOT_FAILED_KEPT_S, FailedTrials
    policy, trial_args = forged_mid_trial(kube, cluster, prom, monkeypatch, tmp_path)
    clock = [0.0]
    monkeypatch.setattr(vllm_take_back, "FAILED_TRIALS", FailedTrials(lambda: clock[0]))
    reads = _counted_reads(monkeypatch)

    def edited_and_repaired() -> None:
        dep = cluster.kube.get("apps/v1", "deployments", NS, "chat")
        containers = dep["spec"]["template"]["spec"]["containers"]
        engine = next(c for c in containers if c["name"] == "engine")
        at = engine["args"].index("--max-num-seqs") + 1
        engine["args"][at] = str(int(engine["args"][at]) + 1)  # a tenant's edit
        cluster.kube.patch("apps/v1", "deployments", NS, "chat",
                           {"spec": {"template": {"spec": {"containers": containers}}}})
        repaired(cluster, policy)
        assert knob_args(cluster) == trial_args  # put back to the trial's

    for _ in range(4):
        edited_and_repaired()
    assert len(reads) == 1, reads
    clock[0] += NOT_FAILED_KEPT_S
    edited_and_repaired()
    assert len(reads) == 2, reads


def test_a_stamp_an_earlier_trial_left_is_not_read_during_a_later_one(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing removes a stamp: the one a take-back left stays on the Deployment, inert,
    through every later trial. Those trials' reconciles render them as recorded, with
    no read of the study (they did, each one)."""
    body, policy = vllm_cr(kube, cluster, prom, tmp_path)
    hook, now = Webhook(cluster.kube), [1_000_000.0]
    loop = _loop(cluster, body, policy, hook, monkeypatch, now)
    taken_back(loop, cluster, hook, now)
    first = cluster.status()["controller"]["trial"]["number"]
    hook.on = False
    for _ in range(20):
        now[0] += 60.0
        assert loop.step()
        trial = cluster.status()["controller"].get("trial")
        if trial is not None and trial["number"] != first:
            break
    else:
        pytest.fail("no later trial started")
    dep = cluster.kube.get("apps/v1", "deployments", NS, "chat")
    assert TAKEN_BACK_ANNOTATION in dep["metadata"]["annotations"]  # the earlier one's
    trial_args = knob_args(cluster)
    reads = _counted_reads(monkeypatch)
    for _ in range(5):
        repaired(cluster, policy)
        assert knob_args(cluster) == trial_args
    assert reads == []
