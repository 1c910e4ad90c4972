"""The context a server advertises and enforces is what its KV cache can hold.

A request can never grow past the cache, even alone: the scheduler ends it there as
``length``. With a KV cache of 40 blocks (640 tokens) the server still advertised the
model's 8,192 and took ``max_tokens=1000``, then ended the reply at 637 tokens with
``finish_reason: length``, no error: a client that asked for more than the server can
give learned it from a truncated answer. vLLM refuses to start in that case; here the
cache is sized by flag, so the server serves what fits and says so.
"""

from __future__ import annotations

import httpx

from tests.support.live_server import build_backend, start_server
from tests.support.waits import HANG_GUARD_S

BLOCKS = 40


def test_the_advertised_context_is_what_the_kv_cache_holds() -> None:
    for executor in ("simulated", "torch"):
        backend = build_backend(executor, num_gpu_blocks=BLOCKS)
        block = backend.engine.config.block_size
        assert backend.max_model_len == BLOCKS * block, executor
        backend.close()
    # A cache larger than the model's context leaves the model's (tiny-cpu's: 8,192).
    assert build_backend("simulated", num_gpu_blocks=100_000).max_model_len == 8192


def test_a_request_for_more_than_the_cache_holds_is_refused_not_cut_short() -> None:
    backend = build_backend("simulated", num_gpu_blocks=BLOCKS, realtime=False)
    limit = BLOCKS * backend.engine.config.block_size
    with start_server(backend) as srv:
        models = httpx.get(srv.url + "/v1/models", timeout=HANG_GUARD_S).json()
        assert models["data"][0]["max_model_len"] == limit
        res = httpx.post(srv.url + "/v1/completions", json={
            "prompt": "once upon a time", "max_tokens": 1000, "ignore_eos": True},
            timeout=HANG_GUARD_S)
        assert res.status_code == 400, res.text
        error = res.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"this server's KV cache holds {limit} tokens" in error["message"]
        # What fits is served whole.
        res = httpx.post(srv.url + "/v1/completions", json={
            "prompt": "once upon a time", "max_tokens": limit - 16, "ignore_eos": True},
            timeout=HANG_GUARD_S)
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["usage"]["completion_tokens"] == limit - 16
        assert body["choices"][0]["finish_reason"] == "length"
