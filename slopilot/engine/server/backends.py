"""Build what a server runs: an engine on an executor, its tokenizer, its metrics.

``build_simulated`` needs no torch: the cost model paces a placeholder model in real
time. ``build_torch`` loads a checkpoint (imported lazily: torch is slow to import).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from slopilot.engine.config import EngineConfig
from slopilot.engine.context_limit import servable_tokens
from slopilot.engine.engine import LLMEngine
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.server.detokenizer import ServerTokenizer
from slopilot.engine.server.placeholder_tokenizer import PlaceholderTokenizer
from slopilot.engine.server.request_limits import max_token_bytes_of


class BackendError(ValueError):
    """Bad backend options (model, scenario, device); the message names the fix."""


@dataclass
class Backend:
    """An engine ready to serve, and what the HTTP layer needs to know about it."""

    engine: LLMEngine
    tokenizer: ServerTokenizer
    served_model_name: str
    max_model_len: int
    metrics: EngineMetrics
    observer: MetricsObserver
    # Token ids that end generation besides the engine's own eos (extra EOS ids).
    eos_token_ids: tuple[int, ...] = ()
    info: dict[str, str] = field(default_factory=dict)
    # The most UTF-8 bytes one token stands for (request_limits.max_token_bytes), derived
    # once from the tokenizer; None where no bound holds (the placeholder's one token per
    # word of any length): then longer prompts are tokenized before they are refused.
    max_token_bytes: int | None = None
    # max_model_len is what the KV cache holds, less than the model's context
    # (``servable_len``): the refusals say so.
    kv_limited: bool = False
    # The ids the model has an embedding row and a logit for, where the tokenizer may
    # hold more (tokens added to it, the model never resized); None: the tokenizer's.
    model_vocab_size: int | None = None

    @property
    def vocab_size(self) -> int:
        """The token ids a request may name or its prompt may encode to: an id past the
        model's rows would fail the engine itself (the embedding lookup)."""
        if self.model_vocab_size is None:
            return self.tokenizer.vocab_size
        return self.model_vocab_size

    @property
    def tokenizer_exceeds_model(self) -> bool:
        """Whether encoding text can give ids past the model's rows (only then is each
        encoded prompt checked)."""
        return self.tokenizer.vocab_size > self.vocab_size

    def close(self) -> None:
        close = getattr(self.engine.executor, "close", None)
        if close is not None:
            close()


def _attach_metrics(engine: LLMEngine, name: str, info: dict[str, str]
                    ) -> tuple[EngineMetrics, MetricsObserver]:
    metrics = EngineMetrics(name, info=info)
    metrics.set_config(engine.config)
    # The HTTP layer observes TTFT and e2e latency itself, from the request's arrival to
    # its first chunk written and to its last (responses.py).
    observer = MetricsObserver(metrics, observe_delivery=False)
    engine.observers.append(observer)
    return metrics, observer


def servable_len(model_len: int, num_gpu_blocks: int, block_size: int) -> int:
    """The longest request (prompt plus output) the server takes: the model's context, at
    most what the KV cache holds. A request can never grow past the cache, even alone
    (the scheduler ends it there as ``length``), so a longer one is refused at the door
    (``context_length_exceeded``) rather than cut short without a word; /v1/models
    advertises it. vLLM refuses to start instead; here the cache is sized by flag
    (``--num-gpu-blocks``), and the log says what it costs."""
    held = num_gpu_blocks * block_size
    limit = servable_tokens(model_len, held)  # the scheduler's rule, which the twin judges by
    if limit < model_len:
        logging.getLogger("slopilot.serve").warning(
            "the KV cache holds %d tokens (%d blocks of %d), less than the model's context "
            "of %d: requests of up to %d tokens (prompt plus max_tokens) are served; give "
            "the cache more blocks to serve the whole context", held, num_gpu_blocks,
            block_size, model_len, held)
    return limit


def build_simulated(config: EngineConfig, *, scenario: str = "tiny-cpu",
                    gpu: str | None = None, sim_model: str | None = None,
                    tp: int | None = None, num_gpu_blocks: int | None = None,
                    served_model_name: str | None = None, realtime: bool = True,
                    gpu_memory_utilization: float | None = None) -> Backend:
    """A cost-model engine; gpu/model/tp default to the scenario's."""
    from slopilot.engine.executors.simulated import SimulatedExecutor
    from slopilot.engine.sim.cost_model import ALLOWED_TP, CostModel, CostModelError
    from slopilot.engine.sim.profiles import ProfileError, get_gpu, get_model
    from slopilot.engine.sim.scenario import ScenarioError, load_scenario

    # The flags first, each error naming its flag ("unknown GPU 'A1000'" named neither).
    for flag, value, lookup in (("--gpu", gpu, get_gpu), ("--sim-model", sim_model, get_model)):
        if value is not None:
            try:
                lookup(value)
            except ProfileError as exc:
                raise BackendError(f"{flag} {value}: {exc}") from None
    # ``is None``, not ``or``: 0 is a value, refused as -1 is, never "not given".
    if tp is not None and tp not in ALLOWED_TP:
        raise BackendError(f"--tp {tp}: tensor parallelism must be one of "
                           f"{', '.join(map(str, ALLOWED_TP))} (GPUs in one node)")
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        raise BackendError(f"--num-gpu-blocks {num_gpu_blocks}: expected at least 1 KV "
                           "block; leave it out to size the cache from the GPU's memory")
    try:
        scen = load_scenario(scenario)
        cost = CostModel(gpu or scen.gpu, sim_model or scen.model,
                         scen.tp if tp is None else tp)
        executor = SimulatedExecutor(cost, block_size=config.block_size, realtime=realtime)
        util = gpu_memory_utilization or scen.gpu_memory_utilization or 0.9
        gpu_blocks = (executor.num_gpu_blocks(util) if num_gpu_blocks is None
                      else num_gpu_blocks)
        cpu_blocks = executor.num_cpu_blocks(config.swap_space_gb)
    except (ScenarioError, CostModelError, ProfileError, KeyError) as exc:
        raise BackendError(str(exc)) from exc
    engine = LLMEngine(config, executor, gpu_blocks, cpu_blocks,
                       executor.swap_time_per_block_s)
    name = served_model_name or cost.model.name
    info = {"executor": "simulated", "gpu": cost.gpu.name, "tp": str(cost.tp)}
    metrics, observer = _attach_metrics(engine, name, info)
    limit = servable_len(cost.model.max_position_embeddings, gpu_blocks, config.block_size)
    return Backend(engine, PlaceholderTokenizer(cost.model.vocab_size), name, limit,
                   metrics, observer, info=info,
                   kv_limited=limit < cost.model.max_position_embeddings)


def build_torch(config: EngineConfig, model: str, *, device: str = "cpu",
                num_gpu_blocks: int | None = None, num_cpu_blocks: int | None = None,
                served_model_name: str | None = None, dtype: str | None = None,
                max_model_len: int | None = None, cpu_kernels: str = "auto",
                decode_graphs: str = "auto", piecewise_graphs: str = "off") -> Backend:
    """A plain-torch engine on a checkpoint directory or a registered model name."""
    from slopilot.engine.executors.torch_runner import TorchExecutor

    executor = TorchExecutor(model, device=device, dtype=dtype, num_gpu_blocks=num_gpu_blocks,
                             num_cpu_blocks=num_cpu_blocks, block_size=config.block_size,
                             swap_space_gb=config.swap_space_gb, max_model_len=max_model_len,
                             cpu_kernels=cpu_kernels, decode_graphs=decode_graphs,
                             piecewise_graphs=piecewise_graphs)
    # The engine stamps the executor's decode_spill knee on every iteration, so the
    # slopilot_iteration_* series count as a calibrated profile of this device does.
    engine = LLMEngine(config, executor, executor.num_gpu_blocks, executor.num_cpu_blocks,
                       executor.swap_time_per_block_s)
    # Before serving, so that no request waits for a capture (limits raised live later
    # capture lazily).
    graphs = executor.capture_decode_graphs(config.max_num_seqs, config.token_budget)
    if graphs:
        logging.getLogger("slopilot.serve").info(
            "captured %d CUDA graph shapes for decode batches of up to %d rows (and, with "
            "--piecewise-graphs, passes of up to %d tokens)", graphs, config.max_num_seqs,
            config.token_budget)
    name = served_model_name or str(model).rstrip("/").split("/")[-1]
    info = {"executor": "torch", "device": str(executor.device),
            "kernels": executor.profile_kernels,
            "dtype": str(executor.dtype).removeprefix("torch.")}
    metrics, observer = _attach_metrics(engine, name, info)
    eos = executor.eos_token_ids
    per_token = max_token_bytes_of(getattr(executor.tokenizer, "tokenizer", None))
    limit = servable_len(executor.max_model_len, executor.num_gpu_blocks, config.block_size)
    model_vocab = executor.config.vocab_size
    extra = executor.tokenizer.vocab_size - model_vocab
    if extra > 0:
        logging.getLogger("slopilot.serve").warning(
            "the tokenizer holds %d token ids past the model's vocabulary of %d (tokens "
            "added to the tokenizer, the model not resized): a prompt that encodes to one "
            "of them is refused (400)", extra, model_vocab)
    return Backend(engine, executor.tokenizer, name, limit, metrics,
                   observer, eos_token_ids=tuple(eos), info=info, max_token_bytes=per_token,
                   kv_limited=limit < executor.max_model_len, model_vocab_size=model_vocab)
