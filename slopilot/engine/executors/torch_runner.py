"""The torch executor: one ``SchedulerOutput`` in, one forward pass, sampled tokens out.

Each iteration: copy swapped-out blocks to host memory, copy swapped-in blocks back, run
the whole mixed batch (prefill chunks and decodes as one flat token list) through the
model, and sample the rows that end at their request's last known token.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel

from slopilot.engine.device_cache import executor_decode_knee
from slopilot.engine.executors.batch import build_batch
from slopilot.engine.executors.decode_graphs import (
    Capture,
    DecodeGraphError,
    DecodeGraphMode,
    DecodeGraphs,
    cuda_capture,
    eager_capture,
    parse_mode,
)
from slopilot.engine.executors.device_room import device_room
from slopilot.engine.executors.graph_shapes import GRAPH_MAX_BATCH
from slopilot.engine.executors.host_memory import keep_freed_memory
from slopilot.engine.executors.kernels import ATTENTION_BACKENDS
from slopilot.engine.executors.kv_cache import PagedKVCache
from slopilot.engine.executors.loader import LoadedModel, load_checkpoint
from slopilot.engine.executors.logprobs import gather_logprobs
from slopilot.engine.executors.native_kernels import KernelError, choose_kernels
from slopilot.engine.executors.piecewise_graphs import (
    DEFAULT_MAX_TOKENS,
    PiecewiseGraphError,
    PiecewiseGraphs,
)
from slopilot.engine.executors.sampler import Sampler
from slopilot.engine.executors.tokenizer import TextTokenizer
from slopilot.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput

log = logging.getLogger(__name__)

GIB = 1 << 30
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# On CPU the "GPU" blocks live in host memory too: take at most this share of what is
# free, so the cache does not starve the process (or its neighbours).
_CPU_KV_SHARE = 0.25
_CPU_KV_DEFAULT_GB = 2.0
# Room left on a CUDA device for activations of one iteration and the allocator's slack.
_CUDA_ACTIVATION_RESERVE = 1 * GIB


def _decimals(gib: float) -> int:
    """Two decimals from 1 GiB up, else three significant figures (0.0176, not 0.02)."""
    return 2 if gib >= 1 or gib <= 0 else 2 - math.floor(math.log10(gib))


def _gib(nbytes: int) -> str:
    gib = nbytes / GIB
    return f"{gib:.{_decimals(gib)}f}"


def _gib_floor(nbytes: int) -> str:
    """``_gib`` rounded down: a size suggested as the most that fits must not round up
    past it."""
    gib = nbytes / GIB
    decimals = _decimals(gib)
    scale = 10 ** decimals
    return f"{math.floor(gib * scale) / scale:.{decimals}f}"


class ExecutorError(ValueError):
    """Bad executor settings; the message names the value and the fix."""


def _parse_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        # bf16 matmuls are slow on CPUs without AMX/AVX512-BF16; float32 is the safe default.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ExecutorError(f"dtype={dtype!r}: use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _available_host_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 8 * GIB


class TorchExecutor:
    def __init__(self, model: str | Path | LoadedModel, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | str | None = None, num_gpu_blocks: int | None = None,
                 num_cpu_blocks: int | None = None, block_size: int = 16,
                 kv_cache_gb: float | None = None, swap_space_gb: float = 4.0,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 seed: int = 0, num_threads: int | None = None,
                 cpu_kernels: str = "auto", decode_graphs: str = "auto",
                 max_graph_batch: int = GRAPH_MAX_BATCH, piecewise_graphs: str = "off",
                 max_graph_tokens: int = DEFAULT_MAX_TOKENS,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = torch.device(device)
        # Times each iteration and its swap copies (a test drives it by hand).
        self._clock = clock
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ExecutorError("device='cuda' but torch sees no CUDA device; use device='cpu'")
        if block_size < 1:
            raise ExecutorError(f"block_size={block_size}: must be >= 1")
        if not 0 < gpu_memory_utilization <= 1:
            raise ExecutorError(
                f"gpu_memory_utilization={gpu_memory_utilization}: must be in (0, 1]")
        if swap_space_gb < 0:
            raise ExecutorError(f"swap_space_gb={swap_space_gb}: must be >= 0")
        try:
            graph_mode = parse_mode(decode_graphs, self.device)
            # Off unless asked for: not yet measured on a GPU (piecewise_graphs.py).
            piece_mode = parse_mode(piecewise_graphs, self.device, field="piecewise_graphs",
                                    auto=DecodeGraphMode.OFF)
        except DecodeGraphError as exc:
            raise ExecutorError(str(exc)) from None
        if piece_mode is DecodeGraphMode.CUDA and graph_mode is not DecodeGraphMode.CUDA:
            raise ExecutorError(
                "piecewise_graphs='cuda' with decode_graphs off: replay the decode passes "
                "from graphs too (decode_graphs='auto' or 'cuda'), or leave both off")
        if max_graph_batch < 1:
            raise ExecutorError(f"max_graph_batch={max_graph_batch}: must be >= 1")
        if num_threads is not None:
            if num_threads < 1:
                raise ExecutorError(f"num_threads={num_threads}: must be >= 1 (or None to "
                                    "keep torch's default)")
            # Process-wide: on a CPU shared with other busy processes, fewer intra-op
            # threads than cores avoids OpenMP barriers spinning on descheduled threads.
            torch.set_num_threads(num_threads)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.dtype = _parse_dtype(dtype, self.device)
        if isinstance(model, LoadedModel):
            self.loaded = model
            model.model.to_runtime(self.device, self.dtype)
        else:
            # Imported here: models.py pulls in the registry, which only names need.
            from slopilot.engine.models import resolve_model
            self.loaded = load_checkpoint(resolve_model(model), device=self.device,
                                          dtype=self.dtype)
        self.model = self.loaded.model
        try:
            self.kernels = choose_kernels(cpu_kernels, self.device, self.dtype)
        except KernelError as exc:
            raise ExecutorError(str(exc)) from None
        self.model.ops = self.kernels.kernels
        self.kernels.kernels.prepare(self.model.projections())
        cfg = self.loaded.config
        self.config = cfg
        self.block_size = block_size
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        self.block_bytes = PagedKVCache.block_bytes(
            num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim, block_size=block_size, dtype=self.dtype)
        # The knee of the decode_spill shape feature on this device and KV layout: the
        # engine loop stamps it on every iteration (sim/shape.py), as a profile of this
        # device computes it.
        self.decode_knee_tokens = executor_decode_knee(
            str(self.device), self.block_bytes, block_size, cfg.num_hidden_layers)
        gpu_blocks = (num_gpu_blocks if num_gpu_blocks is not None
                      else self._blocks_from_memory(kv_cache_gb, gpu_memory_utilization))
        scratch = 0 if graph_mode is piece_mode is DecodeGraphMode.OFF else 1
        if num_gpu_blocks is not None or kv_cache_gb is not None:
            self._check_room(gpu_blocks, scratch, num_gpu_blocks, kv_cache_gb)
        if num_cpu_blocks is None:
            host_cap = _available_host_bytes() // 2
            num_cpu_blocks = int(min(swap_space_gb * GIB, host_cap)) // self.block_bytes
        started = time.perf_counter()
        self.kv_cache = PagedKVCache(
            num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim, num_gpu_blocks=gpu_blocks, num_cpu_blocks=num_cpu_blocks,
            block_size=block_size, dtype=self.dtype, device=self.device,
            scratch_blocks=scratch,
            touch_cpu_blocks=self._host_blocks_to_touch(gpu_blocks, scratch))
        resident = self.kv_cache.resident_cpu_blocks
        if self.device.type == "cpu":  # the pools are touched at start: say what it cost
            log.info("KV cache: %d blocks and the first %d of %d host swap blocks, %.2f GiB "
                     "of host memory made resident in %.1f s", gpu_blocks, resident,
                     num_cpu_blocks, (gpu_blocks + resident) * self.block_bytes / GIB,
                     time.perf_counter() - started)
        self.decode_graphs: DecodeGraphs | None = None
        self.piecewise_graphs: PiecewiseGraphs | None = None
        self._build_graphs(graph_mode, piece_mode, max_graph_batch, max_graph_tokens)
        self.sampler = Sampler(seed=seed, device=self.device, kernels=self.kernels.kernels)

    def _build_graphs(self, decode: DecodeGraphMode, pieces: DecodeGraphMode,
                      max_batch: int, max_tokens: int) -> None:
        # One memory pool for every graph: they replay one at a time.
        pool_capture = (cuda_capture(self.device)
                        if DecodeGraphMode.CUDA in (decode, pieces) else eager_capture)

        def capture_for(mode: DecodeGraphMode) -> Capture:
            return pool_capture if mode is DecodeGraphMode.CUDA else eager_capture

        if decode is not DecodeGraphMode.OFF:
            self.decode_graphs = DecodeGraphs(
                self.model, self.kv_cache, max_model_len=self.max_model_len,
                capture=capture_for(decode), max_batch=max_batch)
        if pieces is not DecodeGraphMode.OFF:
            try:
                self.piecewise_graphs = PiecewiseGraphs(
                    self.model, self.kv_cache, capture=capture_for(pieces),
                    max_tokens=max_tokens)
            except PiecewiseGraphError as exc:
                raise ExecutorError(str(exc)) from None

    def _check_room(self, blocks: int, scratch: int, num_gpu_blocks: int | None,
                    kv_cache_gb: float | None) -> None:
        """A cache sized by hand refused where the device has not the memory for it,
        before torch's allocator fails (a traceback naming no flag). The most it may be
        is what fits beside the scratch block, rounded down: the value suggested must
        itself be accepted."""
        room = device_room(self.device)
        need = (blocks + scratch) * self.block_bytes
        if need <= room.bytes:
            return
        fits = room.bytes // self.block_bytes - scratch
        asked = (f"--num-gpu-blocks {num_gpu_blocks}" if num_gpu_blocks is not None
                 else f"--kv-cache-gb {kv_cache_gb}")
        taken = (f"{asked}: {blocks + scratch} KV blocks of {self.block_bytes} bytes take "
                 f"{_gib(need)} GiB, more than the {room.what} ({_gib(room.bytes)} GiB)")
        if fits < 1:
            beside = " beside the decode graphs' scratch block" if scratch else ""
            raise ExecutorError(
                f"{taken}, where not even one block fits{beside}; free some memory (or "
                "use a smaller block_size or model)")
        fix = (f"give at most {fits} blocks" if num_gpu_blocks is not None
               else f"give at most {_gib_floor(fits * self.block_bytes)}")
        raise ExecutorError(f"{taken}; {fix}, or leave it out to size the cache from memory")

    def _host_blocks_to_touch(self, gpu_blocks: int, scratch: int) -> int | None:
        """How many host swap blocks ``PagedKVCache`` writes at start (None: all; the
        pinned pool on CUDA is resident anyway). One device cacheful, as the most one
        swap-out moves, within half of the host memory the device cache leaves: all of a
        pool sized for the worst case would hold up to 32 GiB resident from the start,
        where most of it may never take a swap."""
        if self.device.type != "cpu":
            return None
        left = device_room(self.device).bytes - (gpu_blocks + scratch) * self.block_bytes
        return min(gpu_blocks, max(left, 0) // 2 // self.block_bytes)

    def _blocks_from_memory(self, kv_cache_gb: float | None, utilization: float) -> int:
        if kv_cache_gb is not None:
            if kv_cache_gb <= 0:
                raise ExecutorError(f"kv_cache_gb={kv_cache_gb}: must be > 0")
            budget = int(kv_cache_gb * GIB)
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(free - total * (1 - utilization)) - _CUDA_ACTIVATION_RESERVE
        else:
            budget = int(min(_CPU_KV_DEFAULT_GB * GIB,
                             _available_host_bytes() * _CPU_KV_SHARE))
        blocks = budget // self.block_bytes
        if blocks < 1:
            raise ExecutorError(
                f"no memory left for the KV cache (budget {budget} bytes, one block is "
                f"{self.block_bytes}); raise gpu_memory_utilization or kv_cache_gb, or "
                "pass num_gpu_blocks")
        return blocks

    def capture_decode_graphs(self, max_num_seqs: int, token_budget: int = 0) -> int:
        """Capture, before serving, the decode graphs a batch limit of ``max_num_seqs`` rows
        can reach at every context up to the model's, and the piecewise graphs of passes
        of up to ``token_budget`` tokens; how many graph sets were new. 0 without CUDA
        graphs: the ``padded`` modes run their shapes as they come (capturing them ahead
        would only run each once, seconds of a CPU's start-up for nothing)."""
        new = 0
        if self.decode_graphs is not None and self.decode_graphs.captures_graphs:
            new += self.decode_graphs.capture_all(max_num_seqs, self.max_model_len)
        pieces = self.piecewise_graphs
        if pieces is not None and pieces.captures_graphs and token_budget > 0:
            new += pieces.capture_all(token_budget)
        return new

    @property
    def graph_batch(self) -> int | None:
        """The largest decode batch replayed from a CUDA graph (the engine stamps it on
        every iteration for the ``eager_passes`` shape feature); None without graphs."""
        graphs = self.decode_graphs
        return graphs.batches[-1] if graphs is not None and graphs.captures_graphs else None

    @property
    def profile_kernels(self) -> str:
        """What a step runs on, as a cost profile records it (``PROFILE_KERNELS``)."""
        if self.kernels.native:
            return "native"
        if self.graph_batch is None:
            return "torch"
        pieces = self.piecewise_graphs
        return "cuda-graphs" if pieces is None or not pieces.captures_graphs \
            else "cuda-graphs-piecewise"

    @property
    def swap_time_per_block_s(self) -> float:
        """A guess of one block's copy time, which ``swap_timeout_ms`` is judged by until
        the timed swap-outs outweigh it (``swap_cost.py``; each iteration's copies are
        timed in ``execute``): PCIe 4.0 x16 at ~25 GB/s effective on CUDA, a ~10 GB/s memcpy on
        CPU. A guess only: SmolLM2-135M's 256-block swap-out, 18.9 ms by it, took 16 to
        72 ms on this project's 2-core machine as it was quiet or busy."""
        bandwidth = 25e9 if self.device.type == "cuda" else 10e9
        return self.block_bytes / bandwidth

    @property
    def tokenizer(self) -> TextTokenizer:
        return self.loaded.tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self.loaded.eos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.loaded.eos_token_ids

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_cache.num_gpu_blocks

    @property
    def num_cpu_blocks(self) -> int:
        return self.kv_cache.num_cpu_blocks

    def _swap(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Run the iteration's copies, out before in (a block freed by a swap-out may be
        the target of a swap-in), each timed for the scheduler and the metrics."""
        cuda = self.device.type == "cuda"
        clock, cache = self._clock, self.kv_cache
        if cuda:
            # Work queued before is not the copies' time.
            torch.cuda.synchronize(self.device)
        if out.swap_out:
            start = clock()
            cache.swap_out(out.swap_out)  # ends on the host: nothing left queued
            result.swap_out_s = clock() - start
        if out.swap_in:
            start = clock()
            cache.swap_in(out.swap_in)
            if cuda:
                # Only queued: wait to time it. The pass would wait for it on the stream
                # anyway; all this costs is the launch overlap, on an iteration that swaps in.
                torch.cuda.synchronize(self.device)
            result.swap_in_s = clock() - start

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        start = self._clock()
        result = ModelRunnerOutput(sampled={})
        if out.swap_out or out.swap_in:
            self._swap(out, result)
        if out.seqs:
            with torch.inference_mode(), sdpa_kernel(ATTENTION_BACKENDS):
                graphs = self.decode_graphs
                prompt_seqs: list[tuple[ScheduledSeq, int]] = []
                if graphs is not None and graphs.takes(out):
                    seqs, sample_logits = graphs.run(out.seqs)
                    prompt_logits = sample_logits[:0]
                else:
                    batch = build_batch(out.seqs, block_size=self.block_size,
                                        num_blocks=self.kv_cache.num_gpu_blocks,
                                        max_model_len=self.max_model_len, device=self.device,
                                        prompt_logprob_targets=out.prompt_logprob_targets)
                    pieces = self.piecewise_graphs
                    if pieces is not None and \
                            pieces.bucket_for(len(batch.input_ids)) is not None:
                        logits = pieces.run(batch)
                    else:
                        logits = self.model(batch.input_ids, batch.positions,
                                            batch.attention, self.kv_cache, batch.logits_rows)
                    seqs, prompt_seqs = batch.sample_seqs, batch.prompt_seqs
                    sample_logits, prompt_logits = logits[:len(seqs)], logits[len(seqs):]
                tokens = self.sampler.sample(
                    sample_logits, [s.sampling for s in seqs],
                    [s.num_output_tokens for s in seqs],
                    [out.histories.get(s.request_id, ((), ())) for s in seqs])
                result.sampled = {s.request_id: t for s, t in zip(seqs, tokens, strict=True)}
                _add_logprobs(result, seqs, tokens, sample_logits, prompt_seqs,
                              prompt_logits, out.prompt_logprob_targets)
        elif self.device.type == "cuda":
            # Only copies ran; wait for them so elapsed_s measures them.
            torch.cuda.synchronize(self.device)
        # out.finished_ids needs nothing here: the sampler derives each seeded draw from
        # (seed, output index), so the executor holds no per-request state to drop.
        result.elapsed_s = self._clock() - start
        return result


def _add_logprobs(result: ModelRunnerOutput, seqs: list[ScheduledSeq], tokens: list[int],
                  sample_logits: torch.Tensor, prompt_seqs: list[tuple[ScheduledSeq, int]],
                  prompt_logits: torch.Tensor, prompt_targets: dict[str, list[int]]) -> None:
    """Logprobs of the raw logits for the rows that asked: sampled tokens, prompt tokens."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
    if rows:
        entries = gather_logprobs(sample_logits[rows], [tokens[i] for i in rows],
                                  [seqs[i].sampling.logprobs or 0 for i in rows])
        for i, entry in zip(rows, entries, strict=True):
            result.logprobs[seqs[i].request_id] = entry
    if prompt_seqs:
        targets = [t for seq, count in prompt_seqs
                   for t in prompt_targets[seq.request_id][:count]]
        num_top = [seq.sampling.prompt_logprobs or 0 for seq, count in prompt_seqs
                   for _ in range(count)]
        entries = gather_logprobs(prompt_logits, targets, num_top)
        at = 0
        for seq, count in prompt_seqs:
            result.prompt_logprobs[seq.request_id] = entries[at:at + count]
            at += count
