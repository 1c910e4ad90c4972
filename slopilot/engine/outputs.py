"""Plain data that crosses the scheduler / executor boundary.

The scheduler hands an executor a ``SchedulerOutput``; the executor answers with a
``ModelRunnerOutput``. Nothing else crosses: no request objects, no callbacks, so the
scheduler can be driven by fake outputs in tests and by a cost model in simulation.

Token layout of one scheduled row (block_size 4, a chunk of 5 tokens at position 6)::

    positions   0 1 2 3 | 4 5 6 7 | 8 9 10 11
    blocks      [  b7   ] [  b2   ] [  b9     ]
    computed    x x x x   x x
    this row                  ^ ^   ^ ^ ^       start_pos=6, len(token_ids)=5
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slopilot.engine.request import SamplingParams, TokenLogprobs


@dataclass(slots=True)
class ScheduledSeq:
    """One request's work in one iteration: a prefill chunk or a single decode token."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    # GPU block ids covering positions [0, start_pos + len(token_ids)); read-only for
    # the executor (it is the block manager's own list, not a copy).
    block_table: list[int]
    # True when this row ends at the request's last known token, so it samples.
    sample: bool
    sampling: SamplingParams
    # Tokens generated so far (for seeded sampling offsets and repetition state).
    num_output_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_prefill(self) -> bool:
        return len(self.token_ids) > 1 or not self.sample


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # (gpu_block, cpu_block) pairs to copy out before the forward pass.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    # (cpu_block, gpu_block) pairs to copy in before the forward pass.
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Requests whose per-request executor state (sampler RNGs) can be dropped.
    finished_ids: list[str] = field(default_factory=list)
    num_preempted_recompute: int = 0
    num_preempted_swap: int = 0
    # Running requests that got no KV room this iteration (preemption not allowed).
    num_stalled: int = 0
    # Rarely used, so kept off the rows (a decode row is built for every running
    # request on every step): the (prompt, output) token lists of rows whose sampling
    # has penalties (the scheduler's own lists: read-only), and for rows that want
    # prompt logprobs, the prompt tokens their positions predict: those at start_pos + 1,
    # start_pos + 2, ... (a chunk's last position may predict the next chunk's first).
    histories: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    prompt_logprob_targets: dict[str, list[int]] = field(default_factory=dict)
    # Set by the engine loop: this iteration starts after the engine sat idle (its
    # caches cold, a GPU's clocks down), which the calibrated cost model charges.
    after_idle: bool = False
    # Set by the engine loop: the knee of the ``decode_spill`` feature (padded decode KV
    # tokens that fill the device's last-level cache), or None where there is none.
    decode_knee: int | None = None
    # Set by the engine loop: the largest decode-only batch the executor replays from a
    # CUDA graph (the ``eager_passes`` feature), or None where it replays none.
    graph_batch: int | None = None
    # The iteration's shape features (``sim.shape.features_of``), computed once for all
    # who ask on this iteration: a calibrated cost model, the metrics, a twin's check.
    shape_features: tuple[float, ...] | None = None
    # Set by ``Scheduler.update_from_output``: what vLLM's iteration_tokens_total
    # observes of this iteration, the tokens it made and, of each request whose first
    # token it made, the prompt less its prefix-cache hit (a chunked prefill counts
    # whole where it ends; its earlier chunks, nowhere).
    vllm_iteration_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.seqs and not self.swap_out and not self.swap_in


@dataclass(slots=True)
class ModelRunnerOutput:
    # request_id -> sampled token, for every row with sample=True.
    sampled: dict[str, int]
    # Wall time the iteration took (measured) or would take (cost model), seconds.
    elapsed_s: float = 0.0
    # Of that, the seconds its swap-out and swap-in copies took (timed around the copies,
    # a CUDA stream synchronized; the simulated executor's: its cost model's), or None
    # where there were none or the executor does not time them. The scheduler exports
    # them and judges the next victim's swap by them (``swap_cost.py``).
    swap_out_s: float | None = None
    swap_in_s: float | None = None
    # request_id -> the sampled token's logprobs, for rows whose sampling asks for them.
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # request_id -> one entry per token of its ``prompt_logprob_targets``, in order.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
