"""How long a trace's requests live on a deployment: what a tuning window's warm-up and
drain must cover (``engine/sim/lifetimes.py``)."""

from __future__ import annotations

import pytest

from slopilot.engine.sim.lifetimes import (
    LIFETIME_QUANTILE,
    covering_s,
    request_lifetime,
    residency_s,
)
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.twin import kv_admits_tokens_for, kv_tokens_for

H100 = load_scenario("azure-conv-2023")  # 1 x H100, Llama-3-8B: a bare --trace's deployment


def test_a_lifetime_is_the_prefill_and_the_output_at_a_full_batchs_decode_step() -> None:
    life = request_lifetime(H100, [TraceRecord(float(t), 400, 12_000) for t in range(50)])
    # Contexts of ~6,400 tokens: the KV cache (~448k tokens) holds ~70 of them.
    assert life.batch_limit == "the KV cache holds" and 60 <= life.batch <= 80
    assert life.output_tokens == 12_000
    assert life.seconds == pytest.approx(12_000 * life.step_s, rel=0.01)  # prefill: ms
    assert 0.015 < life.step_s < 0.04 and covering_s(life) == int(life.seconds) + 1
    assert "12,000 output tokens" in life.describe()
    # Short contexts: max_num_seqs bounds the batch before the cache does.
    chat = request_lifetime(H100, [TraceRecord(0.0, 200, 100)])
    assert chat.batch == 256 and chat.batch_limit == "max_num_seqs allows"
    assert chat.seconds < 5.0
    assert request_lifetime(H100, [TraceRecord(0.0, 200, 100)],
                            {"max_num_seqs": 64}).batch == 64


def test_a_few_long_requests_that_hold_the_cache_set_the_lifetime() -> None:
    # One request in 200 lives ~100 times longer than the rest: a plain 99th percentile of
    # lifetimes is a short one's, but the long ones hold most of what the cache holds.
    records = [TraceRecord(float(t), 300, 12_000 if t % 200 == 0 else 120)
               for t in range(2_000)]
    life = request_lifetime(H100, records)
    assert life.output_tokens == 12_000
    assert LIFETIME_QUANTILE == 0.99


def test_prompts_the_cache_cannot_hold_are_left_out_or_refused() -> None:
    fits = [TraceRecord(0.0, 200, 100)]
    never = TraceRecord(1.0, 10_000_000, 50_000)  # rejected on arrival: no life to cover
    assert request_lifetime(H100, [*fits, never]) == request_lifetime(H100, fits)
    with pytest.raises(ValueError, match="none of the 1 prompts fits the KV cache"):
        request_lifetime(H100, [never])


def test_each_requests_residency_is_its_life_at_the_lifetimes_step() -> None:
    records = [TraceRecord(0.0, 400, 12_000), TraceRecord(1.0, 200, 100),
               TraceRecord(2.0, 10_000_000, 50)]  # the last never fits: it holds nothing
    life = request_lifetime(H100, records)
    stay = residency_s(H100, records, life)
    assert stay[0] == pytest.approx(life.seconds)  # the longest one sets the lifetime
    assert stay[1] == pytest.approx(100 * life.step_s, rel=0.2) and stay[1] > 100 * life.step_s
    assert stay[2] == 0.0
    # What admission leaves for requests: the cache less its watermark's blocks.
    kv = kv_tokens_for(H100)
    assert kv_admits_tokens_for(H100) == pytest.approx(0.95 * kv, abs=16)
    assert kv_admits_tokens_for(H100, {"kv_watermark": 0.2}) == pytest.approx(0.8 * kv, abs=16)
