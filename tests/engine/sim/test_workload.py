"""Workload generators: seeded determinism, statistical shape, sessions, phase shifts."""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.arrivals import Gamma, OnOff, Poisson
from slopilot.engine.sim.distributions import Empirical, Fixed, LogNormal, Uniform
from slopilot.engine.sim.open_loop import OpenLoopPhase, OpenLoopWorkload
from slopilot.engine.sim.sessions import SessionPhase, SessionWorkload
from slopilot.engine.sim.workload import (
    RESERVED_TOKEN_IDS,
    ClassMix,
    RequestSpec,
    TokenSampler,
    Workload,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- distributions -------------------------------------------------------------------

def test_lognormal_mean_is_the_arithmetic_mean() -> None:
    draws = LogNormal(mean=300, sigma=0.8).floats(rng(), 100_000)
    assert draws.mean() == pytest.approx(300, rel=0.02)


def test_clipping_bounds_every_draw() -> None:
    draws = LogNormal(mean=300, sigma=1.5, min=50, max=1000).ints(rng(), 10_000)
    assert draws.min() == 50 and draws.max() == 1000


def test_uniform_ints_cover_both_ends_evenly() -> None:
    draws = Uniform(low=3, high=5).ints(rng(), 30_000)
    counts = np.bincount(draws)[3:]
    assert len(counts) == 3
    assert counts / counts.sum() == pytest.approx([1 / 3] * 3, abs=0.02)


def test_token_counts_are_at_least_one() -> None:
    assert Fixed(value=0).ints(rng(), 5).tolist() == [1] * 5


def test_empirical_follows_its_weights() -> None:
    draws = Empirical(values=(10, 20), weights=(3, 1)).ints(rng(), 40_000)
    assert (draws == 10).mean() == pytest.approx(0.75, abs=0.01)
    assert Empirical(values=(10, 20), weights=(3, 1)).nominal_mean == pytest.approx(12.5)


@pytest.mark.parametrize("make, match", [
    (lambda: LogNormal(mean=-1, sigma=0.5), "mean=-1"),
    (lambda: LogNormal(mean=10, sigma=9), "sigma=9"),
    (lambda: Uniform(low=10, high=5), "high=5"),
    (lambda: Fixed(value=1, min=10, max=5), "max=5"),
    (lambda: Empirical(values=()), "values is empty"),
    (lambda: Empirical(values=(1, 2), weights=(1,)), "one weight per value"),
])
def test_bad_distributions_say_what_is_wrong(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


# -- arrivals ------------------------------------------------------------------------

def test_poisson_rate() -> None:
    times = list(Poisson(rate=5).times(rng(), 0, 2000))
    assert len(times) / 2000 == pytest.approx(5, rel=0.03)
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 2000


def test_gamma_has_the_requested_burstiness() -> None:
    times = np.array(list(Gamma(rate=4, cv=3).times(rng(), 0, 20_000)))
    gaps = np.diff(times)
    assert 1 / gaps.mean() == pytest.approx(4, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3, rel=0.1)


def test_on_off_is_silent_when_off() -> None:
    process = OnOff(rate=10, on_s=2, off_s=8)
    times = np.array(list(process.times(rng(), 100, 1100)))
    assert np.all((times - 100) % 10 < 2)
    assert len(times) / 1000 == pytest.approx(process.mean_rate, rel=0.08)


def test_arrival_processes_refuse_bad_rates() -> None:
    with pytest.raises(ValueError, match="rate=0"):
        Poisson(rate=0)
    with pytest.raises(ValueError, match="cv=0"):
        Gamma(rate=1, cv=0)
    with pytest.raises(ValueError, match="off_s=0"):
        OnOff(rate=1, on_s=1, off_s=0)


# -- tokens, classes, specs ------------------------------------------------------------

def test_synthetic_tokens_avoid_reserved_ids_and_fit_the_vocab() -> None:
    ids = np.array(TokenSampler(vocab_size=50).sample(rng(), 50_000))
    assert ids.min() == RESERVED_TOKEN_IDS and ids.max() == 49


def test_token_sampler_refuses_a_vocab_inside_the_reserved_range() -> None:
    with pytest.raises(ValueError, match="vocab_size=10"):
        TokenSampler(vocab_size=10)


def test_class_mix_shares() -> None:
    mix = ClassMix((0.1, 0.6, 0.3))
    r = rng()
    draws = [mix.sample(r) for _ in range(20_000)]
    for p, share in mix.shares.items():
        assert draws.count(p) / len(draws) == pytest.approx(share, abs=0.015)
    with pytest.raises(ValueError, match="at least one must be positive"):
        ClassMix((0.0, 0.0, 0.0))


@pytest.mark.filterwarnings("error")  # numpy's "overflow encountered in reduce" too
def test_weights_as_large_as_a_float_holds_are_shares_as_any_others() -> None:
    """Each weight was checked finite, not their sum: 1e308 twice summed to inf, and the
    draw failed with numpy's "probabilities do not sum to 1", naming no field."""
    mix = ClassMix((1e308, 1e308, 0.0))
    assert mix.shares == {Priority.P0: 0.5, Priority.P1: 0.5, Priority.P2: 0.0}
    r = rng()
    draws = {mix.sample(r) for _ in range(50)}
    assert draws == {Priority.P0, Priority.P1}
    empirical = Empirical(values=(1.0, 2.0), weights=(1.7e308, 1.7e308))
    assert set(empirical.floats(rng(), 50).tolist()) == {1.0, 2.0}
    assert empirical.nominal_mean == 1.5


def test_ordinary_weights_keep_their_exact_shares() -> None:
    # Scaled only where the sum overflows: a seeded run draws what it drew before.
    assert ClassMix((0.1, 0.7, 0.2)).shares[Priority.P1] == 0.7 / (0.1 + 0.7 + 0.2)


def test_request_spec_refuses_empty_prompts_and_zero_outputs() -> None:
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        RequestSpec(arrival_time=0.0, prompt_token_ids=[], max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens=0"):
        RequestSpec(arrival_time=0.0, prompt_token_ids=[11], max_tokens=0)


# -- open loop ---------------------------------------------------------------------------

def open_loop(seed: int = 0, **kw: object) -> OpenLoopWorkload:
    phase = OpenLoopPhase(arrivals=Poisson(rate=20), prompt_tokens=Uniform(low=10, high=50),
                          output_tokens=Fixed(value=8), classes=ClassMix((0.2, 0.5, 0.3)))
    phases = kw.pop("phases", [phase])
    return OpenLoopWorkload(phases, duration_s=100, seed=seed, **kw)  # type: ignore[arg-type]


def test_open_loop_is_deterministic_by_seed_and_replayable() -> None:
    w = open_loop(seed=7)
    first = list(w.initial())
    assert first == list(w.initial()) == list(open_loop(seed=7).initial())
    assert first != list(open_loop(seed=8).initial())
    assert isinstance(w, Workload)
    assert w.on_finish(first[0], [*first[0].prompt_token_ids, 11], 1.0) == []


def test_open_loop_matches_its_parameters() -> None:
    specs = list(open_loop().initial())
    assert len(specs) / 100 == pytest.approx(20, rel=0.05)
    assert all(10 <= s.num_prompt_tokens <= 50 and s.max_tokens == 8 for s in specs)
    assert all(a.arrival_time <= b.arrival_time for a, b in itertools.pairwise(specs))
    assert all(s.session_id is None for s in specs)


def test_shift_switches_parameters_at_its_time() -> None:
    base = OpenLoopPhase(arrivals=Poisson(rate=20), prompt_tokens=Fixed(value=100),
                         output_tokens=Fixed(value=8), classes=ClassMix.only(Priority.P1))
    shifted = OpenLoopPhase(start_s=50, arrivals=Poisson(rate=40),
                            prompt_tokens=Fixed(value=1000), output_tokens=Fixed(value=8),
                            classes=ClassMix.only(Priority.P0))
    specs = list(open_loop(phases=[base, shifted]).initial())
    before = [s for s in specs if s.arrival_time < 50]
    after = [s for s in specs if s.arrival_time >= 50]
    assert {(s.num_prompt_tokens, s.priority) for s in before} == {(100, Priority.P1)}
    assert {(s.num_prompt_tokens, s.priority) for s in after} == {(1000, Priority.P0)}
    assert len(after) / len(before) == pytest.approx(2, rel=0.15)


def test_shared_prefix_is_common_to_every_prompt() -> None:
    phase = OpenLoopPhase(arrivals=Poisson(rate=5), prompt_tokens=Fixed(value=40),
                          output_tokens=Fixed(value=4), shared_prefix_tokens=16)
    specs = list(open_loop(phases=[phase]).initial())
    assert len({tuple(s.prompt_token_ids[:16]) for s in specs}) == 1
    assert len({tuple(s.prompt_token_ids[16:]) for s in specs}) == len(specs)


def test_phases_must_start_at_zero_and_increase() -> None:
    phase = OpenLoopPhase(arrivals=Poisson(rate=1), prompt_tokens=Fixed(value=4),
                          output_tokens=Fixed(value=4))
    late = OpenLoopPhase(start_s=5, arrivals=Poisson(rate=1), prompt_tokens=Fixed(value=4),
                         output_tokens=Fixed(value=4))
    with pytest.raises(ValueError, match="must start at 0"):
        open_loop(phases=[late])
    with pytest.raises(ValueError, match="strictly increasing"):
        open_loop(phases=[phase, late, late])
    with pytest.raises(ValueError, match="seed=-1"):
        open_loop(seed=-1)


# -- sessions --------------------------------------------------------------------------

def chat(**kw: object) -> SessionPhase:
    fields: dict[str, object] = dict(
        concurrency=4, turns=Fixed(value=3), question_tokens=Fixed(value=20),
        output_tokens=Fixed(value=5), think_time_s=Fixed(value=2.0),
        user_tokens=Fixed(value=7), system_prompt_tokens=Fixed(value=16))
    fields.update(kw)
    return SessionPhase(**fields)  # type: ignore[arg-type]


def drive(w: Workload, latency: float, until: float = 1e9) -> list[tuple[float, RequestSpec]]:
    """A stand-in for the simulator: every request takes ``latency`` seconds and its
    output is tokens 900.. (never reserved ids). Returns (finish time, spec) in order."""
    queue: list[tuple[float, int, RequestSpec]] = []
    order = itertools.count()
    for spec in w.initial():
        heapq.heappush(queue, (spec.arrival_time + latency, next(order), spec))
    done = []
    while queue:
        now, _, spec = heapq.heappop(queue)
        if now > until:
            break
        done.append((now, spec))
        output = list(range(900, 900 + spec.max_tokens))
        for nxt in w.on_finish(spec, spec.prompt_token_ids + output, now):
            assert nxt.arrival_time >= now
            heapq.heappush(queue, (nxt.arrival_time + latency, next(order), nxt))
    return done


def test_next_turn_extends_the_finished_conversation() -> None:
    w = SessionWorkload([chat()], duration_s=1000, seed=3)
    done = drive(w, latency=1.0)
    by_turn = {(s.session_id, s.turn): s for _, s in done}
    for (sid, turn), spec in by_turn.items():
        if turn == 0:
            continue
        prev = by_turn[(sid, turn - 1)]
        history = prev.prompt_token_ids + list(range(900, 900 + prev.max_tokens))
        assert spec.prompt_token_ids[:len(history)] == history
        assert spec.num_prompt_tokens == len(history) + 7
        assert spec.priority == prev.priority
    assert {s.turn for _, s in done} == {0, 1, 2}


def test_first_turns_share_system_prompts_from_a_pool() -> None:
    w = SessionWorkload([chat(num_system_prompts=2, concurrency=30)], duration_s=5, seed=1)
    firsts = list(w.initial())
    assert len({tuple(s.prompt_token_ids[:16]) for s in firsts}) == 2


def test_concurrency_is_held_by_replacing_finished_sessions() -> None:
    w = SessionWorkload([chat(concurrency=5)], duration_s=500, seed=0)
    done = drive(w, latency=1.0)
    # 5 slots, each cycling turns of (think 2 s + latency 1 s): about 500/3 per slot.
    assert len(done) / 5 == pytest.approx(500 / 3, rel=0.05)
    assert len({s.session_id for _, s in done}) > 5 * 50
    # A session lives from its first arrival to its last finish (3 turns of 1 s with two
    # 2 s thinks: 7 s), then its slot waits one think (2 s) for the next user.
    spans: dict[int | None, list[float]] = {}
    for now, s in done:
        span = spans.setdefault(s.session_id, [s.arrival_time, now])
        span[1] = now
    live = [sum(int(a <= t < b) for a, b in spans.values()) for t in np.arange(10, 490, 0.5)]
    assert max(live) <= 5
    assert np.mean(live) == pytest.approx(5 * 7 / 9, rel=0.03)


def test_sessions_are_the_same_whatever_the_engine_latency() -> None:
    fast = drive(SessionWorkload([chat()], duration_s=200, seed=5), latency=0.5)
    slow = drive(SessionWorkload([chat()], duration_s=200, seed=5), latency=3.0)
    first_fast = {s.session_id: s.prompt_token_ids for _, s in fast if s.turn == 0}
    first_slow = {s.session_id: s.prompt_token_ids for _, s in slow if s.turn == 0}
    common = first_fast.keys() & first_slow.keys()
    assert len(common) >= 10
    assert all(first_fast[k] == first_slow[k] for k in common)


def test_sessions_are_deterministic_by_seed() -> None:
    def run(seed: int) -> list[tuple[float, RequestSpec]]:
        phase = chat(turns=Uniform(low=1, high=6), think_time_s=LogNormal(mean=3, sigma=0.5))
        return drive(SessionWorkload([phase], duration_s=100, seed=seed), latency=0.7)
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_max_context_ends_a_session_before_it_outgrows_the_model() -> None:
    w = SessionWorkload([chat(turns=Fixed(value=50), max_context_tokens=100)],
                        duration_s=300, seed=0)
    done = drive(w, latency=1.0)
    assert max(s.num_prompt_tokens + s.max_tokens for _, s in done) <= 100
    assert max(s.turn for _, s in done) < 49


def test_long_context_sessions_open_with_a_document() -> None:
    phase = chat(concurrency=2000, long_context_fraction=0.1,
                 long_context_tokens=Fixed(value=4000))
    firsts = list(SessionWorkload([phase], duration_s=100, seed=0).initial())
    long = [s for s in firsts if s.num_prompt_tokens > 1000]
    assert len(long) / len(firsts) == pytest.approx(0.1, abs=0.02)
    assert {s.num_prompt_tokens for s in long} == {16 + 4000 + 20}


def test_shift_raises_concurrency_and_changes_new_sessions() -> None:
    second = chat(start_s=100, concurrency=8, question_tokens=Fixed(value=500),
                  classes=ClassMix.only(Priority.P0))
    w = SessionWorkload([chat(), second], duration_s=200, seed=0, ramp_s=1.0)
    done = drive(w, latency=1.0)
    starts = [(now, s) for now, s in done if s.turn == 0]
    late = [s for now, s in starts if now - 1.0 >= 100]
    early = [s for now, s in starts if now - 1.0 < 100]
    assert {s.num_prompt_tokens for s in early} == {36}
    assert {s.num_prompt_tokens for s in late} == {516}
    assert {s.priority for s in late} == {Priority.P0}
    in_flight_after = {s.session_id for now, s in done if now > 150}
    assert len(in_flight_after) > 4


def test_on_finish_refuses_a_request_reported_twice() -> None:
    w = SessionWorkload([chat()], duration_s=100, seed=0)
    spec = next(iter(w.initial()))
    w.on_finish(spec, [*spec.prompt_token_ids, 900], spec.arrival_time + 1)
    with pytest.raises(ValueError, match="exactly once"):
        w.on_finish(spec, [*spec.prompt_token_ids, 900], spec.arrival_time + 1)


def test_on_finish_refuses_token_ids_shorter_than_the_prompt() -> None:
    w = SessionWorkload([chat()], duration_s=100, seed=0)
    spec = next(iter(w.initial()))
    with pytest.raises(ValueError, match="prompt \\+ output"):
        w.on_finish(spec, spec.prompt_token_ids[:3], 5.0)


def test_no_turn_is_scheduled_past_the_end() -> None:
    w = SessionWorkload([chat()], duration_s=30, seed=0)
    assert all(s.arrival_time < 30 for _, s in drive(w, latency=0.5))
