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
next missing is no answer anyway. After ``RECHECKS`` lucky counts the climbing stops:
holding flips often enough at that load that only the largest count, with no larger one
to miss, is judged (``gave_up``), rather than running every count up to it. The live
loop's scale-down searches up to the current count, so there it keeps the fleet.

Cost: one run more than the bisection where holding is monotone (per search that finds
a count; none where the answer is the maximum or its next count was run already); where
it is not, each lucky count adds its next count's run and the climb and bisection above
it, at most 1 + 2 log2(max) runs, and ``RECHECKS`` + 1 of them at most before the
maximum decides."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

RECHECKS = 2
"""Lucky counts (held, their next count missed) the climb takes before it stops and
the maximum decides: each costs a run of its next count and the climb above it."""


@dataclass(frozen=True)
class SteadyCount:
    replicas: int | None
    """The smallest count run that holds with its next count holding too (or that is
    ``hi``); None where none is, up to ``top``."""
    lucky: tuple[int, ...] = ()
    """Counts that held while their next count missed, in the order found."""
    gave_up: bool = False
    """The climb stopped after ``RECHECKS`` + 1 lucky counts and judged ``top`` alone."""


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
            # Holding flips at this load: judge the maximum, which no count above can
            # contradict, rather than climbing through every count to it.
            return SteadyCount(top if top == hi and ok(top) else None, tuple(lucky),
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
