"""What a swap's copy costs on CPU: the indexed copy the KV cache used before
(``index_select`` into a fresh tensor, then ``index_copy_``) against its copy now
(``PagedKVCache.swap_out``/``swap_in``: block by block, straight into place), and the
torch executor's guess (``swap_time_per_block_s``, 10 GB/s) that ``swap_timeout_ms`` is
judged by until timed swaps outweigh it.

At SmolLM2-135M's KV shape (30 layers, 3 KV heads, head_dim 64, float32, blocks of 16
tokens: 737,280 bytes a block), with the executor's allocator settings
(``host_memory.keep_freed_memory``), for swaps of 16, 64 and 256 blocks whose ids run in
order or lie scattered over a 600-block pool. The two ways alternate round by round so
a busy machine slows both alike; each figure is the median (and the minimum) over
rounds, in ms, swap-out then swap-in. Every round checks that both ways leave the same
bytes (NaN included) where the blocks land.

    .venv/bin/python benchmarks/swap_copy.py [--rounds 7] [--threads 1]

Ends with ``RESULT out256_indexed_ms=... out256_blocks_ms=... out256_speedup=...
in256_indexed_ms=... in256_blocks_ms=... guess256_ms=... identical=True`` (the
scattered 256-block swaps).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from slopilot.engine.executors.host_memory import keep_freed_memory
from slopilot.engine.executors.kv_cache import PagedKVCache

SHAPE = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "block_size": 16,
         "dtype": torch.float32}
POOL = 600
GUESS_BYTES_PER_S = 10e9  # TorchExecutor.swap_time_per_block_s on CPU


def indexed_out(kv: PagedKVCache, pairs: Sequence[tuple[int, int]]) -> None:
    """The swap-out before 2026-12-06, kept here as the baseline."""
    gpu_ids, cpu_ids = zip(*pairs, strict=True)
    kv.cpu.index_copy_(2, torch.tensor(cpu_ids), kv.gpu.index_select(2, torch.tensor(gpu_ids)))


def indexed_in(kv: PagedKVCache, pairs: Sequence[tuple[int, int]]) -> None:
    cpu_ids, gpu_ids = zip(*pairs, strict=True)
    kv.gpu.index_copy_(2, torch.tensor(gpu_ids), kv.cpu.index_select(2, torch.tensor(cpu_ids)))


Copy = Callable[[PagedKVCache, Sequence[tuple[int, int]]], None]


def timed(copy: Copy, kv: PagedKVCache, pairs: Sequence[tuple[int, int]]) -> float:
    start = time.perf_counter()
    copy(kv, pairs)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    kv = PagedKVCache(num_gpu_blocks=POOL, num_cpu_blocks=POOL, device=torch.device("cpu"),
                      **SHAPE)  # type: ignore[arg-type]
    kv.gpu.normal_()
    kv.gpu[0, 0, :, -1].fill_(float("nan"))  # NaN copied as NaN, bit for bit
    # The host pool is written whole at construction (touch_cpu_blocks=None), as the
    # blocks a serving engine's swaps land in are: every copy timed here is warm.
    block_bytes = PagedKVCache.block_bytes(**SHAPE)  # type: ignore[arg-type]
    identical = True
    result: dict[str, float] = {}
    print(f"{block_bytes:,} bytes a block; threads={args.threads}; ms, median (min)")
    print("| blocks | ids | swap-out indexed | swap-out by block | swap-in indexed "
          "| swap-in by block | guess |")
    print("|---|---|---|---|---|---|---|")
    for n in (16, 64, 256):
        for order in ("in order", "scattered"):
            rng = random.Random(n)
            src = list(range(n)) if order == "in order" else rng.sample(range(POOL), n)
            dst = list(range(n)) if order == "in order" else rng.sample(range(POOL), n)
            out_pairs = list(zip(src, dst, strict=True))
            in_pairs = list(zip(dst, src, strict=True))
            ref = kv.gpu[:, :, src].nan_to_num(7.0)
            times: dict[str, list[float]] = {k: [] for k in ("oi", "ob", "ii", "ib")}
            for r in range(args.rounds):
                ways: list[tuple[str, Copy, Copy]] = [
                    ("i", indexed_out, indexed_in),
                    ("b", PagedKVCache.swap_out, PagedKVCache.swap_in)]
                for tag, out_fn, in_fn in (ways if r % 2 == 0 else ways[::-1]):
                    # Each copy's destination cleared first: a copy that missed shows.
                    kv.cpu[:, :, dst] = 0.0
                    times["o" + tag].append(timed(out_fn, kv, out_pairs))
                    identical &= torch.equal(kv.cpu[:, :, dst].nan_to_num(7.0), ref)
                    kv.gpu[:, :, src] = 0.0
                    times["i" + tag].append(timed(in_fn, kv, in_pairs))
                    identical &= torch.equal(kv.gpu[:, :, src].nan_to_num(7.0), ref)
            med = {k: statistics.median(v) for k, v in times.items()}
            low = {k: min(v) for k, v in times.items()}
            guess = n * block_bytes / GUESS_BYTES_PER_S * 1e3
            cells = " | ".join(f"{med[k]:.1f} ({low[k]:.1f})" for k in ("oi", "ob", "ii", "ib"))
            print(f"| {n} | {order} | {cells} | {guess:.1f} |", flush=True)
            if n == 256 and order == "scattered":
                result = {"out256_indexed_ms": med["oi"], "out256_blocks_ms": med["ob"],
                          "out256_speedup": med["oi"] / med["ob"],
                          "in256_indexed_ms": med["ii"], "in256_blocks_ms": med["ib"],
                          "guess256_ms": guess}
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in result.items())
          + f" identical={identical}")


if __name__ == "__main__":
    main()
