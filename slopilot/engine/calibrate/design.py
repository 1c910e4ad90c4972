"""The designed set of iteration shapes calibration times.

Each feature of the cost model must vary on its own somewhere in the grid, or the fit
cannot tell it from another (an identifiable design):

    prefill    one chunk of 16 .. token_budget tokens at several contexts; every other
               context's chunks do not sample (``sampled`` apart from ``prefill_seqs``)
    multi      several chunks in one batch (``prefill_seqs`` apart from ``tokens``)
    decode     1 .. max_num_seqs decodes at several equal contexts
    ragged     decodes of short and long contexts together, as serving batches them
               (``decode_padded_context`` apart from ``decode_context``)
    mixed      a chunk plus decodes, as chunked prefill runs them
    large      many decodes (half to all of max_num_seqs) of ragged contexts spread up to
               a long one (half to all of max_context), as a server near saturation
               runs them: their padded K/V outgrows the cache (``decode_spill``)
    large mixed  a chunk at some context with such a decode batch
    multi mixed  several chunks at different contexts with ragged decodes, filling the
               budget: what chunked prefill runs near saturation (prompt heads and
               tails queued behind each other); ``prefill_seqs`` and the attention
               terms as they are served, not only one chunk at a time
    swap       KV blocks copied out and in without a forward pass

Context lengths are fractions of ``max_context``; no row goes past it and no batch past
the token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.engine.sim.shape import IterationShape, shape_of_rows


class DesignError(ValueError):
    """Grid options out of range; the message names the option and the fix."""


@dataclass(frozen=True)
class ShapeSpec:
    """One iteration to time: ``(new_tokens, context, samples)`` rows, and swaps."""

    rows: tuple[tuple[int, int, bool], ...]
    group: str
    swap_out: int = 0
    swap_in: int = 0

    @property
    def shape(self) -> IterationShape:
        """The shape without a cache knee (no ``decode_spill``)."""
        return shape_of_rows(self.rows, self.swap_out, self.swap_in)

    def shape_at(self, knee: int | None, graph_batch: int | None = None) -> IterationShape:
        """The shape with ``decode_spill`` beyond ``knee`` padded KV tokens, on a device
        replaying decode batches of up to ``graph_batch`` rows from CUDA graphs."""
        return shape_of_rows(self.rows, self.swap_out, self.swap_in, knee=knee,
                             graph_batch=graph_batch)

    @property
    def kind(self) -> str:
        return self.shape.kind

    def describe(self) -> str:
        if not self.rows:
            return f"swap out {self.swap_out} in {self.swap_in} blocks"
        decodes = [c for n, c, _ in self.rows if n == 1]
        chunks = [(n, c, s) for n, c, s in self.rows if n > 1]
        parts = [f"chunk {n}@{c}{'' if s else ' (no sample)'}" for n, c, s in chunks]
        if decodes:
            lo, hi = min(decodes), max(decodes)
            ctx = f"{lo}" if lo == hi else f"{lo}..{hi}"
            parts.append(f"{len(decodes)} decode{'s' if len(decodes) > 1 else ''}@{ctx}")
        return " + ".join(parts)


@dataclass(frozen=True)
class GridOptions:
    token_budget: int = 512
    max_num_seqs: int = 32
    max_context: int = 1024
    quick: bool = False
    swap: bool = True

    def __post_init__(self) -> None:
        if not 128 <= self.token_budget <= 16384:
            raise DesignError(f"--token-budget {self.token_budget}: expected 128 to 16384 "
                              "(the engine's token_budget range)")
        if not 2 <= self.max_num_seqs <= 4096:
            raise DesignError(f"--max-num-seqs {self.max_num_seqs}: expected 2 to 4096")
        if not 64 <= self.max_context <= 1 << 20:
            raise DesignError(f"--max-context {self.max_context}: expected at least 64")
        if self.token_budget > self.max_context:
            raise DesignError(
                f"--token-budget {self.token_budget} exceeds --max-context "
                f"{self.max_context}; a chunk cannot be longer than the context")


def _geometric(lo: int, hi: int, points: int | None = None) -> list[int]:
    """Powers of two from lo to hi, hi included; thinned to ``points`` when given."""
    out = []
    v = lo
    while v < hi:
        out.append(v)
        v *= 2
    out.append(hi)
    if points is not None and len(out) > points:
        step = (len(out) - 1) / (points - 1)
        out = [out[round(i * step)] for i in range(points)]
    return sorted(set(out))


def design(opts: GridOptions) -> list[ShapeSpec]:
    """The shapes to time, in a fixed order (the harness shuffles repeats itself)."""
    budget, seqs, ctx_max = opts.token_budget, opts.max_num_seqs, opts.max_context
    quick = opts.quick
    chunks = _geometric(16, budget, 4 if quick else None)
    fractions = (0.0, 0.25, 0.5) if quick else (0.0, 0.125, 0.25, 0.5)
    contexts = [int(ctx_max * f) for f in fractions]
    batch_sizes = _geometric(1, seqs, 4 if quick else None)
    out: list[ShapeSpec] = []
    for i, c in enumerate(contexts):
        for n in chunks:
            if c + n <= ctx_max:
                out.append(ShapeSpec(((n, c, i % 2 == 0),), "prefill"))
    # Several chunks, and (below) chunks with decodes: only these tell a forward pass's
    # constant apart from each attention call's, so there are enough to outvote noise.
    multi = ((2, 32, 0), (2, budget // 4, 0), (4, max(16, budget // 8), contexts[-1] // 2))
    for k, n, c in multi[1:] if quick else multi:
        out.append(ShapeSpec(tuple((n, c, j % 2 == 0) for j in range(k)), "multi"))
    decode_contexts = [max(16, c) for c in contexts]
    for c in decode_contexts:
        for d in batch_sizes:
            if d <= budget:
                out.append(ShapeSpec(((1, c, True),) * d, "decode"))
    # Serving's decode batches are ragged: one long context pads all the others. Only
    # these shapes tell decode_padded_context from decode_context, so there are many:
    # half long, and one long among short ones, at two long lengths.
    short = 16
    longs = (max(16, ctx_max // 2),) if quick else (max(16, ctx_max // 4), max(16, ctx_max // 2))
    sizes = [d for d in batch_sizes if d >= 2]
    for long in longs:
        for d in sizes:
            half = tuple((1, long if j % 2 else short, True) for j in range(d))
            out.append(ShapeSpec(half, "ragged"))
            if d >= 4:
                one = ((1, long, True),) + ((1, short, True),) * (d - 1)
                out.append(ShapeSpec(one, "ragged"))
    mixed_chunks = (16, budget // 2) if quick else (16, 64, budget // 2)
    mixed_decodes = (1, max(2, seqs // 2)) if quick else (1, 4, max(4, seqs // 2))
    decode_ctx = max(16, ctx_max // 4)
    for n in mixed_chunks:
        for d in mixed_decodes:
            if n + d <= budget:
                rows = ((n, 0, True),) + ((1, decode_ctx, True),) * d
                out.append(ShapeSpec(rows, "mixed"))
    if not quick:
        out.append(ShapeSpec(((64, contexts[2], True),) + ((1, decode_ctx, True),) * 4,
                             "mixed"))
    out.extend(_large(opts))
    out.extend(_multi_mixed(opts))
    if opts.swap:
        # Two block counts, so a copy call's fixed cost is apart from its per-block one.
        for k_out, k_in in ((4, 16),) if quick else ((4, 4), (32, 32)):
            out.append(ShapeSpec((), "swap", swap_out=k_out))
            out.append(ShapeSpec((), "swap", swap_in=k_in))
    return out


def _spread(d: int, longest: int) -> tuple[tuple[int, int, bool], ...]:
    """d decodes whose contexts run evenly from 16 to ``longest`` (ragged, as served)."""
    lo = min(16, longest)
    return tuple((1, lo + (longest - lo) * j // max(1, d - 1), True) for j in range(d))


def _multi_mixed(opts: GridOptions) -> list[ShapeSpec]:
    """k chunks of the budget's k-th part or less, at contexts from 0 to half the
    longest, beside a ragged decode batch: near saturation most iterations are these,
    and a fit on one chunk at a time prices their attention calls wrong (the served
    iterations with 3-5 chunks read 10-13 % over the profile before this group)."""
    budget, seqs, ctx_max = opts.token_budget, opts.max_num_seqs, opts.max_context
    spots = (0, ctx_max // 8, ctx_max // 4, ctx_max // 2)
    out = []
    for k, share, decodes in ((2, 2, 4), (3, 2, 8), (4, 2, 16), (2, 4, 16), (3, 4, 4),
                              (4, 4, 8)):
        if opts.quick and (k, share) not in ((2, 2), (4, 4)):
            continue
        n = max(16, budget // (k * share))
        d = min(decodes, seqs)
        chunks = tuple((n, spots[j], j % 2 == 0) for j in range(k)
                       if spots[j] + n <= ctx_max)
        if len(chunks) < 2 or n * len(chunks) + d > budget:
            continue
        out.append(ShapeSpec(chunks + _spread(d, max(16, ctx_max // 2)), "multi mixed"))
    return out


def _large(opts: GridOptions) -> list[ShapeSpec]:
    """Near saturation a server runs many decodes of ragged, long contexts, whose padded
    K/V (decodes x the longest) is the largest the grid times; without these the fit
    extrapolates the padded-attention terms into the cache-bound regime."""
    seqs, ctx_max, budget = opts.max_num_seqs, opts.max_context, opts.token_budget
    counts = sorted({max(2, seqs // 2), seqs} if opts.quick
                    else {max(2, seqs // 2), max(2, 3 * seqs // 4), seqs})
    fractions = (0.5, 1.0) if opts.quick else (0.5, 0.75, 0.875, 1.0)
    longest = sorted({max(16, int(ctx_max * f)) - 1 for f in fractions})
    out = [ShapeSpec(_spread(d, c), "large") for d in counts for c in longest]
    n = max(16, budget // 4)
    chunk_ctx = ctx_max // 4 if n + ctx_max // 4 <= ctx_max else 0
    mixed_counts = (seqs,) if opts.quick else (max(2, seqs // 2), seqs)
    mixed_longest = longest[::2] + longest[-1:] if opts.quick else longest[-2:]
    for d in mixed_counts:
        if n + d > budget:
            continue
        for c in sorted(set(mixed_longest)):
            out.append(ShapeSpec(((n, chunk_ctx, True),) + _spread(d, c), "large mixed"))
    return out
