"""The twin refuses what the server refuses for the model's own context, not only the KV's.

The server serves ``min(model context, KV capacity)`` tokens of prompt plus output and
answers a longer request 400 ``context_length_exceeded`` (``backends.servable_len``). The
twin judged the KV cache alone: on 8 x H800 (TP 8) DeepSeek-67B's cache holds far more
than the model's 4,096 tokens, so the twin served 1,612 of the shipped trace's requests
that the deployment refuses, and every figure the tuner acted on counted them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.config import EngineConfig
from slopilot.engine.server.backends import build_simulated
from slopilot.engine.server.errors import APIError
from slopilot.engine.server.protocol import CompletionRequest
from slopilot.engine.server.serving import prepare
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.profiles import get_model
from slopilot.engine.sim.scenario import Scenario, load_scenario, parse_scenario
from slopilot.engine.sim.simulator import build_engine, simulate
from slopilot.engine.sim.trace_scenario import TraceOptions, replay_measure, with_trace

SEED = "seed-h800x8-deepseek67b"
CONTEXT = get_model("deepseek-67b").max_position_embeddings  # 4,096
# (prompt, output): at the context exactly, one over with the output, a prompt that
# leaves no room for any output, and a short one.
REQUESTS = [(CONTEXT - 1096, 1096), (CONTEXT - 96, 200), (CONTEXT, 1), (100, 10)]


def _trace(tmp_path: Path, requests: list[tuple[int, int]]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(
        f'{{"arrival_time": {i}, "prompt_tokens": {p}, "output_tokens": {o}}}\n'
        for i, (p, o) in enumerate(requests)))
    return path


def _server_refuses(prompt: int, output: int) -> bool:
    backend = build_simulated(EngineConfig(), scenario=SEED, realtime=False)
    body = CompletionRequest(prompt=[11] * prompt, max_tokens=output, ignore_eos=True)
    try:
        prepare(backend, body, {}, arrival_time=0.0)
    except APIError as exc:
        assert (exc.status, exc.code) == (400, "context_length_exceeded"), exc.message
        return True
    return False


def test_the_kv_cache_holds_more_than_the_model_so_the_model_decides() -> None:
    engine, _ = build_engine(load_scenario(SEED), EngineConfig())
    kv = engine.scheduler.kv
    assert kv.num_gpu_blocks * kv.block_size > 10 * CONTEXT
    assert engine.scheduler.servable_len == CONTEXT
    backend = build_simulated(EngineConfig(), scenario=SEED, realtime=False)
    assert (backend.max_model_len, backend.kv_limited) == (CONTEXT, False)


def test_the_twin_rejects_what_the_server_refuses_for_the_models_context(
        tmp_path: Path) -> None:
    refused = [_server_refuses(p, o) for p, o in REQUESTS]
    assert refused == [False, True, True, False]
    sc = with_trace(load_scenario(SEED), TraceOptions(path=str(_trace(tmp_path, REQUESTS))))
    run = simulate(sc, measure=replay_measure(sc))
    summary = run.summary
    assert summary.run is not None and summary.run.rejected == sum(refused)
    acc = summary.overall.accounting
    assert acc is not None
    # Counted as a prompt the KV cache can never hold is: rejected, not refused for load
    # (no 429, no TTFT never given), outside the SLO's denominator.
    assert (acc.requests_arrived, acc.requests_rejected) == (4, 2)
    assert summary.overall.requests_finished == 2
    assert summary.overall.requests_refused == 0
    assert summary.overall.slo_attainment == 1.0
    # The output offered counts theirs, as it counts a KV-too-long request's.
    assert acc.offered_tok_s * summary.duration_s == pytest.approx(sum(o for _, o in REQUESTS))


def test_the_closed_loop_cluster_serves_none_of_them(tmp_path: Path) -> None:
    sc = with_trace(load_scenario(SEED), TraceOptions(path=str(_trace(tmp_path, REQUESTS))))
    cluster = SimCluster(sc, {}, replicas=1, seed=0)
    cluster.advance(120.0)
    assert cluster.summary(0.0, 120.0).overall.requests_finished == 2


def _chat(question_tokens: int, *, turns: int = 1, seconds: float = 60.0) -> Scenario:
    """Two chat users on the seed's deployment; each question ``question_tokens`` long."""
    return parse_scenario({
        "name": "chat", "gpu": "H800", "num_gpus": 8, "tp": 8, "model": "deepseek-67b",
        "duration_s": seconds, "seed": 0,
        "workload": {"type": "sessions", "concurrency": 2, "turns": turns,
                     "question_tokens": {"dist": "fixed", "value": question_tokens},
                     "output_tokens": {"dist": "fixed", "value": 100},
                     "user_tokens": {"dist": "fixed", "value": 1000},
                     "think_time_s": {"dist": "fixed", "value": 5}}})


def test_a_refused_turn_ends_its_conversation_and_a_new_user_takes_the_slot() -> None:
    # Each conversation's 4th turn outgrows the context (3 x (1000 + 100) + 1000 > 4096):
    # the deployment refuses it, and a new user starts over in the slot, as when a
    # conversation ends by itself. The slot stayed empty: concurrency fell to 0.
    sc = _chat(1000, turns=8, seconds=120.0)
    run = simulate(sc)
    acc = run.summary.overall.accounting
    assert acc is not None and acc.requests_rejected >= 4
    # Every refused conversation had three turns served first.
    assert run.summary.overall.requests_finished >= 3 * acc.requests_rejected


def test_a_workload_of_requests_all_too_long_is_all_rejected_and_says_so() -> None:
    run = simulate(_chat(CONTEXT))
    summary = run.summary
    acc = summary.overall.accounting
    assert acc is not None and summary.run is not None
    # Every user tried again after their think time: 2 slots, one try per 5 s.
    assert acc.requests_arrived == acc.requests_rejected == summary.run.rejected > 2
    assert summary.overall.requests_finished == 0
    assert summary.overall.throughput_tok_s == summary.overall.goodput_tok_s == 0.0
    assert summary.overall.slo_attainment is None
    assert summary.overall.ttft_p99_ms is None
