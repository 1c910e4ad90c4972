"""The fullest KV cache's window (``engine/sim/windows.py``) and the demand estimate it is
chosen by (``engine/sim/kv_demand.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from slopilot.engine.sim.kv_demand import KVDemand
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.windows import KV_EXCESS_RATIO, trace_windows
from slopilot.tuner.sim.robust import plan_windows

STEP_S = 0.05
"""The decode step the records' residencies are counted at (a slow deployment's)."""
ROOM = 20_000.0
"""What the test's KV cache admits, in tokens."""


def filling(long_from: float = 100.0, long_output: int = 3000) -> list[TraceRecord]:
    """1,200 s of short requests (200 + 20 tokens), one a second, and every other second
    in the quiet stretch at 200-300 s; clumps of ten every 2 s at 600-660 s and of eight
    at 900-960 s (the busiest minutes by arrivals and by tokens, a clump's queue deeper
    than a long request's); and from ``long_from`` a long request every 10 s for 100 s
    (200 + ``long_output`` tokens, living 150 s at ``STEP_S``). Their contexts grow until
    the first of them leaves, a lifetime after it came: the cache is fullest 50 s after
    the last one came, in the quiet stretch."""
    out = [TraceRecord(float(t), 200, 20) for t in range(1200)
           if not (600 <= t < 660 or 900 <= t < 960 or (200 <= t < 300 and t % 2))]
    out += [TraceRecord(600.0 + 2 * c + i / 100, 200, 20) for c in range(30)
            for i in range(10)]
    out += [TraceRecord(900.0 + 2 * c + i / 100, 200, 20) for c in range(30)
            for i in range(8)]
    out += [TraceRecord(long_from + 10.0 * k + 0.5, 200, long_output) for k in range(11)]
    return sorted(out, key=lambda r: r.arrival_time)


def residency(records: list[TraceRecord]) -> np.ndarray:
    return np.array([r.output_tokens * STEP_S for r in records])


def test_a_quiet_stretch_while_long_requests_fill_the_cache_gets_a_window() -> None:
    records = filling()
    before = trace_windows(records, 60.0)
    windows = trace_windows(records, 60.0, residency_s=residency(records),
                            kv_admits_tokens=ROOM)
    # Every window chosen before is chosen as before; the new one comes last.
    assert windows[:-1] == before
    assert [w.name for w in before] == ["busiest arrivals", "busiest tokens", "typical"]
    fullest = windows[-1]
    assert fullest.name == "fullest KV cache"
    # The long requests hold ~24,400 tokens at 250 s (eleven of them, each 200 plus 20 a
    # second of its age), over 20,000 from ~231 s to ~280 s: the window holds all of it,
    # and of its own arrivals only the quiet stretch's.
    demand = KVDemand(np.array([r.arrival_time for r in records]),
                      np.array([r.prompt_tokens for r in records]),
                      np.array([r.output_tokens for r in records]), residency(records))
    assert 200.5 < fullest.start_s <= 231.0 and fullest.end_s >= 280.0
    assert fullest.kv_share == pytest.approx(demand.peak(fullest.start_s, fullest.end_s)
                                             / ROOM)
    assert 1.2 < fullest.kv_share < 1.25
    assert fullest.arrival_rate == pytest.approx(0.5, abs=0.02)
    assert all(w.arrival_rate is not None and w.arrival_rate >= 1.0 for w in before)
    assert "KV cache asked for ~12" in fullest.describe() and "% of what it admits" in \
        fullest.describe()
    assert all(abs(fullest.start_s - w.start_s) >= 30.0 for w in before)
    assert fullest.warmup_s == 30.0 and fullest.drain_s == 20.0
    assert windows == trace_windows(records, 60.0, residency_s=residency(records),
                                    kv_admits_tokens=ROOM)


def test_short_lived_requests_or_a_cache_with_room_add_no_window() -> None:
    # The same arrivals, the long requests' outputs 100 tokens (5 s): the cache never
    # holds more than a few thousand tokens.
    short = filling(long_output=100)
    assert trace_windows(short, 60.0, residency_s=residency(short),
                         kv_admits_tokens=ROOM) == trace_windows(short, 60.0)
    # The long requests on a cache that holds them all.
    records = filling()
    assert trace_windows(records, 60.0, residency_s=residency(records),
                         kv_admits_tokens=30_000.0) == trace_windows(records, 60.0)
    # A request the deployment refuses holds nothing.
    assert trace_windows(records, 60.0, servable_tokens=1000,
                         residency_s=residency(records), kv_admits_tokens=ROOM) \
        == trace_windows(records, 60.0, servable_tokens=1000)


def test_a_cache_filled_inside_a_chosen_window_adds_none() -> None:
    # The long requests arrive so that the cache is fullest inside the busiest window
    # (600-660 s): it judges that already, and nothing outside fills it twice as much.
    records = filling(long_from=460.0)
    windows = trace_windows(records, 60.0, residency_s=residency(records),
                            kv_admits_tokens=ROOM)
    assert "fullest KV cache" not in [w.name for w in windows]
    assert KV_EXCESS_RATIO == 2.0


def test_the_shipped_conversation_trace_gets_no_fullest_cache_window() -> None:
    # Chat requests live up to ~19 s and the busiest minutes hold ~20 req/s: one H100's
    # cache (~448k tokens) is never near full.
    plan = plan_windows(load_scenario("azure-conv-2023"))
    assert [w.name for w in plan.windows] == ["busiest arrivals", "busiest tokens",
                                              "typical", "heaviest prompts"]


def test_both_or_neither_of_residency_and_room() -> None:
    records = filling()
    with pytest.raises(ValueError, match="give both"):
        trace_windows(records, 60.0, residency_s=residency(records))
    with pytest.raises(ValueError, match="one per record"):
        trace_windows(records, 60.0, residency_s=residency(records)[:-1],
                      kv_admits_tokens=ROOM)
    with pytest.raises(ValueError, match="kv_admits_tokens=0"):
        trace_windows(records, 60.0, residency_s=residency(records), kv_admits_tokens=0)


@pytest.mark.parametrize("seed", range(3))
def test_the_demand_and_its_excess_are_the_sum_of_the_requests(seed: int) -> None:
    # Against the model summed request by request on a fine grid: each holds its prompt
    # from its arrival, growing evenly to prompt + output over its residency.
    rng = np.random.default_rng(seed)
    n = 400
    times = np.sort(rng.uniform(0.0, 600.0, n))
    prompt = rng.integers(50, 2000, n).astype(float)
    output = rng.integers(1, 3000, n).astype(float)
    stay = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(1.0, 120.0, n))
    demand = KVDemand(times, prompt, output, stay)
    grid = np.arange(0.0, 800.0, 0.01)
    age = grid[None, :] - times[:, None]
    alive = (age >= 0) & (age < stay[:, None])
    held = np.where(alive, prompt[:, None] + output[:, None] * age
                    / np.where(stay > 0, stay, 1.0)[:, None], 0.0).sum(axis=0)
    probe = rng.uniform(0.0, 800.0, 50)
    exact = held[np.rint(probe / 0.01).astype(int)]
    assert demand.at(probe) == pytest.approx(exact, rel=0.02, abs=200.0)
    room = float(np.percentile(held, 80))
    starts = rng.uniform(0.0, 700.0, 20)
    excess = demand.excess(starts, starts + 60.0, room)
    for s, got in zip(starts, excess, strict=True):
        inside = (grid >= s) & (grid < s + 60.0)
        want = float(np.maximum(held[inside] - room, 0.0).sum() * 0.01)
        assert got == pytest.approx(want, rel=0.01, abs=0.002 * room)
        assert demand.peak(s, s + 60.0) == pytest.approx(held[inside].max(), rel=0.01)
