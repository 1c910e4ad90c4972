"""Host time to build one decode graph replay's inputs, against the eager pass's.

A replayed decode iteration on a GPU costs one replay (3.6 ms for 8 rows on the H200,
docs/benchmarks.md) plus the host work that fills its input buffer: token ids,
positions, new slots, lengths and every row's block table padded to the graph's width.
That host work grows with rows x blocks, so at 256 rows it is a share of the iteration
worth measuring. This script times it on the tiny model (the inputs do not depend on
the model's size, only on rows, context and block size) beside the eager decode pass's
own batch building (``build_batch``) for the same rows, both in one process.

    .venv/bin/python benchmarks/graph_inputs.py [--context 1000] [--repeats 7]

Ends with ``RESULT graph_inputs_us_r8=... eager_batch_us_r8=... ... eager_batch_us_r256=...``
(median microseconds per iteration over the repeats). Run it at two commits to compare
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from slopilot.engine.executors.batch import build_batch
from slopilot.engine.executors.loader import load_checkpoint
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.models import fetch_model
from slopilot.engine.outputs import ScheduledSeq
from slopilot.engine.request import SamplingParams

ROWS = (8, 32, 256)
BLOCK = 16


def rows(n: int, context: int, num_blocks: int) -> list[ScheduledSeq]:
    """``n`` decode rows of ``context`` tokens each, with disjoint block tables."""
    per_row = -(-(context + 1) // BLOCK)
    params = SamplingParams(max_tokens=4)
    return [ScheduledSeq(f"r{i}", [7], context,
                         [(i * per_row + j) % num_blocks for j in range(per_row)],
                         True, params, 0) for i in range(n)]


def timed(fn: object, loops: int) -> float:
    """Microseconds per call of ``fn``, over ``loops`` calls."""
    assert callable(fn)
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - start) / loops * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=1000, help="tokens per row (default 1000)")
    ap.add_argument("--repeats", type=int, default=7, help="rounds; the median is kept")
    ap.add_argument("--loops", type=int, default=200, help="calls per round")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        model = load_checkpoint(fetch_model("tiny-random", Path(cache)))
    blocks = max(ROWS) * -(-(args.context + 1) // BLOCK) + 1
    ex = TorchExecutor(model, num_gpu_blocks=blocks, num_cpu_blocks=1, block_size=BLOCK,
                       max_model_len=max(2048, args.context + 1), decode_graphs="padded")
    graphs = ex.decode_graphs
    assert graphs is not None
    figures: dict[str, float] = {}
    for n in ROWS:
        seqs = rows(n, args.context, ex.num_gpu_blocks)
        shape = graphs.shape_for(seqs)
        assert shape is not None, f"{n} rows of {args.context} tokens take no graph"

        def graph_inputs(seqs: list[ScheduledSeq] = seqs,
                         shape: tuple[int, int] = shape) -> None:
            graphs.stage_inputs(seqs, *shape)

        def eager(seqs: list[ScheduledSeq] = seqs) -> None:
            build_batch(seqs, block_size=BLOCK, num_blocks=ex.num_gpu_blocks,
                        max_model_len=ex.max_model_len, device=ex.device)

        g = statistics.median(timed(graph_inputs, args.loops) for _ in range(args.repeats))
        e = statistics.median(timed(eager, args.loops) for _ in range(args.repeats))
        figures[f"graph_inputs_us_r{n}"] = g
        figures[f"eager_batch_us_r{n}"] = e
        print(f"{n:4d} rows x {args.context} tokens: graph inputs {g:8.1f} us, "
              f"eager batch {e:8.1f} us")
    print("RESULT " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
