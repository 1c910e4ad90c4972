"""A deterministic stand-in for a model: the next token is a function of the position."""

from __future__ import annotations

from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput


class FakeExecutor:
    """Samples ``base + position % span`` so outputs are reproducible and never EOS.

    ``script`` maps request id -> a list of tokens to emit in order (to drive stop
    conditions); ``step_s`` is the pretend iteration time.
    """

    def __init__(self, base: int = 100, span: int = 50, step_s: float = 0.01,
                 script: dict[str, list[int]] | None = None) -> None:
        self.base, self.span, self.step_s = base, span, step_s
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.calls.append(out)
        sampled: dict[str, int] = {}
        for seq in out.seqs:
            if not seq.sample:
                continue
            queue = self.script.get(seq.request_id)
            if queue:
                sampled[seq.request_id] = queue.pop(0)
            else:
                pos = seq.start_pos + len(seq.token_ids)
                sampled[seq.request_id] = self.base + pos % self.span
        return ModelRunnerOutput(sampled=sampled, elapsed_s=self.step_s)
