"""Builders shared by the engine tests."""

from __future__ import annotations

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.request import Priority, Request, SamplingParams
from slopilot.engine.scheduler import Scheduler
from tests.support.fake_executor import FakeExecutor


def make_request(rid: str, prompt_len: int, max_tokens: int = 4,
                 priority: Priority = Priority.P1, first_token: int = 1000,
                 **sampling: object) -> Request:
    params = SamplingParams(**{"max_tokens": max_tokens, "ignore_eos": True, **sampling})  # type: ignore[arg-type]
    return Request(rid, list(range(first_token, first_token + prompt_len)), params,
                   priority=priority)


def make_scheduler(num_blocks: int = 1000, num_cpu_blocks: int = 0,
                   swap_s_per_block: float = 0.0, **knobs: object) -> Scheduler:
    cfg = EngineConfig().with_overrides({"budget_align": 1, **knobs})
    return Scheduler(cfg, num_blocks, num_cpu_blocks, swap_s_per_block)


def make_engine(num_blocks: int = 1000, num_cpu_blocks: int = 0,
                executor: FakeExecutor | None = None, **knobs: object) -> LLMEngine:
    cfg = EngineConfig().with_overrides({"budget_align": 1, **knobs})
    return LLMEngine(cfg, executor or FakeExecutor(), num_blocks, num_cpu_blocks,
                     clock=VirtualClock())


def step(sched: Scheduler, executor: FakeExecutor | None = None):  # type: ignore[no-untyped-def]
    """One schedule + fake execute + update; returns the SchedulerOutput."""
    out = sched.schedule()
    result = (executor or FakeExecutor()).execute(out)
    sched.update_from_output(out, result)
    return out


def tokens_by_id(out) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {s.request_id: len(s.token_ids) for s in out.seqs}
