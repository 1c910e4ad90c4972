"""A capacity count checked against the simulator's noise: a count that holds is the
answer only where the count above it holds too.

``capacity.CapacityPlanner.search`` gallops then bisects (``smallest_holding``), which
alone would take holding as monotone in the replica count. On seeded simulations near
the SLO's edge it is not quite: under random dispatch a P99 is its few largest
requests', and where they land moves with the count, so N may hold while N + 1 misses.
A bisection then reports a count that held by luck, with no count above it tried to say
so: the live loop would scale down to it and the next window, at that count, would
breach and buy the replicas back; ``slopilot tune`` would recommend it. So the search's
count is checked here, for both (the search applies it; tune's capacity answer reads
its ``lucky`` and ``gave_up``): its next count is simulated (one more run, none where the
search already ran it or the count is the search's maximum), and where that misses, the
first count held by luck is named (``lucky``) and the search climbs to the smallest
holding count above the miss (from the counts already run that hold, else climbing by
1, 2, 4, ... from the miss, then bisecting the gap) and checks that one's next count in
turn.

Every count run above the answer then holds, and the count below it misses (or is below
``lo``). Counts below the answer that were never run may hold: taking holding as monotone
there is what keeps the search to about 2 log2(N) runs, and a count that holds with its
next missing is no answer anyway. After ``RECHECKS`` + 1 lucky counts the climbing
stops (``gave_up``): holding flips often enough at that load that chasing next counts
would run every count up to the maximum. The answer is then the smallest count that
holds above the largest count run that missed (the climb and bisection above it, as
for a lucky count), its own next count not checked; None only where no count up to
``top`` holds above it. Not the maximum: it cannot be contradicted, but a reviewer's
table (1-5 missing, 6-14 flipping, 15 and up holding) bought 64 replicas where 12 and
up held on every run, and the scale-down's search, giving up the same way on the same
seeds, kept them for good. An answer given up on is enough to scale up to, and no
evidence for fewer replicas than a fleet has: the live loop's scale-down does not take
it (``CapacityAnswer.fewer_hold``), only the count above it that holds with its next
count, above any count that breached live at that load (``given_up.py``). Nor is it
evidence that a fleet breaching at it, or at a count in the band the twin misses,
suffices: the live loop's scale-up then searches again above the count that breached
(``scaling._above_given_up``); on the same table this search would give up on the same
count, and read as "capacity suffices" it held a breaching fleet there. A breach at a
count the twin holds with its next count is the config's to answer, as any.

Cost: one run more than the bisection where holding is monotone (per search that finds
a count; none where the answer is the maximum or its next count was run already); where
it is not, each lucky count adds its next count's run and the climb and bisection above
it, at most 1 + 2 log2(max) runs, ``RECHECKS`` + 1 of them at most, and one more climb
and bisection on giving up; the maximum, the costliest run, only where that climb
reaches it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

RECHECKS = 2
"""Lucky counts (held, their next count missed) the climb takes before it stops at the
smallest count holding above the last miss: each costs a run of its next count and the
climb above it."""


@dataclass(frozen=True)
class SteadyCount:
    replicas: int | None
    """The smallest count run that holds with its next count holding too (or that is
    ``hi``, or, ``gave_up``, that holds above every count run that missed); None where
    none is, up to ``top``."""
    lucky: tuple[int, ...] = ()
    """Counts that held while their next count missed, in the order found."""
    gave_up: bool = False
    """The climb stopped after ``RECHECKS`` + 1 lucky counts: ``replicas`` is the smallest
    count up to ``top`` that holds above the largest count run that missed, its next count
    not checked. No evidence for fewer replicas than a fleet has (the live loop's
    scale-down does not take it)."""


def steady_count(first: int | None, ok: Callable[[int], bool], tried: Callable[[], Collection[int]],
                 top: int, hi: int) -> SteadyCount:
    """From ``first``, the bisection's count (it holds; the count below it misses), the
    smallest count whose next count holds too. ``ok(n)`` runs count ``n`` (once: the
    caller caches it) and says whether it holds; ``tried()`` the counts run so far.
    Counts above ``top`` are not answers (a later candidate only searches below the best
    count so far) but its next count is still checked where it is at most ``hi``, the
    search's real maximum, past which there is no count to miss."""
    lucky: list[int] = []
    n = first
    while n is not None:
        if n >= hi or ok(n + 1):
            return SteadyCount(n, tuple(lucky))
        lucky.append(n)
        if len(lucky) > RECHECKS:
            # Holding flips at this load: stop chasing next counts. Every count run above
            # the largest miss holds, so the smallest holding above it is the answer the
            # runs support; the maximum (the costliest run) would buy replicas the noise
            # near the line does not call for, and is run only where the climb reaches it.
            # The count just missed (n + 1) is the largest run that missed: the gallop,
            # the bisections and the climbs run none that misses above their answer.
            missed = max((m for m in tried() if m > n + 1 and not ok(m)), default=n + 1)
            return SteadyCount(_next_holding(missed, ok, tried, top), tuple(lucky),
                               gave_up=True)
        n = _next_holding(n + 1, ok, tried, top)
    return SteadyCount(None, tuple(lucky))


def _next_holding(missed: int, ok: Callable[[int], bool],
                  tried: Callable[[], Collection[int]], top: int) -> int | None:
    """The smallest count in (``missed``, ``top``] that holds, bracketed from the counts
    already run (the gallop's top holds) or by climbing 1, 2, 4, ... above ``missed``,
    then bisected; None where ``top`` misses."""
    above = [m for m in tried() if missed < m <= top and ok(m)]
    below, right = missed, min(above, default=None)
    if right is None:
        step = 1
        while True:
            right = min(top, missed + step)
            if right <= below:
                return None
            if ok(right):
                break
            below, step = right, 2 * step
    left = max([below, *(m for m in tried() if below < m < right and not ok(m))]) + 1
    return smallest_holding(ok, left, right)


def smallest_holding(ok: Callable[[int], bool], left: int, right: int) -> int:
    """Binary search in [left, right] for the smallest count that holds, ``right``
    known to hold (holding taken as monotonic between the two)."""
    while left < right:
        mid = (left + right) // 2
        if ok(mid):
            right = mid
        else:
            left = mid + 1
    return right


def given_up(answer: int, held: Mapping[int, bool], verb: str) -> str:
    """The end of tune's sentence on flips where the climb gave up on ``answer``: the
    count it stands above and its next, unchecked (``held``: each count run and whether
    it held)."""
    missed = max((n for n, ok in held.items() if not ok and n < answer), default=None)
    above = "" if missed is None else \
        f" above {missed}, the largest count {verb} that missed"
    unchecked = (f"; {answer + 1} was not checked: holding flips too often at this load "
                 "to chase it" if answer + 1 not in held else "")
    return f"so the answer is {answer}, the smallest count that holds{above}{unchecked}"
