"""Greedy output through HTTP equals transformers on tiny-random, with six prompts in the
engine at once, chunked prefill and forced preemption (by recompute, or by swap) in
between."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from slopilot.engine.config import PreemptionMode
from tests.support.live_server import start_server
from tests.support.waits import HANG_GUARD_S

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def cases(tiny_random_dir: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt, transformers' greedy output) pairs."""
    transformers = pytest.importorskip("transformers")
    from tests.engine.torch_driver import hf_greedy

    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(70, 100))] for _ in range(6)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_random_dir)).float().eval()
    return [(p, hf_greedy(hf, p, MAX_TOKENS)) for p in prompts]


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_greedy_matches_transformers(tiny_random_dir: Path,
                                     cases: list[tuple[list[int], list[int]]],
                                     mode: PreemptionMode) -> None:
    # 16 blocks of 16 tokens hold about two of these requests: the rest preempt.
    knobs = {"token_budget": 128, "budget_align": 64, "chunk_size": 64,
             "preemption_mode": mode.value}
    with start_server(executor="torch", model=str(tiny_random_dir), num_gpu_blocks=16,
                      num_cpu_blocks=64, knobs=knobs) as srv:
        # One request of six prompts: the engine takes all six in one step, so they are
        # in the cache together and preempt however fast or slow the machine is (six
        # separate requests could each finish before the next arrived on a busy one).
        res = httpx.post(srv.url + "/v1/completions", timeout=HANG_GUARD_S, json={
            "prompt": [p for p, _ in cases], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True})
        assert res.status_code == 200, res.text
        choices: list[dict[str, Any]] = sorted(res.json()["choices"],
                                               key=lambda c: int(c["index"]))
        preempted = srv.call(lambda e: dict(e.scheduler.num_preemptions))
        tokenizer = srv.backend.tokenizer
    assert preempted[mode] > 0, preempted
    for choice, (_, want) in zip(choices, cases, strict=True):
        assert choice["token_ids"] == want
        assert choice["text"] == tokenizer.decode(want)
