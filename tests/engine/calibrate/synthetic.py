"""An executor whose times come from known coefficients (plus seeded noise): the fit's
ground truth. It checks every batch the harness builds as the torch executor would."""

from __future__ import annotations

import numpy as np

from slopilot.engine.engine import VirtualClock
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.sim.shape import FEATURES, IterationShape, feature_sums, output_rows

TRUE: dict[str, float] = {
    "iteration": 2e-3, "tokens": 3e-5, "sampled": 1e-4, "decode_seqs": 4e-5,
    "decode_batches": 1.5e-3, "prefill_seqs": 8e-4, "decode_context": 5e-8,
    "decode_padded_context": 2e-7, "prefill_context": 1e-7, "prefill_attention": 4e-9,
    "prefill_attention_dense": 2e-9, "swap_batches": 1e-4, "swap_blocks": 3e-5}
# The padded decode K/V beyond the cache costs 3x a cached padded token.
SPILL = 4e-7
# On a device replaying decode graphs an eager pass costs ~800 launches more than a
# replay (the H200 VM: 3 ms a replayed decode, ~20 ms an eager pass).
EAGER = 1.7e-2
# The engine loop around each pass (scheduler, bookkeeping, metrics): 0.1 ms a step.
LOOP_S = 1e-4


class SyntheticExecutor:
    def __init__(self, coefficients: dict[str, float] | None = None, *, noise: float = 0.0,
                 seed: int = 0, num_gpu_blocks: int = 4096, num_cpu_blocks: int = 64,
                 block_size: int = 16, extra: float = 0.0, knee: int | None = None,
                 graph_batch: int | None = None) -> None:
        self.coefficients = dict(TRUE if coefficients is None else coefficients)
        self.noise, self.extra = noise, extra
        self.rng = np.random.default_rng(seed)
        self.block_size, self.num_gpu_blocks, self.num_cpu_blocks = (
            block_size, num_gpu_blocks, num_cpu_blocks)
        self.calls = 0
        self.knee = knee  # the decode_spill knee its times obey (None: no spill)
        self.graph_batch = graph_batch  # decode batches it replays (None: no graphs)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.calls += 1
        bs = self.block_size
        for seq in out.seqs:
            end = seq.start_pos + len(seq.token_ids)
            assert len(seq.block_table) >= -(-end // bs)
            assert all(0 <= b < self.num_gpu_blocks for b in seq.block_table)
        written = [seq.block_table[p // bs] * bs + p % bs for seq in out.seqs
                   for p in range(seq.start_pos, seq.start_pos + len(seq.token_ids))]
        assert len(written) == len(set(written)), "two rows write the same KV slot"
        shape = IterationShape(*feature_sums(output_rows(out), len(out.swap_out),
                                             len(out.swap_in), knee=self.knee,
                                             graph_batch=self.graph_batch))
        t = sum(self.coefficients.get(f, 0.0) * v
                for f, v in zip(FEATURES, shape.vector(), strict=True))
        # A term the cost model does not have, to make a form that cannot fit.
        t += self.extra * shape.decode_seqs ** 2
        t *= 1.0 + self.noise * self.rng.standard_normal()
        sampled = {s.request_id: 20 for s in out.seqs if s.sample}
        return ModelRunnerOutput(sampled=sampled, elapsed_s=max(t, 1e-9))

    def close(self) -> None:
        return None


class SyntheticLoopClock(VirtualClock):
    """The engine loop's clock for a synthetic executor: each step lasts the executor's
    reported time plus ``LOOP_S``, the loop's own cost, so a step holds its executor as a
    real one's holds its pass (on the wall clock a step lasted microseconds around a
    reported 2 ms) and the host fit has a known answer, the same on any machine."""

    def advance(self, dt: float) -> None:
        super().advance(dt + LOOP_S)
