"""The shapes a decode graph is captured at, without torch: the executor captures them
(``decode_graphs.py``) and the twin's shape features pad a replayed pass to them
(``sim/shape.py``), so both count the same rows and context.

Batch sizes step by at most 1.5x (1, 2, 3, 4, 6, 8, 12, ...), so a batch pads at most a
third of its rows; widths likewise from 32 tokens (32, 48, 64, 96, ...), each a whole
number of blocks, the last one the model's context.
"""

from __future__ import annotations

# The largest decode batch captured as a CUDA graph (vLLM's default stops at 512; a small
# model's decode is launch-bound well past 256 rows anyway). A ``cuda-graphs`` profile's
# twin replays decode-only batches up to this size, as the executor does.
GRAPH_MAX_BATCH = 256
# The smallest width bucket, in context tokens (rounded up to the block size).
_MIN_WIDTH = 32


class GraphShapeError(ValueError):
    """An impossible graph shape setting; the message names it and the fix."""


def _next(size: int) -> int:
    # 1, 2, 3, then alternately x4/3 and x3/2: 4, 6, 8, 12, ...; and 32, 48, 64, 96, ...
    if size < 3:
        return size + 1
    return size * 4 // 3 if size % 3 == 0 else size * 3 // 2


def batch_buckets(limit: int) -> list[int]:
    """Batch sizes captured: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... up to ``limit`` (included)."""
    if limit < 1:
        raise GraphShapeError(f"max_graph_batch={limit}: must be >= 1")
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(_next(sizes[-1]))
    return sizes[:-1] + [limit]


def width_buckets(limit: int, block_size: int) -> list[int]:
    """Context widths captured: 32, 48, 64, 96, ... each rounded up to whole blocks, the
    last one ``limit`` rounded up."""
    def aligned(n: int) -> int:
        return -(-n // block_size) * block_size

    top = aligned(limit)
    widths: list[int] = []
    width = _MIN_WIDTH
    while aligned(width) < top:
        if not widths or aligned(width) > widths[-1]:
            widths.append(aligned(width))
        width = _next(width)
    return widths + [top]


def padded_rows(rows: int) -> int:
    """The batch bucket ``rows`` decodes replay at (up to ``GRAPH_MAX_BATCH``)."""
    size = 1
    while size < rows:
        size = _next(size)
    return size


def padded_width(context: int) -> int:
    """The width bucket of a replayed pass whose longest row holds ``context`` tokens
    (a width past the model's context is capped there by the executor, not here)."""
    width = _MIN_WIDTH
    while width < context:
        width = _next(width)
    return width
