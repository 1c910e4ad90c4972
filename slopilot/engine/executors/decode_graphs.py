"""Decode iterations replayed from CUDA graphs: one launch instead of ~800.

On a CUDA device a decode iteration of a small model is hundreds of small kernels (808
for SmolLM2-135M), and each launch costs 10-17 us of host time: on the H200 VM of
docs/benchmarks.md a decode of 8 rows took 14 ms with the GPU 0-22 % busy, and the same
shape took 11 or 28 ms from one stretch of a run to the next as the host's state moved.
A CUDA graph captured once per padded batch shape replays the whole forward pass in one
launch, so the GPU's time, not the host's, is the iteration's (vLLM and SGLang capture
their decode batches the same way): there 8 rows then took 3.6 ms against 31 ms eager.

A graph fixes every tensor's shape and address, so a batch of ``D`` single-token rows
whose longest context is ``L`` runs as the graph of ``(B, W)``: ``B`` the smallest batch
bucket >= D, ``W`` the smallest width bucket >= L (a multiple of the block size). Its
inputs live in one int64 buffer, filled by one host-to-device copy per iteration::

    | token ids [B] | positions [B] | new slots [B] | context lengths [B] | block tables [B, W/bs] |

Inside the graph each row's context slots come from its block table (``block * bs +
offset``); a column at or past the row's length reads the scratch slot instead, so no
masked column ever reads a slot nobody wrote (only a finite value keeps a zero weight a
zero). Padding rows decode token 0 at position 0 into the cache's scratch block, past the
block manager's blocks (``PagedKVCache(scratch_blocks=1)``), and are never sampled.

Only iterations in which every row has one new token run here; a prefill chunk, a prompt
logprob request, or a batch past the limits runs the eager forward pass. A shape is
captured once, on first use (a capture costs three eager passes) or ahead of serving
(``capture_all``: a server captures what its batch limit can reach before it serves, so
no request pays for one); all graphs share one memory pool and one logits buffer, as they
replay one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from slopilot.engine.executors.batch import (
    AttentionBatch,
    block_matrix,
    check_block_ids,
    row_blocks,
)
from slopilot.engine.executors.graph_shapes import (
    GRAPH_MAX_BATCH,
    GraphShapeError,
    batch_buckets,
    width_buckets,
)
from slopilot.engine.executors.kernels import ATTENTION_BACKENDS
from slopilot.engine.executors.kv_cache import PagedKVCache
from slopilot.engine.executors.llama import LlamaForCausalLM
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput

# Bytes one layer's gathered keys and values may take in a captured batch (B x W slots):
# they live in the graphs' pool for good, unlike an eager pass's, which are freed after
# it. Wider batches run eagerly.
GATHER_BYTES_LIMIT = 256 << 20

# What a capture hands back: a call that reruns the computation, and the tensor each run
# leaves its result in (the computation returns the same tensor every time).
Replay = Callable[[], object]
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replay, torch.Tensor]]


class DecodeGraphMode(StrEnum):
    """How the executor runs decode-only iterations (``--decode-graphs``)."""

    AUTO = "auto"      # CUDA graphs on a CUDA device, the eager pass elsewhere
    CUDA = "cuda"      # CUDA graphs, and an error where there is no CUDA device
    PADDED = "padded"  # the graphs' padded static-shape pass, run eagerly: checks it on CPU
    OFF = "off"        # the eager pass for every iteration


class DecodeGraphError(GraphShapeError):
    """A decode-graph setting that cannot work; the message names it and the fix."""


def parse_mode(value: str | DecodeGraphMode, device: torch.device, *,
               field: str = "decode_graphs",
               auto: DecodeGraphMode = DecodeGraphMode.CUDA) -> DecodeGraphMode:
    """The mode ``field`` runs on ``device``: ``auto`` resolved (to ``auto`` on a CUDA
    device, off elsewhere), an impossible one refused."""
    try:
        mode = DecodeGraphMode(value)
    except ValueError:
        choices = ", ".join(m.value for m in DecodeGraphMode)
        raise DecodeGraphError(f"{field}={value!r}: use one of {choices}") from None
    if mode is DecodeGraphMode.AUTO:
        return auto if device.type == "cuda" else DecodeGraphMode.OFF
    if mode is DecodeGraphMode.CUDA and device.type != "cuda":
        raise DecodeGraphError(
            f"{field}='cuda' on device {device.type!r}: CUDA graphs need a CUDA "
            "device; use 'auto' (or 'padded' to run their padded pass eagerly)")
    return mode


def cuda_capture(device: torch.device) -> Capture:
    """Captures into CUDA graphs that share one memory pool (they replay one at a time)."""
    pool = torch.cuda.graph_pool_handle()

    def capture(run: Callable[[], torch.Tensor]) -> tuple[Replay, torch.Tensor]:
        # Two passes on a side stream first: lazy initialisation (cuBLAS handles and
        # workspaces, kernel selection) must not happen inside the capture.
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            run()
            run()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's harmless CUDA call (a metrics read) must not
        # invalidate the capture.
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            out = run()
        return graph.replay, out

    return capture


def eager_capture(run: Callable[[], torch.Tensor]) -> tuple[Replay, torch.Tensor]:
    """The padded pass without a graph: each replay reruns it, into the same tensor."""
    return run, run()


@dataclass(slots=True)
class _Graph:
    batch: int
    width: int
    replay: Replay
    # The captured computation, kept for as long as the graph: a CUDA graph reads the
    # tensors it closes over (the column indices) by address and does not keep them; freed,
    # their memory goes to other tensors and the graph reads those.
    run: Callable[[], torch.Tensor]


class DecodeGraphs:
    """Decode-only iterations run as replays of per-shape graphs (module docstring)."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, *, max_model_len: int,
                 capture: Capture, max_batch: int = GRAPH_MAX_BATCH) -> None:
        # Whether the capture makes real CUDA graphs (and not ``eager_capture``'s passes).
        self.captures_graphs = capture is not eager_capture
        if cache.scratch_blocks < 1:
            raise DecodeGraphError(
                "the KV cache has no scratch block for padding rows; build it with "
                "PagedKVCache(scratch_blocks=1)")
        self.model = model
        self.cache = cache
        self.block_size = cache.block_size
        self.max_model_len = max_model_len
        self._capture = capture
        self.batches = batch_buckets(max_batch)
        self.widths = width_buckets(max_model_len, self.block_size)
        k_flat = cache.flat(0)[0]
        slot_bytes = 2 * k_flat.shape[1] * k_flat.shape[2] * k_flat.element_size()
        self.max_slots = max(GATHER_BYTES_LIMIT // slot_bytes, 1)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        device = cache.gpu.device
        size = self._input_size(self.batches[-1], self.widths[-1])
        self._inputs = torch.empty(size, dtype=torch.long, device=device)
        pin = device.type == "cuda"
        self._staging = torch.empty(size, dtype=torch.long, pin_memory=pin)
        self._staging_np = self._staging.numpy()  # the same memory, filled by numpy
        # Set once the staged inputs have reached the device: the next iteration must not
        # overwrite them before.
        self._copied = torch.cuda.Event() if pin else None
        self._logits: torch.Tensor | None = None
        self._scratch_block = cache.num_gpu_blocks

    @property
    def captured(self) -> list[tuple[int, int]]:
        """The (batch, width) shapes captured so far."""
        return list(self._graphs)

    def _input_size(self, batch: int, width: int) -> int:
        return batch * (4 + width // self.block_size)

    def shape_for(self, seqs: Sequence[ScheduledSeq]) -> tuple[int, int] | None:
        """The (batch, width) graph that runs these rows, or None if they run eagerly."""
        if not seqs or len(seqs) > self.batches[-1]:
            return None
        if any(s.num_tokens != 1 for s in seqs):
            return None
        longest = max(s.start_pos + 1 for s in seqs)
        if longest > self.widths[-1]:
            return None
        batch = next(b for b in self.batches if b >= len(seqs))
        width = next(w for w in self.widths if w >= longest)
        if batch * width > self.max_slots:
            return None
        return batch, width

    def capture_all(self, max_batch: int, max_context: int) -> int:
        """Capture every shape that ``max_batch`` rows of up to ``max_context`` tokens can
        run as, largest first (the shared pool is then sized by the first); returns how
        many were new. Rows past these limits (a batch limit raised live) capture lazily.
        """
        batch_top = next((b for b in self.batches if b >= max_batch), self.batches[-1])
        width_top = next((w for w in self.widths if w >= max_context), self.widths[-1])
        shapes = [(b, w) for b in self.batches if b <= batch_top
                  for w in self.widths if w <= width_top and b * w <= self.max_slots]
        new = 0
        for shape in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            if shape not in self._graphs:
                self._graphs[shape] = self._new_graph(*shape)
                new += 1
        return new

    def takes(self, out: SchedulerOutput) -> bool:
        """Whether this iteration runs as a graph replay."""
        return not out.prompt_logprob_targets and self.shape_for(out.seqs) is not None

    def run(self, seqs: Sequence[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """One decode iteration: the rows that sample and their float32 logits.

        Call inside ``torch.inference_mode()``. Rows are checked as the eager batch
        builder checks them, before anything runs.
        """
        shape = self.shape_for(seqs)
        if shape is None:
            raise DecodeGraphError(
                f"{len(seqs)} rows do not fit a decode graph; ask shape_for() first")
        batch, width = shape
        matrix = self._rows(seqs, width // self.block_size)  # before a capture too
        graph = self._graphs.get(shape)
        if graph is None:
            graph = self._graphs[shape] = self._new_graph(batch, width)
        self._fill(seqs, matrix, batch, width)
        graph.replay()
        assert self._logits is not None
        logits = self._logits[:batch]
        sampling = [i for i, s in enumerate(seqs) if s.sample]
        chosen = [seqs[i] for i in sampling]
        if len(sampling) == len(seqs):
            return chosen, logits[:len(seqs)]
        # dtype given: an empty list (no row samples) would make a float tensor, which
        # cannot index.
        return chosen, logits[torch.tensor(sampling, dtype=torch.long,
                                           device=logits.device)]

    def _rows(self, seqs: Sequence[ScheduledSeq], blocks: int) -> np.ndarray:
        """The rows' block tables as ``blocks`` columns padded with the scratch block,
        checked as the eager batch builder checks them."""
        tables = [row_blocks(seq, block_size=self.block_size,
                             num_blocks=self.cache.num_gpu_blocks,
                             max_model_len=self.max_model_len, check_ids=False)
                  for seq in seqs]
        matrix = block_matrix(tables, blocks, self._scratch_block)
        check_block_ids(seqs, matrix, np.array([len(t) for t in tables], dtype=np.int64),
                        self.cache.num_gpu_blocks)
        return matrix

    def stage_inputs(self, seqs: Sequence[ScheduledSeq], batch: int, width: int) -> None:
        """Check the rows, then fill the graph's input buffer for them, padded to
        ``batch`` rows of ``width`` tokens, and send it to the device (one copy)."""
        self._fill(seqs, self._rows(seqs, width // self.block_size), batch, width)

    def _fill(self, seqs: Sequence[ScheduledSeq], matrix: np.ndarray, batch: int,
              width: int) -> None:
        if self._copied is not None:  # the last iteration's inputs have left the buffer
            self._copied.synchronize()
        n, bs, blocks = len(seqs), self.block_size, width // self.block_size
        size = self._input_size(batch, width)
        flat = self._staging_np[:size]
        ids, positions, slots, lengths = (flat[k * batch:(k + 1) * batch] for k in range(4))
        positions[:n] = [seq.start_pos for seq in seqs]
        ids[:n] = [seq.token_ids[0] for seq in seqs]
        rows = np.arange(n)
        slots[:n] = matrix[rows, positions[:n] // bs] * bs + positions[:n] % bs
        lengths[:n] = positions[:n] + 1
        ids[n:], positions[n:], slots[n:], lengths[n:] = 0, 0, self.cache.scratch_slot, 1
        table_view = flat[4 * batch:].reshape(batch, blocks)
        table_view[:n] = matrix
        table_view[n:] = self._scratch_block
        self._inputs[:size].copy_(self._staging[:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def _new_graph(self, batch: int, width: int) -> _Graph:
        # Captured over padding only (every row a padding row): the warm-up passes and
        # the capture itself then write the scratch block, never a request's blocks.
        self.stage_inputs([], batch, width)
        inputs = self._views(batch, width)
        bs = self.block_size
        columns = torch.arange(width, device=self._inputs.device)
        offsets = columns % bs
        scratch = self.cache.scratch_slot
        model, cache = self.model, self.cache
        if self._logits is None:
            vocab = model.lm_head.weight.shape[0]
            self._logits = torch.empty(self.batches[-1], vocab, dtype=torch.float32,
                                       device=self._inputs.device)
        logits = self._logits

        def forward() -> torch.Tensor:
            ids, positions, new_slots, lengths, tables = inputs
            # Not repeat_interleave: it sums its repeats on the host, which a capture
            # does not allow.
            slots = tables[:, :, None].expand(-1, -1, bs).reshape(batch, width) * bs + offsets
            slots = torch.where(columns < lengths[:, None], slots, scratch)
            attention = AttentionBatch(slot_mapping=new_slots, single_slots=slots,
                                       single_lengths=lengths)
            out = logits[:batch]
            out.copy_(model.forward_decode(ids, positions, attention, cache))
            return out

        # The executor's attention backends: a capture fixes the choice for good.
        with torch.inference_mode(), sdpa_kernel(ATTENTION_BACKENDS):
            replay, _ = self._capture(forward)
        return _Graph(batch, width, replay, forward)

    def _views(self, batch: int, width: int) -> tuple[torch.Tensor, ...]:
        flat = self._inputs
        b = batch
        tables = flat[4 * b:self._input_size(batch, width)].view(b, width // self.block_size)
        return flat[:b], flat[b:2 * b], flat[2 * b:3 * b], flat[3 * b:4 * b], tables
