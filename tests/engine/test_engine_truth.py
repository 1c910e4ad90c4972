"""What the engine generates does not depend on what the scheduler does.

The real scheduler drives the torch executor on the seeded tiny Llama, with a KV cache so
small that requests are preempted (recompute and swap) mid-prefill and mid-decode, beside
shared prefixes (ending on a block boundary, one short, one past), P0 arrivals, aborts,
stop tokens, max_tokens filling a block exactly and a live config change. Every request's
tokens must equal that request run alone on a big cache. After every step the block
manager's integrity check holds, blocks are held by running requests only (host blocks by
swapped ones only), and every block the block manager calls free is poisoned with NaN, so
a read of KV that is not the request's own shows; at the end nothing is held.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.executors.loader import LoadedModel
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import Priority, Request, RequestStatus, SamplingParams
from tests.engine.torch_driver import torch_threads

VOCAB_TOP = 250  # prompt ids stay inside the tiny tokenizer's vocabulary


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@dataclass
class Spec:
    rid: str
    prompt: list[int]
    params: SamplingParams
    priority: Priority = Priority.P1
    arrive_at: int = 0


@dataclass
class Run:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    preemptions: int = 0


class _Poisoning:
    """The executor, then NaN into every block the block manager calls free (never-used
    ones too): a later read of them, by anyone, turns that request's logits to NaN."""

    def __init__(self, executor: TorchExecutor) -> None:
        self.executor = executor
        self.engine: LLMEngine | None = None

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        result = self.executor.execute(out)
        assert self.engine is not None
        kv = self.engine.scheduler.kv
        free = kv._free + list(range(kv._next_fresh, kv.num_gpu_blocks))
        if free:
            self.executor.kv_cache.gpu[:, :, torch.tensor(free)] = float("nan")
        return result


def _check_holders(engine: LLMEngine) -> None:
    """Device blocks belong to running requests only, host blocks to swapped ones only:
    a table left behind by a request that stopped running is a leak, even while the
    block counts still add up."""
    sched = engine.scheduler
    running = {r.request_id for r in sched.running}
    swapped = {r.request_id for r in sched._waiting
               if r.status is RequestStatus.PREEMPTED_SWAPPED}
    assert set(sched.kv.tables) == running
    assert set(sched.kv._cpu_tables) == swapped


def run_engine(loaded: LoadedModel, config: EngineConfig, specs: list[Spec], *,
               num_gpu_blocks: int, num_cpu_blocks: int,
               events: dict[int, list[Callable[[LLMEngine], object]]] | None = None) -> Run:
    executor = TorchExecutor(loaded, num_gpu_blocks=num_gpu_blocks,
                             num_cpu_blocks=num_cpu_blocks, block_size=config.block_size,
                             cpu_kernels="torch")
    executor.kv_cache.gpu.fill_(float("nan"))
    poisoning = _Poisoning(executor)
    engine = LLMEngine(config, poisoning, num_gpu_blocks, num_cpu_blocks,
                       executor.swap_time_per_block_s, clock=VirtualClock())
    poisoning.engine = engine
    pending = sorted(specs, key=lambda s: s.arrive_at)
    requests: list[Request] = []
    events = events or {}
    last_event = max(events, default=-1)
    step = 0
    while pending or engine.has_work() or step <= last_event:
        while pending and pending[0].arrive_at <= step:
            spec = pending.pop(0)
            req = Request(spec.rid, list(spec.prompt), spec.params, priority=spec.priority,
                          eos_token_id=executor.eos_token_id)
            engine.add_request(req)
            requests.append(req)
        for event in events.get(step, ()):
            event(engine)
        engine.step()
        engine.scheduler.check_integrity()
        _check_holders(engine)
        step += 1
        assert step < 5000, "the engine stopped making progress"
    kv = engine.scheduler.kv
    kv.begin_step()  # the last swap-ins' host blocks come back at the next step
    assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == num_cpu_blocks
    assert not kv.tables and not engine.scheduler.requests
    return Run({r.request_id: r.output_token_ids for r in requests},
               sum(r.num_preemptions for r in requests))


_ALONE: dict[tuple[tuple[int, ...], SamplingParams, int], list[int]] = {}


def alone(loaded: LoadedModel, spec: Spec, block_size: int) -> list[int]:
    """The request by itself, whole prompt in one chunk, on a cache it cannot fill."""
    key = (tuple(spec.prompt), spec.params, block_size)
    if key not in _ALONE:
        cfg = EngineConfig().with_overrides({"budget_align": 1, "token_budget": 2048,
                                             "chunk_size": 2048, "block_size": block_size})
        solo = Spec(spec.rid, spec.prompt, spec.params)
        _ALONE[key] = run_engine(loaded, cfg, [solo], num_gpu_blocks=2048 // block_size,
                                 num_cpu_blocks=0).outputs[spec.rid]
    return _ALONE[key]


def _workload(rng: random.Random, bs: int, num_requests: int) -> list[Spec]:
    family = [rng.randrange(3, VOCAB_TOP) for _ in range(6 * bs)]
    specs = []
    for i in range(num_requests):
        if i % 2:
            # A shared prefix ending on a block boundary, one token short, one past.
            cut = rng.randint(1, 4) * bs + rng.choice((-1, 0, 1))
            prompt = family[:cut] + [rng.randrange(3, VOCAB_TOP)
                                     for _ in range(rng.randint(0, bs))]
        else:
            prompt = [rng.randrange(3, VOCAB_TOP) for _ in range(rng.randint(1, 150))]
        # Output that ends exactly as a block fills, or not.
        max_tokens = rng.choice((1, 7, bs - len(prompt) % bs or bs,
                                 2 * bs - len(prompt) % bs))
        specs.append(Spec(f"r{i}", prompt,
                          SamplingParams(max_tokens=max_tokens,
                                         ignore_eos=rng.random() < 0.7),
                          rng.choice(list(Priority)), rng.randrange(0, 8)))
    return specs


knobs = st.fixed_dictionaries({
    "token_budget": st.integers(128, 300),
    "chunk_size": st.integers(64, 128),
    "max_num_seqs": st.integers(1, 8),
    "preemption_mode": st.sampled_from(list(PreemptionMode)),
    "recompute_max_tokens": st.sampled_from([0, 40, 65536]),
    "max_preemptions_per_step": st.integers(0, 4),
    "swap_timeout_ms": st.sampled_from([0.0, 10000.0]),
    "p0_preempt_utilization": st.sampled_from([0.0, 0.5, 0.9]),
    "kv_watermark": st.sampled_from([0.0, 0.1]),
    "enable_prefix_caching": st.booleans(),
})
live_knobs = st.fixed_dictionaries({
    "token_budget": st.integers(128, 300),
    "chunk_size": st.integers(64, 128),
    "max_num_seqs": st.integers(1, 8),
    "enable_prefix_caching": st.booleans(),
})


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(knobs=knobs, change=live_knobs, seed=st.integers(0, 2**16),
       block_size=st.sampled_from([8, 16]), num_requests=st.integers(2, 8),
       spare_blocks=st.integers(0, 3), num_cpu_blocks=st.sampled_from([0, 4, 40]),
       change_at=st.integers(0, 40), abort_at=st.integers(0, 40))
def test_greedy_tokens_do_not_depend_on_the_schedule(
        loaded_tiny: LoadedModel, knobs: dict[str, Any], change: dict[str, Any], seed: int,
        block_size: int, num_requests: int, spare_blocks: int, num_cpu_blocks: int,
        change_at: int, abort_at: int) -> None:
    rng = random.Random(seed)
    specs = _workload(rng, block_size, num_requests)
    # The longest request just fits: the cache is that small, so the rest must preempt.
    longest = max(len(s.prompt) + s.params.max_tokens for s in specs)
    num_gpu_blocks = -(-longest // block_size) + spare_blocks
    for k in (knobs, change):
        k["chunk_size"] = min(k["chunk_size"], k["token_budget"])
    config = EngineConfig().with_overrides({"budget_align": 1, "block_size": block_size,
                                            **knobs})
    aborted = specs[-1].rid
    events: dict[int, list[Callable[[LLMEngine], object]]] = {
        change_at: [lambda e: e.scheduler.update_config(e.config.with_overrides(change))],
    }
    events.setdefault(abort_at, []).append(lambda e: e.abort_request(aborted))
    run = run_engine(loaded_tiny, config, specs, num_gpu_blocks=num_gpu_blocks,
                     num_cpu_blocks=num_cpu_blocks, events=events)
    for spec in specs:
        want = alone(loaded_tiny, spec, block_size)
        got = run.outputs[spec.rid]
        if spec.rid == aborted:
            assert got == want[:len(got)], spec.rid
        else:
            assert got == want, spec.rid


@pytest.mark.parametrize("mode", list(PreemptionMode))
def test_p0_arrivals_preempt_mid_chunk_and_mid_decode(loaded_tiny: LoadedModel,
                                                      mode: PreemptionMode) -> None:
    """Three P2s decode until they fill a cache of 12 blocks while a long P1 prefills in
    64-token chunks beside them; P0s arrive all along and push them out (swapped or
    recomputed; auto swaps those past 64 tokens), the P1 mid-chunk and the P2s
    mid-decode, with rows of theirs already scheduled in that step undone. With a stop
    token and seeded sampled requests, every output is as alone, seeded sampling
    included (the sampler draws a request's n-th token from (seed, n), whatever
    preempted it in between)."""
    rng = random.Random(7)
    bs = 16
    prompts = [[rng.randrange(3, VOCAB_TOP) for _ in range(n)]
               for n in (130, 40, 40, 40, 20, 20, 20)]
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    seeded = SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.2, seed=5)
    stop_at = alone(loaded_tiny, Spec("s", prompts[6], greedy), bs)[4]
    stop = SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=frozenset([stop_at]))
    # The three P2s fill the cache as they decode; the long P1 prefills beside them.
    specs = [Spec("long", prompts[0], greedy, Priority.P1, 0),
             Spec("bulk0", prompts[1], greedy, Priority.P2, 0),
             Spec("bulk1", prompts[2], seeded, Priority.P2, 0),
             Spec("bulk2", prompts[3], greedy, Priority.P2, 0),
             Spec("rt0", prompts[4], greedy, Priority.P0, 1),
             Spec("rt1", prompts[5], dataclasses.replace(seeded, seed=11), Priority.P0, 5),
             Spec("stop", prompts[6], stop, Priority.P0, 9)]
    config = EngineConfig().with_overrides({
        "budget_align": 1, "token_budget": 128, "chunk_size": 64, "max_num_seqs": 4,
        "preemption_mode": mode, "recompute_max_tokens": 64,
        "p0_preempt_utilization": 0.0, "kv_watermark": 0.0})
    run = run_engine(loaded_tiny, config, specs, num_gpu_blocks=12, num_cpu_blocks=24)
    assert run.preemptions > 0
    for spec in specs:
        assert run.outputs[spec.rid] == alone(loaded_tiny, spec, bs), spec.rid
    assert len(run.outputs["stop"]) <= 5 and run.outputs["stop"][-1] == stop_at
