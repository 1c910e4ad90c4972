"""A deterministic stand-in for a model: the next token is a function of the position."""

from __future__ import annotations

from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import TokenLogprobs


class FakeExecutor:
    """Samples ``base + position % span`` so outputs are reproducible and never EOS.

    ``script`` maps request id -> a list of tokens to emit in order (to drive stop
    conditions); ``step_s`` is the pretend iteration time. Logprobs, when asked for,
    are -position / 1000 (so each entry says which position produced it).
    """

    def __init__(self, base: int = 100, span: int = 50, step_s: float = 0.01,
                 script: dict[str, list[int]] | None = None) -> None:
        self.base, self.span, self.step_s = base, span, step_s
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.calls.append(out)
        result = ModelRunnerOutput(sampled={}, elapsed_s=self.step_s)
        for seq in out.seqs:
            targets = out.prompt_logprob_targets.get(seq.request_id)
            if targets:
                result.prompt_logprobs[seq.request_id] = [
                    TokenLogprobs(t, -(seq.start_pos + j + 1) / 1000, 1)
                    for j, t in enumerate(targets)]
            if not seq.sample:
                continue
            queue = self.script.get(seq.request_id)
            pos = seq.start_pos + len(seq.token_ids)
            token = queue.pop(0) if queue else self.base + pos % self.span
            result.sampled[seq.request_id] = token
            if seq.sampling.logprobs is not None:
                result.logprobs[seq.request_id] = TokenLogprobs(token, -pos / 1000, 1)
        return result
