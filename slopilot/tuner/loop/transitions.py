"""The controller's states and the only moves between them, as one table.

Every move the controller makes goes through ``check``: a move the table does not list
raises ``ControllerError`` naming both states and the event. The picture in
``controller.py``'s docstring is ``render_diagram()`` of this table, and docs/architecture.md
carries both the picture and ``render_table()`` (tests compare them;
``python -m slopilot.tuner.loop.transitions [--table]`` prints them after a change).

A move carries what the next state's step needs (``Go``). A new state (say, checking the
twin's prediction against a measured window before a warm start or a capacity plan is
trusted) is a new ``ControllerState`` member, its rows here, and its step function in
``controller.STEPS``.
"""

from __future__ import annotations

import argparse
import enum
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.settings import MAX_HOLD_DOUBLINGS
from slopilot.tuner.loop.state import ControllerState

S = ControllerState


class Event(enum.StrEnum):
    """Why the loop moves from one state to another."""

    SCALE_ALERT = "scale_alert"
    HOLD_ALERT = "hold_alert"
    RETUNE_ALERT = "retune_alert"
    NOTHING_HOLDS_OFFLINE = "nothing_holds_offline"
    HEADROOM = "headroom"
    RETUNE_SUFFICES = "retune_suffices"
    CAPACITY_SUFFICES = "capacity_suffices"
    TUNE_CLOSEST = "tune_closest"
    SCALED_UP = "scaled_up"
    MAX_REPLICAS = "max_replicas"
    REPLICAS_FLAT = "replicas_flat"
    REPLICAS_SHORT = "replicas_short"
    TRIAL_HOLDS = "trial_holds"
    TRIAL_LIMIT = "trial_limit"
    TRIAL_RATE_LIMIT = "trial_rate_limit"
    TOO_LITTLE_TRAFFIC = "too_little_traffic"
    COMMITTED = "committed"
    NOTHING_MEASURED = "nothing_measured"
    NO_FEASIBLE_CONFIG = "no_feasible_config"
    COOLDOWN_OVER = "cooldown_over"
    COMMIT_STUCK = "commit_stuck"
    ERROR = "error"
    TUNING_OFF = "tuning_off"
    ENGINE_SWITCHED = "engine_switched"
    STORAGE_SWITCHED = "storage_switched"


@dataclass(frozen=True)
class Transition:
    source: ControllerState
    target: ControllerState
    event: Event
    when: str


_ON_ERROR = ("any error: an episode rolled back to its best known config (an apply that "
             "fails is owed, retried at the start of later ticks, and no episode starts "
             "until it lands); outside one, the config left as it is")
_ON_TUNING_OFF = ("tuning turned off (or the deployment deleted): the episode ends, its "
                  "open trial told failed")
_ON_ENGINE_SWITCHED = ("spec.backend or the model switched: the episode ends, its open "
                       "trial told failed in its own engine's study, its configs "
                       "forgotten")
_ON_STORAGE_SWITCHED = ("the study's storage switched (spec.tuning.storage, or the "
                        "operator's default storage): the episode ends, its open trial "
                        "told failed in the old storage's study")
TRANSITIONS: tuple[Transition, ...] = (
    Transition(S.STEADY, S.SCALING, Event.SCALE_ALERT,
               "an alert with action scale fires (and none with action hold)"),
    Transition(S.STEADY, S.SCALING, Event.NOTHING_HOLDS_OFFLINE,
               "a retune alert, and the offline study finds no config that holds at this "
               "replica count (below max: one more replica at least; at max: whether "
               "fewer do as well)"),
    Transition(S.STEADY, S.TUNING, Event.RETUNE_ALERT,
               "an alert with action retune fires (and none with action hold)"),
    Transition(S.STEADY, S.COOLDOWN, Event.HEADROOM,
               "quiet for scale_down_after_s and the simulator holds the SLO with fewer "
               "replicas (where its search gave up, at the count above that holds with "
               "its next, above any that breached live at this load): scaled down"),
    Transition(S.STEADY, S.COOLDOWN, Event.REPLICAS_FLAT,
               "quiet for scale_down_after_s, no count holds in simulation and more "
               "replicas stop moving the worst term past fewer than now: scaled down"),
    Transition(S.SCALING, S.TUNING, Event.RETUNE_SUFFICES,
               "the offline study finds a config that holds at this replica count"),
    Transition(S.SCALING, S.TUNING, Event.CAPACITY_SUFFICES,
               "the simulator holds the SLO at the current replica count with its next "
               "count (not on a count its search gave up at, nor one in the band it "
               "misses: below max, the search goes on above the count that breached and "
               "scales up)"),
    Transition(S.SCALING, S.TUNING, Event.TUNE_CLOSEST,
               "at max replicas and nothing holds in simulation (or its search gave up at "
               "a count the breaching max lies above): try the closest live"),
    Transition(S.SCALING, S.COOLDOWN, Event.SCALED_UP, "scaled up to the planned count"),
    Transition(S.SCALING, S.COOLDOWN, Event.MAX_REPLICAS,
               "at max replicas after live evidence that nothing holds: say so"),
    Transition(S.SCALING, S.COOLDOWN, Event.REPLICAS_FLAT,
               "no count up to max holds in simulation and more replicas stop moving the "
               "worst term past fewer than now (an SLO below what one request takes "
               "alone): scaled down to that count; or already at it: say so, and no new "
               "round in the same situation until its backoff ends"),
    Transition(S.SCALING, S.COOLDOWN, Event.REPLICAS_SHORT,
               "more replicas needed than served when the last scale-up's wait gave up "
               "(a quota, no node fits; those that never came given back), before "
               "its hold has passed (max_backoff_s, doubled for each refusal in a row, "
               f"at most x{2 ** MAX_HOLD_DOUBLINGS}) and unless more serve since: say "
               "so, buy none"),
    Transition(S.TUNING, S.SCALING, Event.SCALE_ALERT,
               "an alert with action scale fires during the episode (not one it began "
               "under), below max replicas: its open trial told failed, its rollback "
               "config restored"),
    Transition(S.TUNING, S.COOLDOWN, Event.HOLD_ALERT,
               "an alert with action hold fires during the episode (a stalled engine, "
               "targets down): its open trial told failed, its rollback config restored, "
               "no replica bought"),
    Transition(S.TUNING, S.COMMIT, Event.TRIAL_HOLDS, "a trial's window holds the SLO"),
    Transition(S.TUNING, S.COMMIT, Event.TRIAL_LIMIT, "max_trials trials in this episode"),
    Transition(S.TUNING, S.COMMIT, Event.TRIAL_RATE_LIMIT,
               "hourly_trials trials in the last hour (max_trials_per_hour, or "
               "30 or max_trials, the more)"),
    Transition(S.TUNING, S.COMMIT, Event.TOO_LITTLE_TRAFFIC,
               "a trial ran max_trial_s short of min_class_requests of a class, or, "
               "before the first, the probe's rate of an alert class (of what the floor "
               "counts: on vLLM the meter's streams) reaches short of it in max_trial_s: "
               "too little traffic to judge one, the episode ends"),
    Transition(S.COMMIT, S.COOLDOWN, Event.COMMITTED,
               "the episode's best feasible config applied to every replica"),
    Transition(S.COMMIT, S.COOLDOWN, Event.TRIAL_RATE_LIMIT,
               "the hour's trials ran out before any held, and the measured misses of "
               "such cut episodes at this count, load, config and spec add up to fewer "
               "than max_trials: the starting config kept, no replica bought on a spent "
               "budget"),
    Transition(S.COMMIT, S.COOLDOWN, Event.NOTHING_MEASURED,
               "no trial of the episode was judged on a measured window (no data, too "
               "few requests, refused): the starting config kept, no replica bought on "
               "no evidence"),
    Transition(S.COMMIT, S.COOLDOWN, Event.TOO_LITTLE_TRAFFIC,
               "the episode ended on too little traffic to judge a trial and none held: "
               "the starting config kept, no replica bought on no verdict"),
    Transition(S.COMMIT, S.SCALING, Event.NO_FEASIBLE_CONFIG,
               "no live trial held the SLO in max_trials (not cut by the hour's "
               "budget, at least one measured), or the measured misses of episodes cut "
               "by it at this count, load, config and spec add up to max_trials: at "
               "least one more replica"),
    Transition(S.COOLDOWN, S.STEADY, Event.COOLDOWN_OVER,
               "cooldown_s has passed, and after a scale-up its replicas serve (the "
               "cooldown counts from then) or replica_ready_s has passed (said: inform, "
               "those that never came given back)"),
    Transition(S.COOLDOWN, S.COOLDOWN, Event.COMMIT_STUCK,
               "the commit's rollout is stuck (past the Deployment's progress deadline, "
               "paused, or unmoved for rollout_timeout_s): the committed config before it "
               "back on every replica and on record, the stuck one held from trials for "
               "max_backoff_s, a new cooldown"),
    *(Transition(s, S.COOLDOWN, Event.ERROR, _ON_ERROR) for s in S),
    # Not a step's move: the operator's, when its daemon for the deployment ends. Kept, a
    # TUNING, COMMIT or SCALING state went on when tuning was turned on again, with no
    # alert to ask for it.
    *(Transition(s, S.STEADY, Event.TUNING_OFF, _ON_TUNING_OFF) for s in S),
    # Nor this: the operator's, as it rebuilds the controller for the switched spec. Its
    # trials were the other engine's (each backend and model has a study of its own).
    *(Transition(s, S.STEADY, Event.ENGINE_SWITCHED, _ON_ENGINE_SWITCHED) for s in S),
    # The operator's too: the trial's number was asked in the other storage's study.
    *(Transition(s, S.STEADY, Event.STORAGE_SWITCHED, _ON_STORAGE_SWITCHED) for s in S),
)

_ALLOWED: dict[tuple[ControllerState, ControllerState], frozenset[Event]] = {}
for _t in TRANSITIONS:
    _key = (_t.source, _t.target)
    _ALLOWED[_key] = _ALLOWED.get(_key, frozenset()) | {_t.event}


def check(source: ControllerState, target: ControllerState, event: Event) -> None:
    """Raise ``ControllerError`` unless the table lists ``source -> target`` on ``event``."""
    if event in _ALLOWED.get((source, target), frozenset()):
        return
    allowed = "; ".join(f"-> {t.target.value} on {t.event.value}"
                        for t in TRANSITIONS if t.source is source)
    raise ControllerError(f"illegal transition {source.value} -> {target.value} on "
                          f"{event.value}; from {source.value} the table allows: {allowed}")


@dataclass(frozen=True)
class Go:
    """A move to ``target`` within this tick, and what the target's step needs."""

    target: ControllerState
    event: Event
    reason: str
    action: Action = Action.NONE
    """Into COOLDOWN: what the tick's decision reports (commit, scale, inform, revert)."""
    at_least: int | None = None
    """Into SCALING: the fewest replicas live evidence allows (one more than now)."""
    config: Mapping[str, Any] | None = None
    """Into COOLDOWN after a commit: the committed config."""
    summary: WindowSummary | None = None
    """Into COMMIT and on to COOLDOWN: the window that showed the config holds."""


# Left to right as an episode runs; every state is a column.
LAYOUT = (S.STEADY, S.SCALING, S.TUNING, S.COMMIT, S.COOLDOWN)
_COLUMN = 10
_SELF = "again->|"
"""A move from a state back into it, drawn ending at its column."""


def _everywhere() -> list[tuple[ControllerState, Event]]:
    """(target, event) of the moves the table allows from every state, by column."""
    found = {(t.target, t.event) for t in TRANSITIONS
             if all(t.event in _ALLOWED.get((s, t.target), ()) for s in S)}
    return sorted(found, key=lambda te: (LAYOUT.index(te[0]), te[1].value))


def render_diagram() -> str:
    """The table as a picture: one column per state, one arrow per (from, to) pair with
    its events; an event that leads from every state to one target is one "any state" row."""
    if sorted(LAYOUT) != sorted(ControllerState):
        raise ControllerError(f"LAYOUT {[s.value for s in LAYOUT]} must name every state once")
    x = {s: 2 + _COLUMN * i for i, s in enumerate(LAYOUT)}
    width = x[LAYOUT[-1]] + 1
    everywhere = _everywhere()
    pairs: dict[tuple[ControllerState, ControllerState], list[str]] = {}
    for t in TRANSITIONS:
        if (t.target, t.event) not in everywhere:
            pairs.setdefault((t.source, t.target), []).append(t.event.value)
    lines = ["".join(s.value.upper().ljust(_COLUMN) for s in LAYOUT)]
    for (source, target), events in sorted(
            pairs.items(), key=lambda kv: (LAYOUT.index(kv[0][0]), LAYOUT.index(kv[0][1]))):
        a, b = x[source], x[target]
        lo, hi = min(a, b), max(a, b)
        row = [" "] * width
        if a == b:  # a move that stays: back into the state (its wait begins again)
            row[b - len(_SELF) + 1:b + 1] = _SELF
        else:
            row[lo:hi + 1] = "|" + "-" * (hi - lo - 1) + "|"
            row[b - 1 if b > a else b + 1] = ">" if b > a else "<"
        lines += _events_beside("".join(row), events, width)
    label = "  any state -"
    for target, event in everywhere:
        if x[target] - 1 >= len(label):
            arrow = label.ljust(x[target] - 1, "-") + ">|"
        else:  # no room for the label on its left: drawn from the right
            arrow = " " * x[target] + "|<" + " any state".rjust(width - x[target] - 2, "-")
        lines.append(arrow.ljust(width) + "   " + event.value)
    return "\n".join(line.rstrip() for line in lines)


EVENTS_WIDTH = 48
"""Characters of events beside an arrow before they go on the next line: the picture
sits indented in docstrings and docs within 100 columns."""


def _events_beside(arrow: str, events: list[str], width: int) -> list[str]:
    """``arrow`` with its events, the ones that do not fit on further lines under them."""
    out, line = [], ""
    for event in events:
        if line and len(line) + 2 + len(event) > EVENTS_WIDTH:
            out.append(line + ",")
            line = event
        else:
            line = f"{line}, {event}" if line else event
    out.append(line)
    return [(arrow if i == 0 else " " * width) + "   " + text for i, text in enumerate(out)]


def render_table() -> str:
    """The table in Markdown (docs/architecture.md carries it; a test compares); a move
    from every state is one "any state" row."""
    everywhere = _everywhere()
    rows = ["| from | to | on | when |", "|---|---|---|---|"]
    rows += [f"| {t.source.value} | {t.target.value} | `{t.event.value}` | {t.when} |"
             for t in TRANSITIONS if (t.target, t.event) not in everywhere]
    whens = {(t.target, t.event): t.when for t in TRANSITIONS}
    rows += [f"| any state | {target.value} | `{event.value}` | {whens[target, event]} |"
             for target, event in everywhere]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the diagram (``controller.py``'s docstring) or, with ``--table``, the
    Markdown table (docs/architecture.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m slopilot.tuner.loop.transitions",
        description="Print the controller's transition diagram, as controller.py's "
        "docstring and docs/architecture.md carry it.")
    parser.add_argument("--table", action="store_true",
                        help="print the Markdown table of docs/architecture.md instead")
    print(render_table() if parser.parse_args(argv).table else render_diagram())
    return 0


if __name__ == "__main__":
    sys.exit(main())
