"""What the decode-graph and piecewise-graph tests share (their ``make`` fixture is in
conftest.py): five prompts ending mid-block in a NaN-poisoned cache, and a capture that
keeps nothing alive (as a CUDA graph keeps nothing its capture read)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import pytest
import torch

from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams
from tests.engine.torch_driver import greedy

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
Make = Callable[..., TorchExecutor]


def row(rid: str, tokens: list[int], start: int, table: list[int],
        params: SamplingParams | None = None, sample: bool = True) -> ScheduledSeq:
    return ScheduledSeq(rid, tokens, start, list(table), sample, params or greedy(4), 0)


# Five prompts, most of whose lengths end mid-block (block size 4), so the last block
# holds slots nobody wrote; five rows run as the graph of six, one row padding.
PROMPTS = {"a": (list(range(3, 13)), [5, 9, 2]), "b": (list(range(20, 27)), [7, 1]),
           "c": ([40, 41, 42], [11]), "d": (list(range(50, 58)), [13, 14, 16]),
           "e": ([60], [15])}


def prefilled(ex: TorchExecutor) -> dict[str, int]:
    """Poison the whole cache with NaN, then prefill the five prompts; their first tokens."""
    ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks] = float("nan")
    out = ex.execute(SchedulerOutput(seqs=[row(r, p, 0, t) for r, (p, t) in PROMPTS.items()]))
    return out.sampled


def decode_rows(first: dict[str, int], params: SamplingParams | None = None
                ) -> list[ScheduledSeq]:
    return [row(r, [first[r]], len(p), t, params) for r, (p, t) in PROMPTS.items()]


def forgetful(run: Callable[[], torch.Tensor]) -> tuple[Callable[[], object], torch.Tensor]:
    """A capture that keeps nothing of ``run`` alive, as ``torch.cuda.graph`` keeps nothing
    its capture read: a replay fails once the computation is gone."""
    out = run()
    ref = weakref.ref(run)
    del run

    def replay() -> object:
        alive = ref()
        assert alive is not None, "the captured computation was freed"
        return alive()
    return replay, out


def touched_slots(before: torch.Tensor, after: torch.Tensor) -> set[tuple[int, int]]:
    """The (block, offset) slots whose keys or values differ (NaN equal to NaN)."""
    changed = ~torch.eq(after.nan_to_num(7.0), before.nan_to_num(7.0))
    return {(int(b), int(o)) for b, o in changed.any(dim=(0, 1, 4, 5)).nonzero()}
