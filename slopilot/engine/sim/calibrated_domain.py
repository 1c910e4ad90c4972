"""Where a run on a calibrated profile went past what the calibration timed.

A profile's fit covers the iterations its grid held (``FitReport.token_budget``: the
largest chunk, ``max_num_seqs``: the largest batch, ``max_context``: the longest
context); beyond them the twin prices an iteration by extending the fitted lines, a
figure no calibration measured. ``DomainWatch`` rides a run as a step observer and
keeps the largest of each it saw; ``beyond`` says, one line a figure, which passed the
profile's.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request
from slopilot.engine.sim.profile_types import CostProfile


@dataclass
class DomainWatch:
    """Step observer: the largest iteration figures of a run."""

    most_tokens: int = 0  # new tokens in one iteration
    most_seqs: int = 0  # rows (sequences) in one iteration
    longest_context: int = 0  # a row's context after its new tokens

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        self.most_tokens = max(self.most_tokens, out.num_batched_tokens)
        self.most_seqs = max(self.most_seqs, len(out.seqs))
        if out.seqs:
            self.longest_context = max(self.longest_context, max(
                s.start_pos + len(s.token_ids) for s in out.seqs))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None: ...
    def on_finished(self, req: Request, now: float) -> None: ...


def beyond(profile: CostProfile, watch: DomainWatch, config: EngineConfig) -> list[str]:
    """One line for each figure of the run past the profile's calibrated domain (none
    for a profile that records no domain)."""
    fit = profile.fit
    if fit is None:
        return []
    tail = ("the twin extrapolates its fit there, at a cost no calibration measured; "
            "calibrate with")
    out = []
    if 0 < fit.token_budget < watch.most_tokens:
        out.append(f"iterations of up to {watch.most_tokens} new tokens (token_budget "
                   f"{config.token_budget}) ran past the profile's calibrated domain "
                   f"(fit.token_budget: {fit.token_budget}): {tail} --token-budget "
                   f"{config.token_budget} to time them")
    if 0 < fit.max_num_seqs < watch.most_seqs:
        out.append(f"iterations of up to {watch.most_seqs} sequences (max_num_seqs "
                   f"{config.max_num_seqs}) ran past the profile's calibrated domain "
                   f"(fit.max_num_seqs: {fit.max_num_seqs}): {tail} --max-num-seqs "
                   f"{config.max_num_seqs} to time them")
    if 0 < fit.max_context < watch.longest_context:
        out.append(f"contexts of up to {watch.longest_context} tokens (prompt and output so "
                   f"far) ran past the profile's calibrated domain (fit.max_context: "
                   f"{fit.max_context}): {tail} --max-context {watch.longest_context} "
                   "(or more) to time them")
    return out
