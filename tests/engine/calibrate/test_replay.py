"""The fidelity machinery: a 'real' engine whose executor takes exactly the profile's
time agrees with the twin, so every error is zero; a slower one shows up as error."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from slopilot.engine.calibrate.compare import (
    ClassFigures,
    bootstrap_intervals,
    compare,
    repeat_noise,
    sensitivity,
)
from slopilot.engine.calibrate.replay import Iteration, Recorder, replay_real, replay_sim
from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import Priority
from slopilot.engine.sim.calibrated import CalibratedCostModel
from slopilot.engine.sim.correction import rescaled
from slopilot.engine.sim.scenario import parse_scenario
from slopilot.engine.sim.shape import IterationShape, shape_of
from slopilot.engine.sim.twin import with_profile
from slopilot.engine.sim.workload import RequestSpec
from slopilot.engine.window_summary import WindowSummary
from tests.support.profiles import make_profile


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class ProfileExecutor:
    """Spends (on the fake clock) what the cost model predicts, times ``slowdown``."""

    def __init__(self, cost: CalibratedCostModel, clock: FakeTime, slowdown: float = 1.0
                 ) -> None:
        self.cost, self.clock, self.slowdown = cost, clock, slowdown

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        dt = self.cost.executor_time(shape_of(out)) * self.slowdown
        self.clock.t += dt
        return ModelRunnerOutput({s.request_id: 50 for s in out.seqs if s.sample}, dt)


def _specs() -> list[RequestSpec]:
    classes = (Priority.P0, Priority.P1, Priority.P1, Priority.P2)
    return [RequestSpec(arrival_time=0.05 * i + 0.013 * (i % 3),
                        prompt_token_ids=[11 + (i * 7 + j) % 200 for j in range(20 + 9 * (i % 5))],
                        max_tokens=4 + i % 6, priority=classes[i % 4]) for i in range(24)]


def _run(slowdown: float, specs: list[RequestSpec] | None = None,
         summaries: list[WindowSummary] | None = None, **knobs: Any
         ) -> tuple[Any, Recorder, Recorder]:
    """The report of ``specs`` (``_specs()`` by default) through both; the twin's
    summary appended to ``summaries`` where given."""
    profile = make_profile("tiny-random", device="cpu", host={}, kv_gib=0.01)
    cost = CalibratedCostModel(profile)
    config = EngineConfig(token_budget=128, budget_align=1, chunk_size=64, max_num_seqs=8,
                          swap_space_gb=0.01).with_overrides(knobs)
    scenario = with_profile(parse_scenario({
        "name": "t", "gpu": "x", "model": "tiny-random", "duration_s": 10,
        "workload": {"type": "open_loop", "prompt_tokens": 8, "output_tokens": 2,
                     "arrivals": {"process": "poisson", "rate": 1}}}), profile)
    clock = FakeTime()
    real, sim = Recorder(), Recorder()
    engine = LLMEngine(config, ProfileExecutor(cost, clock, slowdown),
                       cost.num_kv_blocks(16), cost.num_cpu_blocks(16, config.swap_space_gb),
                       clock=WallClock(clock.now), observers=[real])
    specs = specs or _specs()
    run = replay_real(engine, specs, real, clock=clock.now, sleep=clock.sleep)
    summary = replay_sim(scenario, config, specs, sim)
    if summaries is not None:
        summaries.append(summary)
    report = compare("test", 20.0, real, sim, cost, first_arrival_real=run.t0,
                     real_span_s=run.wall_s, sim_span_s=max(sim.finished.values()))
    return report, real, sim


def test_an_executor_that_is_the_profile_matches_the_twin_exactly() -> None:
    report, real, sim = _run(1.0)
    assert len(real.ttft) == len(sim.ttft) == 24 and real.rejected == sim.rejected == 0
    assert set(report.classes) == {"p0", "p1", "p2"}
    assert report.worst_error() == pytest.approx(0.0, abs=1e-9)
    assert report.iterations.mape == pytest.approx(0.0, abs=1e-9)
    assert report.throughput[0] == pytest.approx(report.throughput[1], rel=1e-9)
    assert [it.shape for it in real.iterations] == [it.shape for it in sim.iterations]
    # The features kept per iteration give back its prediction (a later profile's too).
    cost = CalibratedCostModel(make_profile("tiny-random", device="cpu", host={}, kv_gib=0.01))
    assert len(report.shapes) == len(report.points)
    assert [cost.shape_time(IterationShape(*v)) for v in report.shapes] == \
        pytest.approx([p for _, p, _ in report.points])


def test_the_engine_and_the_twin_turn_away_the_same_requests_from_a_full_queue() -> None:
    """A queue of 3 filled by a P2 burst, then P0s and more P2s: both sides displace the
    newest P2 not yet started for each P0 (no P0 is refused) and refuse the late P2s
    alike, counted in the same classes, and run the same iterations."""
    specs = [RequestSpec(arrival_time=0.001 * i, prompt_token_ids=[11 + i] * 24,
                         max_tokens=40, priority=Priority.P2) for i in range(8)]
    specs += [RequestSpec(arrival_time=0.02 + 0.001 * i, prompt_token_ids=[61 + i] * 16,
                          max_tokens=3, priority=p)
              for i, p in enumerate([Priority.P0, Priority.P2, Priority.P0, Priority.P2])]
    summaries: list[WindowSummary] = []
    _, real, sim = _run(1.0, specs, summaries, max_num_seqs=2, max_waiting=3)
    summary = summaries[0]
    assert summary.run is not None
    offered = Counter(int(s.priority) for s in specs)
    served_real, served_sim = Counter(real.priority.values()), Counter(sim.priority.values())
    assert served_real == served_sim
    refused_real = {p: offered[p] - served_real[p] for p in offered}
    assert refused_real == {p: summary.classes[Priority(p)].requests_refused for p in offered}
    assert refused_real[Priority.P0] == 0 and refused_real[Priority.P2] > 2
    assert real.rejected == summary.run.rejected == sum(refused_real.values())
    assert [it.shape for it in real.iterations] == [it.shape for it in sim.iterations]


def test_a_slower_executor_shows_as_error_in_iterations_and_latency() -> None:
    report, _, _ = _run(1.25)
    assert report.iterations.mape == pytest.approx(0.2, rel=1e-6)  # 1 - 1 / 1.25
    assert report.iterations.executor_mape == pytest.approx(0.2, rel=1e-6)
    assert report.worst_error() > 0.1
    assert report.throughput[0] < report.throughput[1]


def test_arrivals_are_stamped_with_their_own_time_not_the_drivers() -> None:
    report, real, _ = _run(1.0)
    # Every TTFT is at least one iteration: a request waits for the pass it joins.
    assert min(real.ttft.values()) > 0
    assert dataclasses.is_dataclass(report)


def _iteration(step_s: float, decodes: int = 1, context: int = 100) -> Iteration:
    shape = IterationShape(iteration=1, tokens=decodes, sampled=decodes, decode_seqs=decodes,
                           decode_batches=1, decode_context=context * decodes,
                           decode_padded_context=context * decodes)
    return Iteration(0.0, step_s, step_s, shape, 0)


def test_repeat_noise_is_the_spread_of_alike_iterations_around_their_median() -> None:
    # Five alike decodes 0.9, 1, 1, 1, 1.2 s: median 1, |t - m| / t = 1/9, 0, 0, 0, 1/6.
    alike = [_iteration(t, context=100 + i) for i, t in enumerate((0.9, 1.0, 1.0, 1.0, 1.2))]
    floor, n = repeat_noise(alike)
    assert n == 5 and floor == pytest.approx((1 / 9 + 1 / 6) / 5)
    # Shapes with fewer than five alike, or another batch, do not count.
    others = [_iteration(3.0, decodes=4), _iteration(9.0, decodes=4),
              _iteration(1.0, context=5000)]
    assert repeat_noise([*alike, *others]) == (floor, 5)
    assert repeat_noise(others) == (None, 0)


def test_the_report_carries_the_noise_of_the_real_runs_alike_iterations() -> None:
    report, real, _ = _run(1.0)
    # The executor takes exactly the profile's time: alike shapes differ only by the
    # context read within one bucket.
    assert report.iterations.noise_count > 0
    assert report.iterations.noise_floor is not None and report.iterations.noise_floor < 0.005
    assert (report.iterations.noise_floor, report.iterations.noise_count) == \
        repeat_noise(real.iterations)


def _recorder(ttfts: list[float]) -> Recorder:
    rec = Recorder()
    for i, t in enumerate(ttfts):
        rec.ttft[f"r{i}"], rec.priority[f"r{i}"] = t, int(Priority.P1)
        rec.gaps[f"r{i}"] = [0.01 * (1 + i % 3)] * 5
    return rec


def test_bootstrap_intervals_bracket_each_figure_and_are_seeded() -> None:
    rec = _recorder([float(t) for t in range(1, 31)])
    iv = bootstrap_intervals(rec, int(Priority.P1))
    lo, hi = iv["ttft_p50"]
    assert 1 < lo < 15.5 < hi < 30  # around the median, far inside the range
    assert iv["tbt_p50"][0] <= 0.02 <= iv["tbt_p50"][1]
    assert bootstrap_intervals(rec, int(Priority.P1)) == iv
    assert bootstrap_intervals(rec, int(Priority.P0)) == {}  # no such requests
    assert bootstrap_intervals(_recorder([1.0]), int(Priority.P1)) == {}


def test_a_prediction_inside_the_measurements_interval_is_flagged() -> None:
    fig = ClassFigures(30, {"ttft_p50": 15.5, "ttft_p99": 29.7}, {"ttft_p50": 16.0,
                       "ttft_p99": 40.0}, {"ttft_p50": (12.0, 19.0), "ttft_p99": (27.0, 30.0)})
    assert fig.within_interval() == {"ttft_p50": True, "ttft_p99": False}


def test_the_report_carries_an_interval_per_measured_figure() -> None:
    report, _, _ = _run(1.25)
    for c in report.classes.values():
        assert set(c.measured_interval) == set(c.measured)
        for k, (lo, hi) in c.measured_interval.items():
            assert lo <= c.measured[k] <= hi


def _real_run(slowdown: float, clock: FakeTime) -> tuple[Recorder, object]:
    profile = make_profile("tiny-random", device="cpu", host={}, kv_gib=0.01)
    cost = CalibratedCostModel(profile)
    config = EngineConfig(token_budget=128, budget_align=1, chunk_size=64, max_num_seqs=8,
                          swap_space_gb=0.01)
    real = Recorder()
    engine = LLMEngine(config, ProfileExecutor(cost, clock, slowdown),
                       cost.num_kv_blocks(16), cost.num_cpu_blocks(16, config.swap_space_gb),
                       clock=WallClock(clock.now), observers=[real])
    return real, replay_real(engine, _specs(), real, clock=clock.now, sleep=clock.sleep)


@pytest.mark.parametrize("slowdown", [1.0, 1.25])
def test_a_second_real_run_is_compared_as_a_twin_would_be(slowdown: float) -> None:
    """The engine's own repeatability: the same requests served twice, later on the
    same clock; the second run's figures against the first's."""
    clock = FakeTime()
    first, run1 = _real_run(1.0, clock)
    second, run2 = _real_run(slowdown, clock)
    assert run2.t0 > run1.t0 + run1.wall_s  # served after the first, on the wall clock
    cost = CalibratedCostModel(make_profile("tiny-random", device="cpu", host={},
                                            kv_gib=0.01))
    report = compare("repeat", 20.0, first, second, cost, first_arrival_real=run1.t0,
                     real_span_s=run1.wall_s, sim_span_s=run2.wall_s,
                     first_arrival_sim=run2.t0)
    if slowdown == 1.0:
        assert report.worst_error() == pytest.approx(0.0, abs=1e-9)
        assert report.throughput[1] == pytest.approx(report.throughput[0], rel=1e-9)
    else:
        assert report.worst_error() > 0.1
        assert report.throughput[1] < report.throughput[0]


def test_sensitivity_is_the_largest_move_of_any_moved_run() -> None:
    base = _recorder([float(t) for t in range(1, 31)])
    slower = _recorder([1.1 * t for t in range(1, 31)])
    faster = _recorder([0.95 * t for t in range(1, 31)])
    moves = sensitivity(base, [slower, faster])
    assert set(moves) == {"p1"}
    assert moves["p1"]["ttft_p50"] == pytest.approx(0.1)
    assert moves["p1"]["ttft_p99"] == pytest.approx(0.1)
    assert moves["p1"]["tbt_p50"] == pytest.approx(0.0)  # the gaps did not move
    assert sensitivity(base, [base])["p1"] == dict.fromkeys(moves["p1"], 0.0)
    gone = Recorder()  # the class lost every request: moved without bound
    assert sensitivity(base, [gone])["p1"]["ttft_p50"] == float("inf")
    fig = ClassFigures(30, {"ttft_p50": 1.0, "tbt_p50": 1.0}, {"ttft_p50": 1.5,
                       "tbt_p50": 1.05}, sensitivity={"ttft_p50": 0.4, "tbt_p50": 0.02})
    assert fig.sensitive(0.1) == {"ttft_p50"}


def _loaded_sensitivity(spacing_s: float) -> float:
    """The twin's largest TTFT move with every iteration 2 % slower or faster."""
    profile = make_profile("tiny-random", device="cpu", host={}, kv_gib=0.01)
    config = EngineConfig(token_budget=128, budget_align=1, chunk_size=64, max_num_seqs=8,
                          swap_space_gb=0.01)
    base = parse_scenario({
        "name": "t", "gpu": "x", "model": "tiny-random", "duration_s": 10,
        "workload": {"type": "open_loop", "prompt_tokens": 8, "output_tokens": 2,
                     "arrivals": {"process": "poisson", "rate": 1}}})
    specs = [dataclasses.replace(s, arrival_time=i * spacing_s)
             for i, s in enumerate(_specs() * 4)]
    runs = []
    for factor in (1.0, 1.02, 0.98):
        rec = Recorder()
        replay_sim(with_profile(base, rescaled(profile, factor)), config, specs, rec)
        runs.append(rec)
    return max(v for c in sensitivity(runs[0], runs[1:]).values()
               for k, v in c.items() if k.startswith("ttft"))


def test_a_queue_near_saturation_amplifies_a_small_cost_error() -> None:
    # Spaced out, a request's TTFT is its own prefill: it moves as the iterations do.
    # Arriving about as fast as they are served, waits pile up on each other: the same
    # 2 % moves some TTFT percentile by 5x as much. (All at once, the whole timeline
    # scales and nothing is amplified.)
    light, loaded = _loaded_sensitivity(10.0), _loaded_sensitivity(0.02)
    assert light == pytest.approx(0.02, rel=0.05)
    assert _loaded_sensitivity(0.0) == pytest.approx(0.02, rel=0.05)
    assert loaded > 5 * light
