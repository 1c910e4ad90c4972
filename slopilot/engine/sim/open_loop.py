"""Open-loop synthetic traffic: arrivals that do not wait for the server, in phases.

A phase fixes the arrival process, the length distributions and the class mix from its
start time until the next phase starts; a second phase is how a scenario says "at T the
traffic shifts to longer prompts and more P0" (what the tuner has to notice and follow).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from slopilot.engine.sim.arrivals import ArrivalProcess
from slopilot.engine.sim.distributions import Distribution
from slopilot.engine.sim.workload import (
    DEFAULT_VOCAB_SIZE,
    ClassMix,
    RequestSpec,
    TokenSampler,
    check_run,
    child_rng,
)

# Stream ids for child_rng: each purpose draws from its own stream.
_ARRIVALS, _REQUEST, _PREFIX = 1, 2, 3


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenLoopPhase:
    """Traffic from ``start_s`` until the next phase (or the end of the run)."""

    start_s: float = 0.0
    arrivals: ArrivalProcess
    prompt_tokens: Distribution
    output_tokens: Distribution
    classes: ClassMix = ClassMix()
    # Tokens every prompt of this phase starts with (a shared system prompt): prefix
    # caching has something to hit even in open-loop traffic. Counted inside prompt_tokens.
    shared_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"start_s={self.start_s}: must be a finite time >= 0")
        if self.shared_prefix_tokens < 0:
            raise ValueError(f"shared_prefix_tokens={self.shared_prefix_tokens}: must be >= 0")


class OpenLoopWorkload:
    """Requests arrive on their own clock; finishing one never causes another."""

    def __init__(self, phases: list[OpenLoopPhase] | tuple[OpenLoopPhase, ...], *,
                 duration_s: float, seed: int = 0,
                 vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
        check_run([p.start_s for p in phases], duration_s, seed)
        self.phases = tuple(phases)
        self.duration_s = duration_s
        self.seed = seed
        self.tokens = TokenSampler(vocab_size)

    def initial(self) -> Iterator[RequestSpec]:
        for k, phase in enumerate(self.phases):
            end = self.phases[k + 1].start_s if k + 1 < len(self.phases) else self.duration_s
            end = min(end, self.duration_s)
            if phase.start_s >= end:
                break
            prefix = self.tokens.sample(child_rng(self.seed, _PREFIX, k),
                                        phase.shared_prefix_tokens)
            arrivals = phase.arrivals.times(child_rng(self.seed, _ARRIVALS, k),
                                            phase.start_s, end)
            # Lengths and tokens draw from their own stream, so changing the arrival
            # process (say, its rate) keeps the requests themselves the same.
            rng = child_rng(self.seed, _REQUEST, k)
            for t in arrivals:
                n_prompt = phase.prompt_tokens.int1(rng)
                n_out = phase.output_tokens.int1(rng)
                priority = phase.classes.sample(rng)
                shared = prefix[:max(0, n_prompt - 1)]
                own = self.tokens.sample(rng, n_prompt - len(shared))
                yield RequestSpec(arrival_time=t, prompt_token_ids=shared + own,
                                  max_tokens=n_out, priority=priority)

    def on_finish(self, spec: RequestSpec, all_token_ids: list[int],
                  now: float) -> list[RequestSpec]:
        return []

    def on_rejected(self, spec: RequestSpec, now: float) -> list[RequestSpec]:
        return []

    @property
    def mean_rate(self) -> float:
        """Requests per second averaged over the run (the phases' rates, time-weighted)."""
        total = 0.0
        for k, phase in enumerate(self.phases):
            end = self.phases[k + 1].start_s if k + 1 < len(self.phases) else self.duration_s
            total += phase.arrivals.mean_rate * max(0.0, min(end, self.duration_s) - phase.start_s)
        return total / self.duration_s
