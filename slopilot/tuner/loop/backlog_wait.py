"""Waiting out the backlog a trial inherited: the queue the config before it left.

An episode starts because the config that ran was overloaded, so its trials begin on a
queue. The requests in it get their first tokens under the trial's config, with TTFTs
of the whole wait, and past ``settle_s`` they were the trial's window: a config serving
twice the arrivals read a 19 s P0 TTFT P99 on a 800 ms SLO and was cut at its early
look, while arrivals under it saw 767 ms (``docs/benchmarks.md``, "A trial's inherited
backlog"). The simulator's twin judges a config from an empty queue, on its own traffic.

So a trial's window starts once the queue of the replicas it is measured on
(``QueueGauge``) has fallen to what a config that keeps up holds steady: by Little's law,
the arrivals a second times the largest TTFT target (a config that meets it waits less
than that on average), at least one. The few still waiting then get their first tokens
within that target, inside ``settle_s``. No window is measured meanwhile, the early
look's included, and the wait does not count against ``max_trial_s`` (``started_at``
and ``began_at`` move to the drain, as to a rollout's end): that bounds a window, and
the floor of requests a verdict needs is no nearer for a backlog served. The drain's
moment is the tick's ``now``, not a clock read after the look: the queue is read at that
instant (``QueueGauge.queue(now)``), however long the query takes to answer.

A config that does not drain the backlog is judged on it, from its start as before, and
fails (its users get those latencies, and it is no config for this load): once
``revert_after_s`` has passed since the first reading, a queue that has not fallen over
the last such stretch, or one falling too slowly over it to reach the steady level within
``max_trial_s`` of the trial's start, ends the wait, and the early look cuts it at that
same tick. A deployment whose replicas export no queue (``QueueReading`` None, or an
evaluator without the gauge) is measured from ``settle_s``, as before.
"""

from __future__ import annotations

import logging

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.ports import QueueGauge
from slopilot.tuner.loop.state import RunningTrial
from slopilot.tuner.study.evaluator import QueueReading, WindowRejected

log = logging.getLogger(__name__)

QUEUE_FLOOR = 1.0
"""The least queue counted as steady: one request between two iterations is no backlog."""


def steady_queue(ctx: LoopContext, arrivals_per_s: float) -> float | None:
    """The requests a config that keeps up holds waiting at ``arrivals_per_s``; None
    where no class has a TTFT target (a queue then costs no SLO: nothing to wait for)."""
    targets = [c.ttft_p99_ms for c in ctx.settings.slo.classes().values()
               if c.ttft_p99_ms is not None]
    if not targets:
        return None
    return max(QUEUE_FLOOR, arrivals_per_s * max(targets) / 1000.0)


def trial(ctx: LoopContext, now: float, t: RunningTrial) -> Decision | None:
    """A draining trial's tick: a decision while it works the backlog off, or after the
    tick at which it did (its window starts then); None where its window runs from its
    start (no backlog, none readable, or one it does not drain), for the trial's window
    to be looked at in this same tick."""
    reading = _read(ctx, now, t)
    bound = None if reading is None else steady_queue(ctx, reading.arrivals_per_s)
    if reading is None or bound is None:
        t.draining = False
        return None
    if reading.waiting <= bound:
        t.draining = False
        if t.backlog_first is None:  # none inherited: its window began at the apply
            return None
        t.started_at = t.began_at = now
        return ctx.decide(Action.NONE, f"trial {t.number}: the backlog it inherited "
                          f"({t.backlog_first:.0f} waiting) is served, {reading.waiting:.0f}"
                          f" waiting now; its window starts", trial=t.number)
    if t.backlog_first is None or t.backlog_first_at is None or now <= t.backlog_first_at:
        t.backlog_first, t.backlog_first_at = reading.waiting, now
        return _waiting(ctx, t, reading, bound)
    why = _not_draining(ctx, now, t, reading, bound)
    if why is None:
        return _waiting(ctx, t, reading, bound)
    log.info("%s: trial %d judged on the backlog it inherited: %s", ctx.settings.key,
             t.number, why)
    t.draining = False
    return None


def _read(ctx: LoopContext, now: float, t: RunningTrial) -> QueueReading | None:
    gauge = ctx.evaluator
    if not isinstance(gauge, QueueGauge):
        return None
    try:
        return gauge.queue(now, canary=t.canary)
    except WindowRejected as exc:  # the canary not told: its window will say so
        log.info("%s: trial %d's queue not read (%s): measured from settle_s",
                 ctx.settings.key, t.number, exc)
        return None


def _not_draining(ctx: LoopContext, now: float, t: RunningTrial, reading: QueueReading,
                  bound: float) -> str | None:
    """Why the config is judged on the backlog now, or None while it may yet drain it."""
    s = ctx.settings
    assert t.backlog_first is not None and t.backlog_first_at is not None
    began = t.began_at if t.began_at is not None else t.started_at
    if now - began >= s.max_trial_s:
        return f"{reading.waiting:.0f} still waiting after max_trial_s={s.max_trial_s:g} s"
    # The fall over the last stretch, not since the first reading: a queue whose
    # clients give up levels off where they balance the shortfall, and its average fall
    # since a fast first minute promised a drain it never made.
    mark, mark_at = ((t.backlog_mark, t.backlog_mark_at) if t.backlog_mark is not None
                     and t.backlog_mark_at is not None
                     else (t.backlog_first, t.backlog_first_at))
    looked = now - mark_at
    if looked < s.revert_after_s:  # the early look's own moment: no sooner
        return None
    fall = (mark - reading.waiting) / looked
    if fall <= 0.0:
        return (f"its queue has not fallen in {looked:.0f} s ({mark:.0f} waiting, now "
                f"{reading.waiting:.0f})")
    eta = (reading.waiting - bound) / fall
    if now + eta > began + s.max_trial_s:
        return (f"its queue falls {fall:.2g} a second: {reading.waiting:.0f} waiting "
                f"reach {bound:.1f} in {eta:.0f} s, past max_trial_s={s.max_trial_s:g} s "
                "from its start")
    t.backlog_mark, t.backlog_mark_at = reading.waiting, now
    return None


def _waiting(ctx: LoopContext, t: RunningTrial, reading: QueueReading,
             bound: float) -> Decision:
    where = "the canary" if t.canary else "the replicas"
    return ctx.decide(Action.NONE, f"trial {t.number} works off the backlog it inherited: "
                      f"{reading.waiting:.0f} requests waiting on {where}, where a config "
                      f"that keeps up holds {bound:.1f} at {reading.arrivals_per_s:.2g}/s; "
                      "no window until they are served", trial=t.number)
