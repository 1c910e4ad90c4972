"""A rollback whose apply failed: owed, tried again with a growing wait, reported until it lands.

A tick that raises during an episode puts every replica back on the episode's best (or
starting) config (``Controller._rollback``). That apply can fail as well (a replica that
does not answer, an API server that is down), and the trial's config, perhaps the one that
broke the SLO, then stays on the canary or on every replica. The operator's periodic sync
puts the committed config back on its pods within a minute; nothing does on the demo's
local processes or the simulated cluster, and the loop itself went on as if it had rolled
back, until some later episode's end applied a config.

So the restore is kept as owed (``LoopState.pending_restore``, persisted with the rest of
the state) and tried again at the start of a tick once its wait is over: the next tick,
then ``RETRY_FIRST_S`` doubling up to ``RETRY_MAX_S`` between tries, one apply per tick at
most, for as long as it fails (given up, the trial's config would stay). A tick that
tries does nothing else, and its decision says how it went (``restore_failed``,
``restored``: revert actions, counted in ``slopilot_tuner_actions_total`` by that reason);
in between, the loop goes on, but no episode (so no trial) starts (``blocked``): each
would apply configs over the one owed, and begin on a committed config the replicas do
not run. A scale applies no config and still goes ahead. What is applied is the episode's
record as ``LoopState.rollback_config`` reads it when tried (its best, else its start), so
an edit of the spec meanwhile is honoured as during an episode.

A config the engine refuses (``ConfigError``: a value in an older release's wider range,
a knob no longer live) is no failure to wait out: tried again it is refused again, and
the restore was owed for ever, no episode ever starting. So it is dropped for the
committed config (``DeploymentHandle.committed_config``, the deployment's own), applied
in the same try (``restore_refused``, naming the refusal); that one failing to arrive
keeps the owed restore and its wait (``restore_failed``), and refused too, the owed
restore ends with nothing applied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import ConfigError
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import LoopState, PendingRestore

log = logging.getLogger(__name__)

RETRY_FIRST_S = 5.0
"""The wait after the first retry failed (the first retry is the next tick's): one
operator tick, so a replica back within seconds is not kept on the trial's config."""
RETRY_MAX_S = 60.0
"""The longest wait between two tries: the operator's sync interval, so a replica that
stays away is not asked more often than the sync asks it, and one back is not left on
the trial's config for much longer than a window."""


def wait_after(failures: int) -> float:
    """The wait before the next try after ``failures`` failed applies."""
    if failures <= 1:
        return 0.0
    return min(RETRY_FIRST_S * 2.0 ** (failures - 2), RETRY_MAX_S)


def failed(loop: LoopState, now: float, error: Exception, trial: int | None = None
           ) -> PendingRestore:
    """Record a failed apply of the rollback: the first makes it owed, each later one
    moves the next try further out."""
    why = f"{type(error).__name__}: {error}"
    kept = loop.pending_restore
    if kept is None:
        kept = PendingRestore(since=now, attempts=0, retry_at=now, error=why, trial=trial)
    kept.attempts += 1
    kept.error = why
    kept.retry_at = now + wait_after(kept.attempts)
    loop.pending_restore = kept
    return kept


def retry(ctx: LoopContext, now: float) -> Decision | None:
    """The owed restore, tried when its wait is over: the tick's decision then (it does
    nothing else); None when nothing is owed or its wait runs."""
    loop = ctx.loop
    kept = loop.pending_restore
    if kept is None or now < kept.retry_at:
        return None
    target = loop.rollback_config()
    if target is None:  # a state written by hand: nothing on record to put back
        log.warning("%s: a restore is owed but no episode config is on record; dropped",
                    ctx.settings.key)
        loop.pending_restore = None
        return None
    try:
        ctx.deployment.apply_config(target, canary=False)
    except ConfigError as exc:  # refused, not lost on the way: waiting changes nothing
        return _refused(ctx, now, kept, target, exc)
    except Exception as exc:  # still owed: the next try waits longer
        kept = failed(loop, now, exc)
        log.warning("%s: restore failed again (%d attempts): %s", ctx.settings.key,
                    kept.attempts, kept.error)
        return ctx.decide(Action.REVERT, f"restore_failed: {owed(kept, now)}",
                          trial=kept.trial, config=target)
    loop.pending_restore = None
    log.info("%s: restored after %d failed attempt(s)", ctx.settings.key, kept.attempts)
    return ctx.decide(Action.REVERT, f"restored: the episode's {_which(loop)} config back "
                      f"on every replica after {kept.attempts} failed attempt(s) over "
                      f"{now - kept.since:.0f} s (last: {kept.error})", trial=kept.trial,
                      config=target)


def _refused(ctx: LoopContext, now: float, kept: PendingRestore,
             target: Mapping[str, Any], refusal: ConfigError) -> Decision:
    """The engine refuses ``target``: the committed config goes back instead (module
    docstring)."""
    loop, key = ctx.loop, ctx.settings.key
    why = (f"the episode's {_which(loop)} config is refused by the engine "
           f"({type(refusal).__name__}: {refusal})")
    log.warning("%s: %s; the committed config goes back instead: %s", key, why,
                dict(target))
    committed: dict[str, Any] | None = None
    try:
        committed = ctx.deployment.committed_config()
        ctx.deployment.apply_config(committed, canary=False)
    except ConfigError as again:
        loop.pending_restore = None
        log.warning("%s: the committed config is refused too; the owed restore ends: %s",
                    key, again)
        left = f"trial {kept.trial}'s config" if kept.trial is not None else \
            "a trial's config"
        return ctx.decide(Action.REVERT, f"restore_refused: {why}, and the committed "
                          f"config too ({type(again).__name__}: {again}): the owed restore "
                          f"ends with nothing applied; {left} may still run there",
                          trial=kept.trial)
    except Exception as exc:  # the committed config did not arrive: owed, with its wait
        kept = failed(loop, now, exc)
        log.warning("%s: restore failed again (%d attempts): %s", key, kept.attempts,
                    kept.error)
        return ctx.decide(Action.REVERT, f"restore_failed: {why}; the committed config "
                          f"instead: {owed(kept, now)}", trial=kept.trial, config=committed)
    loop.pending_restore = None
    return ctx.decide(Action.REVERT, f"restore_refused: {why}; the committed config back "
                      f"on every replica instead, after {kept.attempts} failed attempt(s) "
                      f"over {now - kept.since:.0f} s", trial=kept.trial, config=committed)


def blocked(ctx: LoopContext, now: float) -> str | None:
    """Why no episode may start now (a restore is owed), in words; None when one may."""
    kept = ctx.loop.pending_restore
    if kept is None:
        return None
    return f"restore_pending: {owed(kept, now)}; no episode starts until it lands"


def owed(kept: PendingRestore, now: float) -> str:
    """The owed restore in words: what failed, how often, and when it is tried next."""
    left = f"trial {kept.trial}'s config" if kept.trial is not None else "a trial's config"
    wait = kept.retry_at - now
    when = f"in {wait:.0f} s" if wait > 0 else "at the next tick"
    return (f"the episode's config could not be put back on every replica "
            f"({kept.attempts} attempt(s) since {kept.since:.0f}, last: {kept.error}); "
            f"{left} may still run there; next try {when}")


def _which(loop: LoopState) -> str:
    return "best" if loop.best_config else "starting"
