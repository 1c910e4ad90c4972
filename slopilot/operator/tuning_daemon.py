"""The kopf daemon that runs one tuner controller per LLMDeployment while tuning is enabled.

Each step is one ``DeploymentLoop.step`` (deployment_loop.py): read the object fresh, tick
the controller, write its status, keep the pods on the spec's config.

Threads: kopf runs a sync daemon on its handler pool for the daemon's whole life, and
that pool (min(32, CPUs + 4)) then has no thread left for reconciles once there are a
few tuning CRs. This daemon is async: each step runs on the operator's pool for tuning
steps (``memo.tuning_pool``, tuning_pool.py), a namespace's on a share of it, and kopf's
pool stays free for the handlers. A thread of its own per CR made the operator's
threads as many as its tenants' tuning CRs. Waiting for a slot holds no thread, and a
stop ends the wait.

Only the peering leader runs daemons (settings.py). The controller itself comes from
daemon.py's factory.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import kopf

from slopilot.operator.crd import GROUP, PLURAL, VERSION
from slopilot.operator.daemon import load_factory, tick_interval
from slopilot.operator.daemon_pause import pause
from slopilot.operator.deployment_loop import DeploymentLoop
from slopilot.operator.fair_slots import NotRun
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.pod_memory import memory_of

# Set by `slopilot operator` on SIGTERM/SIGINT before kopf begins to stop: a daemon that
# kopf starts while shutting down is not told to stop, so each one also checks this.
OPERATOR_STOPPING = threading.Event()


@kopf.daemon(GROUP, VERSION, PLURAL, id="controller", when=tuning_enabled,
             cancellation_backoff=15.0, cancellation_timeout=10.0)
async def run_controller(stopped: kopf.DaemonStopped, name: str, namespace: str | None,
                         uid: str, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    if namespace is None:
        raise kopf.PermanentError("LLMDeployment is namespaced; got none")
    loop = DeploymentLoop(memo.kube, namespace, name, str(uid), mint=memo.tokens,
                          policy=memo.policy, factory=load_factory(), locks=memo.locks,
                          logger=logger, memory=memory_of(memo))
    interval = tick_interval()
    # Its calls one at a time, in this task's context variables (kopf's event posting
    # finds its queue through them).
    lane = memo.tuning_pool.lane(namespace)

    def stopping() -> bool:
        return bool(stopped) or OPERATOR_STOPPING.is_set()

    gone = False
    try:
        while not stopping():
            try:
                if not await lane.run(loop.step, until=stopping):
                    gone = True  # the object is gone or going
                    break
            except NotRun:  # stopped while it waited for a slot
                break
            await pause(stopped, interval)
    finally:
        # Also when kopf cancels the task: the end of the trial is recorded either way.
        reason = stopped.reason or kopf.DaemonStoppingReason.DONE
        if OPERATOR_STOPPING.is_set() or reason & (kopf.DaemonStoppingReason.OPERATOR_EXITING
                                                   | kopf.DaemonStoppingReason.OPERATOR_PAUSING):
            ending = None  # a restarted (or the other) operator resumes the trial
        elif gone or reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            ending = loop.end_deleted
        elif reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH:
            ending = functools.partial(loop.abandon, "tuning was disabled during the trial",
                                       restore=True)
        else:
            ending = None
        if ending is not None:
            await asyncio.shield(lane.run(ending))
            await asyncio.shield(lane.run(loop.retire))  # it reads the CR: not on the loop
        await asyncio.shield(lane.run(loop.close))  # after a step that may still run
