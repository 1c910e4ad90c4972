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

An API server that does not answer a step (no answer, 5xx, 429: ``api_reach.transient``)
does not end the daemon: the step is tried again on the same ``DeploymentLoop``, backing
off (``StepBackoff``), so that a decision whose status write the outage failed is still
held and written first (deployment_loop.py). Raised to kopf, the daemon was started again
with a new loop 10 s later, which asked a second trial beside the unwritten one. A refusal
(403, 422) still raises to kopf, which logs it and starts the daemon again.

From its start to its end's end the daemon is in ``memo.tuning_daemons``
(daemon_ends.py), which the deletion handler waits on. Only the peering leader runs
daemons (settings.py). The controller itself comes from
daemon.py's factory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import kopf

from slopilot.operator.api_reach import FIRST_RETRY_S, MAX_RETRY_S, transient
from slopilot.operator.crd import GROUP, PLURAL, VERSION
from slopilot.operator.daemon import load_factory, tick_interval
from slopilot.operator.daemon_pause import pause
from slopilot.operator.deployment_loop import DeploymentLoop
from slopilot.operator.fair_slots import NotRun
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.pod_memory import memory_of
from slopilot.operator.tuning_pool import Lane

# Set by `slopilot operator` on SIGTERM/SIGINT before kopf begins to stop: a daemon that
# kopf starts while shutting down is not told to stop, so each one also checks this.
OPERATOR_STOPPING = threading.Event()


@dataclasses.dataclass
class StepBackoff:
    """The wait before a daemon's next step: the tick ``interval`` after a step that
    ended; after one the API server failed, the longer of the interval and the API's first
    retry (api_reach.py), doubling with each failed step in a row up to ``MAX_RETRY_S``
    (or the interval, if longer), so that an outage is not met with a step a tick."""

    interval: float
    retry: float | None = None
    """The last wait after a failed step; None after a step that ended."""

    def ended(self) -> float:
        self.retry = None
        return self.interval

    def failed(self) -> float:
        if self.retry is None:
            self.retry = max(self.interval, FIRST_RETRY_S)
        else:
            self.retry = min(self.retry * 2, max(MAX_RETRY_S, self.interval))
        return self.retry


@kopf.daemon(GROUP, VERSION, PLURAL, id="controller", when=tuning_enabled,
             cancellation_backoff=15.0, cancellation_timeout=10.0)
async def run_controller(stopped: kopf.DaemonStopped, name: str, namespace: str | None,
                         uid: str, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    if namespace is None:
        raise kopf.PermanentError("LLMDeployment is namespaced; got none")
    loop = DeploymentLoop(memo.kube, namespace, name, str(uid), mint=memo.tokens,
                          policy=memo.policy, factory=load_factory(), locks=memo.locks,
                          logger=logger, memory=memory_of(memo))
    backoff = StepBackoff(tick_interval())
    # Its calls one at a time, in this task's context variables (kopf's event posting
    # finds its queue through them).
    lane = memo.tuning_pool.lane(namespace)

    def stopping() -> bool:
        return bool(stopped) or OPERATOR_STOPPING.is_set()

    gone = False
    ends = memo.tuning_daemons
    end = ends.started(str(uid))  # before the first await: the deletion handler waits
    try:
        while not stopping():
            try:
                if not await lane.run(loop.step, until=stopping):
                    gone = True  # the object is gone or going
                    break
            except NotRun:  # stopped while it waited for a slot
                break
            except Exception as exc:
                if not transient(exc):
                    raise  # kopf logs it and starts the daemon again, with a new loop
                wait = backoff.failed()
                logger.warning("the API server did not answer the tuning step (%s: %s); "
                               "its controller, and a decision not yet in the status, are "
                               "kept: trying again in %g s", type(exc).__name__, exc, wait)
                await pause(stopped, wait)
                continue
            await pause(stopped, backoff.ended())
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
        # One shielded whole: a second cancel leaves it running, and the deletion handler
        # waits for it (daemon_ends.py), not for this task.
        finishing = asyncio.ensure_future(_finish(lane, loop, ending))
        finishing.add_done_callback(lambda _: ends.ended(str(uid), end))
        await asyncio.shield(finishing)


async def _finish(lane: Lane, loop: DeploymentLoop, ending: Callable[[], None] | None
                  ) -> None:
    """The daemon's end: ``ending`` (the trial and the study ended) and the metrics, or
    without one a decision not yet on record written, then the heartbeat, each after a
    step that may still run on the lane."""
    try:
        if ending is not None:
            await lane.run(ending)
            await lane.run(loop.retire)  # it reads the CR: not on the loop
        else:  # the trial is resumed by the next operator: from the status
            await lane.run(loop.flush)
    finally:
        await lane.run(loop.close)
