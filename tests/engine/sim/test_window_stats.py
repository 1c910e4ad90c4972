"""``SlidingStats``: each sliding window of one run measured as that window alone is."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slopilot.engine.request import Priority, Request, SamplingParams
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.window_stats import Sliding, SlidingStats
from slopilot.engine.sim.window_sweep import gap_windows
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.tuner.study.objective import holds, score


def test_starts_tile_every_hop_and_end_on_the_span() -> None:
    assert Sliding(10.0, 5.0).starts(0.0, 32.0) == [0.0, 5.0, 10.0, 15.0, 20.0, 22.0]
    assert Sliding(10.0, 5.0).starts(0.0, 30.0) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert Sliding(10.0, 5.0).starts(0.0, 8.0) == [0.0]


@pytest.mark.parametrize("field", ["length_s", "hop_s"])
def test_a_window_of_no_seconds_is_refused_by_name(field: str) -> None:
    kwargs = {"length_s": 10.0, "hop_s": 5.0, field: 0.0}
    with pytest.raises(ValueError, match=field):
        Sliding(**kwargs)


def test_each_window_reads_what_a_run_measuring_only_it_reads() -> None:
    scenario = load_scenario("mixed-priority")
    whole = Measure(0.0, 30.0, 40.0)
    run = simulate(scenario, replicas=1, measure=whole, sliding=Sliding(12.0, 6.0))
    assert [(w.start_s, w.end_s) for w in run.windows] == [
        (0.0, 12.0), (6.0, 18.0), (12.0, 24.0), (18.0, 30.0)]
    for w in run.windows:
        alone = simulate(scenario, replicas=1, measure=Measure(w.start_s, w.end_s, 40.0))
        assert w.summary.to_dict()["requests_arrived"] > 0
        assert w.summary.to_dict() == alone.summary.to_dict()
    plain = simulate(scenario, replicas=1, measure=whole)
    assert run.summary.to_dict() == plain.summary.to_dict()


def test_starts_at_given_points_beside_or_instead_of_the_grid() -> None:
    assert Sliding(10.0, 5.0, at=(7.0, 40.0)).starts(0.0, 30.0) == [
        0.0, 5.0, 7.0, 10.0, 15.0, 20.0]
    assert Sliding(10.0, None, at=(7.0, 3.0)).starts(0.0, 30.0) == [3.0, 7.0]
    with pytest.raises(ValueError, match="hop_s"):
        Sliding(10.0, None)


def _arrival(stats: SlidingStats, rid: str, t: float) -> None:
    stats.on_arrival(Request(rid, [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=t))


def test_windows_are_made_where_the_run_has_requests_not_over_its_span() -> None:
    # Two requests 2e6 s apart (a stray time's span): the dense grid was 199,998
    # SimStats, ~466 MB before any request; the windows that hold an arrival are 6.
    slo = SLOSpec.from_profile("standard")
    stats = SlidingStats(slo, 2e6, Sliding(30.0, 10.0))
    assert stats.made == 0
    _arrival(stats, "a", 5.0)
    _arrival(stats, "b", 1_000_005.0)
    assert stats.made == 1 + 3  # [0, 30), and the three windows that hold 1,000,005
    assert [w.start_s for w in stats.windows()] == [0.0, 999_980.0, 999_990.0, 1_000_000.0]
    assert [w.summary.to_dict()["requests_arrived"] for w in stats.windows()] == [1] * 4


def test_a_quiet_stretch_makes_no_window_and_the_busy_ones_read_as_before() -> None:
    # The grid's windows with an arrival or a step, each as the dense grid measured it
    # (each window as a run of it alone reads, above); the quiet ones are not made.
    scenario = load_scenario("mixed-priority")
    whole = Measure(0.0, 30.0, 40.0)
    run = simulate(scenario, replicas=1, measure=whole, sliding=Sliding(6.0, 2.0))
    grid = Sliding(6.0, 2.0).starts(0.0, 30.0)
    made = [w.start_s for w in run.windows]
    assert made == grid  # a busy run: every window of the grid is made
    for w in run.windows[::5]:
        alone = simulate(scenario, replicas=1, measure=Measure(w.start_s, w.end_s, 40.0))
        assert w.summary.to_dict() == alone.summary.to_dict()


def test_the_tbt_sweep_counts_each_window_as_its_own_measurement_does() -> None:
    # The gaps of the requests arriving in a window, the horizon's cut included: a
    # window from an arrival, and one ending just before one, read as measured in full.
    scenario = load_scenario("mixed-priority")
    whole = Measure(2.0, 20.0, 24.0)
    run = simulate(scenario, replicas=1, measure=whole, sliding=Sliding(6.0, 2.0))
    stats = run.stats
    assert isinstance(stats, SlidingStats)
    p1 = Priority.P1
    arrivals, _, _ = stats.token_gaps.series(p1)
    late = float(arrivals[arrivals > 12.0][0])
    starts = (float(arrivals[5]), late - 6.0, float(arrivals[-3]))
    again = simulate(scenario, replicas=1, measure=whole,
                     sliding=Sliding(6.0, 2.0, at=starts, tbt_margin=0.8))
    swept = again.stats
    assert isinstance(swept, SlidingStats)
    limit_s = swept.token_gaps.over_s[p1]
    assert limit_s == pytest.approx(scenario.slo.class_slo(p1).tbt_p99_ms * 0.2 / 1000)
    parts = {part.start_time: part for part in swept.parts}
    overs = 0
    for start in {*starts, *Sliding(6.0, 2.0).starts(2.0, 20.0)}:
        tbt = np.frombuffer(parts[start].classes[p1].tbt, dtype=np.float64)
        [w] = gap_windows(swept.token_gaps, p1, [start], 6.0, 20.0)
        assert (w.gaps, w.over) == (len(tbt), int((tbt > limit_s).sum())), start
        # And its verdict, the P99 against the limit, as the full measurement's.
        p99 = float(np.percentile(tbt, 99)) if len(tbt) else None
        assert w.misses == (p99 is not None and p99 > limit_s), start
        assert w.p99_s is None or w.p99_s == p99, start
        overs += w.over
    assert overs > 0, "the case needs gaps over the limit"


def _sweep_and_judge(target_ms: float, margin: float, gaps: list[float]
                     ) -> tuple[bool, bool]:
    # Three P1 requests in one 10 s window, each streaming ``gaps``: the TBT sweep's
    # verdict on the window (``GapWindow.misses``), and the verdict on the same window
    # measured in full, scored and judged with the headroom as the whole-trace check
    # judges it (``score``, ``holds``).
    slo = SLOSpec(ClassSLO(), ClassSLO(tbt_p99_ms=target_ms), ClassSLO())
    stats = SlidingStats(slo, 10.0, Sliding(10.0, 10.0, tbt_margin=margin))
    for i in range(3):
        req = Request(f"r{i}", [1], SamplingParams(max_tokens=len(gaps) + 1),
                      arrival_time=float(i))
        stats.on_arrival(req)
        stats.on_first_token(req, 0.01, float(i))
        for g in gaps:
            stats.on_token_gap(req, g, float(i))
    stats.close()
    [w] = gap_windows(stats.token_gaps, Priority.P1, [0.0], 10.0, 10.0)
    [figures] = stats.windows()
    judged = holds(score(figures.summary, slo), margin)
    return w.misses, not judged


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3])
@pytest.mark.parametrize("target_ms", [10.0, 20.0, 30.0, 50.0, 70.0, 100.0, 150.0, 200.0,
                                       300.0, 500.0])
def test_the_tbt_sweep_judges_a_p99_at_the_limit_as_the_verdict_does(
        target_ms: float, margin: float) -> None:
    # Every gap at the limit, as it may be spelled in seconds (and an ulp either side):
    # the sweep skipped the replay of a window its full measurement missed (10 ms, 10 %:
    # P99 9.0 ms, term -0.09999999999999998 > -0.1), where its limit was built apart
    # from the verdict's term. And the one-rank band: a P99 read between a gap at the
    # limit and one a few ulps over it.
    spellings = {target_ms * (1.0 - margin) / 1000.0, target_ms / 1000.0 * (1.0 - margin),
                 (target_ms - target_ms * margin) / 1000.0}
    cases: list[list[float]] = []
    for at in sorted(spellings):
        for g in (math.nextafter(at, 0.0), at, math.nextafter(at, math.inf)):
            cases.append([g] * 200)
            for ulps in (1, 50, 100, 300):
                over = g
                for _ in range(ulps):
                    over = math.nextafter(over, math.inf)
                # 989 small gaps, then g, then 10 over: numpy's P99 reads rank 989.01.
                cases.append([0.001] * 989 + [g] + [over] * 10)
    for gaps in cases:
        sweep, full = _sweep_and_judge(target_ms, margin, gaps)
        assert sweep == full, (target_ms, margin, gaps[989 if len(gaps) > 200 else 0])
