"""Waiting out a rollout: a config that reaches the replicas as new pods (vLLM's knobs
are its arguments) runs nowhere until they are ready, and the old pods serve meanwhile.

A window measured from the apply judged the old pods (the ServiceMonitor scrapes ready
pods only: the loading one is not seen at all, so no window was rejected for it), and a
good config was told infeasible on the old config's figures. So a trial whose apply left
the deployment ``Pending`` (``DeploymentHandle.settled``) is held: no window measured,
no early look (a fleet half rolled out is judged on nothing, its breaches included), no
next trial. Once ``Settled``, its window starts from that moment. ``Stuck`` (past the
Deployment's progress deadline) ends it failed, ``rollout_stuck``, and rolls it back.

A cooldown (after a commit, a rollback or a scale) does not end while the rollout it
began runs: STEADY would read alerts and start an episode on the old pods' figures.
"""

from __future__ import annotations

import logging

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.ports import Pending, Stuck
from slopilot.tuner.loop.state import RunningTrial
from slopilot.tuner.loop.trial import end_trial

log = logging.getLogger(__name__)


def trial(ctx: LoopContext, now: float, t: RunningTrial) -> Decision:
    """A rolling trial's tick: still pending, rolled out (its window starts now), or
    stuck (failed and rolled back)."""
    state = ctx.deployment.settled(now)
    if isinstance(state, Pending):
        return ctx.decide(Action.NONE, f"trial {t.number} rolling out: {state.why}; no "
                          "window until every replica runs it", trial=t.number)
    if isinstance(state, Stuck):
        why = f"rollout_stuck trial {t.number}: {state.why}"
        ctx.study.tell_failed(t.number, why)
        return end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
                         f"{why}; rolled back", None)
    t.rolling = False
    t.started_at = t.began_at = now
    return ctx.decide(Action.NONE, f"trial {t.number} rolled out: its window starts",
                      trial=t.number)


def cooling(ctx: LoopContext, now: float) -> tuple[bool, str | None]:
    """Whether the cooldown must go on for a rollout under way, and, for one past its
    deadline, what the decision says of it (the cooldown then ends: waiting longer
    changes nothing, and the next episode's trials meet the same deadline)."""
    state = ctx.deployment.settled(now)
    if isinstance(state, Pending):
        return True, f"cooling down: rolling out: {state.why}"
    if isinstance(state, Stuck):
        log.warning("%s: rollout_stuck: %s", ctx.settings.key, state.why)
        return False, f"rollout_stuck: {state.why}"
    return False, None
