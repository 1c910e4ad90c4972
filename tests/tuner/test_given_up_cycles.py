"""The live loop through several breach -> search -> scale-up cycles where the twin's
capacity search gives up (``loop/steady_count.py``: holding flips near the line).

An answer given up on is a count whose next count missed in the twin's runs, taken for
a scale-up but not for a scale-down. When the live fleet breaches at that count (the
twin was wrong there, or the load grew), the next search, on the same table, gives up
at the same count: read as "capacity suffices at the current count", it started a live
episode of configs at a count the twin itself called noise at the line, then a scale-up
of one replica into a count the twin's table misses, and the hourly trial budget then
held the fleet there, breaching, for hours (``steady_count.py``'s docstring named the
risk: "not tested through a cycle"). A breach at an answer given up on, or at a count
above it in the band the twin misses, is live evidence that the count misses: the loop
scales to the smallest count the twin holds above it, bounded by ``max_replicas``, says
why in the decision, and runs no live trial at a count the replicas are the remedy for.
A breach at a count the twin holds with its next count is the config's (a live episode),
not a replica bought for good at every alert. A scale-down on a search that gave up goes
only to the count above it that holds with its next, and never to a count that breached
live at the same load (no flapping); at a lighter load the replicas go back.

The controller runs on the fakes with a scripted clock (a tick every 15 s); the twin is
the real ``CapacityPlanner`` on a table of P0 TTFT shares per count, and the live fleet
breaches (its window over the SLO, a scale alert firing) at every count outside a set.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from slopilot.engine.sim.arrivals import Poisson
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.ports import SimulatorBusy
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from slopilot.tuner.study.objective import TrialResult
from tests.tuner.controller_fakes import (
    GOOD,
    TERMS,
    FakeDeployment,
    FakeEvaluator,
    FakeOffline,
    Rig,
    summary,
)

# The twin's table (P0 TTFT p99 as a share of its limit): 1-5 miss, 6-14 flip (even
# counts hold at 75 %, odd ones miss at 110 %), 15 and up hold at 70 %. The search gives
# up at 12 (6, 8 and 10 held while their next count missed), with or without headroom.
FLIPPY = {n: (1.3 if n < 6 else (0.75 if n % 2 == 0 else 1.1) if n < 15 else 0.7)
          for n in range(1, 65)}
# The same band six replicas up: the load the twin measures after it grew.
GROWN = {n: FLIPPY.get(n - 6, 1.3) if n > 6 else 1.3 for n in range(1, 65)}


@dataclass
class Twin:
    """The real capacity search on ``table``, which a test may swap (the load grew)."""

    table: dict[int, float]
    runs: list[int] = field(default_factory=list)
    busy_above: int | None = None
    """Counts above this are refused as the simulator's workers are busy."""

    def planner(self) -> CapacityPlanner:
        def score_fn(scenario: Scenario, config: Mapping[str, Any], n: int) -> TrialResult:
            if self.busy_above is not None and n > self.busy_above:
                raise SimulatorBusy(f"no worker free for {n} replicas")
            self.runs.append(n)
            share = self.table[n]
            return TrialResult(dict(config), 100.0, (share - 1, -0.5, -0.5, -0.5, -0.9),
                               share <= 1, constraint_names=TERMS)
        return CapacityPlanner(score_fn=score_fn)


@dataclass
class Live:
    """The fleet as served: it holds the SLO at the counts in ``holds`` and breaches at
    every other (the window's P0 TTFT over its limit, the alert that scales firing),
    whatever config it runs: replicas are the remedy here, not knobs."""

    dep: FakeDeployment
    holds: set[int]

    def firing(self) -> list[Alert]:
        if self.dep.n in self.holds:
            return []
        return [Alert(name="SlopilotTTFTP99High", action=AlertAction.SCALE,
                      severity="warning", priority_class="p0", since=0.0)]

    def figures(self, config: Mapping[str, Any]) -> WindowSummary:
        return summary() if self.dep.n in self.holds else summary(p0_ttft=400.0)


def rig(twin: Twin, holds: set[int], *, replicas: int = 4, max_replicas: int = 64,
        offline: FakeOffline | None = None, **settings: Any) -> tuple[Rig, Live, Controller]:
    dep = FakeDeployment(n=replicas)
    live = Live(dep, holds)
    r = Rig(dep=dep, planner=twin.planner(), alerts=live,  # type: ignore[arg-type]
            offline=offline, settings={"max_replicas": max_replicas, **settings})
    r.ev = FakeEvaluator(dep, live.figures)
    return r, live, r.build()


def rate_of(scenario: Scenario) -> float:
    return scenario.workload.phases[-1].arrivals.mean_rate  # type: ignore[union-attr]


def with_rate(scenario: Scenario, rate: float) -> Scenario:
    *before, last = scenario.workload.phases  # type: ignore[union-attr]
    phase = dataclasses.replace(last, arrivals=Poisson(rate=rate))
    return dataclasses.replace(scenario, workload=dataclasses.replace(
        scenario.workload, phases=(*before, phase)))  # type: ignore[arg-type]


def run(ctl: Controller, start: int, seconds: int) -> list[Decision]:
    return [ctl.tick(float(t)) for t in range(start, start + seconds, 15)]


def acted(decisions: list[Decision]) -> list[str]:
    return [d.line() for d in decisions if d.action is not Action.NONE]


def scale_ups(decisions: list[Decision]) -> list[str]:
    return [d.reason for d in decisions
            if d.action is Action.SCALE and d.reason.startswith("scale_up")]


def test_a_breach_at_the_count_given_up_on_scales_above_it_and_stays() -> None:
    # The twin is wrong at 12: live, 12 breaches and 14 and up hold. The breach at 12
    # buys 14, the smallest count the twin holds above 12 (13 misses there), with no
    # live trial of configs at 12; and 14 is kept for the hour after (no scale-down on
    # an answer given up on, so no flapping back to 12).
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(14, 65)))
    decisions = run(ctl, 0, 3600)
    lines = acted(decisions)
    assert r.dep.scaled == [12, 14], lines
    assert r.dep.applied == [], lines  # no trial: the alert asks for replicas
    up = scale_ups(decisions)
    assert up[0].startswith("scale_up 4->12"), up
    # The move says why: the search gave up at 12, and 12 breached live.
    assert up[1].startswith("scale_up 12->14"), up
    assert "gave up at 12" in up[1] and "12 breach" in up[1], up[1]
    assert 64 not in twin.runs, twin.runs


def test_a_breach_in_the_band_at_a_count_the_twin_misses_buys_its_next_holding_count(
) -> None:
    # The fleet serves 13, above the count the twin gave up at (12), and breaches: the
    # twin misses 13 too, so the count lies in the band where holding flips, and the
    # twin's answer from it (14, with 15 holding) is bought, no live trial at 13.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(14, 65)), replicas=13)
    decisions = run(ctl, 0, 1800)
    lines = acted(decisions)
    assert r.dep.scaled == [14], lines
    assert r.dep.applied == [], lines
    up = scale_ups(decisions)[0]
    assert "gave up at 12" in up and "13 breaches live, a count the twin misses" in up, up


def test_a_breach_above_the_band_is_the_configs_to_answer_not_the_count_given_up_on(
) -> None:
    # The twin is wrong up to 16 (it holds 14 and 15 and up; live, 17 and up). The breach
    # at 12 buys 14, as above. 14 the twin holds with its next count: a breach there is
    # no evidence against 12, and a live episode of configs at 14 (capacity_suffices)
    # answers it; finding none, it buys one replica on that live evidence. (Before, each
    # breach above 12 bought the twin's next count on the give-up rule, with no trial:
    # a rule that, at counts the twin holds cleanly, bought a replica for good at every
    # alert.)
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(17, 65)))
    decisions = run(ctl, 0, 3600)
    lines = acted(decisions)
    assert r.dep.scaled[:3] == [12, 14, 15], lines
    assert 64 not in twin.runs, twin.runs
    assert any("capacity_suffices at 14 replica(s); the twin's search gave up at 12" in line
               and "14, above it, breaches live and the twin holds it" in line
               for line in lines), lines
    trials = {d.replicas for d in decisions if d.action is Action.TRIAL}
    assert 12 not in trials and 14 in trials, trials
    up = scale_ups(decisions)
    assert "12 breaches live" in up[1] and "no_feasible_config" in up[2], up


def test_with_an_offline_study_that_finds_no_config_the_breach_skips_the_twins_miss(
) -> None:
    # The offline study says no config holds at 12: at least 13, which the twin's own
    # runs miss. The count bought is the twin's smallest holding above 12, not 12 + 1.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(14, 65)),
                    offline=FakeOffline(ranked=[(dict(GOOD), False)]))
    decisions = run(ctl, 0, 1800)
    assert r.dep.scaled == [12, 14], acted(decisions)


def test_after_the_load_grew_a_breach_at_the_new_answer_given_up_on_goes_above_it() -> None:
    # 12 served the first load. The load grows: the twin's band moves six counts up and
    # its search gives up at 20 (12, 16 and 18 held while their next count missed, 19
    # the largest miss); live, 20 and 21 breach too and 22 and up hold.
    twin = Twin(FLIPPY)
    r, live, ctl = rig(twin, set(range(12, 65)))
    first = run(ctl, 0, 600)
    assert r.dep.scaled == [12], acted(first)
    twin.table, live.holds = GROWN, set(range(22, 65))
    later = run(ctl, 600, 3000)
    lines = acted(later)
    assert r.dep.scaled == [12, 20, 21, 22], lines
    # 21 the twin holds with its next count: the breach there is tuned for first (no
    # live trial at 20, the count given up on, nor at 12).
    trials = {d.replicas for d in later if d.action is Action.TRIAL}
    assert trials == {21}, trials
    up = scale_ups(later)
    assert up[0].startswith("scale_up 12->20") and "gave up" not in up[0], up
    assert "gave up at 20" in up[1] and "20 breach" in up[1], up
    assert "gave up at 20" in up[2] and "21 breach" in up[2], up
    assert "no_feasible_config" in up[2], up


def test_at_max_replicas_a_breach_at_an_answer_given_up_on_is_bounded_by_the_max() -> None:
    # Live, no count up to the maximum (14) holds. The breach at 12 buys 14, the
    # maximum; there the replicas are spent, and the loop neither scales past it nor
    # back down to the count given up on.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(), max_replicas=14)
    decisions = run(ctl, 0, 3600)
    lines = acted(decisions)
    assert r.dep.scaled == [12, 14], lines
    assert all(n <= 14 for n in twin.runs), twin.runs
    # At the maximum a live episode of configs is the remedy left, and it says so: not
    # "capacity suffices" on a count the twin gave up on.
    assert not any("capacity_suffices" in line for line in lines), lines
    episodes = [d.reason.split("retune: ", 1)[1] for d in decisions
                if "retune: " in d.reason]
    assert episodes, lines
    assert all(e.startswith("max_replicas 14 reached and 14 breaches; the twin's search "
                            "gave up at 12") for e in episodes), episodes


def test_a_twin_busy_above_the_count_given_up_on_still_buys_one_replica_above_it() -> None:
    # The search above 12 gets no answer: the alert's one replica, said as such.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(13, 65)))
    first = run(ctl, 0, 30)
    assert r.dep.scaled == [12], acted(first)
    twin.busy_above = 12
    later = run(ctl, 30, 1800)
    assert r.dep.scaled == [12, 13], acted(later)
    up = scale_ups(later)[0]
    assert up.startswith("scale_up 12->13: twin_busy") and "gave up at 12" in up, up


# A lighter load: the band moves down (3-11 flip), 12 and up hold. The search still
# gives up (at 10: 4, 6 and 8 held while their next count missed).
LIGHTER = {n: (1.3 if n < 3 else (0.75 if n % 2 == 0 else 1.1) if n < 12 else 0.7)
           for n in range(1, 65)}


@pytest.mark.parametrize("burst_s", [15, 60])
def test_bursts_at_a_count_the_twin_holds_cleanly_buy_no_replica(burst_s: int) -> None:
    # The twin gives up at 12 and holds 15 and up, each with its next count; the fleet
    # serves 15. Six bursts, each an alert firing at the count serving for a minute (or
    # one tick), then a quiet half hour. A breach at a count the twin holds cleanly is
    # no evidence against the count it gave up at, far below: each is the config's to
    # answer (capacity_suffices), not a replica bought for good. It bought 16, 17, ...
    # 21, one per burst, and the lighter load after kept all of them.
    twin = Twin(FLIPPY)
    r, live, ctl = rig(twin, set(range(12, 65)), replicas=15)
    decisions, t = run(ctl, 0, 900), 900
    for _ in range(6):
        live.holds = set(range(12, 65)) - {r.dep.n}
        decisions += run(ctl, t, burst_s)
        t += burst_s
        live.holds = set(range(1, 65))
        decisions += run(ctl, t, 1800)
        t += 1800
    lines = acted(decisions)
    assert scale_ups(decisions) == [], lines
    suffices = [line for line in lines if "capacity_suffices at 1" in line]
    assert suffices and all("above it, breaches live and the twin holds it" in line
                            for line in suffices), lines
    # The quiet fleet may go to 14, which the twin holds with its next count (with the
    # scale-down's headroom), never lower: 13, the count above the one given up on,
    # misses in its runs.
    assert set(r.dep.scaled) <= {14}, lines
    twin.table = LIGHTER
    later = run(ctl, t, 7200)
    assert scale_ups(later) == [], acted(later)
    assert r.dep.n <= 15, acted(later)


def test_a_lighter_load_gives_back_the_replicas_the_give_up_rule_bought() -> None:
    # The breach at 12 bought 14 on the give-up rule. The load then falls to a quarter
    # (past the probe's noise on the rig's 10 s windows): the twin's
    # search from the minimum still gives up (at 10: the band moved down), but above it
    # 12 holds with its next count, with the scale-down's headroom, and no live breach
    # at this load says otherwise: the quiet fleet goes back to 12 and stays. (Before, a
    # search that gave up was never read for a scale-down, and the 14 were kept for good.)
    twin = Twin(FLIPPY)
    r, live, ctl = rig(twin, set(range(14, 65)))
    first = run(ctl, 0, 1800)
    assert r.dep.scaled == [12, 14], acted(first)
    twin.table, live.holds = LIGHTER, set(range(12, 65))
    r.probe.scenario = with_rate(r.probe.scenario, rate_of(r.probe.scenario) / 4)
    later = run(ctl, 1800, 2 * 3600)
    lines = acted(later)
    assert r.dep.scaled == [12, 14, 12], lines
    down = [d.reason for d in later if d.reason.startswith("scale_down")]
    assert len(down) == 1 and down[0].startswith("scale_down 14->12"), down
    assert "gave up at 10" in down[0], down[0]


def test_at_the_load_a_count_breached_at_the_scale_down_stays_above_it() -> None:
    # As the load grew (the test above it): 20 and 21 breached live at this load, and
    # the twin, giving up at 20, holds 20 and 21 with their next counts. The quiet fleet
    # of 22 is not cut to either: the live breach at this load outweighs the twin there.
    twin = Twin(FLIPPY)
    r, live, ctl = rig(twin, set(range(12, 65)))
    run(ctl, 0, 600)
    twin.table, live.holds = GROWN, set(range(22, 65))
    later = run(ctl, 600, 4 * 3600)
    assert r.dep.scaled == [12, 20, 21, 22], acted(later)


def test_episodes_cut_by_the_hours_budget_add_up_to_a_replica_bought() -> None:
    # The twin holds 15 cleanly; live, 15 breaches and 16 and up hold. The hour allows
    # 4 trials, an episode 6. Each episode at 15 (capacity_suffices) is cut by the
    # hour's budget, and a cut episode buys no replica: the fleet sat breaching at 15
    # for hours, episode after episode. Their measured misses at the same count, load,
    # spec and config add up: at 6 (max_trials) nothing held, as one whole episode
    # would have said, and a replica is bought on that live evidence.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(16, 65)), replicas=15, max_trials=6,
                    max_trials_per_hour=4)
    decisions = run(ctl, 0, 3 * 3600)
    lines = acted(decisions)
    assert r.dep.scaled[:1] == [16], lines
    up = scale_ups(decisions)
    found = re.search(r"no_feasible_config after (\d+) measured trials at 15 replica\(s\) "
                      r"across episodes cut by the hour's budget", up[0])
    assert found is not None and int(found.group(1)) >= 6, up
    # Each cut episode before it still held the starting config, no replica bought.
    cut = [line for line in lines
           if line.startswith("state=cooldown") and "trial_rate_limit" in line]
    assert len(cut) >= 2, lines
    assert all("measured misses at this count and load" in line for line in cut), lines
    trials = [d for d in decisions if d.action is Action.TRIAL]
    assert {d.replicas for d in trials} == {15}, lines
    assert len(trials) == int(found.group(1)), lines
    # 16 holds: no alert, no episode, no more replicas.
    assert r.dep.scaled == [16], lines


def test_a_cut_episode_still_buys_no_replica_while_its_misses_are_below_max_trials() -> None:
    # As above, but the budget's misses add up to fewer than max_trials (12) within the
    # first hours: every cut episode holds the starting config, and no replica is bought.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(16, 65)), replicas=15, max_trials=12,
                    max_trials_per_hour=4)
    decisions = run(ctl, 0, 3600 + 1800)
    lines = acted(decisions)
    assert r.dep.scaled == [], lines
    assert any(line.startswith("state=cooldown") and "trial_rate_limit" in line
               for line in lines), lines


def test_a_load_that_moved_starts_the_cut_episodes_count_again() -> None:
    # The first cut episode's 4 misses are kept with the load they were measured at. The
    # load then falls to a quarter (the twin still holds 15, live 15 still breaches): the
    # misses were evidence for their own load only, and the next cut episode counts from
    # its own trials, not from 4.
    twin = Twin(FLIPPY)
    r, _, ctl = rig(twin, set(range(16, 65)), replicas=15, max_trials=6,
                    max_trials_per_hour=4)
    first = run(ctl, 0, 1800)
    kept = ctl.loop.missed_trials
    assert kept is not None and kept["trials"] == 4, acted(first)
    r.probe.scenario = with_rate(r.probe.scenario, rate_of(r.probe.scenario) / 4)
    later = run(ctl, 1800, 3600)
    cut = [re.search(r"none of this episode's (\d+) held; (\d+) of 6 measured misses", line)
           for line in acted(later)
           if line.startswith("state=cooldown") and "trial_rate_limit" in line]
    assert cut and cut[0] is not None, acted(later)
    assert cut[0].group(1) == cut[0].group(2), acted(later)
    assert r.dep.scaled == [], acted(later)
