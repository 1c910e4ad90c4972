"""A CR's pods brought to its spec's live knobs while tuning is off: each sync on the pod
syncs' pool (pod_sync_pool.py), its wait said in the CR's status once it is long, its
writes under the CR's lock (cr_locks.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from slopilot.operator.cr_locks import key_of
from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.deployment_loop import CONFIG_SYNC_S
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.pod_admin import HTTP_TIMEOUT_S
from slopilot.operator.pod_memory import memory_of
from slopilot.operator.pod_sync_pool import PodSyncPool, Ticket, Waited
from slopilot.operator.pods_status import (
    SYNC_DEFERRED,
    record_pods_condition,
    record_sync_deferred,
)
from slopilot.operator.policy import policy_problems
from slopilot.operator.reconcile import not_reconciled
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.prometheus.bounded import bounded_client

SYNC_WAIT_SAID_S = CONFIG_SYNC_S
"""How long a CR's sync waits for a slot (pod_sync_pool.py) before its PodsConfigured
condition says its pods were not checked, and why, with a Warning event: the timer's
interval, by which the pods are checked less often than it promises. A shorter wait is
the slots' turn going round; said at once, every sync of a busy minute (the timers after
an operator restart) would write its status."""


async def sync_when_free(body: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger,
                         until: Callable[[], bool]) -> None:
    """``sync_pods`` on the pod syncs' pool (``memo.pod_syncs``, pod_sync_pool.py),
    joining the CR's sync that waits or runs, awaited until it ends or ``until()``: then,
    where it still waits for a slot, it is withdrawn. One that waits past
    ``SYNC_WAIT_SAID_S`` is said in the CR's status (``say_sync_waits``)."""
    meta = body["metadata"]
    pool: PodSyncPool = memo.pod_syncs
    ticket = pool.ask(meta["namespace"], meta["name"], str(meta["uid"]),
                      functools.partial(sync_pods, body, memo, logger))
    late_at: float | None = ticket.asked_at + SYNC_WAIT_SAID_S
    while (waited := await pool.wait(ticket, until=until, late_at=late_at)) is Waited.LATE:
        late_at = None  # said once a wait
        await say_sync_waits(body, memo, logger, ticket)
    if waited is Waited.STOPPED:
        pool.withdraw(*ticket.key)


async def say_sync_waits(body: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger,
                         ticket: Ticket) -> None:
    """The CR's sync waits for a slot still: said in its PodsConfigured condition
    (``SyncDeferred``, written on one of kopf's threads: it is the API server's call
    alone), a Warning event and the operator's log. Not written once the sync holds a
    slot: its own condition is the last word."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    why = (f"not checked for {SYNC_WAIT_SAID_S:g} s: this deployment's sync waits for a "
           f"slot: {memo.pod_syncs.why_waiting(namespace)}; it runs once one is free")
    logger.warning("the pods' configs were %s", why)
    post_sync_waits(body, why)

    def record() -> None:
        # Under the CR's lock, as the sync's own condition is written: a sync that took
        # its slot meanwhile finds this condition and writes over it, or this finds it
        # started and writes nothing.
        with memo.locks.hold(key_of(body)):
            if not ticket.started:
                record_sync_deferred(memo.kube, namespace, name, str(meta["uid"]), why,
                                     meta.get("generation"))

    executor = getattr(memo, "handler_threads", None)  # kopf's; None: asyncio's own
    await asyncio.get_running_loop().run_in_executor(executor, record)


def post_sync_waits(raw: Mapping[str, Any], why: str) -> None:
    """The Warning event of a sync that waits for a slot (kopf posts a logger's lines as
    events only when told to, which the operator is not: settings.py)."""
    kopf.warn(cast("kopf.Body", raw), reason=SYNC_DEFERRED, message=why)


def sync_pods(body: Mapping[str, Any], memo: kopf.Memo, logger: kopf.Logger) -> None:
    """Bring the running pods to the spec's live knobs and SLO (tuning is off: no trials).

    Only for a spec the reconcile accepts: one the policy or the API server refuses
    touches nothing, its knobs included (the pods run the last accepted spec's). Judged
    on the object as it is now: kopf hands a timer the copy it had when the timer was
    due, and once tuning is on the daemon syncs, around its trials. The CR's lock is
    taken around the sync's writes only (``guard``), never while it waits on the pods.
    """
    meta = body["metadata"]
    body = memo.kube.get(API_VERSION, PLURAL, meta["namespace"], meta["name"]) or {}
    if str((body.get("metadata") or {}).get("uid")) != str(meta["uid"]) or \
            tuning_enabled(body.get("spec") or {}):
        return  # gone, a successor of the same name, or the daemon's to sync now
    try:
        spec = parse_spec(body)
    except SpecError:
        return
    if policy_problems(spec, memo.policy, namespace=meta["namespace"]) \
            or not_reconciled(memo.kube, body, spec):
        return
    # Closed here: a handle's own client is never closed, and one per call kept a socket
    # to each pod open until a garbage collection found it.
    try:
        with bounded_client(HTTP_TIMEOUT_S) as http:
            handle = KubeDeploymentHandle(memo.kube, meta["namespace"], meta["name"],
                                          mint=memo.tokens, policy=memo.policy, http=http,
                                          uid=str(meta["uid"]), memory=memory_of(memo),
                                          guard=lambda: memo.locks.hold(key_of(body)))
            done = handle.sync_config()
    except Exception as exc:  # the CR went away, or the API: the timer tries again
        logger.warning("the pods' configs were not checked: %s: %s", type(exc).__name__,
                       exc)
        return
    if done.updated:
        logger.info("the spec's live knobs sent to %s", ", ".join(done.updated))
    for why in done.left:
        logger.warning("a pod is not on the spec's config: %s", why)
    with memo.locks.hold(key_of(body)):  # not between a deferral's look and its write
        record_pods_condition(memo.kube, meta["namespace"], meta["name"], str(meta["uid"]),
                              done, body["metadata"].get("generation"))
