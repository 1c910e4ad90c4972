"""A refusal of replicas that repeats at the same cap holds the next scale-ups longer.

Before, while a quota never rose, the loop tried a scale-up again every ``max_backoff_s``
for ever: each try left pods ``Pending`` for ``replica_ready_s`` (a cluster-autoscaler
adding a GPU node each time), gave them back and informed. Now each refusal in a row at
the same cap doubles the hold, up to ``MAX_HOLD_DOUBLINGS`` doublings; more replicas
serving than the refusal's ``ready`` (the quota raised) forgets it. Driven by the
controller's own clock (``Controller.tick(now)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slopilot.tuner.loop.clock_step import rebase_future
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Decision
from slopilot.tuner.loop.settings import MAX_HOLD_DOUBLINGS
from slopilot.tuner.loop.state import LoopState
from tests.tuner.controller_fakes import FakePlanner, Rig
from tests.tuner.test_replica_wait import QUOTA, READY_S, quota_rig

BACKOFF_S = 600.0
STEP = 10.0


@dataclass(frozen=True)
class Refusal:
    """One give-up as the loop recorded it."""

    at: float
    hold_s: float
    strikes: int | None
    said: str


def rig(planner: FakePlanner | None = None) -> Rig:
    out = quota_rig(planner or FakePlanner(needed=4))
    out.settings["max_backoff_s"] = BACKOFF_S
    return out


def refusals(ctl: Controller, start: float, end: float) -> tuple[list[Refusal], float]:
    """Tick from ``start`` until before ``end``; each give-up (a new ``replicas_short``)
    with the hold it set; and the time ticked to."""
    out: list[Refusal] = []
    t = start
    while t < end:
        before = ctl.loop.replicas_short
        d: Decision = ctl.tick(t)
        short = ctl.loop.replicas_short
        if short is not None and (before is None or short.since != before.since):
            assert short.until is not None
            out.append(Refusal(short.since, short.until - short.since,
                               getattr(short, "strikes", None), d.reason))
        t += STEP
    return out, t


def test_refusals_in_a_row_at_the_same_quota_double_the_hold() -> None:
    r = rig()
    ctl = r.build()
    seen, _ = refusals(ctl, 0.0, 3 * READY_S + 3 * BACKOFF_S + 100.0)
    assert [x.hold_s for x in seen] == [BACKOFF_S, 2 * BACKOFF_S, 4 * BACKOFF_S], seen
    assert [x.strikes for x in seen] == [1, 2, 3]
    # Each try is made once its hold has ended, and not before.
    assert seen[1].at == seen[0].at + BACKOFF_S + READY_S
    assert seen[2].at == seen[1].at + 2 * BACKOFF_S + READY_S
    assert r.dep.scaled == [4, 2] * 3
    # The inform says which refusal in a row it is and when the next try is.
    assert "refused 3 times in a row" in seen[2].said, seen[2].said
    assert f"tried again in {4 * BACKOFF_S:.0f} s" in seen[2].said, seen[2].said


def test_the_hold_is_capped() -> None:
    r = rig()
    ctl = r.build()
    cap = 2 ** MAX_HOLD_DOUBLINGS
    end = (MAX_HOLD_DOUBLINGS + 3) * READY_S + (2 * cap + cap - 1) * BACKOFF_S + 100.0
    seen, _ = refusals(ctl, 0.0, end)
    holds = [x.hold_s / BACKOFF_S for x in seen]
    assert holds == [2.0 ** k for k in range(MAX_HOLD_DOUBLINGS + 1)] + [cap, cap], holds
    assert [x.strikes for x in seen] == list(range(1, MAX_HOLD_DOUBLINGS + 4))
    # Held, a scale alert says the strike count and when the next try is.
    t = seen[-1].at + STEP
    d = ctl.tick(t)
    while "no scale_up" not in d.reason and t < seen[-1].at + 100.0:
        t += STEP
        d = ctl.tick(t)
    assert f"refused {MAX_HOLD_DOUBLINGS + 3} times in a row" in d.reason, d.line()
    assert f"tried again in {seen[-1].at + cap * BACKOFF_S - t:.0f} s" in d.reason, \
        d.line()


def test_a_raised_quota_resets_the_backoff() -> None:
    r = rig()
    ctl = r.build()
    seen, t = refusals(ctl, 0.0, 2 * READY_S + BACKOFF_S + 20.0)
    assert [x.strikes for x in seen] == [1, 2]
    r.dep.ready_cap = 3  # the quota raised by one pod: the next try has 3 of 4 serving
    more, t = refusals(ctl, t, t + 2 * BACKOFF_S + READY_S + 20.0)
    assert [(x.strikes, x.hold_s) for x in more] == [(1, BACKOFF_S)], more
    assert r.dep.scaled[-2:] == [4, 3]


def test_replicas_that_all_serve_forget_the_strikes() -> None:
    r = rig()
    ctl = r.build()
    _, t = refusals(ctl, 0.0, 2 * READY_S + BACKOFF_S + 20.0)
    assert ctl.loop.replicas_short is not None and ctl.loop.replicas_short.strikes == 2
    r.dep.ready_cap = None  # the quota lifted: the next try's four all serve
    _, t = refusals(ctl, t, t + 2 * BACKOFF_S + READY_S)
    assert r.dep.scaled[-1] == 4 and r.dep.n == 4
    assert ctl.loop.replicas_short is None
    # Lowered again later (the episode the alert starts at four ends buying two more),
    # a refusal is the first of its kind.
    r.dep.n, r.dep.ready_cap = 2, 2
    again, _ = refusals(ctl, t, t + 800.0)
    assert [x.strikes for x in again] == [1], again


def test_a_hand_scale_that_serves_forgets_the_strikes() -> None:
    r = rig()
    ctl = r.build()
    _, t = refusals(ctl, 0.0, 2 * READY_S + BACKOFF_S + 20.0)
    assert ctl.loop.replicas_short is not None and ctl.loop.replicas_short.strikes == 2
    r.dep.n, r.dep.ready_cap = 3, 3  # the quota raised and scaled by hand
    refusals(ctl, t, t + 60.0)
    assert ctl.loop.replicas_short is None


def test_a_restart_mid_backoff_keeps_the_strike_count() -> None:
    r = rig()
    ctl = r.build()
    seen, t = refusals(ctl, 0.0, 2 * READY_S + BACKOFF_S + 20.0)
    assert [x.strikes for x in seen] == [1, 2]
    saved = LoopState.from_dict(json.loads(json.dumps(ctl.to_dict())))
    assert saved.replicas_short == ctl.loop.replicas_short
    again = r.build(state=saved)
    more, _ = refusals(again, t, t + 2 * BACKOFF_S + READY_S + 20.0)
    assert [(x.strikes, x.hold_s) for x in more] == [(3, 4 * BACKOFF_S)], more


def test_a_refusal_kept_by_an_older_version_reads_as_the_first_strike() -> None:
    saved = LoopState.from_dict({"state": "steady", "replicas_short": {
        "asked": 4, "ready": 2, "since": 100.0, "why": QUOTA, "until": 700.0}})
    assert saved.replicas_short is not None and saved.replicas_short.strikes == 1
    r = rig()
    ctl = r.build(state=saved)
    d = ctl.tick(200.0)
    assert "no scale_up above 2" in d.reason and "tried again in 500 s" in d.reason, \
        d.line()
    seen, _ = refusals(ctl, 700.0, 700.0 + READY_S + 20.0)
    assert [(x.strikes, x.hold_s) for x in seen] == [(2, 2 * BACKOFF_S)], seen
    assert r.dep.scaled == [4, 2]


def test_a_clock_stepped_back_keeps_the_doubled_hold() -> None:
    """``clock_step.rebase_future`` brings a hold written ahead back to its own length
    from now: the third strike's 4x, not ``max_backoff_s``."""
    r = rig()
    ctl = r.build()
    seen, t = refusals(ctl, 0.0, 3 * READY_S + 3 * BACKOFF_S + 100.0)
    assert [x.strikes for x in seen] == [1, 2, 3]
    saved = LoopState.from_dict(ctl.to_dict())
    short = saved.replicas_short
    assert short is not None and short.until is not None
    short.since += 86400.0
    short.until += 86400.0
    again = r.build(state=saved)
    again.tick(t)
    kept = again.loop.replicas_short
    assert kept is not None and kept.until == t + 4 * BACKOFF_S and kept.strikes == 3


def test_a_refusal_after_a_quiet_spell_is_a_first_again() -> None:
    """The count is of refusals in a row: once the alert has been quiet past the longest
    hold after the last one ended, a refusal is the first again (a month-old count held
    a new one twice as long), as kubelet's backoff forgets after a while."""
    r = rig()
    ctl = r.build()
    seen, t = refusals(ctl, 0.0, 2 * READY_S + BACKOFF_S + 20.0)
    assert [x.strikes for x in seen] == [1, 2]
    ended = seen[-1].at + seen[-1].hold_s
    fired, r.alerts.alerts = r.alerts.alerts, []
    quiet_until = ended + 2 ** MAX_HOLD_DOUBLINGS * BACKOFF_S + STEP
    _, t = refusals(ctl, t, quiet_until)
    r.alerts.alerts = fired
    later, _ = refusals(ctl, t, t + READY_S + 100.0)
    assert [(x.strikes, x.hold_s) for x in later] == [(1, BACKOFF_S)], later


def test_a_refusal_soon_after_the_hold_is_still_in_a_row() -> None:
    r = rig()
    ctl = r.build()
    seen, t = refusals(ctl, 0.0, READY_S + 20.0)
    ended = seen[-1].at + seen[-1].hold_s
    fired, r.alerts.alerts = r.alerts.alerts, []
    _, t = refusals(ctl, t, ended + BACKOFF_S)  # quiet, but for less than the cap
    r.alerts.alerts = fired
    later, _ = refusals(ctl, t, t + READY_S + 100.0)
    assert [x.strikes for x in later] == [2], later


def test_a_count_written_into_the_status_is_kept_small() -> None:
    """A tenant may write ``status.controller``: a count of 4,000 digits held no longer
    (the hold is capped), but every message said it and every write kept it."""
    saved = LoopState.from_dict({"state": "steady", "replicas_short": {
        "asked": 4, "ready": 2, "since": 100.0, "why": QUOTA, "until": 700.0,
        "strikes": int("9" * 4000)}})
    short = saved.replicas_short
    assert short is not None and short.strikes <= 1000
    r = rig()
    ctl = r.build(state=saved)
    d = ctl.tick(200.0)
    assert len(d.reason) < 600, d.reason
    assert len(json.dumps(ctl.to_dict())) < 4000


def test_a_time_written_far_ahead_is_said_briefly_as_it_is_brought_back() -> None:
    """An ``until`` of 1e308 written into the status is brought back to its hold from
    now; the log line named it in 309 digits."""
    saved = LoopState.from_dict({"state": "steady", "replicas_short": {
        "asked": 4, "ready": 2, "since": 100.0, "why": QUOTA, "until": 1e308}})
    r = rig()
    moved = rebase_future(saved, r.build().settings, 200.0)
    assert moved and all(len(m) < 80 for m in moved), moved
    assert saved.replicas_short is not None and saved.replicas_short.until == 200.0 + BACKOFF_S
