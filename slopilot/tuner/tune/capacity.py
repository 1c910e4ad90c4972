"""The capacity answer: when no config holds the SLO on the replicas tuned at, the
smallest replica count that holds it, by the loop's own capacity search
(``loop/capacity.CapacityPlanner``) over the same windows and verdict.

The config that came closest on too few replicas is not always the best on more: under
overload a small ``max_num_seqs`` can buy TTFT that costs throughput once there is room.
So a few candidates are searched (the closest trials and the start config), each only
below the best count found so far, and the smallest count wins (ties: the earlier
candidate).

When none holds, the search may show that replicas are not the cure: a term that stays
where it is as the count doubles (``Flat``, in ``loop/replica_plateau.py``: one test for
this and the live loop) is bound by what each request costs alone (a long prompt's
prefill on an idle replica, one decode step), which more replicas do not shorten.
``tiny-cpu`` is the case: its P0 prompts reach 7,000 tokens after the shift, and their
prefill alone takes longer than P0's 300 ms TTFT limit on one A100, so its P0 TTFT p99
reads the same share of its limit on 2 replicas as on 16.

The flatness test reads two counts' P99s, and dispatch noise moves those: a reviewer's P0
TTFT p99 read 200 % of its limit on 2 replicas, 175 % on 4, 171 % on 8 and 151 % on 16,
not flat by that test, and the answer said "raise --max-replicas" for a term whose
prompts each alone on an idle replica read 133 ms against its 100 ms limit. So where no
count holds on a trace, each TTFT term is also held against its class's idle floor
(``idle_floor.py``): at ``FLOOR_SHARE`` of its limit or more, on every candidate's knobs,
no replica count holds, and the answer says so with the floor's figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.replica_plateau import Flat, flat
from slopilot.tuner.sim.robust import RobustEvaluator
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.verdict import term_label, worst_share
from slopilot.tuner.tune.idle_floor import IdleFloor, idle_floors


@dataclass(frozen=True)
class CapacityOutcome:
    replicas: int | None
    """The smallest count in [lo, hi] that holds; None when even ``hi`` does not."""
    config: Mapping[str, Any]
    """The knobs it holds with (the first candidate's when none holds)."""
    label: str
    """Which candidate that is: ``trial 27``, ``the start config``."""
    lo: int
    hi: int
    tried: Mapping[int, TrialResult] = field(default_factory=dict)
    """The winning candidate's results per count."""
    searched: tuple[tuple[str, int, bool], ...] = ()
    """(candidate, replicas, holds) for every simulation, in order."""
    floors: tuple[IdleFloor, ...] = ()
    """When none holds on a trace: each TTFT-limited class's idle floor, the lowest over
    the candidates' knobs (``idle_floor.py``)."""

    def binding(self) -> tuple[IdleFloor, ...]:
        """The floors that leave no replica count to hold their term."""
        return tuple(f for f in self.floors if f.binds)

    def flat(self) -> Flat | None:
        """The worst term of the two largest counts tried, when it is the same term and
        moved less than ``FLAT_SHARE`` of its limit (``loop/replica_plateau.flat``, the
        live loop's test too); None when some count holds."""
        return None if self.replicas is not None else flat(self.tried)

    def table_lines(self) -> list[str]:
        """The report's table: per count the winning candidate tried, whether it holds and
        its worst term, named, as a share of its limit."""
        lines = [self.sentence(), "",
                 "| replicas | holds SLO | worst term | share of limit |", "|---|---|---|---|"]
        for n, r in sorted(self.tried.items()):
            share, name = worst_share(r)
            label = "-" if name is None else term_label(name)[0]
            lines.append(f"| {n} | {'yes' if r.feasible else 'no'} | {label} | {share} |")
        return lines

    def sentence(self) -> str:
        tried = ", ".join(f"{label} on {n}: {'holds' if ok else 'misses'}"
                          for label, n, ok in self.searched)
        if self.replicas is None:
            bound = self.binding()
            if bound:
                return (f"No replica count holds the SLO (tried: {tried}): "
                        + "; ".join(f.text() for f in bound)
                        + ". More replicas only take the queue away, not a prompt's own "
                          "prefill: a faster GPU, tensor parallelism, shorter prompts in "
                          "that class or a looser limit can.")
            flat = self.flat()
            if flat is not None:
                return f"Not even {self.hi} replicas hold the SLO (tried: {tried}). {flat.text()}"
            return (f"Not even {self.hi} replicas hold the SLO (tried: {tried}); raise "
                    "--max-replicas, relax the SLO, or use a larger GPU or model "
                    "parallelism.")
        return (f"{self.replicas} replica{'s' if self.replicas != 1 else ''} hold the SLO "
                f"in every window with headroom, with {self.label}'s knobs (tried: {tried}).")

    def to_dict(self) -> dict[str, Any]:
        flat = self.flat()
        return {"replicas": self.replicas, "lo": self.lo, "hi": self.hi,
                "config": dict(self.config), "candidate": self.label,
                "tried": {str(n): {"feasible": r.feasible,
                                   "worst_term": max(r.constraints, default=0.0),
                                   "worst_term_name": worst_share(r)[1]}
                          for n, r in sorted(self.tried.items())},
                "flat": None if flat is None else dataclasses.asdict(flat),
                "idle_floor": [f.to_dict() for f in self.floors],
                "searched": [{"candidate": label, "replicas": n, "feasible": ok}
                             for label, n, ok in self.searched]}


def capacity_answer(evaluator: RobustEvaluator,
                    candidates: Sequence[tuple[str, Mapping[str, Any]]], lo: int, hi: int,
                    note: Callable[[str], None] = lambda _: None) -> CapacityOutcome:
    """Search ``[lo, hi]`` from below (``CapacityPlanner.search``) for each candidate."""
    if not candidates:
        raise ValueError("candidates is empty: the capacity search needs a config")
    searched: list[tuple[str, int, bool]] = []
    best: CapacityOutcome | None = None
    seen: list[Mapping[str, Any]] = []
    for label, config in candidates:
        if config in seen:
            continue
        seen.append(config)
        top = hi if best is None or best.replicas is None else best.replicas - 1
        if top < lo:
            break

        def score(scenario: Scenario, cfg: Mapping[str, Any], n: int,
                  label: str = label) -> TrialResult:
            note(f"capacity: {label} on {n} replicas ...")
            result = evaluator.at_replicas(n).evaluate(cfg)
            searched.append((label, n, result.feasible))
            note(f"capacity: {label} on {n} replicas "
                 f"{'holds' if result.feasible else 'does not hold'} the SLO")
            return result

        answer = CapacityPlanner(score_fn=score).search(
            evaluator.scenario, config, lo, top, margin=evaluator.margin)
        if best is None or answer.replicas is not None:
            best = CapacityOutcome(answer.replicas, dict(config), label, lo, hi,
                                   dict(answer.results))
    assert best is not None
    floors: tuple[IdleFloor, ...] = ()
    if best.replicas is None and isinstance(evaluator.scenario.workload, TraceSpec):
        lowest: dict[str, IdleFloor] = {}
        for config in seen:
            for f in idle_floors(evaluator.scenario, config, evaluator.slo):
                if f.cls not in lowest or f.ttft_ms < lowest[f.cls].ttft_ms:
                    lowest[f.cls] = f
        floors = tuple(lowest.values())
    return dataclasses.replace(best, searched=tuple(searched), floors=floors)
