"""A stream's token gaps as its client times them: each token reaches it with its chunk.

``vllm bench serve`` appends one ITL per chunk, the whole time since the chunk before;
an ``openai`` SDK user times content deltas the same way. Two tokens that come in one
chunk after a 60 ms wait were a 60 ms stall to either, not two 30 ms gaps: over a 40 ms
target the stall is a slow gap, whatever came with it.
"""

from __future__ import annotations

import pytest

from slopilot.engine.client_gaps import ClientGaps
from slopilot.engine.slo import ClassSLO


def test_a_chunks_wait_is_its_first_tokens_gap_and_the_rest_came_with_it() -> None:
    gaps = ClientGaps()
    assert gaps.written(2, 1.0) == [0.0]  # the first chunk's wait is the TTFT
    assert gaps.written(1, 1.01) == pytest.approx([0.01])
    assert gaps.written(2, 1.07) == pytest.approx([0.06, 0.0])
    assert gaps.written(0, 1.5) == []  # no token: no gap, and the clock goes on from 1.07
    assert gaps.written(3, 1.08) == pytest.approx([0.01, 0.0, 0.0])


def test_a_stall_that_brings_several_tokens_is_judged_as_the_client_saw_it() -> None:
    """49 one-token chunks 10 ms apart and one 60 ms wait that brings two tokens: 50 gaps
    as the tokens' count says, one of them over 40 ms, as a client timing chunks counts
    it: 1 of 50 is over 1 %, missed. Shared, the wait read as two 30 ms gaps, none over:
    met, where the client missed."""
    slo = ClassSLO(ttft_p99_ms=400, tbt_p99_ms=40)
    gaps = ClientGaps()
    seen = gaps.written(1, 0.0)
    for i in range(1, 49):
        seen += gaps.written(1, 0.01 * i)
    seen += gaps.written(2, 0.48 + 0.06)
    assert len(seen) == 50  # one a token after the first
    over = sum(1 for g in seen if g > 0.04)
    assert over == 1
    assert sum(seen) == pytest.approx(0.54)
    assert not slo.met(0.1, len(seen), over)
