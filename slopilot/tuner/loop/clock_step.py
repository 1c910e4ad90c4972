"""Times the loop kept that lie after ``now``: brought back to at most one wait from now.

Every time in ``LoopState`` is a reading of the clock that ticks the controller, and it
is persisted (``status.controller``) across restarts and operator replicas. A time after
``now`` means the clock stepped back since it was read (an NTP step), another clock
wrote it (a restarted operator on a node whose clock is behind, a peer replica's ahead),
or someone wrote the status by hand. Kept, each wait lasted the step's length on top of
its own: a trial served its config for a day on a clock stepped back a day, and
``cooldown_until: 1e15`` cooled for ever. ``rebase_future`` moves each such time back so
that its wait is at most its own length from now: a trial's window starts now (what the
window measured before the step is on another clock), and so do its time applied
(``began_at``, which its limit counts from), a rate-limit entry, a
quiet period, a rollout's last move or a state's ``since``; a cooldown, a backoff, a
stuck config's hold, a refused scale's hold or an owed restore's wait ends at most its
length from now. A clock that jumps forward needs nothing: each wait just ends, as after
an operator that was down that long.
"""

from __future__ import annotations

from slopilot.tuner.loop.backoff import Backoff
from slopilot.tuner.loop.restore import wait_after
from slopilot.tuner.loop.scale_wait import hold_s
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import LoopState


def rebase_future(loop: LoopState, settings: ControllerSettings, now: float) -> list[str]:
    """Bring ``loop``'s times after ``now`` back (module docstring); returns the fields
    moved, each as ``name (N s ahead)``, for the caller's log line."""
    moved: list[str] = []

    def note(name: str, value: float) -> None:
        # ``.4g``: a time written into the status may be 1e308, not 309 digits in the log.
        moved.append(f"{name} ({value - now:.4g} s ahead)")

    if loop.since > now:
        note("since", loop.since)
        loop.since = now
    trial = loop.trial
    if trial is not None and trial.started_at > now:
        note("trial.started_at", trial.started_at)
        trial.started_at = now
    if trial is not None and trial.began_at is not None and trial.began_at > now:
        # What ``max_trial_s`` and the backlog's wait count from: left ahead, a trial
        # whose windows starved outlived its limit by the step.
        note("trial.began_at", trial.began_at)
        trial.began_at = now
    if ahead := [t for t in loop.trial_starts if t > now]:
        note("trial_starts", max(ahead))
        loop.trial_starts = [min(t, now) for t in loop.trial_starts]
    if loop.headroom_since is not None and loop.headroom_since > now:
        note("headroom_since", loop.headroom_since)
        loop.headroom_since = now
    if loop.cooldown_until is not None and loop.cooldown_until > now + settings.cooldown_s:
        note("cooldown_until", loop.cooldown_until - settings.cooldown_s)
        loop.cooldown_until = now + settings.cooldown_s
    if loop.backoff is not None and (kept := Backoff.from_dict(loop.backoff)) is not None:
        cap = max(settings.max_backoff_s, settings.cooldown_s)  # as backoff.record caps it
        wait = min(max(kept.wait_s, 0.0), cap)
        if kept.until > now + wait or wait != kept.wait_s:
            note("backoff.until", kept.until - wait)
            loop.backoff = Backoff(kept.situation, min(kept.until, now + wait),
                                   wait).to_dict()
    watch = loop.rollout
    if watch is not None and watch.since > now:
        note("rollout.since", watch.since)
        watch.since = now
    if late := [c for c in loop.stuck_configs if c.until > now + settings.max_backoff_s]:
        note("stuck_configs.until", max(c.until for c in late) - settings.max_backoff_s)
        for c in late:
            c.until = now + settings.max_backoff_s
    for name in ("replica_wait", "replicas_short"):
        kept = getattr(loop, name)
        if kept is not None and kept.since > now:  # its wait restarts from now
            note(f"{name}.since", kept.since)
            kept.since = now
    short = loop.replicas_short
    if short is not None and short.until is not None \
            and short.until > now + (hold := hold_s(settings, short)):
        note("replicas_short.until", short.until - hold)
        short.until = now + hold
    owed = loop.pending_restore
    if owed is not None:
        if owed.since > now:
            note("pending_restore.since", owed.since)
            owed.since = now
        wait = wait_after(owed.attempts)
        if owed.retry_at > now + wait:
            note("pending_restore.retry_at", owed.retry_at - wait)
            owed.retry_at = now + wait
    return moved
