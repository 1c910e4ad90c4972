"""The two questions the loop asks the simulator (the twin), in one place.

``warm_starts``: which configs an offline study on the measured workload ranks best at a
replica count (each with "holds in simulation"); ``capacity``: how many replicas hold the
SLO at that load. The steps lean on both with margins (``LoopContext.scale_up_margin``,
``headroom_margin``).

Neither answer is taken on faith: with an ``IterationSource``, ``checked`` first compares
the twin with the last measured window and corrects its profile (``twin_check.py``), and
both questions are put to the corrected twin. A twin whose error stays above
``twin_max_error`` after correction is not trusted: ``warm_starts`` gives nothing (the
episode runs live trials from the study alone) and ``capacity`` gives None (the steps
scale on live evidence only, one replica at a time, and never down). A twin whose
simulator processes are busy with other deployments' calls past the queue limit
(``SimulatorBusy``) gives no answer the same way: one deployment's searches must not
stop another's loop; so does a call that ran past its time limit or its memory cap, or
whose process was killed (a measured workload too heavy to simulate: ``ports.NO_ANSWER``),
which rolled back every tick that asked, so no trial ever ran. ``unavailable`` says why
there was no answer. A trusted twin whose P0 p99s came out below the measured ones plans a
scale-down with that shortfall added to its margin: an optimistic twin must not size a
scale-down.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.twin import with_profile
from slopilot.tuner.loop import scale_wait
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.ports import NO_ANSWER, SimulatorBusy
from slopilot.tuner.loop.twin_check import TwinCheck, check_twin, measured_window

Ranked = list[tuple[dict[str, Any], bool]]
HISTORY = 8
"""Checked windows whose iterations the next correction is fitted on too."""
MAX_MARGIN = 0.9


def checked(ctx: LoopContext, now: float, scenario: Scenario, config: Mapping[str, Any],
            replicas: int) -> tuple[Scenario, TwinCheck | None]:
    """``scenario`` on the twin corrected from the last window, and the check; once a
    tick (a step that asks both questions checks once)."""
    if ctx.iterations is None:
        return scenario, None
    check = ctx.twin_check
    if check is None or check.at != now:
        w = ctx.settings.window_s
        start, mid = max(0.0, now - w), max(0.0, now - w / 2)
        halves = (ctx.iterations.iterations(start, mid), ctx.iterations.iterations(mid, now))
        measured = measured_window(ctx.evaluator, start, now) if now > start else None
        check = check_twin(ctx.settings, halves, scenario, config, replicas, measured,
                           at=now, window_s=now - start if now > start else w,
                           history=[s for _, window in ctx.twin_history for s in window],
                           simulator=ctx.twin)
        if not ctx.twin_history or ctx.twin_history[-1][0] <= start:  # no overlap
            ctx.twin_history = [*ctx.twin_history, (now, [*halves[0], *halves[1]])][-HISTORY:]
        ctx.twin_check = check
        ctx.loop.twin = check.to_dict()
        ctx.metrics.twin(ctx.settings.deployment, check)
    if check.profile is not None:  # corrected (or a datasheet twin shown wrong)
        scenario = with_profile(scenario, check.profile)
    return scenario, check


def unavailable(ctx: LoopContext, now: float) -> str | None:
    """Why the twin gave no answer this tick (busy, failed, or checked and not trusted); None
    when it answered (or was not asked)."""
    if ctx.twin_no_answer is not None and ctx.twin_no_answer[0] == now:
        return ctx.twin_no_answer[1]
    check = ctx.twin_check
    if check is None or check.at != now or check.trusted:
        return None
    return f"twin_untrusted: {check.reason}"


def _no_answer(ctx: LoopContext, now: float, exc: Exception) -> None:
    if isinstance(exc, SimulatorBusy):
        ctx.twin_no_answer = (now, f"twin_busy: {exc}")
    else:
        why = str(exc) or f"{type(exc).__name__} in the simulator"
        ctx.twin_no_answer = (now, f"twin_failed: {why}")


def warm_starts(ctx: LoopContext, now: float, replicas: int, current: Mapping[str, Any],
                scenario: Scenario | None = None) -> Ranked:
    """The offline study's best configs, minus ``current``, the one that is running.

    The running config is what the firing alert measured: the live evidence that it
    does not hold outranks a simulator that says it does (a workload profile that
    lags the shift, a cost model off for this hardware), so it is no warm start.
    """
    current = dict(current)
    scenario = scenario if scenario is not None else ctx.probe.measure(now)
    if ctx.offline is None:
        return []
    scenario, check = checked(ctx, now, scenario, current, replicas)
    if check is not None and not check.trusted:
        return []
    k = ctx.settings.warm_start_k
    try:
        ranked = ctx.offline.best_configs(scenario, replicas, current, k + 1)
    except NO_ANSWER as exc:
        _no_answer(ctx, now, exc)
        return []
    return [(c, ok) for c, ok in ranked
            if any(current.get(key) != v for key, v in c.items())][:k]


def capacity(ctx: LoopContext, now: float, scenario: Scenario, config: Mapping[str, Any],
             lo: int, hi: int, *, margin: float, running: Mapping[str, Any],
             removing: bool = False) -> CapacityAnswer | None:
    """The fewest replicas in [lo, hi] that hold ``config`` with ``margin`` to spare;
    None when the twin, checked on the window ``running`` served, is not trusted, or busy.
    ``removing``: the answer may take replicas away (a scale-down)."""
    scenario, check = checked(ctx, now, scenario, running, scale_wait.serving(ctx, now))
    if check is not None and not check.trusted:
        return None
    if removing and check is not None and (optimism := check.latency_optimism()) > 0:
        # Corrected step times can still leave the twin's p99s low (the window did not
        # exercise the shapes a heavier load per replica brings): a scale-down plans
        # with that much more headroom. A scale-up does not: one replica short is put
        # right by the next alert, a margin it can never meet would buy the maximum.
        margin = min(MAX_MARGIN, margin + optimism)
    try:
        return ctx.planner.search(scenario, config, lo, hi, margin=margin)
    except NO_ANSWER as exc:
        _no_answer(ctx, now, exc)
        return None
