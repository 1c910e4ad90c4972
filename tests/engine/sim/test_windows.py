"""Window selection: the busiest windows by arrivals and by tokens, a typical one, seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.trace import TraceRecord, read_trace
from slopilot.engine.sim.windows import (
    WindowChoice,
    _heaviest_prompts,
    seed_windows,
    trace_windows,
)
from slopilot.engine.sim.workload_spec import TraceSpec
from tests.support.heavy_minute import heavy_minute
from tests.support.mooncake_shift import DOCUMENTS, FOLLOW_UPS, mooncake_shift


def synthetic() -> list[TraceRecord]:
    """600 s at 2 req/s of 100-token requests; a request burst at 200-230 s (10 req/s)
    and a stretch of long prompts at 450-480 s (2 req/s of 5,000 tokens)."""
    out = []
    for i in range(1200):
        t = i * 0.5
        prompt = 5000 if 450 <= t < 480 else 100
        out.append(TraceRecord(t, prompt, 10))
    for i in range(240):  # 8 more per second in the burst
        out.append(TraceRecord(200 + i / 8, 100, 10))
    return sorted(out, key=lambda r: r.arrival_time)


def test_busiest_by_arrivals_by_tokens_and_a_typical_window() -> None:
    windows = trace_windows(synthetic(), 30.0, warmup_s=20.0, drain_s=10.0)
    by_name = {w.name: w for w in windows}
    assert list(by_name) == ["busiest arrivals", "busiest tokens", "typical"]
    busy, tokens, typical = by_name.values()
    assert busy.start_s == pytest.approx(200.0) and busy.arrival_rate == pytest.approx(10.0)
    assert tokens.start_s == pytest.approx(450.0)
    assert tokens.token_rate is not None and tokens.token_rate > 9000
    assert typical.arrival_rate == pytest.approx(2.0)
    assert typical.token_rate == pytest.approx(2 * 110)
    for w in windows:
        assert w.length_s == 30.0 and w.warmup_s == 20.0 and w.drain_s == 10.0
    assert "busiest arrivals: 200-230 s (10.0 req/s" in busy.describe()


def test_the_tokens_window_may_overlap_the_arrivals_window_by_exactly_half() -> None:
    """The tokens window may overlap the first by half its length, no more: a heavy
    stretch that starts half a window after a request burst is its own window, from its
    first request on (105 s, not 106 s and one heavy request short)."""
    records = [TraceRecord(float(t), 10, 0) for t in range(300)]  # background, 1 req/s
    records += [TraceRecord(100 + i / 50, 10, 0) for i in range(50)]  # the burst
    records += [TraceRecord(float(t), 5000, 10) for t in range(105, 115)]  # heavy
    records.sort(key=lambda r: r.arrival_time)
    by_name = {w.name: w for w in trace_windows(records, 10.0, warmup_s=0.0)}
    assert by_name["busiest arrivals"].start_s == 100.0
    assert by_name["busiest tokens"].start_s == 105.0


def test_the_choice_is_deterministic_and_windows_do_not_overlap_much() -> None:
    a = trace_windows(synthetic(), 60.0)
    assert a == trace_windows(synthetic(), 60.0)
    for i, w in enumerate(a):
        for v in a[i + 1:]:
            assert abs(w.start_s - v.start_s) >= 30.0


def test_warmup_never_reaches_before_the_trace() -> None:
    records = [TraceRecord(float(t), 5000 if t < 20 else 10, 5) for t in range(300)]
    first = trace_windows(records, 30.0, warmup_s=60.0)
    tokens = next(w for w in first if w.name == "busiest tokens" or w.start_s == 0.0)
    assert tokens.start_s == 0.0 and tokens.warmup_s == 0.0


def test_a_short_trace_is_one_window_over_all_of_it() -> None:
    records = [TraceRecord(float(t), 10, 5) for t in range(50)]
    (only,) = trace_windows(records, 30.0)
    assert only.name == "whole trace" and only.start_s == 0.0 and only.end_s >= 49.0


def test_the_shipped_conversation_trace_windows_find_its_busy_minutes() -> None:
    spec = load_scenario("azure-conv-2023").workload
    assert isinstance(spec, TraceSpec)
    records = spec.records()
    windows = trace_windows(records, 60.0)
    busy = windows[0]
    assert busy.arrival_rate is not None and busy.arrival_rate >= 19.0  # the mean is 13.8
    assert all(w.start_s > 300 for w in windows[:2])  # not the quiet first minutes


def test_seeds_for_generated_workloads() -> None:
    assert [w.seed for w in seed_windows(4, 3, 60.0)] == [4, 5, 6]
    assert seed_windows(0, 1, 60.0)[0] == WindowChoice("seed 0", 0.0, 60.0, 0.0, 20.0, seed=0)
    with pytest.raises(ValueError, match="seeds=0"):
        seed_windows(0, 0, 60.0)


@pytest.mark.parametrize("length", [0.0, -5.0, float("inf")])
def test_bad_lengths_are_refused(length: float) -> None:
    with pytest.raises(ValueError, match="length_s"):
        trace_windows(synthetic(), length)


def sparse() -> list[TraceRecord]:
    """Bursts of 50 requests every 30 minutes, silence between: most minutes are empty."""
    return [TraceRecord(1800.0 * b + i * 0.5, 1000 + 10 * i, 100)
            for b in range(6) for i in range(50)]


def test_a_sparse_traces_typical_window_has_traffic() -> None:
    # The median minute of a bursty trace is empty, and an empty window judges nothing.
    windows = trace_windows(sparse(), 60.0)
    typical = next(w for w in windows if w.name == "typical")
    assert typical.arrival_rate is not None and typical.arrival_rate > 0
    assert any(typical.start_s <= r.arrival_time < typical.end_s for r in sparse())


def test_a_single_request_trace_has_no_made_up_rate() -> None:
    # One arrival spans no time: its rate is one request over the one second the replay
    # runs, not one over a nanosecond.
    (only,) = trace_windows([TraceRecord(0.0, 100, 10)], 60.0)
    assert only.arrival_rate == pytest.approx(1.0) and only.length_s == pytest.approx(1.0)
    assert only.token_rate == pytest.approx(110.0)


def test_the_typical_window_costs_memory_by_requests_not_by_span() -> None:
    # Its grid was every window of the span: two requests 1e10 s apart (a file of three
    # lines, within the trace's 1e11 s bound) asked numpy for 1.3 GB, and at 9e10 s
    # tune was killed by the kernel. Measured here on 6e8 s, 80 MB the old way.
    import tracemalloc

    records = [TraceRecord(t, 100, 10) for t in (0.0, 1.0, 3e8, 3e8 + 1, 6e8)]
    tracemalloc.start()
    try:
        windows = trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    # Both grid windows with arrivals overlap the busiest ones: no typical, as before.
    assert [(w.name, w.start_s) for w in windows] == [("busiest arrivals", 0.0),
                                                      ("busiest tokens", 3e8)]


def off_peak_burst() -> list[TraceRecord]:
    """900 s of 800-token prompts, 1 req/s rising to 3 req/s at 400-600 s, and at 120 s
    an off-peak burst: 15 prompts of 6,000 tokens within a second (fewer tokens than the
    busiest minute's, and fewer requests)."""
    out = []
    t = 0.0
    while t < 900.0:
        out.append(TraceRecord(t, 800, 40))
        t += 1 / 3 if 400.0 <= t < 600.0 else 1.0
    out += [TraceRecord(120.0 + i / 15, 6000, 10) for i in range(15)]
    return sorted(out, key=lambda r: r.arrival_time)


def test_a_sub_minute_burst_off_the_busiest_minutes_gets_a_window() -> None:
    # The busiest minute by arrivals and by tokens is at the peak (3 x 840 = 2,520
    # tok/s against the burst minute's 1 x 840 + 90,150 / 60 = 2,343); the burst's
    # queue (90,150 tokens in a second) is the trace's worst TTFT, and a study judged
    # without it said "holds" where the whole trace missed.
    records = off_peak_burst()
    windows = trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)
    names = [w.name for w in windows]
    assert names[:2] == ["busiest arrivals", "busiest tokens"]
    assert all(w.start_s >= 390.0 for w in windows[:2])
    burst = next(w for w in windows if w.name == "sharpest burst")
    assert burst.start_s <= 120.0 and burst.end_s > 121.0
    assert burst.warmup_s == 30.0
    assert "typical" in names  # still chosen, clear of the burst's window
    typical = next(w for w in windows if w.name == "typical")
    assert abs(typical.start_s - burst.start_s) >= 30.0


def test_a_burst_inside_the_busiest_windows_adds_none() -> None:
    # The same burst at the peak: the busiest windows already judge its queue.
    records = sorted([r for r in off_peak_burst() if r.prompt_tokens != 6000]
                     + [TraceRecord(500.0 + i / 15, 6000, 10) for i in range(15)],
                     key=lambda r: r.arrival_time)
    windows = trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)
    assert "sharpest burst" not in [w.name for w in windows]


def test_a_minute_of_fresh_prompts_outweighs_one_of_shared_prefixes(tmp_path: Path) -> None:
    # Mooncake's hash_ids say which prompt tokens an earlier prompt sent: the follow-ups'
    # minute brings ~48,000 prompt tokens a second, all but ~3,800 a prefix the cache
    # holds; the documents' minute ~31,000, every one prefilled. Ranked by all tokens,
    # no window judged the documents, and tune said "holds" where the whole replay missed.
    records = read_trace(mooncake_shift(tmp_path / "shift.jsonl"))
    windows = trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)
    by_name = {w.name: w for w in windows}
    busy = by_name["busiest arrivals"]
    assert FOLLOW_UPS[0] <= busy.start_s < FOLLOW_UPS[1]
    tokens = by_name["busiest tokens"]
    assert DOCUMENTS[0] - 10.0 <= tokens.start_s <= DOCUMENTS[0] + 5.0, tokens.describe()
    # Its rate is the work: prompt tokens past a shared prefix, plus the outputs.
    assert tokens.token_rate is not None and 25_000 < tokens.token_rate < 35_000
    assert busy.token_rate is not None and busy.token_rate < 6_000
    assert "past shared prefixes" in tokens.describe()


def test_fresh_tokens_count_what_no_earlier_prompt_sent() -> None:
    # Mooncake blocks: a prefix counts as sent only from the first block on (a block id
    # seen after another prefix is not the same tokens to the cache), cut to the prompt.
    blocks = [TraceRecord(0.0, 1100, 5, prefix_blocks=(0, 1, 2)),
              TraceRecord(1.0, 2000, 5, prefix_blocks=(0, 1, 2, 3)),
              TraceRecord(2.0, 700, 5, prefix_blocks=(9, 1)),
              TraceRecord(3.0, 300, 5, prefix_blocks=(0,))]
    assert fresh_tokens(blocks).tolist() == [1105, 2000 - 1024 - 76 + 5, 705, 5]
    # A session's later turn opens with its longest earlier turn's prompt.
    turns = [TraceRecord(0.0, 400, 10, session_id=1), TraceRecord(1.0, 900, 10, session_id=1),
             TraceRecord(2.0, 600, 10, session_id=1), TraceRecord(3.0, 500, 10, session_id=2)]
    assert fresh_tokens(turns).tolist() == [410, 510, 10, 510]
    # Without either, every prompt token is work, as before.
    plain = [TraceRecord(0.0, 100, 10), TraceRecord(0.0, 100, 10)]
    assert fresh_tokens(plain).tolist() == [110, 110]


def _holds(w: WindowChoice, times: list[float]) -> int:
    return sum(w.start_s <= t < w.end_s for t in times)


def test_a_quiet_minute_of_the_longest_prompts_gets_a_window() -> None:
    # Busiest by arrivals and by tokens are the clumps' minutes, the long prompts build
    # no queue beside theirs, and the typical minute is a quiet one: no window judged
    # them, and their minute's P99 is theirs (tune said "holds" where a minute of the
    # whole replay missed: tests/tuner/test_tune_heavy_prompts.py).
    records = heavy_minute()
    windows = trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)
    names = [w.name for w in windows]
    assert names[:2] == ["busiest arrivals", "busiest tokens"]
    assert "sharpest burst" not in names and "typical" in names
    heavy = [r.arrival_time for r in records if r.prompt_tokens == 7000]
    # Past the P99's rank (the 2nd of ~66 requests): more than one long prompt.
    assert any(_holds(w, heavy) >= 2 for w in windows), [w.describe() for w in windows]
    heaviest = next(w for w in windows if w.name == "heaviest prompts")
    assert _holds(heaviest, heavy) >= 2, heaviest.describe()
    # Of the minutes as heavy at that rank, the one holding both threes.
    assert _holds(heaviest, heavy) == 6 and heaviest.p99_prompt_tokens == 7000
    assert "prompts of 7,000+ tokens at its P99" in heaviest.describe()
    assert heaviest.warmup_s == 30.0 and heaviest.drain_s == 20.0
    assert all(abs(heaviest.start_s - w.start_s) >= 30.0 for w in windows if w is not heaviest)
    assert windows == trace_windows(records, 60.0, warmup_s=30.0, drain_s=20.0)


def test_prompts_the_deployment_refuses_get_no_window() -> None:
    # Past its context a prompt is refused on arrival and no TTFT counts it: 7,000-token
    # prompts on a deployment serving 4,096 tokens leave that minute as quiet as any.
    windows = trace_windows(heavy_minute(), 60.0, servable_tokens=4096)
    assert "heaviest prompts" not in [w.name for w in windows]
    assert "heaviest prompts" in [w.name for w in trace_windows(heavy_minute(), 60.0,
                                                               servable_tokens=8192)]


@pytest.mark.parametrize("seed", range(4))
def test_the_heaviest_prompts_are_those_every_windows_p99_reads(seed: int) -> None:
    # The bisection against each window's own P99-rank prompt, as numpy's quantile
    # (the summary's) ranks it: the lower of the two its linear P99 interpolates.
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, 900.0, 3000) ** 1.3 / 900.0 ** 0.3)  # rising rate
    work = np.round(rng.lognormal(np.log(1500), 1.0, 3000))
    starts = times[times + 60.0 <= times[-1]]
    free = rng.random(len(starts)) < 0.7
    found = _heaviest_prompts(times, work, starts, free, 60.0)
    assert found is not None
    each = [float(np.percentile(work[(times >= s) & (times < s + 60.0)], 99, method="lower"))
            if f else -1.0 for s, f in zip(starts, free, strict=True)]
    assert found[1] == max(each) and free[found[0]] and each[found[0]] == found[1]


@pytest.mark.parametrize("night", [1, 2, 3, 6])
def test_the_typical_window_is_one_that_carries_the_traffic(night: int) -> None:
    """A diurnal trace's many near-silent minutes outnumbered its busy ones, and the
    median minute with arrivals was one of them, "typical: 660-720 s (0.0 req/s)" where
    minutes of 3 arrivals or fewer held 35 of its 5,787 requests. Here 30 night minutes of
    ``night`` requests each and 10 busy ones of 120: the night minutes carry too little
    of the traffic to be typical of it, however much of it they hold together (a cut by
    their share of the requests, 5 %, chose a night minute from 2 requests a minute)."""
    records = [TraceRecord(m * 60.0 + 20.0 + i, 100, 10)
               for m in range(30) for i in range(night)]
    records += [TraceRecord(1800.0 + m * 60.0 + i / 2, 100, 10)
                for m in range(10) for i in range(120)]
    records.sort(key=lambda r: r.arrival_time)
    typical = next(w for w in trace_windows(records, 60.0, warmup_s=0.0)
                   if w.name == "typical")
    assert typical.arrival_rate == pytest.approx(2.0)


def test_a_minute_that_dwarfs_the_rest_is_the_traffic() -> None:
    """One minute of 1,000 requests among 60 of one each: the busiest windows take that
    minute, and no minute of one request is called typical beside it."""
    records = [TraceRecord(m * 60.0 + 5.0, 100, 10) for m in range(60)]
    records += [TraceRecord(3600.0 + i * 0.06, 100, 10) for i in range(1000)]
    records += [TraceRecord(3720.0 + m * 60.0 + 5.0, 100, 10) for m in range(5)]
    records.sort(key=lambda r: r.arrival_time)
    names = {w.name: w for w in trace_windows(records, 60.0, warmup_s=0.0)}
    assert "typical" not in names or names["typical"].arrival_rate > 1.0, names
