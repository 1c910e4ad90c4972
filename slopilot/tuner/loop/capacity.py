"""How many replicas hold the SLO at the measured load: a search over the simulator.

The search gallops up from ``lo`` (lo, 2 lo, 4 lo, ...) to the first count that holds,
then bisects below it: about 2 log2(N) simulations, none of them of more than twice the
N it finds. A simulation's time and memory grow with its replica count (512 replicas
took 39 s and 1.1 GB), so simulating ``hi`` first, when a handful suffice, would make
every search as dear as the largest. ``margin`` asks for headroom: every SLO term at
most ``1 - margin`` of its limit, so a scale-down decision is not taken at the edge and
undone by the next burst.

The gallop and bisection alone take holding as monotone in the replica count, and on
seeded runs near the SLO's edge it is not: N may hold while N + 1 misses, and a
bisection landing on N would scale the fleet down to a count the next window undoes. So
the count found is checked against its next count (``steady_count.py``, the rule
``slopilot tune`` applies too): one count more is run where holding is monotone (none
where the answer is ``hi`` or the search ran its next count already), one simulation or,
where its first draw lands near the line, ``draws`` of them, and a count that held by
luck is named (``CapacityAnswer.lucky``), not answered with.

Each simulated run is made long enough to hold ``SIM_MIN_CLASS_REQUESTS`` of its least
served judged class (``study/sample_floor.py``; cv^2 times that on a bursty load, whose
clumped requests say less each), up to ``SIM_MAX_DURATION_S``: at a low
rate 120 s held a dozen P0 requests, whose "P99" is their maximum, and a count that
truly misses by 8 % "held" in a quarter of the probes. A count whose run reached the cap
short of the floor is in ``CapacityAnswer.short``: its "holds" says little, and a
scale-down is not taken on it.

A count whose first seeded run of the measured load lands near the margin's line
(``CLEAR``) is judged on the median of ``draws`` (3) runs, not that one: near the edge one
draw's P99 is a coin toss (the closed loop's post-shift load on 3 replicas held with 10 %
headroom in 9 of 10 draws, and the one draw the loop took was the tenth: it bought 4,
docs/closed_loop.md). A count then holds when most draws hold, and the median draw's
terms are the count's result. A first run further off decides alone: each run is a whole
simulation, and the operator's worker bounds a capacity plan's time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.steady_count import smallest_holding, steady_count
from slopilot.tuner.study.objective import TrialResult, holds, score
from slopilot.tuner.study.sample_floor import (
    SIM_MAX_DURATION_S,
    SIM_MIN_CLASS_REQUESTS,
    Shortfall,
    burst_floor,
    long_enough,
)

log = logging.getLogger(__name__)

SimulateFn = Callable[[Scenario, Mapping[str, Any], int], WindowSummary]
ScoreFn = Callable[[Scenario, Mapping[str, Any], int], TrialResult]
"""A config's scored result on N replicas (e.g. a robust verdict over several windows)."""
DrawFn = Callable[[Scenario, Mapping[str, Any], int, "int | None"], TrialResult]
"""One seeded draw's scored result of a config on N replicas (seed None: unseeded)."""

DRAWS = 3
"""Seeded runs per replica count whose median verdict the search takes (where the first
is near the line: ``CLEAR``)."""
CLEAR = 0.1
"""How far (a share of the limit) a first draw's worst term lies from the margin's line
for it to decide alone. The closed loop's post-shift load on 3 replicas read P0 TTFT at
91.7 % of its limit in the one draw the loop took (0.017 from the 10 % headroom's line):
drawn again, 9 of 10 draws held it."""


class CapacityError(ValueError):
    """Bad bounds or margin for a capacity search; the message names the fix."""


def _worst(result: TrialResult) -> float:
    """The term nearest (or furthest over) its limit: a count holds with ``margin`` when
    this is at most ``-margin``."""
    return max(result.constraints, default=-1.0)


def _long_enough(duration_s: float | None, floor: int, max_duration_s: float
                 ) -> Callable[[Scenario, Mapping[str, Any], int, int | None],
                               tuple[WindowSummary, Shortfall | None]]:
    def run(scenario: Scenario, config: Mapping[str, Any], replicas: int, seed: int | None
            ) -> tuple[WindowSummary, Shortfall | None]:
        def at(d: float) -> WindowSummary:
            return simulate(scenario, config, replicas=replicas, duration_s=d,
                            seed=seed).summary
        base = scenario.duration_s if duration_s is None else duration_s
        return long_enough(at, scenario.slo, base, floor=burst_floor(scenario, floor),
                           max_duration_s=max(base, max_duration_s))
    return run


@dataclass
class CapacityAnswer:
    replicas: int | None
    """Smallest feasible count in [lo, hi]; None when even hi is not enough."""
    results: dict[int, TrialResult] = field(default_factory=dict)
    """Every count simulated, with its scored result."""
    short: dict[int, Shortfall] = field(default_factory=dict)
    """The counts whose run reached its time cap short of the requests of a judged class
    its P99 needs: their verdict is one of a few requests' largest."""
    lucky: tuple[int, ...] = ()
    """Counts that held while their next count missed, in the order found
    (``steady_count``): none is the answer."""
    gave_up: bool = False
    """Holding flipped at ``steady_count.RECHECKS`` + 1 counts: ``replicas`` is the
    smallest count that holds above the largest count run that missed, its next count
    not checked. Enough to scale up to, no evidence for scaling down (``fewer_hold``)."""
    checked: bool = False
    """The answer's next count was run only to check that the answer did not hold by
    luck (the gallop and bisection had not run it)."""

    def fewer_hold(self, current: int) -> bool:
        """Whether fewer than ``current`` replicas hold, on runs long enough to say so,
        and not on an answer given up on: holding that flips near the answer is noise at
        the line, and a fleet cut to a count whose next count missed breaches and buys
        the replicas back."""
        return self.replicas is not None and self.replicas < current \
            and not self.gave_up and not any(n < current for n in self.short)

    def why_short(self, current: int) -> str | None:
        """Why fewer than ``current`` cannot be said to hold; None when they can, or
        when no run fell short."""
        below = sorted(n for n in self.short if n < current)
        if not below:
            return None
        short = self.short[below[0]]
        return (f"too little traffic to judge fewer replicas: the simulated run of {below[0]} "
                f"held {short.describe()}{' (the cap)' if short.capped else ''}")


class CapacityPlanner:
    """Smallest replica count whose simulated summary meets the SLO at a given load."""

    def __init__(self, *, duration_s: float | None = 120.0, seed: int | None = 0,
                 simulate_fn: SimulateFn | None = None, score_fn: ScoreFn | None = None,
                 min_class_requests: int = SIM_MIN_CLASS_REQUESTS,
                 max_duration_s: float = SIM_MAX_DURATION_S, draws: int = DRAWS,
                 draw_fn: DrawFn | None = None) -> None:
        if duration_s is not None and duration_s <= 0:
            raise CapacityError(f"duration_s={duration_s}: expected a positive time")
        if sum(f is not None for f in (simulate_fn, score_fn, draw_fn)) > 1:
            raise CapacityError("give one of simulate_fn, score_fn and draw_fn, not both "
                                "(nor all three)")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1 \
                or draws % 2 == 0:
            raise CapacityError(f"draws={draws!r}: expected an odd count >= 1 (a median "
                                f"verdict needs a middle draw), e.g. {DRAWS}")
        if isinstance(min_class_requests, bool) or min_class_requests < 0:
            raise CapacityError(f"min_class_requests={min_class_requests!r}: expected a "
                                f"count >= 0, e.g. {SIM_MIN_CLASS_REQUESTS}")
        self._short: dict[int, Shortfall] = {}
        self._draw_fn: DrawFn | None = None
        # A caller's simulate_fn or score_fn is one verdict, sized (and seeded) by it.
        self._draws, self._seed = (draws, seed) if simulate_fn is None \
            and score_fn is None else (1, seed)
        run = _long_enough(duration_s, min_class_requests, max_duration_s)

        def one_draw(scenario: Scenario, config: Mapping[str, Any], n: int,
                     draw_seed: int | None) -> TrialResult:
            summary, short = run(scenario, config, n, draw_seed)
            if short is not None:
                self._short[n] = short
            return score(summary, scenario.slo, config)

        def one_window(scenario: Scenario, config: Mapping[str, Any], n: int) -> TrialResult:
            assert simulate_fn is not None
            return score(simulate_fn(scenario, config, n), scenario.slo, config)

        if score_fn is not None:
            self._score: ScoreFn | None = score_fn
        elif simulate_fn is not None:  # its own length: the caller's to size
            self._score = one_window
        else:
            self._score, self._draw_fn = None, draw_fn or one_draw

    def _median(self, scenario: Scenario, config: Mapping[str, Any], n: int,
                margin: float) -> TrialResult:
        """The median of ``draws`` seeded runs by their worst term: it holds with a margin
        exactly when most draws do, and its terms are what the replica plateau and the
        scale-down read (a majority's draw nearest the line, taken after two draws agreed,
        read one replica of an SLO below one prefill as flat where its median moves).
        A first draw ``CLEAR`` or more from the margin's line, either side, decides alone:
        a draw that far off is no coin toss, and every draw costs a whole simulation (the
        operator's worker bounds a capacity plan's time)."""
        assert self._draw_fn is not None

        def draw(k: int) -> TrialResult:
            assert self._draw_fn is not None
            return self._draw_fn(scenario, config, n,
                                 None if self._seed is None else self._seed + k)
        first = draw(0)
        if abs(_worst(first) + margin) >= CLEAR:
            return first
        draws = [first, *(draw(k) for k in range(1, self._draws))]
        return sorted(draws, key=_worst)[len(draws) // 2]

    def _checked(self, lo: int, hi: int, margin: float) -> None:
        if isinstance(lo, bool) or isinstance(hi, bool) or not 1 <= lo <= hi:
            raise CapacityError(f"replica bounds [{lo}, {hi}]: need 1 <= lo <= hi")
        if not 0.0 <= margin < 1.0:
            raise CapacityError(f"margin={margin}: expected a fraction in [0, 1)")

    def _oracle(self, scenario: Scenario, config: Mapping[str, Any], margin: float,
                answer: CapacityAnswer) -> Callable[[int], bool]:
        def ok(n: int) -> bool:
            if n not in answer.results:
                self._short.pop(n, None)
                answer.results[n] = self._score(scenario, config, n) \
                    if self._score is not None else self._median(scenario, config, n, margin)
                if n in self._short:
                    answer.short[n] = self._short.pop(n)
            return holds(answer.results[n], margin)
        return ok

    def search(self, scenario: Scenario, config: Mapping[str, Any], lo: int, hi: int,
               *, margin: float = 0.0, check_to: int | None = None) -> CapacityAnswer:
        """The smallest count in [lo, hi] that holds with its next count holding too
        (``steady_count``), found from below: ``lo``, then doubling, then a binary
        search in the last gap, then the count found checked against its next count. A
        simulation of N replicas costs N times one of a single replica (and a tenant's
        ``replicas.max`` is not ours to spend), so the search never simulates much more
        than the answer needs. ``check_to`` (default ``hi``): the largest count run to
        check an answer's next count, for a caller that searches below a count it
        already knows holds (``tune``'s later candidates) but whose real maximum is
        higher."""
        self._checked(lo, hi, margin)
        check_to = hi if check_to is None else check_to
        if isinstance(check_to, bool) or check_to < hi:
            raise CapacityError(f"check_to={check_to!r}: expected a count >= hi ({hi}), "
                                "the real maximum the search's bound lies under")
        answer = CapacityAnswer(replicas=None)
        ok = self._oracle(scenario, config, margin, answer)
        below, n = lo - 1, lo  # invariant: below does not hold (or is below lo)
        while not ok(n):
            if n == hi:
                log.info("capacity: %d replicas do not hold the SLO at this load", hi)
                return answer
            below, n = n, min(hi, 2 * n)
        bisected = smallest_holding(ok, below + 1, n)
        searched = set(answer.results)
        steady = steady_count(bisected, ok, answer.results.keys, hi, check_to)
        answer.replicas, answer.lucky, answer.gave_up = \
            steady.replicas, steady.lucky, steady.gave_up
        answer.checked = steady.replicas is not None \
            and steady.replicas + 1 in answer.results.keys() - searched
        if steady.lucky:
            log.info("capacity: %s held while the count above missed (the simulator's "
                     "noise): not the answer", ", ".join(map(str, steady.lucky)))
        log.info("capacity: %s replicas hold the SLO (searched %s)", steady.replicas,
                 sorted(answer.results))
        return answer
