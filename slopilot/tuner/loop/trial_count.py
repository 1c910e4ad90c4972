"""The hour's live-trial count across a crash: the loop's record with the study's.

``LoopState.trial_starts`` bounds the trials an hour starts (``hourly_trials``). It is
entered before a trial's apply, but reaches the status only with the tick's write: an
operator killed in between (SIGKILL, an OOM the trial itself may cause, a node lost)
restarted with no record of a trial its pods ran, and a crash loop applied trials
without bound. ``trial.py`` therefore also stamps each start on the trial in the study
(``ports.TrialStarts``) before the apply, and a new controller merges the study's
stamps of the last hour into its record once (``recount``), before its first trial: its
next status write keeps them, so no tick reads the study for it again.

Both are on the loop's clock (the stamp is the tick's ``now``, as the record's entry),
not Optuna's ``datetime_start`` (the host's wall clock, which a virtual clock's tests
and benchmarks never meet). The same start is in both under the same value, so the two
are merged as multisets: each value as many times as the source that has it most. The
study's stamps are its family's (``study_family.family_trials``): a restart under a
changed space asks in a successor study, and the base's stamps, a crash's among them,
still count. The record alone holds the starts of a study in another storage (before a
storage switch), and the study alone those of a trial whose tick was never written.

A clock stepped back (an NTP step) after a start moves the record's entry back to the
clock (``clock_step.rebase_future``), while the study's stamp keeps the value it was
stamped with, now ahead of the clock: matched by value, a restart counted that start
twice. So a stamp ahead of ``now`` is matched first with a record entry no stamp holds
(``merged``); only one with no such entry is a start the record lacks. (A record entry
with no stamp is otherwise one of a study in another storage, or a start whose stamp
failed and whose trial was never applied: matched with one of those, a start ahead of a
stepped-back clock may go uncounted once, in a restart that follows both.)

Such a trial was also its episode's, and ``LoopState.episode_trials`` lost it with the
tick: a start found only in the study while the record's episode is open is counted in
that episode too, so that a crash loop does not run an episode past ``max_trials``. A
record outside an episode (the crash came in the tick that began one) is left: the
episode begins again from 0, the start counted in the hour alone.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import TrialStarts

log = logging.getLogger(__name__)
HOUR_S = 3600.0


def merged(kept: Iterable[float], stamped: Iterable[float],
           now: float | None = None) -> list[float]:
    """``kept`` with each start of ``stamped`` it lacks: a value both hold counts as
    many times as the one that holds it more often, not twice. With ``now``, a stamp
    after it (the clock stepped back since) that ``kept`` lacks is matched first with an
    entry of ``kept`` at or before ``now`` that no stamp holds: the record's own entry
    for it, brought back to the clock by ``rebase_future`` (module docstring)."""
    kept, have = list(kept), Counter(kept)
    counts = Counter(stamped)
    spare = [] if now is None else \
        [r for r in sorted((have - counts).elements()) if r <= now]
    out = list(kept)
    for at, n in sorted(counts.items()):
        extra = max(0, n - have[at])
        if now is not None and at > now:
            taken = min(extra, len(spare))
            del spare[:taken]
            extra -= taken
        out.extend([at] * extra)
    return sorted(out)


def recount(ctx: LoopContext, now: float) -> None:
    """Merge the study's starts of the hour before ``now`` into the loop's record, once
    per controller. Raises where the study cannot be read (the caller decides whether
    that stops a trial); tried again at the next call then."""
    study = ctx.study
    if ctx.starts_recounted or not isinstance(study, TrialStarts):
        return
    # The hour as ``Controller.tick`` keeps it: a start exactly an hour old is out.
    stamped = [t for t in study.started_since(now - HOUR_S) if now - t < HOUR_S]
    loop = ctx.loop
    before = len(loop.trial_starts)
    loop.trial_starts = merged(loop.trial_starts, stamped, now)
    ctx.starts_recounted = True
    if (found := len(loop.trial_starts) - before) <= 0:
        return
    episode = ""
    if loop.episode_open:
        # Started after the last state written, which was this episode's: its trials
        # too (at most one tick goes unwritten, and none both ends an episode and
        # starts the next one's trial). Uncounted, each crash gave the episode one
        # trial more than its limit.
        loop.episode_trials += found
        episode = f" and in this episode's trials (now {loop.episode_trials})"
    log.warning("%s: %d trial start(s) of the last hour found in study %s and not in "
                "the loop's record (its process stopped before its status said so): "
                "counted in the hourly cap%s", ctx.settings.key, found, study.name, episode)


def try_recount(ctx: LoopContext, now: float) -> None:
    """``recount``, where a study out of reach only waits: the tick goes on (no trial is
    asked of a study out of reach), and the next one tries again."""
    try:
        recount(ctx, now)
    except Exception as exc:  # SQLAlchemy's many kinds: the database is out of reach
        if not ctx.starts_unread:
            log.warning("%s: the study's trial starts not read (%s: %s); read before the "
                        "next trial", ctx.settings.key, type(exc).__name__, exc)
        ctx.starts_unread = True
    else:
        ctx.starts_unread = False
