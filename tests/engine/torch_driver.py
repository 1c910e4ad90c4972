"""A hand-rolled schedule for driving TorchExecutor in tests, without the real scheduler.

Requests start staggered (so prefills and decodes share iterations), prompts are cut into
chunks smaller than themselves, blocks come from a FIFO free list (so a freed block gets
reused by someone else), and a chosen request can be swapped out and back in with fresh
block ids in between. Freed blocks are poisoned with NaN, so a read of stale KV shows.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams


@dataclass
class _Seq:
    rid: str
    prompt: list[int]
    params: SamplingParams
    start_step: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    output: list[int] = field(default_factory=list)
    cpu_blocks: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.params.max_tokens


@dataclass
class Plan:
    chunk: int = 4
    stagger: int = 2
    # step -> request id to swap out at that step (it is swapped back in one step later).
    swap_out_at: dict[int, str] = field(default_factory=dict)


def generate(executor: TorchExecutor, prompts: list[list[int]], params: list[SamplingParams],
             plan: Plan) -> dict[str, list[int]]:
    bs = executor.block_size
    free = deque(range(executor.num_gpu_blocks))
    free_cpu = deque(range(executor.num_cpu_blocks))
    seqs = [_Seq(f"r{i}", p, sp, i * plan.stagger)
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    swapped: set[str] = set()
    step = 0
    while not all(s.done for s in seqs):
        out = SchedulerOutput()
        for s in seqs:
            if s.rid in swapped:
                s.blocks = [free.popleft() for _ in s.cpu_blocks]
                out.swap_in += list(zip(s.cpu_blocks, s.blocks, strict=True))
                free_cpu.extend(s.cpu_blocks)
                s.cpu_blocks = []
                swapped.discard(s.rid)
        victim = plan.swap_out_at.get(step)
        for s in seqs:
            if s.done or step < s.start_step or s.rid in swapped:
                continue
            if s.rid == victim and s.blocks:
                s.cpu_blocks = [free_cpu.popleft() for _ in s.blocks]
                out.swap_out += list(zip(s.blocks, s.cpu_blocks, strict=True))
                free.extend(s.blocks)
                swapped.add(s.rid)
                continue
            if s.computed < len(s.prompt):
                n = min(plan.chunk, len(s.prompt) - s.computed)
                tokens = s.prompt[s.computed:s.computed + n]
            else:
                n, tokens = 1, [s.output[-1]]
            while len(s.blocks) * bs < s.computed + n:
                s.blocks.append(free.popleft())
            out.seqs.append(ScheduledSeq(
                request_id=s.rid, token_ids=tokens, start_pos=s.computed,
                block_table=s.blocks, sample=s.computed + n >= len(s.prompt) + len(s.output),
                sampling=s.params, num_output_tokens=len(s.output)))
            s.computed += n
        result = executor.execute(out)
        if out.swap_out:
            # Poison what the victim left behind: only the host copy may be read back.
            gone = torch.tensor([g for g, _ in out.swap_out])
            executor.kv_cache.gpu[:, :, gone] = float("nan")
        for s in seqs:
            if s.rid in result.sampled:
                s.output.append(result.sampled[s.rid])
                if s.done:
                    free.extend(s.blocks)
                    s.blocks = []
        step += 1
    return {s.rid: s.output for s in seqs}


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with n intra-op threads: on a small shared CPU, busy neighbours make OpenMP
    barriers spin, and one thread per test process is several times faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def hf_greedy(hf_model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Reference greedy decoding with transformers' own KV cache, EOS ignored."""
    out: list[int] = []
    past = None
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(max_tokens):
            res = hf_model(input_ids=ids, cache=past, use_cache=True)
            past = res.cache
            out.append(int(res.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def save_hf_checkpoint(hf_model: torch.nn.Module, path: Path) -> Path:
    """save_pretrained plus the tiny byte-level tokenizer, which the loader requires."""
    from slopilot.engine.executors.tiny_random import build_tokenizer

    hf_model.save_pretrained(str(path))  # type: ignore[operator]
    build_tokenizer().save(str(path / "tokenizer.json"))
    return path
