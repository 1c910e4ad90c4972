"""An executor with no model: the cost model says how long each iteration takes.

In virtual mode ``execute`` returns at once and the discrete-event simulator advances
its clock by ``elapsed_s``. In realtime mode it sleeps the modelled time, so a real
server (HTTP, metrics scraping, alerting) runs on a laptop as if it had the GPU.

Sampled tokens are a fixed placeholder that is never the EOS or a request's stop
token, so every request runs to its ``max_tokens``: output lengths come from the
workload, not from the (absent) model. Penalties and logit bias change nothing (there
are no logits to change). Logprobs, when asked for, are synthetic but well formed: the
token at hand is the most likely, at log(1/2), and the alternatives follow at log(1/4),
log(1/8), ... (a distribution, so a client's checks on sums and order hold).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import TokenLogprobs
from slopilot.engine.sim.cost_model import CostModel, CostModelError

if TYPE_CHECKING:
    from slopilot.engine.sim.twin import IterationCostModel

DEFAULT_PLACEHOLDER_TOKEN_ID = 100
_LN2 = math.log(2.0)


class SimulatedExecutor:
    """Implements ``Executor`` from a cost model (datasheet ``CostModel`` or calibrated
    ``CalibratedCostModel``); holds no per-request state."""

    def __init__(self, cost_model: CostModel | IterationCostModel, *, block_size: int = 16,
                 eos_token_id: int | None = None,
                 placeholder_token_id: int = DEFAULT_PLACEHOLDER_TOKEN_ID,
                 realtime: bool = False,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        vocab = cost_model.model.vocab_size
        if not 0 <= placeholder_token_id < vocab:
            raise CostModelError(
                f"placeholder_token_id={placeholder_token_id} is outside {cost_model.model.name}'s "
                f"vocabulary [0, {vocab}); pick an id below {vocab}")
        if placeholder_token_id == eos_token_id:
            raise CostModelError(
                f"placeholder_token_id={placeholder_token_id} is the EOS token, so every "
                "request would stop after one token; pick another placeholder id")
        # Fail here, not on the first swap, when the block size is unusable.
        self.swap_time_per_block_s = cost_model.swap_time_per_block(block_size)
        self.cost_model = cost_model
        # The engine loop stamps it on each iteration (sim/shape.py: decode_spill).
        self.decode_knee_tokens: int | None = getattr(cost_model, "decode_knee_tokens", None)
        self.graph_batch: int | None = cost_model.graph_batch
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.placeholder_token_id = placeholder_token_id
        self.realtime = realtime
        self._clock = clock
        self._sleep = sleep
        self.num_iterations = 0
        self.busy_s = 0.0  # modelled GPU time so far (the busy-ratio numerator)

    # -- sizing, for the engine and the scheduler -------------------------------------

    @property
    def max_model_len(self) -> int:
        """The model's context: the server refuses a longer request, and so does the twin
        (``context_limit``), whatever the KV cache holds."""
        return self.cost_model.model.max_position_embeddings

    def num_gpu_blocks(self, gpu_memory_utilization: float = 0.9) -> int:
        return self.cost_model.num_kv_blocks(self.block_size, gpu_memory_utilization)

    def num_cpu_blocks(self, swap_space_gb: float) -> int:
        return self.cost_model.num_cpu_blocks(self.block_size, swap_space_gb)

    # -- one iteration ----------------------------------------------------------------

    def modelled_time(self, out: SchedulerOutput) -> float:
        """Seconds the iteration would take: swaps (before the pass) plus the pass."""
        return self.cost_model.output_time(out, self.block_size)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        start = self._clock() if self.realtime else 0.0
        elapsed = self.modelled_time(out)
        result = ModelRunnerOutput(sampled={}, elapsed_s=elapsed)
        # What the modelled copies took, as a real executor reports what it timed: the
        # twin's scheduler exports them and learns the swap cost from them too.
        if out.swap_out:
            result.swap_out_s = self.cost_model.swap_time(len(out.swap_out), self.block_size)
        if out.swap_in:
            result.swap_in_s = self.cost_model.swap_time(len(out.swap_in), self.block_size)
        sampled, logprobs = result.sampled, result.logprobs
        targets = out.prompt_logprob_targets
        for s in out.seqs:
            if targets and s.request_id in targets:
                k = s.sampling.prompt_logprobs or 0
                result.prompt_logprobs[s.request_id] = [
                    self._synthetic(t, k) for t in targets[s.request_id]]
            if s.sample:
                token = sampled[s.request_id] = self._token_for(s.sampling.stop_token_ids)
                if s.sampling.logprobs is not None:
                    logprobs[s.request_id] = self._synthetic(token, s.sampling.logprobs)
        self.num_iterations += 1
        self.busy_s += elapsed
        if self.realtime:
            left = elapsed - (self._clock() - start)
            if left > 0:
                self._sleep(left)
        return result

    def _synthetic(self, token: int, num_top: int) -> TokenLogprobs:
        vocab = self.cost_model.model.vocab_size
        top = tuple(((token + i) % vocab, -(i + 1) * _LN2) for i in range(num_top))
        return TokenLogprobs(token, -_LN2, 1, top)

    def _token_for(self, stop_token_ids: frozenset[int]) -> int:
        token = self.placeholder_token_id
        if token in stop_token_ids:
            # The smallest id that ends nothing; such an id exists unless every id stops.
            token = next(t for t in range(self.cost_model.model.vocab_size + 1)
                         if t not in stop_token_ids and t != self.eos_token_id)
        return token

    def close(self) -> None:
        return None
