"""kopf handlers: reconcile each LLMDeployment's owned objects and repair drift.

``kopf run -m slopilot.operator.handlers`` (or ``slopilot operator``) loads this module;
importing it registers every handler, the controller daemon included.

- create / update of spec / resume: parse the spec and check it against the operator's
  policy (refused with a ``Valid=False`` condition, phase Invalid and a Warning event,
  touching nothing) and against what the API server accepts in the owned objects
  (``Reconciled=False``), then create or patch the owned objects; the status says what
  was done and which knobs vLLM ignores. A spec that works but should change (a
  deprecated field, a knob the backend caps) gets a ``SpecWarning`` Warning event and
  says so in the Valid condition. Status is written conditionally on the version read
  (status_writer.py), so the daemon's conditions and these never erase each other.
- the built-in engine's running pods are brought to the spec's live knobs (which the
  engine reads from its ConfigMap only at start) after each reconcile and once a
  ``deployment_loop.CONFIG_SYNC_S``, while tuning is off; while it is on, the controller
  daemon does it, around its trials. The pods run the tenant's image: a sync runs on
  the pod syncs' own pool, in its namespace's share, waiting for a slot on the event
  loop where the others' hold them (pod_sync_pool.py), never on kopf's threads.
- deletion: the CR's study is deleted from every storage it lived in (study_cleanup.py),
  after its tuning daemon's end, if one runs (which does it first: daemon_ends.py);
  this is the only deletion for a CR whose daemon never ran here (tuning off, or the CR
  deleted while no operator ran).
- events of owned Deployments, NetworkPolicies, Services, ConfigMaps and, where
  prometheus-operator's CRDs exist, ServiceMonitors and PrometheusRules: a deleted or
  edited one is re-created or patched back from its LLMDeployment (drift repair), and
  the ``Reconciled`` condition says what was put back, or what could not be, which a
  timer then tries again (drift.py). Their watches ask the API server for managed
  objects only (``watch_only_managed``), a label anyone may copy: an event of an object
  whose kind and name are none the CR renders (``owned_names``) is dropped, and the
  others ask for their CR's repair on the drift repairs' queue (drift_repairs.py), on
  kopf's event loop: one per CR at once, coalesced, on a share of kopf's threads, a
  namespace's on a share of that, so that one tenant's events cost the others a turn,
  not its backlog.

Most handlers are synchronous (the official client is): kopf runs them in worker
threads (``settings.HANDLER_THREADS``, shared by every tenant), and a per-deployment
lock keeps a drift repair, a spec reconcile and the controller's writes (a scale, a
committed config) from interleaving. A pod sync takes the lock around its writes only,
as the daemon's does: held while it waited on the tenant's pods, the CR's reconcile and
its drift repair waited for it, each on a thread of its own.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from slopilot.operator import tuning_daemon  # noqa: F401  # registers the controller daemon
from slopilot.operator.conditions import DriftReason
from slopilot.operator.cr_locks import LockTable, key_of
from slopilot.operator.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from slopilot.operator.daemon_ends import DaemonEnds
from slopilot.operator.deployment_loop import CONFIG_SYNC_S
from slopilot.operator.disruption_budget import (
    FOREIGN_BUDGET,
    FOREIGN_BUDGET_S,
    budget_is_anothers,
)
from slopilot.operator.drift import RETRY_S as DRIFT_RETRY_S
from slopilot.operator.drift import record_repair, unrepaired
from slopilot.operator.drift_repairs import DriftRepairs
from slopilot.operator.failed_trials import DEFERRED_RETRY_S
from slopilot.operator.kubeapi import ApiError, Kube, load_client
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.owned_meta import MANAGED
from slopilot.operator.ownership import controlled_by
from slopilot.operator.pod_sync_pool import PodSyncPool
from slopilot.operator.pod_syncs import sync_pods, sync_when_free
from slopilot.operator.reconcile import Change, Outcome, owned_names, reconcile
from slopilot.operator.settings import configure, operator_policy
from slopilot.operator.spec_reconciles import SpecReconciles
from slopilot.operator.spec_status import status_of, untuned_ready
from slopilot.operator.status_writer import write_status
from slopilot.operator.study_cleanup import delete_studies
from slopilot.operator.tokens import load_or_create
from slopilot.operator.tuning_daemon import OPERATOR_STOPPING
from slopilot.operator.tuning_pool import TuningPool
from slopilot.operator.validation import DNS_1123_SUBDOMAIN
from slopilot.operator.vllm_take_back import RenderDeferred

# The owned kinds whose events repair drift, as kopf's decorators name them. kopf serves
# a kind only where the cluster does (its discovery, watched as CRDs come and go): without
# prometheus-operator the last two are left unwatched, with one warning in the log.
OWNED_KINDS = (("apps", "v1", "deployments"), ("networking.k8s.io", "v1", "networkpolicies"),
               ("v1", "services"), ("v1", "configmaps"),
               ("policy", "v1", "poddisruptionbudgets"),
               ("monitoring.coreos.com", "v1", "servicemonitors"),
               ("monitoring.coreos.com", "v1", "prometheusrules"))
# The event reason of a spec's warnings: a deprecated field, a knob the backend caps.
SPEC_WARNING = "SpecWarning"


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    watch_only_managed(settings)
    memo.kube = Kube(load_client())
    memo.locks = LockTable()
    memo.handler_threads = settings.execution.executor  # kopf's (settings.HANDLER_THREADS)
    memo.tuning_pool = TuningPool()  # every tuning daemon's steps, one pool (tuning_pool.py)
    memo.tuning_daemons = DaemonEnds()  # whose daemon runs, for deletions (daemon_ends.py)
    memo.policy = operator_policy()
    memo.tokens = load_or_create(memo.kube, memo.policy.operator_namespace)


@kopf.on.startup()
async def start_pod_syncs(memo: kopf.Memo, **_: Any) -> None:
    """The pod syncs' pool (pod_sync_pool.py), on kopf's event loop, where a reconcile on
    one of kopf's threads asks it for a sync."""
    memo.pod_syncs = PodSyncPool(loop=asyncio.get_running_loop())


@kopf.on.startup()
async def start_spec_reconciles(settings: kopf.OperatorSettings, memo: kopf.Memo,
                                **_: Any) -> None:
    """The spec reconciles' slots (spec_reconciles.py), on kopf's handler threads, a
    namespace's on a share of them."""
    memo.spec_reconciles = SpecReconciles(executor=settings.execution.executor)


@kopf.on.startup()
async def start_drift_repairs(settings: kopf.OperatorSettings, memo: kopf.Memo,
                              **_: Any) -> None:
    """The drift repairs' queue (drift_repairs.py), on kopf's event loop, running them on
    kopf's handler threads, a share of them."""
    memo.drift_repairs = DriftRepairs(executor=settings.execution.executor)


@kopf.on.cleanup()
async def stop_drift_repairs(memo: kopf.Memo, **_: Any) -> None:
    """Every drift repair still waiting for a slot withdrawn: the operator is exiting
    (its next start's resume reconciles every CR)."""
    repairs: DriftRepairs | None = getattr(memo, "drift_repairs", None)
    if repairs is not None:
        repairs.shutdown()


@kopf.on.cleanup()
async def stop_pod_syncs(memo: kopf.Memo, **_: Any) -> None:
    """Every pod sync still waiting for a slot withdrawn: the operator is exiting."""
    pool: PodSyncPool | None = getattr(memo, "pod_syncs", None)
    if pool is not None:
        pool.shutdown()


def watch_only_managed(settings: kopf.OperatorSettings) -> None:
    """Ask the API server for the owned kinds' managed objects only.

    A handler's ``labels=`` filter runs in the operator: without a server-side selector
    every tenant's ConfigMaps, Services, Deployments and NetworkPolicies stream to it, to
    be read and dropped, a load that grows with the cluster rather than with the
    deployments this operator runs.
    """
    selector = ",".join(f"{key}={value}" for key, value in MANAGED.items())
    for kind in OWNED_KINDS:
        settings.watching.label_selectors[kind] = selector


def post_events(raw: Mapping[str, Any], outcome: Outcome, *, reason: str) -> None:
    """Warning events for refusals and gaps, a Normal one when something was written."""
    body = cast("kopf.Body", raw)  # kopf reads only metadata: any mapping will do
    if outcome.warnings:
        kopf.warn(body, reason=SPEC_WARNING, message="; ".join(outcome.warnings))
    if not outcome.valid:
        kopf.warn(body, reason=outcome.refusal.value, message="; ".join(outcome.problems))
        return
    done = [f"{change.value} {what}" for what, change in outcome.changes.items()
            if change is not Change.UNCHANGED]
    if done:
        kopf.info(body, reason=reason, message="; ".join(done))
    if outcome.not_restored:
        kopf.warn(body, reason=DriftReason.NOT_REPAIRED.value,
                  message="; ".join(outcome.not_restored))
    if outcome.left_alone:
        kopf.warn(body, reason=FOREIGN_BUDGET, message="; ".join(outcome.left_alone))
    if outcome.unsupported_knobs:
        kopf.warn(body, reason="KnobsIgnored", message="vLLM has no argument for "
                  f"{', '.join(outcome.unsupported_knobs)}; they are left out")


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile_llmdeployment(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                  **_: Any) -> None:
    """``reconcile_spec`` on a slot of the CR's namespace (spec_reconciles.py): one
    tenant's edits wait for their turn, holding none of kopf's threads meanwhile."""
    reconciles: SpecReconciles = memo.spec_reconciles
    await reconciles.run(body["metadata"]["namespace"],
                         functools.partial(reconcile_spec, body, memo, logger))


def reconcile_spec(body: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger) -> None:
    """Reconcile the CR's objects to its spec and write what the reconcile owns of its
    status; kopf calls it again after ``retry_s`` where a name is taken, and after
    ``DEFERRED_RETRY_S`` where what to render waits on a study's answer (nothing applied
    nor written: ``vllm_take_back.RenderDeferred``)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    with memo.locks.hold(key_of(body)):
        try:
            outcome = reconcile(memo.kube, body, policy=memo.policy, mint=memo.tokens,
                                defer_unanswered=True)
        except RenderDeferred as exc:  # nothing applied, nor its status: asked again
            raise kopf.TemporaryError(str(exc), delay=DEFERRED_RETRY_S) from None
        ready = untuned_ready(memo.kube, body)
        write_status(memo.kube, namespace, name,
                     lambda fresh: status_of(fresh, outcome, ready))
    if outcome.valid and outcome.admin_token and not tuning_enabled(body.get("spec") or {}):
        # Asked again: a sync of the CR under way may have read the spec before this edit.
        # Not waited for: the sync waits for its slot on the event loop, not on this thread.
        memo.pod_syncs.ask_threadsafe(namespace, name, str(body["metadata"]["uid"]),
                                      functools.partial(sync_pods, body, memo, logger),
                                      again=True)
    post_events(body, outcome, reason="Reconciled")
    logger.info("reconciled: %s", dict(outcome.changes) or outcome.problems)
    if outcome.retry_s is not None:  # kopf runs the handler again, spec change or not
        raise kopf.TemporaryError("; ".join(outcome.problems), delay=outcome.retry_s)


def tuning_disabled(spec: Mapping[str, Any], **_: Any) -> bool:
    return not tuning_enabled(spec)


DAEMON_END_WAIT_S = 5.0
"""How long the deletion handler waits on kopf's loop for the CR's daemon to end before
it asks kopf to call it again: a daemon stops within a tick, and the handler's cycle
holds kopf's escalation (its cancel of a daemon that does not stop) until it returns."""

DAEMON_END_GIVE_UP_S = 120.0
"""How long since the deletion handler first ran (kopf's ``runtime``, kept on the CR
across restarts) a daemon's end may take before the study is deleted beside it. kopf
cancels a daemon that has not stopped after 15 s and lets it go 10 s later, but its
end is shielded and goes on after a step stuck on its thread (a storage query waiting
on a lock, until the server's statement timeout cuts it: ``heartbeat.STATEMENT_TIMEOUT_S``,
under this bound); waited for without a bound, the CR stayed Terminating for ever."""


DAEMON_END_RETRY_S = 20.0
"""How long kopf waits before calling the deletion handler again while a daemon ends:
kopf logs (and posts as an event) each ``kopf.TemporaryError`` as an ERROR, so a few in
the ``DAEMON_END_GIVE_UP_S`` bound, not one every cycle of a few seconds."""


@kopf.on.delete(GROUP, VERSION, PLURAL, id="study-cleanup", optional=True)
async def delete_deleted_studies(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                 runtime: datetime.timedelta,
                                 **_: Any) -> None:
    """A deleted CR's study is deleted from every storage on record (study_cleanup.py),
    once no tuning daemon of this process runs for it (daemon_ends.py). Its daemon's end
    fails the running trial and deletes the study; where none ends with the CR (tuning
    off; or deleted while no operator ran: kopf starts no daemon for a CR already
    Terminating, so a tuning CR's study stayed, its trial RUNNING), this is the
    deletion, and after a daemon's end a no-op. Before the finalizer goes: the
    daemon's finalizer, or the config-sync timer's while tuning is off, holds the CR
    until it returns. Optional: it adds no finalizer of its own, so it never keeps a CR
    Terminating that nothing else would. A daemon's end still going after
    ``DAEMON_END_GIVE_UP_S`` is left behind with a warning, and the study deleted.

    On the tuning pool, in the namespace's share, as a daemon's own deletion at its end:
    a silent database holds each call for its connect timeout, and on kopf's handler
    threads a tenant deleting many CRs held every other tenant's reconciles.

    A pod sync of the CR still waiting for a slot is withdrawn first (a reconcile asked
    it, and no timer awaits it to withdraw it at its stop)."""
    meta = body["metadata"]
    memo.pod_syncs.withdraw(meta["namespace"], meta["name"], str(meta["uid"]))
    if not await memo.tuning_daemons.wait(str(meta["uid"]), DAEMON_END_WAIT_S):
        if runtime.total_seconds() < DAEMON_END_GIVE_UP_S:
            raise kopf.TemporaryError(
                "the tuning daemon is still ending; the study is deleted once it has (at "
                f"most {DAEMON_END_GIVE_UP_S:.0f} s after the deletion)",
                delay=DAEMON_END_RETRY_S)
        logger.warning("the tuning daemon of %s/%s has not ended in %.0f s (a step stuck "
                       "on its thread, such as a storage query waiting on a lock): the "
                       "study is deleted beside its end", meta["namespace"], meta["name"],
                       DAEMON_END_GIVE_UP_S)
    lane = memo.tuning_pool.lane(meta["namespace"])
    await lane.run(functools.partial(delete_studies, body, memo.policy, log=logger))


@kopf.timer(GROUP, VERSION, PLURAL, id="config-sync", interval=CONFIG_SYNC_S,
            initial_delay=CONFIG_SYNC_S, when=tuning_disabled)
async def sync_untuned_pods(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                            **kwargs: Any) -> None:
    """A pod that read an older ConfigMap (it started before an edit and became ready
    after the reconcile's sync) is brought over within one interval. Async: the sync
    waits for its slot holding no thread, and the next interval counts from its end.
    Stopped (the CR deleted, tuning turned on: the daemon syncs, the operator stopping),
    a sync still waiting is withdrawn."""
    if body["metadata"].get("deletionTimestamp"):
        return
    # kopf passes a timer its stop flag as it does a daemon, but types it for daemons only.
    stopped: kopf.DaemonStopped = kwargs["stopped"]

    def stopping() -> bool:
        return bool(stopped) or OPERATOR_STOPPING.is_set()

    await sync_when_free(body, memo, logger, stopping)


def controlling_owner(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The LLMDeployment ``body`` names as its controller, else one it names as an owner
    (its controller mark taken off, which the reconcile puts back; or another controller
    took the object, which the reconcile reports), if its name could be one: the API
    server does not check an owner reference's name, and anyone who can create the
    object can write ``../../team-b/llmdeployments/chat`` there."""
    refs = body.get("metadata", {}).get("ownerReferences") or ()
    for ref in sorted(refs, key=lambda r: r.get("controller") is not True):
        if ref.get("kind") == KIND \
                and ref.get("apiVersion") == API_VERSION:
            name = ref.get("name")
            return dict(ref) if isinstance(name, str) and \
                DNS_1123_SUBDOMAIN.fullmatch(name) else None
    return None


async def repair_drift(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                       logger: kopf.Logger, **_: Any) -> None:
    """An owned object was deleted or edited: its owner's repair asked (drift_repairs.py),
    not awaited, on no thread. The watch selects a label anyone can put on their objects,
    with a controller reference to their own CR: an object that is none of the names
    the CR renders (``owned_names``) is no drift of it, and reaches no reconcile."""
    if event.get("type") not in ("MODIFIED", "DELETED"):
        return  # the initial listing and our own creations: resume/create handle those
    owner = controlling_owner(body)
    if owner is None:
        return
    meta = body.get("metadata") or {}
    if (body.get("kind"), meta.get("name")) not in owned_names(owner["name"]):
        return
    namespace, name = meta["namespace"], owner["name"]
    memo.drift_repairs.ask(namespace, name,
                           functools.partial(repair_named, namespace, name, memo, logger))


def repair_named(namespace: str, name: str, memo: kopf.Memo, logger: kopf.Logger) -> None:
    """``repair`` of the CR ``namespace/name`` as it is now, whichever CR has the name:
    a repair is asked by name (drift_repairs.py), since an event's owner reference names
    whatever uid the object's writer chose. Repaired for an object that is not its own
    (an earlier CR's, say), a CR is reconciled as at an event of its own objects: a
    no-op where they are in sync."""
    cr = memo.kube.get(API_VERSION, PLURAL, namespace, name)
    if cr is None or cr["metadata"].get("deletionTimestamp"):
        return  # the owner is going away; the garbage collector takes the rest
    repair(cr, memo, logger)


def repair(cr: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger) -> None:
    """Reconcile ``cr`` and say in its Reconciled condition what was put back, or why
    something could not be (drift.py). An API error is reported, not raised: kopf retries
    no event handler, and the condition's timer looks again."""
    meta = cr["metadata"]
    found: Outcome | ApiError | RenderDeferred
    with memo.locks.hold(key_of(cr)):
        try:
            found = reconcile(memo.kube, cr, policy=memo.policy, mint=memo.tokens,
                              defer_unanswered=True)
        except (ApiError, RenderDeferred) as exc:  # the timer looks again (drift.py)
            found = exc
            logger.warning("drift of %s not repaired: %s", meta["name"], exc)
        # Under the lock: a spec reconcile's condition, written after, is the last word.
        record_repair(memo.kube, meta["namespace"], meta["name"], str(meta["uid"]), found,
                      ready=untuned_ready(memo.kube, cr))
    if isinstance(found, Outcome) and any(
            c is not Change.UNCHANGED for c in found.changes.values()):
        logger.info("repaired drift of %s: %s", meta["name"], dict(found.changes))
        post_events(cr, found, reason="DriftRepaired")


def drift_unrepaired(status: Mapping[str, Any], **_: Any) -> bool:
    return unrepaired(status)


@kopf.timer(GROUP, VERSION, PLURAL, id="drift-retry", interval=DRIFT_RETRY_S,
            initial_delay=DRIFT_RETRY_S, when=drift_unrepaired)
async def retry_drift_repair(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                             **_: Any) -> None:
    """A repair left something it could not put back: look again (once it is put back,
    or a spec reconcile says otherwise, the condition stops this timer). Asked as an
    event's repair is, joining one that waits or runs, and awaited: the next interval
    counts from its end. A stop ends the wait only: others may wait for that repair."""
    await _repair_in_turn(body, memo, logger, repair_named)


async def _repair_in_turn(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                          repair: Callable[[str, str, kopf.Memo, kopf.Logger], None]
                          ) -> None:
    """A timer's ``repair`` of the CR, asked as an event's repair is (joining one that
    waits or runs) and awaited, so the timer's next interval counts from its end; none
    for a CR being deleted."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return
    namespace, name = meta["namespace"], meta["name"]
    asked = memo.drift_repairs.ask(namespace, name, functools.partial(
        repair, namespace, name, memo, logger))
    await asyncio.wait((asked.done,))


def foreign_budget(status: Mapping[str, Any], **_: Any) -> bool:
    return budget_is_anothers(status)


@kopf.timer(GROUP, VERSION, PLURAL, id="foreign-budget", interval=FOREIGN_BUDGET_S,
            initial_delay=FOREIGN_BUDGET_S, when=foreign_budget)
async def replace_deleted_budget(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                 **_: Any) -> None:
    """The CR's budget is another's (disruption_budget.py): once that one is gone, the
    CR is repaired, which makes the operator's own and clears the condition."""
    await _repair_in_turn(body, memo, logger, _repair_if_budget_gone)


def _repair_if_budget_gone(namespace: str, name: str, memo: kopf.Memo,
                           logger: kopf.Logger) -> None:
    """``repair_named``, where no budget of the name is left, or one this CR controls (a
    look that finds the other's still there changes nothing and writes nothing)."""
    live = memo.kube.get("policy/v1", "poddisruptionbudgets", namespace, name)
    cr = memo.kube.get(API_VERSION, PLURAL, namespace, name)
    if cr is None:
        return
    if live is not None and not controlled_by(live, KIND, str(cr["metadata"].get("uid"))):
        return
    logger.info("the PodDisruptionBudget %s/%s that was another's is gone: the "
                "operator's own is made", namespace, name)
    repair_named(namespace, name, memo, logger)


for _kind in OWNED_KINDS:  # one handler for every owned kind
    kopf.on.event(*_kind, labels=MANAGED)(repair_drift)
