"""The least a class's TTFT p99 can read on any number of replicas: its P99-rank prompt
alone on an idle replica.

A TTFT is at least the prefill of its own prompt, and more replicas only take the
queue in front of it away. So over a trace, a class's TTFT p99 cannot fall below the
idle TTFT at its P99 rank: numpy's linear P99 (the summary's) between the idle TTFTs
of the two prompts it interpolates between (counted in tokens past a prefix an earlier
prompt sent, as the windows count them: ``prefix_reuse.fresh_tokens``), each priced as
the simulator prices it: that one request replayed on an idle replica with the config's
knobs (chunking and all). An idle TTFT grows with the prompt, so this is the P99 the
class's prompts would read each alone, what a replay of them 3 s apart reads.

Found by a reviewer: a P0 TTFT p99 read 200 % of its 100 ms limit on 2 replicas, 175 %
on 4, 171 % on 8, 151 % on 16, dispatch noise moving it by more than the capacity
search's flatness test (``loop/replica_plateau.flat``: under 5 % from 8 to 16) allows,
and tune advised "raise --max-replicas"; 64 replicas read 146 ms, and the same prompts
each alone on an idle replica 133 ms. Where the floor reaches ``FLOOR_SHARE`` of the
limit, no replica count holds (with the headroom, none can), and the capacity answer
says so (``capacity.py``) rather than asking for more replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.sim.twin import servable_tokens_for
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import HEADROOM

FLOOR_SHARE = 0.9
"""The share of its limit from which a class's idle floor says no replica count holds
its TTFT term: the verdict's headroom (10 %) leaves no room above it, and dispatch
onto a replica that is not idle only adds to it."""

P99 = 0.99
IDLE_HORIZON_S = 600.0
"""How long the one request's replay may run: any prefill a replica serves ends well
within it."""


@dataclass(frozen=True)
class IdleFloor:
    """One class's TTFT p99 floor: its P99-rank prompt alone on an idle replica."""

    cls: str
    """The class's label, ``p0``."""
    prompt_tokens: int
    """The shorter of the two prompts its P99 interpolates between, in tokens past a
    prefix sent before."""
    prompt_tokens_above: int
    """The longer one (the same where the rank falls on one prompt)."""
    ttft_ms: float
    limit_ms: float
    requests: int
    """The class's requests in the trace that one replica serves."""

    @property
    def term(self) -> str:
        return f"{self.cls}.ttft_p99"

    @property
    def share(self) -> float:
        return self.ttft_ms / self.limit_ms

    @property
    def binds(self) -> bool:
        """Whether it leaves no replica count to hold the term (``FLOOR_SHARE``)."""
        return self.share >= FLOOR_SHARE

    @property
    def past_limit(self) -> bool:
        """Whether it is past the limit itself: no count is even within the SLO short of
        the headroom, so the capacity search has nothing to replay for."""
        return self.ttft_ms > self.limit_ms

    def text(self) -> str:
        prompts = (f"{self.prompt_tokens:,} tokens" if self.prompt_tokens_above
                   == self.prompt_tokens else
                   f"{self.prompt_tokens:,} and {self.prompt_tokens_above:,} tokens")
        # Under the limit it binds through the headroom: said bare, "96 ms of its 100 ms
        # limit" read as a term that holds.
        needs = (f"; a verdict holds it only under {(1 - HEADROOM) * self.limit_ms:.0f} ms, "
                 f"the limit less its {HEADROOM:.0%} headroom"
                 if self.share < 1.0 else "")
        return (f"{self.cls.upper()} TTFT p99 cannot fall below {self.ttft_ms:.0f} ms "
                f"({self.share:.0%} of its {self.limit_ms:.0f} ms limit{needs}): its P99 "
                f"over its "
                f"{self.requests:,} requests, between its prompts of {prompts}, reads that "
                "with each prompt alone on an idle replica")

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "term": self.term, "prompt_tokens": self.prompt_tokens,
                "prompt_tokens_above": self.prompt_tokens_above,
                "ttft_ms": self.ttft_ms, "limit_ms": self.limit_ms, "share": self.share,
                "requests": self.requests, "binds": self.binds}


def idle_floors(scenario: Scenario, config: Mapping[str, Any],
                slo: SLOSpec | None = None) -> list[IdleFloor]:
    """Each TTFT-limited class's floor over ``scenario``'s trace with knob overrides
    ``config``; empty for a generated workload (its prompts are drawn per seed: its
    capacity answer keeps the flatness test alone)."""
    spec = scenario.workload
    if not isinstance(spec, TraceSpec):
        return []
    slo = slo if slo is not None else scenario.slo
    records = spec.records()
    if not records:
        return []
    # Each record's class as the replay draws it (from its place in the trace).
    replay = TraceWorkload(records, seed=scenario.seed, classes=spec.classes,
                           vocab_size=spec.vocab_size)
    classes = np.array([r.priority.value for r in replay.initial()], dtype=np.int64)
    output = np.fromiter((r.output_tokens for r in records), dtype=np.float64)
    prompt = fresh_tokens(records) - output
    limit = servable_tokens_for(scenario, config)
    served = np.fromiter((r.prompt_tokens + r.output_tokens <= limit for r in records),
                         dtype=bool)
    out = []
    for p, c in slo.classes().items():
        if c.ttft_p99_ms is None:
            continue
        mine = prompt[served & (classes == p.value)]
        if not len(mine):
            continue
        lo = max(1, int(np.percentile(mine, 100 * P99, method="lower")))
        hi = max(1, int(np.percentile(mine, 100 * P99, method="higher")))
        rank = P99 * (len(mine) - 1)
        at_lo = _alone_ms(scenario, config, p, lo)
        at_hi = at_lo if hi == lo else _alone_ms(scenario, config, p, hi)
        ttft = at_lo + (rank - np.floor(rank)) * (at_hi - at_lo)
        out.append(IdleFloor(p.label, lo, hi, float(ttft), float(c.ttft_p99_ms), len(mine)))
    return out


def _alone_ms(scenario: Scenario, config: Mapping[str, Any], priority: Priority,
              tokens: int) -> float:
    """The TTFT of one ``tokens``-token prompt on an idle replica, as simulated."""
    spec = scenario.workload
    assert isinstance(spec, TraceSpec)
    workload = TraceWorkload([TraceRecord(0.0, tokens, 1, priority=priority)],
                             seed=scenario.seed, vocab_size=spec.vocab_size)
    run = simulate(scenario, config, replicas=1, workload=workload,
                   measure=Measure(0.0, 1.0, IDLE_HORIZON_S), until_judged=True)
    ttft = run.summary.classes[priority].ttft_p99_ms
    if ttft is None:
        raise ValueError(f"a {tokens:,}-token {priority.label.upper()} prompt alone on an "
                         f"idle replica got no first token in {IDLE_HORIZON_S:.0f} s")
    return float(ttft)
