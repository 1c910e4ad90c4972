"""Trials a dead process left RUNNING, failed as stale while the loop asks no trial.

A process killed after the study recorded a trial's ask and before its status said so
(``trial.py``: the ask, the start's stamp and the apply come before the tick's write)
leaves that trial RUNNING in the study, on no loop's record and beaten for by no one.
Optuna fails such a trial as stale (``heartbeat.py``) only where a study is opened or a
trial asked: a restarted loop that starts no episode (the alert gone, the hour's trials
used, a cooldown) left it RUNNING for as long as no episode came, days in the study's
history and its reports. So a loop whose study has stale trials to fail
(``ports.StaleTrials``) fails them once a ``SWEEP_S`` on its clock, beside its ticks:
only trials whose heartbeat stopped for the grace period, never one a live process holds
(the loop's own beats, or another operator replica's). A study out of reach is said once
and tried at the next sweep.
"""

from __future__ import annotations

import logging

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import StaleTrials

log = logging.getLogger(__name__)

SWEEP_S = 60.0
"""How often the study's stale trials are failed: a query a minute per deployment, and a
trial left by a dead process failed within a minute of its grace period's end."""


def sweep(ctx: LoopContext, now: float) -> None:
    """Fail the study's stale trials where a ``SWEEP_S`` has passed on the loop's clock
    since the last sweep (at once for a new controller; a clock stepped back sweeps
    again at once rather than waiting out the step)."""
    study = ctx.study
    if not isinstance(study, StaleTrials):
        return
    last = ctx.stale_swept_at
    if last is not None and 0 <= now - last < SWEEP_S:
        return
    ctx.stale_swept_at = now
    try:
        study.fail_stale()
    except Exception as exc:  # SQLAlchemy's many kinds: the database is out of reach
        if not ctx.stale_unswept:
            log.warning("%s: the study's stale trials not failed (%s: %s); tried again in "
                        "%g s", ctx.settings.key, type(exc).__name__, exc, SWEEP_S)
        ctx.stale_unswept = True
    else:
        ctx.stale_unswept = False
