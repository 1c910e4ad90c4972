"""Soak: many concurrent requests, random aborts, a tiny KV cache that forces preemption,
and live config changes, all at once. Every request ends exactly once; nothing leaks.

What it asserts happened does not rest on how the client and the engine interleave (a
starved client sends fewer requests at once, and then maybe none is preempted):

- a preemption: the soak opens with one request of ``OVERFLOW`` prompts, more than the
  cache holds, on fixed knobs and an idle engine. The engine takes its prompts in one
  step, so what it schedules is a function of them alone: it preempts on any machine, and
  the rest of the load starts once it has (a condition, not a sleep), while it runs;
- an abort: some requests are planned (seeded, before any is sent) to close their
  stream at its first event, which always comes before ``[DONE]``;
- a config change: the retuner's first change is valid and always sent, before the
  load can end.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.server.conftest import ADMIN_TOKEN
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

NUM_REQUESTS = 200
CONCURRENCY = 32
OVERFLOW = 8
"""Prompts of 90 tokens, 64 tokens out each: 1,232 tokens for a cache of 768."""
KNOBS = {"token_budget": 512, "chunk_size": 128, "preemption_mode": "recompute"}


def _success_by_reason(srv: LiveServer) -> dict[str, float]:
    text = httpx.get(srv.url + "/metrics").text
    return {s.labels["finished_reason"]: s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "vllm:request_success_total"}


@dataclass(frozen=True)
class Plan:
    body: dict[str, Any]
    abort_after: int | None  # events, then the stream is closed
    stream: bool


def _plan(rng: random.Random, i: int) -> Plan:
    prompt_len, max_tokens = rng.randint(1, 150), rng.randint(1, 24)
    body: dict[str, Any] = {"prompt": " ".join(f"w{i}x{k}" for k in range(prompt_len)),
                            "max_tokens": max_tokens, "priority": rng.choice([0, 1, 2])}
    abort_after = rng.randint(1, 3) if rng.random() < 0.25 else None
    return Plan(body, abort_after, abort_after is not None or rng.random() >= 0.5)


async def _one(client: httpx.AsyncClient, plan: Plan, statuses: list[int],
               outcomes: dict[str, int]) -> None:
    body, abort_after, max_tokens = plan.body, plan.abort_after, plan.body["max_tokens"]
    if not plan.stream:
        res = await client.post("/v1/completions", json=body)
        statuses.append(res.status_code)
        if res.status_code == 200:
            usage = res.json()["usage"]
            assert usage["completion_tokens"] == max_tokens
            outcomes["finished"] += 1
        return
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as res:
        statuses.append(res.status_code)
        if res.status_code != 200:
            return
        events = 0
        async for line in res.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                outcomes["finished"] += 1
                return
            events += 1
            if abort_after is not None and events >= abort_after:
                outcomes["aborted"] += 1
                return  # leaving the block closes the connection mid-stream


async def _retune(client: httpx.AsyncClient, rng: random.Random, stop: asyncio.Event,
                  statuses: list[int]) -> int:
    changes = 0
    while not stop.is_set():
        budget = rng.choice([128, 256, 512, 1024])
        knobs = {"token_budget": budget, "chunk_size": rng.choice([64, 128, budget]),
                 "max_num_seqs": rng.randint(2, 64),
                 "preemption_mode": rng.choice(["recompute", "swap", "auto"]),
                 "max_preemptions_per_step": rng.randint(1, 4), "budget_align": 64}
        res = await client.put("/admin/config", json=knobs,
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        statuses.append(res.status_code)
        changes += res.status_code == 200
        await asyncio.sleep(0.03)  # pacing between changes, not waiting for a result
    return changes


def _preempted(srv: LiveServer) -> int:
    return srv.call(lambda e: sum(e.scheduler.num_preemptions.values()))


async def _overflow(client: httpx.AsyncClient) -> httpx.Response:
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(90)] for _ in range(OVERFLOW)]
    return await client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 64})


async def test_soak() -> None:
    rng = random.Random(7)
    plans = [_plan(random.Random(rng.random()), i) for i in range(NUM_REQUESTS)]
    # Some stream closes at its first event: an abort whatever the interleaving.
    assert any(p.abort_after == 1 for p in plans)
    # 48 blocks of 16 tokens: a few long requests fill it, so preemption is routine.
    srv = start_server(num_gpu_blocks=48, admin_token=ADMIN_TOKEN, knobs=KNOBS)
    try:
        statuses: list[int] = []
        outcomes = {"finished": 0, "aborted": 0}
        limits = httpx.Limits(max_connections=CONCURRENCY + 4)
        async with httpx.AsyncClient(base_url=srv.url, timeout=HANG_GUARD_S,
                                     limits=limits) as client:
            overflow = asyncio.create_task(_overflow(client))
            # The load starts once the overflow preempted (or ended, and the assert says
            # it did not): its knobs are the server's until then.
            await asyncio.to_thread(
                wait_for, lambda: overflow.done() or _preempted(srv) > 0,
                "the overflowing request to preempt")
            assert _preempted(srv) > 0, "the overflowing request ran without a preemption"
            sem = asyncio.Semaphore(CONCURRENCY)

            async def bounded(plan: Plan) -> None:
                async with sem:
                    await _one(client, plan, statuses, outcomes)

            stop = asyncio.Event()
            tuner = asyncio.create_task(_retune(client, random.Random(1), stop, statuses))
            await asyncio.gather(*(bounded(p) for p in plans))
            stop.set()
            changes = await tuner
            res = await overflow
        assert res.status_code == 200, res.text
        assert [c["finish_reason"] for c in res.json()["choices"]] == ["length"] * OVERFLOW
        assert all(s < 500 for s in statuses), sorted(set(statuses))
        assert changes > 0 and outcomes["aborted"] > 0
        assert outcomes["finished"] + outcomes["aborted"] == NUM_REQUESTS
        # Aborted connections are noticed between iterations; then all is idle.
        state = await asyncio.to_thread(
            _wait_idle_state, srv)
        assert state["requests"] == 0 and state["used"] == 0 and state["waiting"] == 0
        by_reason = _success_by_reason(srv)
        # Every request ended exactly once in the engine's own accounting (the
        # overflow's prompts are a request each).
        assert sum(by_reason.values()) == NUM_REQUESTS + OVERFLOW
        assert by_reason.get("length", 0) >= outcomes["finished"] + OVERFLOW
    finally:
        srv.stop()


def _wait_idle_state(srv: LiveServer) -> dict[str, int]:
    wait_for(lambda: srv.call(lambda e: not e.scheduler.requests),
             what="the engine to go idle")

    def state(e: Any) -> dict[str, int]:
        e.scheduler.check_integrity()
        return {"requests": len(e.scheduler.requests), "used": e.scheduler.kv.num_used_blocks,
                "waiting": e.scheduler.num_waiting}
    return srv.call(state)
