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
from slopilot.engine.sim.scenario import load_scenario
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

