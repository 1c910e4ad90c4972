"""A user's trace on a scenario's deployment: ``--trace FILE`` and the trace options.

The scenario gives the hardware, the model, the knobs and the SLO; the trace replaces
its workload. The options (window, time scale or target rate, class mix) apply to the
given trace, or to a trace scenario's own (``--time-scale 0.3`` on ``azure-conv-2023``).
With any of them the run covers the whole replayed trace: it lasts until the last
arrival (plus a second), whatever the scenario's ``duration_s`` was written for.

A replay is then followed for up to ``REPLAY_DRAIN_S`` past that (``replay_measure``):
a user replaying a trace asks what happens to its requests, and cutting the run a
second after the last arrival would leave the last ones unfinished on an idle engine.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario, ScenarioError
from slopilot.engine.sim.simulator import Measure
from slopilot.engine.sim.trace import BUILTIN_TRACES, MAX_TARGET_RATE, TraceError, TraceRecord
from slopilot.engine.sim.trace_formats import FORMATS, TRACE_DEPLOYMENT
from slopilot.engine.sim.workload import ClassMix
from slopilot.engine.sim.workload_spec import TraceSpec

REPLAY_DRAIN_S = 120.0
"""How long a whole-trace replay follows its requests after the last arrival (no new
ones come); the run ends sooner once they have all finished. What is still waiting
then is censored (``SimStats``) and counted as unfinished."""


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """What the trace flags say; every field None means "as the scenario has it"."""

    path: str | None = None
    fmt: str | None = None
    model: str | None = None
    """Replay only this model's rows (a trace with a Model column: BurstGPT's)."""
    start_s: float | None = None
    """Trace seconds (from its first request, before scaling) where the replay starts."""
    end_s: float | None = None
    time_scale: float | None = None
    target_rate: float | None = None
    classes: ClassMix | None = None
    """Class shares for requests the trace gives no class (default: all P1)."""

    def __post_init__(self) -> None:
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ScenarioError(f"{_flag(name)} {value:g}: trace seconds count from the "
                                    "first request, so 0 is its start; give a number >= 0, "
                                    "e.g. 0:10")
        # One range, said the same for 0 and below: "-1: expected a number >= 0" told a
        # user to try 0, which was then refused as not positive.
        for name in ("time_scale", "target_rate"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ScenarioError(f"{_flag(name)} {value:g}: expected a number > 0")
        if self.target_rate is not None and self.target_rate > MAX_TARGET_RATE:
            raise ScenarioError(f"--target-rate {self.target_rate:g}: above "
                                f"{MAX_TARGET_RATE:,.0f} req/s, past any deployment (the "
                                "whole trace in an instant); give requests per second, e.g. 5")
        if self.time_scale is not None and self.target_rate is not None:
            raise ScenarioError("--time-scale and --target-rate both given; give one (the "
                                "target rate picks the time scale)")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ScenarioError(f"--trace-window {self.start_s:g}:{self.end_s:g}: the end "
                                "must come after the start")
        if self.model is not None and not self.model.strip():
            raise ScenarioError("--trace-model '': give a model the trace names, e.g. GPT-4")
        if self.fmt is not None and self.fmt not in FORMATS:
            raise ScenarioError(f"--trace-format {self.fmt!r}: use one of {', '.join(FORMATS)}")

    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))


def _flag(name: str) -> str:
    return {"start_s": "--trace-window start", "end_s": "--trace-window end",
            "time_scale": "--time-scale", "target_rate": "--target-rate"}[name]


def parse_window(text: str | None) -> tuple[float | None, float | None]:
    """``START:END``, ``START:`` or ``:END`` (trace seconds) from ``--trace-window``."""
    if text is None:
        return None, None
    lo, sep, hi = text.partition(":")
    if not sep:
        raise ScenarioError(f"--trace-window {text!r}: expected START:END in trace seconds, "
                            "e.g. 600:900 (either end may be left out)")
    try:
        return (float(lo) if lo.strip() else None, float(hi) if hi.strip() else None)
    except ValueError:
        raise ScenarioError(f"--trace-window {text!r}: START and END must be seconds, "
                            "e.g. 600:900") from None


def parse_classes(text: str | None) -> ClassMix | None:
    """``p0=0.1,p1=0.9`` from ``--classes``."""
    if text is None:
        return None
    weights: dict[Priority, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            priority = Priority.parse(name.strip())
        except ValueError as e:  # say which name is not a class, not only the shape
            raise ScenarioError(f"--classes {text!r}: {e}") from None
        if priority in weights:  # the last share won, silently
            given = name.strip()
            which = (f"{priority.label} is" if given.lower() == priority.label
                     else f"{given!r} is {priority.label},")
            raise ScenarioError(f"--classes {text!r}: {which} given twice; give each "
                                "class once, e.g. p0=0.1,p1=0.6,p2=0.3")
        try:
            weights[priority] = float(value)
            if not sep:
                raise ValueError
        except ValueError:
            raise ScenarioError(f"--classes {text!r}: expected CLASS=SHARE,..., e.g. "
                                "p0=0.1,p1=0.6,p2=0.3") from None
    return _as_shares(text, weights)


# A sum this far past 1 is float rounding (0.1+0.2+0.7), not a share too many: tune writes
# back the shares it read, which sum to 1 only to the ulp.
_SUM_SLACK = 1e-9


def _as_shares(text: str, given: dict[Priority, float]) -> ClassMix:
    """The classes' shares of the requests: each a fraction from 0 to 1, at most 1 in all,
    the rest the default class's (p1). Read as weights, scaled to sum to 1, ``p0=0.2``
    made every request p0 where a user meant 20 %, and ``p0=0.5,p1=0.6`` ran p0 at 45 %
    without a word."""
    total = sum(given.values())
    scaled = ""
    if math.isfinite(total) and total > 0 and all(v >= 0 for v in given.values()):
        scaled = ",".join(f"{p.label}={v / total:.3g}" for p, v in given.items())
        scaled = f"e.g. {scaled} (the same scaled to 1)"
    for p, value in given.items():
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ScenarioError(
                f"--classes {text!r}: {p.label}={value:g} is not a share; give each class's "
                "fraction of the requests, from 0 to 1 (the rest go to p1), "
                f"{scaled or 'e.g. p0=0.1,p1=0.6,p2=0.3'}")
    if total > 1 + _SUM_SLACK:
        raise ScenarioError(
            f"--classes {text!r}: the shares sum to {total:g}, more than every request; "
            f"give shares that sum to 1 or less (the rest go to p1), {scaled}")
    shares = dict(given)
    shares[Priority.P1] = shares.get(Priority.P1, 0.0) + max(0.0, 1.0 - total)
    return ClassMix.of(shares)


def with_trace(scenario: Scenario, options: TraceOptions) -> Scenario:
    """``scenario`` replaying the trace the options name (or its own, re-cut)."""
    if not options.given():
        return scenario
    own = scenario.workload if isinstance(scenario.workload, TraceSpec) else None
    if options.path is None and own is None:
        raise ScenarioError(f"scenario {scenario.name!r} generates its traffic; the trace "
                            "options apply to a trace: pass --trace FILE.csv")
    if options.path is not None:
        path = options.path
        if path not in BUILTIN_TRACES and Path(path).is_dir():  # not "no such file"
            raise ScenarioError(f"--trace {path}: is a folder, not a trace file; name a "
                                ".csv or .jsonl file in it")
        if path not in BUILTIN_TRACES and Path(path).exists() and not Path(path).is_file():
            # Not "no such file": it is there. A pipe (--trace <(zcat t.csv.gz)) would
            # give its rows to the first read only, and the tuner reads the trace again.
            raise ScenarioError(f"--trace {path}: not a regular file (a pipe, or a device); "
                                "a trace is read more than once: save it to a file and "
                                "give that")
        if path not in BUILTIN_TRACES and not Path(path).is_file():
            raise ScenarioError(f"--trace {path}: no such file (or name a shipped trace: "
                                f"{', '.join(BUILTIN_TRACES)})")
        base = TraceSpec(trace=path, classes=ClassMix.only(Priority.P1))
        name = f"{scenario.name}+{Path(path).stem}"
    else:
        assert own is not None
        base, name = own, scenario.name
    scaled = options.time_scale is not None or options.target_rate is not None
    spec = dataclasses.replace(
        base, fmt=options.fmt or (None if options.path else base.fmt),
        model=options.model or (None if options.path else base.model),
        start_s=base.start_s if options.start_s is None else options.start_s,
        end_s=base.end_s if options.end_s is None else options.end_s,
        time_scale=options.time_scale if scaled else base.time_scale,
        target_rate=options.target_rate if scaled else base.target_rate,
        classes=options.classes or base.classes)
    try:
        records = spec.records()
    except TraceError as e:
        raise ScenarioError(f"--trace: {e}") from None
    return dataclasses.replace(scenario, name=name, workload=spec,
                               duration_s=math.floor(records[-1].arrival_time) + 1.0)


def replay_note(spec: TraceSpec, records: list[TraceRecord],
                until_s: float | None = None) -> str:
    """What a run replays, for ``simulate``'s title: its requests and their span, and for
    Mooncake's JSONL the unit its times were read in. Milliseconds cannot be told from
    seconds by their values: a file converted to seconds replays 1000 times faster, and
    the span is where that shows (docs/traces.md). ``records``: ``spec``'s, as the run
    replayed them (read once: a million rows' rescale is seconds); ``until_s``: the run's
    end (``--duration``), past which none arrived."""
    from slopilot.engine.sim.distribution_spec import read_cached

    if until_s is not None:
        records = records[:bisect.bisect_left(records, until_s, key=_arrival)]
    if not records:
        return f"the trace replays no request before {until_s:g} s"
    span = records[-1].arrival_time - records[0].arrival_time
    unit = (" (Mooncake's timestamps read as milliseconds)"
            if read_cached(spec.trace, spec.fmt, spec.model).fmt == "mooncake" else "")
    # Three figures, not the file's own digits: "over 59.9935 s" read as a measurement.
    shown = f"{span:,.0f}" if span >= 100 else f"{span:.3g}"
    return f"the trace replays {len(records):,} requests over {shown} s{unit}"


def _arrival(record: TraceRecord) -> float:
    return record.arrival_time


def replay_measure(scenario: Scenario) -> Measure:
    """What ``simulate`` counts on ``scenario`` over its duration: every arrival, and for
    a trace replay its requests followed ``REPLAY_DRAIN_S`` past the end."""
    if not isinstance(scenario.workload, TraceSpec):
        return Measure.whole(scenario.duration_s)
    return Measure(0.0, scenario.duration_s, scenario.duration_s + REPLAY_DRAIN_S)


def load_with_trace(scenario: str | None, options: TraceOptions, default: str) -> Scenario:
    """The scenario a command runs: ``scenario`` (or the default for a bare ``--trace``,
    else ``default``), with the trace options applied."""
    from slopilot.engine.sim.scenario import load_scenario

    if scenario is None:
        scenario = TRACE_DEPLOYMENT if options.path is not None else default
    return with_trace(load_scenario(scenario), options)
