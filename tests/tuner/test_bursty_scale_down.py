"""A bursty load (gamma gaps, cv 4) planned as Poisson read as calm: the loop gave back
replicas its bursts need (6 -> 2 at 6 req/s on tiny-cpu's A100s), and the windows after
breached. Planned on the burstiness its probe measures, the capacity runs need cv^2 times
the floor, reach their cap short of it, and no scale-down is taken on them.

The production Controller over a SimCluster, ticked on an injected clock as
``benchmarks/bursty_scale_down.py`` runs it (its figures: docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from benchmarks.bursty_scale_down import scenario, start
from slopilot.tuner.loop.decision import Action


def _fewest(poisson_plan: bool, cv: float | None) -> tuple[int, list[str]]:
    # The operator's 15 quiet minutes, then the first look at fewer replicas; the
    # capacity runs capped at 20 minutes (the hour's cap reads the same here, slower).
    sc = scenario(6.0, cv, 16.0)
    run, ticks = start(sc, 0, poisson_plan=poisson_plan, max_duration_s=1200.0)
    for _ in ticks:
        pass
    reasons = [d.reason for _, d in run.decisions if d.action is Action.SCALE]
    return min(n for _, n in run.path), reasons


@pytest.mark.slow
def test_a_bursty_load_keeps_the_replicas_its_bursts_need() -> None:
    before, why_before = _fewest(poisson_plan=True, cv=4.0)
    assert before <= 3, why_before  # today's plan: Poisson at the rate
    after, why = _fewest(poisson_plan=False, cv=4.0)
    assert after >= 5, why
