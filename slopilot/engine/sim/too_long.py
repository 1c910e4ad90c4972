"""Requests a deployment can never serve, counted and said: each is past the longest
request one replica takes (``context_limit.servable_tokens``: the model's context, at most
its KV cache), so the server answers it 400 and the twin rejects it before it is judged.

Knobs cannot change that, and no SLO term measures it: a run that turns away most of its
load looks, by its P99s alone, like one that holds. ``simulate`` and ``tune`` warn above
``WARN_SHARE`` of the requests, and ``tune``'s verdict says it; above its
``--max-too-long`` share (``WARN_SHARE`` unless given) ``tune``'s verdict does not hold
(docs/tuning.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from slopilot.engine.config import EngineConfig
    from slopilot.engine.scheduler import Scheduler
    from slopilot.engine.sim.scenario import Scenario
    from slopilot.engine.sim.trace_formats import TraceRecord
    from slopilot.engine.window_summary import WindowSummary

WARN_SHARE = 0.01
"""Above this share of a run's requests rejected as too long, ``simulate`` and ``tune``
warn: a trace's odd overlong prompt is noise, one in a hundred already a class of the
load that the verdict does not see. ``tune``'s verdict does not hold above it either,
unless ``--max-too-long`` names a larger share."""


@dataclass(frozen=True)
class ServableLimit:
    """The longest request (prompt plus output) one replica of a deployment serves."""

    tokens: int
    bound: Literal["context", "kv_cache"]
    """What sets it: the model's context, or (smaller than that) the whole KV cache."""
    model: str
    kv_tokens: int
    """What one replica's whole KV cache holds (``tokens`` where it is the bound)."""

    def words(self) -> str:
        if self.bound == "context":
            return f"{self.model}'s {self.tokens:,}-token context"
        return f"one replica's KV cache of {self.tokens:,} tokens"

    def fix(self) -> str:
        if self.bound == "context":
            return "give a --scenario whose model's context holds them"
        return "give a --scenario whose GPUs hold them"


@dataclass(frozen=True)
class TooLong:
    """How many of a run's requests exceed ``limit``: rejected, never judged."""

    requests: int
    of: int
    limit: ServableLimit

    @property
    def share(self) -> float:
        return self.requests / self.of if self.of else 0.0

    @property
    def warns(self) -> bool:
        return self.exceeds(WARN_SHARE)

    def exceeds(self, max_share: float) -> bool:
        """More of them than ``max_share`` of the requests (none never does)."""
        return self.requests > 0 and self.share > max_share

    def percent(self) -> str:
        """The share as the warning says it: a decimal below 10 %, never rounded onto the
        warning's own threshold (2 of 199, above 1 %, read "1%", then "1.0%") nor onto
        all of them (9,996 of 10,000 read "100%")."""
        said = f"{self.share:.1%}" if self.share < 0.0995 else f"{self.share:.0%}"
        if self.share > WARN_SHARE and said in (f"{WARN_SHARE:.0%}", f"{WARN_SHARE:.1%}"):
            return f"just over {WARN_SHARE:.0%}"
        if self.requests < self.of and said == "100%":
            return "over 99.9%"
        return said

    def text(self) -> str:
        """``90 of 100 requests (90%) exceed llama-3-8b's 8,192-token context ...``."""
        return (f"{self.requests:,} of {self.of:,} requests ({self.percent()}) exceed "
                f"{self.limit.words()} (prompt plus output): each is rejected (the "
                "server's 400) whatever the knobs, and no SLO figure judges it; "
                f"{self.limit.fix()}, or check that the prompt and output columns hold "
                "lengths in tokens")

    def clause(self) -> str:
        """The verdict's sentence on them, shorter than ``text``'s warning."""
        return f"{self.rejected()}; {self.limit.fix()}."

    def rejected(self) -> str:
        """``90 of 100 requests (90%) exceed ... and are rejected unjudged``."""
        return (f"{self.requests:,} of {self.of:,} requests ({self.percent()}) exceed "
                f"{self.limit.words()} and are rejected unjudged")

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "of": self.of, "share": self.share,
                "limit_tokens": self.limit.tokens, "limit": self.limit.bound}


def scheduler_limit(sched: Scheduler, model: str) -> ServableLimit:
    """What bounds ``sched``'s requests (``Scheduler.servable_len``) and why."""
    holds = sched.kv.num_gpu_blocks * sched.kv.block_size
    if sched.max_model_len is not None and sched.max_model_len < holds:
        return ServableLimit(sched.max_model_len, "context", model, holds)
    return ServableLimit(holds, "kv_cache", model, holds)


def servable_limit(scenario: Scenario, config: EngineConfig) -> tuple[ServableLimit,
                                                                      Scheduler]:
    """One replica of ``scenario`` on ``config``: its limit, and the scheduler that
    judges requests by it (``can_ever_finish``)."""
    from slopilot.engine.sim.simulator import build_engine  # heavy: not at import

    engine, _ = build_engine(scenario, config)
    return scheduler_limit(engine.scheduler, scenario.model), engine.scheduler


def of_summary(summary: WindowSummary, limit: ServableLimit) -> TooLong | None:
    """The requests a run rejected as too long (rejected less refused for load), of
    those that arrived; None where the summary has no accounting."""
    a = summary.overall.accounting
    if a is None:
        return None
    bad = round(a.requests_rejected - summary.overall.requests_refused)
    return TooLong(max(bad, 0), a.requests_arrived, limit)


def count(scenario: Scenario, config: EngineConfig,
          records: Iterable[TraceRecord]) -> TooLong:
    """How many of a trace's ``records`` one replica of ``scenario`` never serves."""
    limit, sched = servable_limit(scenario, config)
    n = bad = 0
    for r in records:
        n += 1
        bad += not sched.can_ever_finish(r.prompt_tokens, r.output_tokens)
    return TooLong(bad, n, limit)
