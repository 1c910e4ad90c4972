"""The shape of one iteration: the handful of sums an iteration's time depends on.

Three places read an iteration's shape and must agree on it exactly: the calibrated cost
model (time = coefficients . features), the calibration fit (the same features measured
on the real executor), and the engine's ``slopilot_iteration_*`` series (the features
summed over a scrape window, so a controller can compare a twin with live iterations
and refit it). They all call ``shape_of`` on a ``SchedulerOutput`` or ``shape_of_rows``
on ``(new tokens, context, samples)`` rows.

One scheduled row is a decode (one new token) or a prefill chunk (n > 1 new tokens after
c cached ones; it samples only when it ends the prompt)::

    row          c cached     n new       reads           attention pairs (causal / dense)
    decode       c            1           c + 1 KV        c + 1
    chunk        c            n           c + n KV        n * c + n * (n + 1) / 2  /  n * (c + n)

Features (one coefficient each, seconds per unit; ``FEATURES`` fixes their order):

    iteration               1 per forward pass: launches, weight streaming, Python per step
    eager_passes            1 per forward pass that a device replaying decode graphs runs
                            eagerly (a prefill chunk in it, or more decodes than its largest
                            graph): on such a device a decode-only pass is one graph launch,
                            and an eager one pays for its ~800-1,400 kernel launches
    tokens                  new tokens: linear layers, norms, RoPE, KV writes
    tokens_past_knee        new tokens beyond the first ``GEMM_KNEE_TOKENS`` (8): a linear
                            layer over a few rows is bound by reading its weights, which
                            the first row pays and the next few ride along with; past
                            the knee each row adds its own multiply (on this project's CPU
                            1 to 8 decodes cost 17.1 to 20.5 ms, 8 to 32 about 1 ms each)
    sampled                 rows that sample: LM head rows and the sampler
    decode_seqs             decode rows: per-row bookkeeping
    decode_batches          1 when there are decodes: they share one batched attention
                            call per layer, a fixed cost of its own (inside a graph
                            replay it has none: counted in eager passes only there)
    prefill_seqs            prefill chunks: each runs its own attention call per layer
    decode_context          sum of KV tokens decodes read
    decode_width            the batched attention's width: the longest decode's context
                            (a graph replay: its graph's width). A few rows cannot fill a
                            GPU, and each runs its keys in sequence: there the call takes
                            as long as its longest row, whatever the rows' count
    decode_padded_context   decodes x the longest decode's context: a padded batched
                            attention reads and multiplies this many (a graph replay:
                            its graph's rows x width, ``executors/graph_shapes.py``)
    decode_spill            padded KV tokens beyond the knee (``decode_padded_context -
                            knee`` when positive): the decodes' gathered keys and values
                            of one layer no longer fit the last-level cache, so the
                            attention streams them from DRAM and each token costs more
    prefill_context         sum of KV tokens chunks read
    prefill_attention       sum of (query, key) pairs of chunks: causal attention FLOPs,
                            what a kernel that skips the masked half computes
    prefill_attention_dense sum of n * (c + n): the whole score matrix, what a kernel
                            that materialises it and masks (torch's math path) computes
    swap_batches            1 for swapping out and 1 for swapping in: a copy call each
    swap_blocks             KV blocks copied out to or in from host memory
    idle_starts             1 when the iteration starts after the engine sat idle: code
                            and data caches others filled meanwhile, a GPU's clocks down
                            (the engine loop sets ``SchedulerOutput.after_idle``)

Whether a device replays decode graphs, and up to which batch, is not fitted either: the
profile records it (``device.kernels: cuda-graphs``), the engine loop puts the executor's
largest graph batch on ``SchedulerOutput.graph_batch`` and the simulator the profile's, so
``eager_passes`` is 0 everywhere else (a CPU, an eager CUDA engine, a datasheet roofline).
A graph is also skipped for a batch whose padded context outgrows its memory bound or
that wants prompt logprobs; the feature does not see those rare passes.

The knee of ``decode_spill`` is not fitted: it is the device's last-level cache over one
layer's K and V bytes per token (``decode_knee_tokens``), so the engine (which knows its
model and its device), the simulator (from the profile's ``device.cache_bytes``) and the
calibration fit compute the same feature per iteration; a live correction can then
refit its coefficient from window sums like any other. The engine loop puts the knee on
``SchedulerOutput.decode_knee``; no knee (an old profile, a datasheet roofline) means no
spill.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, fields
from operator import add

from slopilot.engine.executors.graph_shapes import padded_rows, padded_width
from slopilot.engine.outputs import SchedulerOutput

FEATURES: tuple[str, ...] = (
    "iteration", "eager_passes", "tokens", "tokens_past_knee", "sampled", "decode_seqs",
    "decode_batches", "prefill_seqs", "decode_context", "decode_width", "decode_padded_context",
    "decode_spill", "prefill_context", "prefill_attention", "prefill_attention_dense",
    "swap_batches", "swap_blocks", "idle_starts")

# Bump when a feature's meaning changes; profiles carry the version and the hash of the
# feature definitions they were fitted on (an older one gets a warning).
# v2: decode_spill (padded decode KV beyond the last-level cache).
# v3: eager_passes (decode-only passes replayed from CUDA graphs), decode_batches counted
# in eager passes only on such a device, decode_width (a batched attention's longest row).
# v4: tokens_past_knee (a pass's rows past the first few cost more than those within).
FORM_VERSION = 4
# Not fitted, and the same on every device, so that the engine, the simulator and the
# fit compute the feature alike with nothing to stamp: the knee that fitted best in a scan
# of this project's CPU samples (benchmarks/form_gemm_knee.py: 2.9 % -> 1.8 % mean fit
# error, decodes 4.7 % -> 1.6 %). Where rows cost alike on either side (a launch-bound
# GPU) the fit leaves the feature at 0.
GEMM_KNEE_TOKENS = 8
FORM_NAME = "linear-shape-features"


def form_hash() -> str:
    """A short digest of the form: its name, version and the feature list, in order."""
    text = f"{FORM_NAME}:{FORM_VERSION}:{','.join(FEATURES)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class IterationShape:
    """The sums of one iteration (or, added up, of many); see the module docstring."""

    iteration: float = 0
    eager_passes: float = 0
    tokens: float = 0
    tokens_past_knee: float = 0
    sampled: float = 0
    decode_seqs: float = 0
    decode_batches: float = 0
    prefill_seqs: float = 0
    decode_context: float = 0
    decode_width: float = 0
    decode_padded_context: float = 0
    decode_spill: float = 0
    prefill_context: float = 0
    prefill_attention: float = 0.0
    prefill_attention_dense: float = 0
    swap_batches: float = 0
    swap_blocks: float = 0
    idle_starts: float = 0

    @property
    def prefill_tokens(self) -> float:
        return self.tokens - self.decode_seqs

    @property
    def context_tokens(self) -> float:
        """KV tokens read, decodes and chunks together."""
        return self.decode_context + self.prefill_context

    @property
    def kind(self) -> str:
        """``decode``, ``prefill``, ``mixed`` or ``swap`` (only copies ran)."""
        if self.decode_seqs and self.prefill_seqs:
            return "mixed"
        if self.decode_seqs:
            return "decode"
        if self.prefill_seqs:
            return "prefill"
        return "swap"

    def vector(self) -> tuple[float, ...]:
        """The features in ``FEATURES`` order."""
        return (self.iteration, self.eager_passes, self.tokens, self.tokens_past_knee,
                self.sampled, self.decode_seqs,
                self.decode_batches, self.prefill_seqs, self.decode_context,
                self.decode_width, self.decode_padded_context, self.decode_spill,
                self.prefill_context, self.prefill_attention, self.prefill_attention_dense,
                self.swap_batches, self.swap_blocks, self.idle_starts)

    def __add__(self, other: IterationShape) -> IterationShape:
        return IterationShape(*map(add, self.vector(), other.vector()))


if tuple(f.name for f in fields(IterationShape)) != FEATURES:  # pragma: no cover
    raise RuntimeError("IterationShape's fields must be FEATURES, in order")

KINDS: tuple[str, ...] = ("decode", "prefill", "mixed", "swap")


def decode_knee_tokens(cache_bytes: int | None, kv_bytes_per_layer_token: int) -> int | None:
    """Padded decode KV tokens whose one layer's K and V fill ``cache_bytes``: the knee
    of ``decode_spill``. None (no spill term) when the cache size is unknown."""
    if cache_bytes is None or cache_bytes <= 0 or kv_bytes_per_layer_token <= 0:
        return None
    return max(1, cache_bytes // kv_bytes_per_layer_token)


def shape_of_rows(rows: Iterable[tuple[int, int, bool]], swap_out: int = 0,
                  swap_in: int = 0, after_idle: bool = False,
                  knee: int | None = None, graph_batch: int | None = None) -> IterationShape:
    """The shape of one iteration from ``(new_tokens, context_before, samples)`` rows,
    the numbers of blocks swapped out and in, whether the engine was idle before, the
    knee of ``decode_spill`` (None: no spill) and the largest decode batch the device
    replays from a graph (None: it replays none)."""
    return IterationShape(*feature_sums(rows, swap_out, swap_in, after_idle, knee,
                                        graph_batch))


def feature_sums(rows: Iterable[tuple[int, int, bool]], swap_out: int = 0,
                 swap_in: int = 0, after_idle: bool = False,
                 knee: int | None = None, graph_batch: int | None = None
                 ) -> tuple[float, ...]:
    """``shape_of_rows(...).vector()`` without building the dataclass (the hot path)."""
    tokens = sampled = decodes = chunks = 0
    d_ctx = d_max = p_ctx = dense = 0
    pairs = 0.0
    for n, c, sample in rows:
        if n < 1 or c < 0:
            raise ValueError(f"row (new_tokens={n}, context={c}): expected new_tokens >= 1 "
                             "and context >= 0")
        tokens += n
        sampled += sample
        if n == 1:  # the executor batches every one-token row as a decode
            decodes += 1
            d_ctx += c + 1
            if c + 1 > d_max:
                d_max = c + 1
        else:
            chunks += 1
            p_ctx += c + n
            pairs += n * c + n * (n + 1) / 2
            dense += n * (c + n)
    eager = 1 if graph_batch is not None and tokens and (chunks or decodes > graph_batch) \
        else 0
    width = d_max
    if graph_batch is not None and decodes and not eager:
        # A replayed pass attends over its graph's padded rows and width.
        width = padded_width(d_max)
        padded = padded_rows(decodes) * width
    else:
        padded = decodes * d_max
    spill = padded - knee if knee is not None and padded > knee else 0
    decode_batch = 1 if decodes and (eager or graph_batch is None) else 0
    return (1 if tokens else 0, eager, tokens, max(tokens - GEMM_KNEE_TOKENS, 0), sampled,
            decodes, decode_batch, chunks,
            d_ctx, width, padded, spill, p_ctx, pairs, dense,
            (1 if swap_out else 0) + (1 if swap_in else 0), swap_out + swap_in,
            1 if after_idle else 0)


def output_rows(out: SchedulerOutput) -> list[tuple[int, int, bool]]:
    return [(len(s.token_ids), s.start_pos, s.sample) for s in out.seqs]


def features_of(out: SchedulerOutput) -> tuple[float, ...]:
    """``shape_of(out).vector()``. The rows' sums are computed on the first call of an
    iteration and kept on ``out`` (with ``out.decode_knee`` and ``out.graph_batch``, which
    the engine sets before anyone asks); ``idle_starts`` (the last feature) is read from
    ``out.after_idle`` on every call, since the engine sets it after scheduling."""
    features = out.shape_features
    if features is None:
        features = out.shape_features = feature_sums(
            output_rows(out), len(out.swap_out), len(out.swap_in), knee=out.decode_knee,
            graph_batch=out.graph_batch)
    return features[:-1] + (1,) if out.after_idle else features


def shape_of(out: SchedulerOutput) -> IterationShape:
    """The shape of the iteration a scheduler planned."""
    return IterationShape(*features_of(out))
