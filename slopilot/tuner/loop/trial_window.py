"""A running trial's window and its verdict: measured past its first ``settle_s`` from
when its config took effect (its apply's return, ``trial.py``; a rollout's end or a
drained backlog where it waited for one), looked
at early for a breach that cuts it short, repeated when the window says nothing of it
(rejected, or without a sample of the class the alerts are about), confirmed on a second
window when it holds within ``HEADROOM`` of a limit, and scored: a trial that holds sends
the episode to COMMIT."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from slopilot.engine.window_summary import ClassFigures, WindowSummary
from slopilot.tuner.loop.context import LoopContext
from slopilot.tuner.loop.decision import Action, Decision, TrialOutcome
from slopilot.tuner.loop.state import ControllerState, RunningTrial
from slopilot.tuner.loop.transitions import Event, Go
from slopilot.tuner.loop.trial import end_trial, next_trial
from slopilot.tuner.study.evaluator import (
    PrometheusUnavailable,
    ReplicaRestarted,
    WindowRejected,
)
from slopilot.tuner.study.objective import (
    HEADROOM,
    TrialResult,
    holds,
    score,
    unmeasured,
)
from slopilot.tuner.study.sample_floor import Shortfall, shortfall, starved


def running_trial(ctx: LoopContext, now: float, t: RunningTrial) -> Decision | Go:
    s = ctx.settings
    elapsed = now - t.started_at
    if elapsed < s.window_s:
        return _early_look(ctx, now, t, elapsed)
    start = _measured_from(ctx, t)
    began = _window_began(t)
    if now - began > s.max_trial_s + s.window_s:
        # Looked at long after it could have ended (an operator down for days, a late
        # tick): its last max_trial_s are the trial's, not days of loads and a config the
        # pods may have lost in between, in one range query over all of it. Not its last
        # window alone: at a thin class's rate that was unjudged by construction (14 of
        # 100 P0 requests in 2 min, where the config had served 330 since).
        start = now - s.max_trial_s
    try:
        summary = ctx.evaluator.measure(start, now, canary=t.canary)
    except ReplicaRestarted as exc:
        return _restarted(ctx, t, exc)
    except WindowRejected as exc:
        return _repeat(ctx, now, t, exc.reason)
    why = _no_verdict(ctx, summary)
    if why is not None:
        return _repeat(ctx, now, t, why)
    bound = _bound(ctx, summary)
    short = shortfall(summary, s.slo, s.min_class_requests, now - start, bound)
    if short is not None and not _decisive_miss(ctx, summary, bound, now - start):
        if (breach := _breach(ctx, summary)) is not None:
            return _cut(ctx, t, summary, breach)
        return _extended(ctx, now, t, short, now - began, summary)
    return _scored(ctx, now, t, summary, start)


def _bound(ctx: LoopContext, summary: WindowSummary) -> frozenset[str] | None:
    """The classes the floor binds: those the episode's alerts are about (every judged
    class where they name none), and any class ``starved`` in the window (clients left
    waiting for a first token, fewer samples than the floor). Another class's figures
    decide no commit on fewer than the floor: within its SLO, its sparse P99 is no
    evidence either way and holds the trial back from nothing; over it, it is a miss
    (``_decisive_miss``). A starved class within it is no evidence of an SLO met: its
    few first tokens are the lucky ones while the rest wait (its waiters past their
    target are in its P99 already, and a breach cuts the trial: ``_breach``)."""
    about = ctx.loop.episode_classes
    if not about:
        return None
    s = ctx.settings
    return frozenset(about) | starved(summary, s.slo, s.min_class_requests)


def _decisive_miss(ctx: LoopContext, summary: WindowSummary,
                   bound: frozenset[str] | None, duration_s: float) -> bool:
    """Whether a class misses its SLO on evidence enough for a verdict now, without
    waiting for the floor of the others: one that holds the floor, or one the floor does
    not bind (a sparse class over its SLO counts as a miss, as before the floor). A
    class the floor binds that is short of it and reads over is no verdict yet (the
    breach rule still cuts it when it reads far over)."""
    s = ctx.settings
    result = score(summary, s.slo)
    missed = {name.split(".")[0] for name, value
              in zip(result.constraint_names, result.constraints, strict=True)
              if "." in name and value > 0.0}
    return any(
        (bound is not None and label not in bound)
        or shortfall(summary, s.slo, s.min_class_requests, duration_s,
                     frozenset({label})) is None
        for label in missed)


def _window_began(t: RunningTrial) -> float:
    """Where ``max_trial_s`` counts from: the trial's start for its first window, and
    its confirming window's own start for that one. Counted from the trial's start, a
    first window that needed 690 s for the floor left its confirming one too little time
    to reach it, and no confirmation at the docs' own headline rate ever completed."""
    if t.edge_constraints is not None:
        return t.started_at
    return t.began_at if t.began_at is not None else t.started_at


def _extended(ctx: LoopContext, now: float, t: RunningTrial, short: Shortfall,
              ran_s: float, summary: WindowSummary) -> Decision | Go:
    """A window with fewer than ``min_class_requests`` of a judged class is no verdict:
    its P99 is one of a few requests' largest, and at 12 requests a config 1.25 x over
    the SLO passed a third of the time (``docs/closed_loop.md``). The trial runs on and
    its window is measured again, over all of it since it settled, until it holds
    enough; past ``max_trial_s`` from the window's start (``_window_began``) the trial
    ends unjudged, and the episode with it (the next trial would see the same trickle)."""
    s = ctx.settings
    if ran_s < s.max_trial_s:
        return ctx.decide(Action.NONE, f"trial {t.number} extended: {short.describe()}, "
                          f"judged at {short.floor}", trial=t.number)
    why = f"too little traffic to judge: {short.describe()} (max_trial_s)"
    ctx.study.tell_failed(t.number, why)
    end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
              f"too_little_traffic trial {t.number}: {why}", summary)
    return Go(ControllerState.COMMIT, Event.TOO_LITTLE_TRAFFIC,
              f"trial {t.number} rolled back, {why}", summary=summary)


def _repeat(ctx: LoopContext, now: float, t: RunningTrial, why: str) -> Decision:
    """A window that does not count: measured again, up to ``max_window_repeats`` times
    in a row, after which the trial counts as failed and is reverted."""
    t.repeats += 1
    if t.repeats >= ctx.settings.max_window_repeats:
        ctx.study.tell_failed(t.number, f"window rejected {t.repeats} times: {why}")
        return end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
                          f"window_rejected trial {t.number} {t.repeats} times: {why}",
                          None)
    t.started_at = now
    return ctx.decide(Action.REPEAT, f"window_rejected trial {t.number} "
                      f"(repeat {t.repeats}): {why}", trial=t.number)


def _restarted(ctx: LoopContext, t: RunningTrial, exc: ReplicaRestarted) -> Decision:
    """A replica the trial measures restarted its process in place during the window (a
    container OOM-killed under the trial's larger batches, a failed liveness probe): the
    new process started from its ConfigMap, the committed config, so what follows is not
    the trial's config, and a crash under a config is the loudest verdict on it. The
    trial is failed and reverted at once. Before, the early look read the rejection as
    "too little to tell yet", and each full window was rejected and measured again, up
    to ``max_window_repeats`` windows of a canary crash-looping under the trial. A
    restart that was not the config's costs one trial; the study is told it failed, not
    a figure."""
    why = f"{exc.reason} (under trial {t.number}'s config)"
    ctx.study.tell_failed(t.number, why)
    return end_trial(ctx, t, TrialOutcome.FAILED, Action.REVERT,
                     f"replica_restarted trial {t.number}: {why}", None)


def _no_verdict(ctx: LoopContext, summary: WindowSummary) -> str | None:
    """Why a measured window says nothing of the trial, or None when it does.

    ``score`` reads a class without samples as meeting its SLO, which is right for a
    class the workload does not send. It is not for the class an alert fired on: a
    canary's window (a share of the traffic) can miss a small class entirely, and the
    trial then "held" with nothing measured for what the episode is about. A class the
    alerts are not about may be absent (a trace without P2); a window in which no class
    with an SLO was measured at all is never a verdict."""
    absent = unmeasured(summary, ctx.settings.slo)
    about = [c for c in ctx.loop.episode_classes if c in absent]
    if about:
        return f"no sample of {', '.join(about)} (the class the alert fired on) in the window"
    judged = [p for p, c in ctx.settings.slo.classes().items()
              if c.ttft_p99_ms is not None or c.tbt_p99_ms is not None]
    if judged and len(absent) == len(judged):
        return "no sample of any class with an SLO in the window"
    return None


def _measured_from(ctx: LoopContext, t: RunningTrial) -> float:
    """Where a trial's window is measured from: past its first seconds, in which the
    requests that arrived under the config before it finish (``settle_s``; its start is
    the drain of a backlog it inherited, ``backlog_wait.py``, where it had one); a repeat
    follows a window of the same config, so it is measured whole, as is a confirming one."""
    first = t.repeats == 0 and t.edge_constraints is None
    return t.started_at + (ctx.settings.settle_s if first else 0.0)


def _early_look(ctx: LoopContext, now: float, t: RunningTrial,
                elapsed: float) -> Decision:
    """Mid-window, after ``revert_after_s``: cut a trial short that breaks a class's SLO
    badly (past the window, an extended one is looked at alike on every tick)."""
    partial, start = None, _measured_from(ctx, t)
    if elapsed >= ctx.settings.revert_after_s and now > start:
        try:
            partial = ctx.evaluator.measure(start, now, canary=t.canary)
        except ReplicaRestarted as exc:
            return _restarted(ctx, t, exc)
        except WindowRejected:
            partial = None  # too little to tell yet: the window goes on
    breach = None if partial is None else _breach(ctx, partial)
    if partial is None or breach is None:
        return ctx.decide(Action.NONE, f"trial {t.number} running", trial=t.number)
    return _cut(ctx, t, partial, breach)


def _cut(ctx: LoopContext, t: RunningTrial, summary: WindowSummary,
         breach: str) -> Decision:
    """A trial that breaks a class's SLO badly, cut short (the early look, and every
    tick of a window extended for the floor): told its score, reverted."""
    ctx.study.tell(t.number, score(summary, ctx.settings.slo, t.config))
    ctx.loop.count_measured()
    return end_trial(ctx, t, TrialOutcome.REVERTED, Action.REVERT,
                      f"slo_breach trial {t.number} cut short: {breach}", summary)


def _scored(ctx: LoopContext, now: float, t: RunningTrial,
            summary: WindowSummary, start: float) -> Decision | Go:
    loop, s = ctx.loop, ctx.settings
    result = score(summary, s.slo, t.config)
    evidence = summary
    first = None if t.edge_constraints is None else _first_window(ctx, t)
    if first is not None:
        # Judged again by the SLO in force: the terms kept with the trial are the SLO's
        # it was judged on then, and an edit since (a target tightened, a class's added)
        # read them against the new one's (a miss committed, or zip() failed the tick).
        result = _with_first_window(result, score(first, s.slo, t.config))
        if result.feasible:  # the commit's evidence: what it was judged on
            evidence = both_windows(first, summary)
    elif result.feasible and not holds(result, HEADROOM):
        return _confirm(ctx, now, t, result, start)
    ctx.study.tell(t.number, result)
    ctx.metrics.trial(s.deployment, TrialOutcome.COMPLETE)
    loop.episode_trials += 1
    loop.count_measured()
    loop.trial = None
    if result.feasible:
        loop.episode_feasible += 1
        if loop.best_goodput is None or result.goodput_tok_s > loop.best_goodput:
            loop.best_config, loop.best_goodput = dict(t.config), result.goodput_tok_s
        return Go(ControllerState.COMMIT, Event.TRIAL_HOLDS, f"trial {t.number} holds the "
                  f"SLO (goodput {result.goodput_tok_s:.0f} tok/s)", summary=evidence)
    worst = max(zip(result.constraint_names, result.constraints, strict=True),
                key=lambda kv: kv[1], default=("?", 0.0))
    reason = f"trial {t.number} infeasible: {worst[0]} {worst[1]:+.0%} over"
    if loop.episode_trials >= s.max_trials or \
            len(loop.trial_starts) >= s.hourly_trials:
        return next_trial(ctx, now, reason)  # ends the episode now
    return ctx.decide(Action.NONE, reason, trial=t.number, config=t.config, summary=summary)


def _confirm(ctx: LoopContext, now: float, t: RunningTrial, result: TrialResult,
             start: float) -> Decision:
    """A window that holds, but with a term within ``HEADROOM`` of its limit: one more
    window of the same config before it counts. The simulator's verdicts need 10 % to
    spare, and a live window's P99 rests on a few hundred requests of a class at most:
    one window at 99.7 % of a limit used to commit everywhere. A config held on two
    windows commits (a config truly at the limit passes one about half the time, two
    about a quarter, where each window holds ``min_class_requests`` of each judged
    class: on a dozen, whose P99 is their maximum, one passed nine times in ten); one
    clear of the margin still commits on its first."""
    t.edge_constraints, t.edge_goodput = list(result.constraints), result.goodput_tok_s
    t.edge_from, t.started_at = start, now
    name, value = max(zip(result.constraint_names, result.constraints, strict=True),
                      key=lambda kv: kv[1])
    return ctx.decide(Action.REPEAT, f"confirming trial {t.number}: {name} at "
                      f"{value + 1:.1%} of its limit, within the {HEADROOM:.0%} margin: "
                      "one more window", trial=t.number, config=t.config,
                      summary=result.summary)


def _with_first_window(second: TrialResult, first: TrialResult) -> TrialResult:
    """The trial's result over its two windows, both judged by one SLO: each term the
    worse window's, the lower goodput, feasible only when both held."""
    constraints = tuple(max(a, b) for a, b in zip(first.constraints, second.constraints,
                                                   strict=True))
    return dataclasses.replace(
        second, constraints=constraints, feasible=all(c <= 0.0 for c in constraints),
        goodput_tok_s=min(first.goodput_tok_s, second.goodput_tok_s))


def _first_window(ctx: LoopContext, t: RunningTrial) -> WindowSummary | None:
    """The confirming trial's first window, measured again; None where it can no longer
    be (a state from before ``edge_from``, or a window Prometheus no longer answers
    for): the SLO it was judged by is then unknown, and the window just measured is a
    first window of its own."""
    if t.edge_from is None or not t.edge_from < t.started_at:
        return None
    try:
        return ctx.evaluator.measure(t.edge_from, t.started_at, canary=t.canary)
    except (WindowRejected, PrometheusUnavailable):
        return None


def both_windows(first: WindowSummary, second: WindowSummary) -> WindowSummary:
    """Two windows of one config as the verdict on both reads them: each class's worse
    P99s, SLO attainment and goodput (the lower), its requests over both; the engine's
    other figures the second window's."""
    def worse(a: float | None, b: float | None, pick: Callable[[float, float], float]
              ) -> float | None:
        return b if a is None else a if b is None else pick(a, b)

    def joined(a: ClassFigures, b: ClassFigures) -> ClassFigures:
        return ClassFigures(
            requests_finished=a.requests_finished + b.requests_finished,
            throughput_tok_s=min(a.throughput_tok_s, b.throughput_tok_s),
            goodput_tok_s=min(a.goodput_tok_s, b.goodput_tok_s),
            ttft_p99_ms=worse(a.ttft_p99_ms, b.ttft_p99_ms, max),
            tbt_p99_ms=worse(a.tbt_p99_ms, b.tbt_p99_ms, max),
            slo_attainment=worse(a.slo_attainment, b.slo_attainment, min),
            requests_refused=a.requests_refused + b.requests_refused,
            ttft_samples=None if a.ttft_samples is None or b.ttft_samples is None
            else a.ttft_samples + b.ttft_samples,
            # Waiting at the end of both: the second window's (the first's were in it).
            requests_awaiting=b.requests_awaiting)

    return dataclasses.replace(
        second, duration_s=first.duration_s + second.duration_s,
        preemptions_per_min=max(first.preemptions_per_min, second.preemptions_per_min),
        overall=joined(first.overall, second.overall),
        classes={p: joined(first.classes[p], second.classes[p]) for p in second.classes},
        window=None)


def _breach(ctx: LoopContext, summary: WindowSummary) -> str | None:
    """A class's P99 over ``1 + revert_margin`` times its SLO, for every class with an
    SLO: the early look's rule for P0, applied to each (a P1 at 10 x its SLO, or any
    breach on a workload without P0, ran its whole window). The margin stays wide: a
    partial window's P99 rests on few requests, and a trial cut on noise is a trial lost."""
    limit = 1.0 + ctx.settings.revert_margin
    for p, slo in ctx.settings.slo.classes().items():
        figures = summary.classes[p]
        for key, value, bound in (("ttft_p99_ms", figures.ttft_p99_ms, slo.ttft_p99_ms),
                                  ("tbt_p99_ms", figures.tbt_p99_ms, slo.tbt_p99_ms)):
            if bound is not None and value is not None and value > limit * bound:
                return f"{p.label} {key}={value:.0f} > {limit:g} x {bound:g}"
    return None
