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

A generated workload's prompts are drawn per seed, and every seed the study judges on
must hold (``study/verdict.robust_verdict``): so each seed's drawn requests that arrive in
its measured window are priced the same way (less the phase's shared prefix, which the
prefix cache may serve), and a class's floor is its highest over the seeds. A session
workload's follow-up turns are drawn from the answers as the run goes, so it has none.

``FloorBook`` prices each config once: ``tune`` says the start config's floor before the
study (the study cannot find a config that holds where it binds, and the trials' knobs move
one prompt's prefill little: a reviewer read 169-172 ms across token budgets 1024-16384),
and the capacity answer reads the same book for its candidates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.sim.twin import servable_tokens_for
from slopilot.engine.sim.windows import WindowChoice
from slopilot.engine.sim.workload_spec import OpenLoopSpec, TraceSpec
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.tuner.sim.robust import WindowPlan
from slopilot.tuner.study.objective import HEADROOM

FLOOR_SHARE = 0.9
"""The share of its limit from which a class's idle floor says no replica count holds
its TTFT term: the verdict's headroom (10 %) leaves no room above it, and dispatch
onto a replica that is not idle only adds to it."""

P99 = 0.99
Alone = Callable[[Priority, int], float]
"""A ``tokens``-token prompt of a class's TTFT alone on an idle replica (``_alone_ms``)."""
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
    """The class's requests in the trace (or the seed) that one replica serves."""
    window: str | None = None
    """For a generated workload, the seed whose requests read it (``seed 1``): the
    highest over the seeds judged on."""

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
                f"{self.requests:,} requests{'' if self.window is None else ' in ' + self.window}"
                f", between its prompts of {prompts}, reads that "
                "with each prompt alone on an idle replica")

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "term": self.term, "prompt_tokens": self.prompt_tokens,
                "prompt_tokens_above": self.prompt_tokens_above,
                "ttft_ms": self.ttft_ms, "limit_ms": self.limit_ms, "share": self.share,
                "requests": self.requests, "window": self.window, "binds": self.binds}


def idle_floors(scenario: Scenario, config: Mapping[str, Any],
                slo: SLOSpec | None = None, plan: WindowPlan | None = None
                ) -> list[IdleFloor]:
    """Each TTFT-limited class's floor over ``scenario``'s trace, or over the seeds of
    ``plan`` (``kind == "seeds"``) for an open-loop workload, with knob overrides
    ``config``; empty for a session workload or a generated one without its seeds."""
    spec = scenario.workload
    slo = slo if slo is not None else scenario.slo
    priced: dict[tuple[Priority, int], float] = {}

    def alone(p: Priority, tokens: int) -> float:
        # Seeds drawn from one distribution share prompt lengths: each priced once.
        if (p, tokens) not in priced:
            priced[p, tokens] = _alone_ms(scenario, config, p, tokens)
        return priced[p, tokens]

    if isinstance(spec, TraceSpec):
        return _trace_floors(scenario, spec, config, slo, alone)
    if not isinstance(spec, OpenLoopSpec) or plan is None or plan.kind != "seeds":
        return []
    worst: dict[str, IdleFloor] = {}
    for w in plan.windows:
        for f in _seed_floors(scenario, spec, config, slo, w, alone):
            if f.cls not in worst or f.ttft_ms > worst[f.cls].ttft_ms:
                worst[f.cls] = f
    return list(worst.values())


class FloorBook:
    """Each config's floors (``idle_floors``), priced once whoever asks first."""

    def __init__(self, scenario: Scenario, slo: SLOSpec, plan: WindowPlan | None) -> None:
        self.scenario, self.slo, self.plan = scenario, slo, plan
        self._priced: list[tuple[dict[str, Any], list[IdleFloor]]] = []

    def of(self, config: Mapping[str, Any]) -> list[IdleFloor]:
        for seen, floors in self._priced:
            if seen == config:
                return floors
        floors = idle_floors(self.scenario, config, self.slo, self.plan)
        self._priced.append((dict(config), floors))
        return floors


def up_front(floors: list[IdleFloor]) -> str | None:
    """The warning ``tune`` prints before the study where the start config's floor binds
    a term, with its cures; None where none binds. Said as what it is, a floor on the
    start config's knobs: the trials' knobs are not priced."""
    binding = [f for f in floors if f.binds]
    if not binding:
        return None
    said = "; ".join(f.text() for f in binding)
    cls = " and ".join(f.cls.upper() for f in binding)
    return (f"on the start config's knobs, {said}. No replica count holds "
            f"{'that term' if len(binding) == 1 else 'those terms'} on those knobs, and the "
            "trials' knobs move one prompt's prefill little: loosen "
            f"{cls}'s TTFT limit, serve on a faster GPU or with more tensor parallelism, or "
            f"shorten {cls}'s prompts. The study runs on to find the closest config; stop it "
            "(Ctrl-C) if that is not worth the wait")


def _trace_floors(scenario: Scenario, spec: TraceSpec, config: Mapping[str, Any],
                  slo: SLOSpec, alone: Alone) -> list[IdleFloor]:
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
    return _floors(slo, prompt, classes, served, alone)


def _seed_floors(scenario: Scenario, spec: OpenLoopSpec, config: Mapping[str, Any],
                 slo: SLOSpec, w: WindowChoice, alone: Alone) -> list[IdleFloor]:
    """The floors of one seed's drawn requests that arrive in its measured window (the
    ones its verdict counts, as ``RobustEvaluator`` draws them)."""
    horizon = w.warmup_s + w.length_s + w.drain_s
    specs = [r for r in scenario.build_workload(seed=w.seed, duration_s=horizon).initial()
             if w.warmup_s <= r.arrival_time < w.warmup_s + w.length_s]
    if not specs:
        return []
    starts = [p.start_s for p in spec.phases]
    # The phase's shared prefix left out: the prefix cache may serve it (a lower bound).
    shared = np.array([spec.phases[int(np.searchsorted(starts, r.arrival_time,
                                                       side="right")) - 1]
                       .shared_prefix_tokens for r in specs], dtype=np.float64)
    tokens = np.array([r.num_prompt_tokens for r in specs], dtype=np.float64)
    prompt = np.maximum(1.0, tokens - np.minimum(shared, tokens - 1))
    classes = np.array([r.priority.value for r in specs], dtype=np.int64)
    limit = servable_tokens_for(scenario, config)
    served = np.array([r.num_prompt_tokens + r.max_tokens <= limit for r in specs],
                      dtype=bool)
    return [dataclasses.replace(f, window=w.name)
            for f in _floors(slo, prompt, classes, served, alone)]


def _floors(slo: SLOSpec, prompt: np.ndarray, classes: np.ndarray, served: np.ndarray,
            alone: Alone) -> list[IdleFloor]:
    """Each TTFT-limited class's floor over the requests' fresh prompt tokens."""
    out = []
    for p, c in slo.classes().items():
        if c.ttft_p99_ms is None:
            continue
        mine = prompt[served & (classes == p.value)]
        if len(mine):
            out.append(_floor(p, c, mine, alone))
    return out


def _floor(p: Priority, c: ClassSLO, mine: np.ndarray, alone: Alone) -> IdleFloor:
    assert c.ttft_p99_ms is not None
    lo = max(1, int(np.percentile(mine, 100 * P99, method="lower")))
    hi = max(1, int(np.percentile(mine, 100 * P99, method="higher")))
    rank = P99 * (len(mine) - 1)
    at_lo = alone(p, lo)
    at_hi = at_lo if hi == lo else alone(p, hi)
    ttft = at_lo + (rank - np.floor(rank)) * (at_hi - at_lo)
    return IdleFloor(p.label, lo, hi, float(ttft), float(c.ttft_p99_ms), len(mine))


def _alone_ms(scenario: Scenario, config: Mapping[str, Any], priority: Priority,
              tokens: int) -> float:
    """The TTFT of one ``tokens``-token prompt on an idle replica, as simulated."""
    spec = scenario.workload
    assert isinstance(spec, TraceSpec | OpenLoopSpec)
    workload = TraceWorkload([TraceRecord(0.0, tokens, 1, priority=priority)],
                             seed=scenario.seed, vocab_size=spec.vocab_size)
    run = simulate(scenario, config, replicas=1, workload=workload,
                   measure=Measure(0.0, 1.0, IDLE_HORIZON_S), until_judged=True)
    ttft = run.summary.classes[priority].ttft_p99_ms
    if ttft is None:
        raise ValueError(f"a {tokens:,}-token {priority.label.upper()} prompt alone on an "
                         f"idle replica got no first token in {IDLE_HORIZON_S:.0f} s")
    return float(ttft)
