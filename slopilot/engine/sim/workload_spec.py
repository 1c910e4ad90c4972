"""The ``workload:`` section of a scenario: parsed and checked once, built many times.

A spec is immutable; ``build(seed=..., duration_s=...)`` makes a fresh stateful workload,
so a tuner can replay the same traffic against many engine configurations.

    workload:
      type: open_loop | sessions | trace
      ...phase fields...
      shift: {at_s: 900, <fields that change>}   # or a list of such shifts

A shift starts a new phase at ``at_s`` that inherits every field it does not name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slopilot.engine.sim import arrivals as arr
from slopilot.engine.sim import distributions as dist
from slopilot.engine.sim.distribution_spec import build, parse_distribution, read_cached, trace_name
from slopilot.engine.sim.open_loop import OpenLoopPhase, OpenLoopWorkload
from slopilot.engine.sim.sessions import SessionPhase, SessionWorkload
from slopilot.engine.sim.spec_reader import Reader, ScenarioError
from slopilot.engine.sim.trace import (
    TraceError,
    TraceRecord,
    TraceWorkload,
    mean_rate,
    rescale,
    window,
)
from slopilot.engine.sim.trace_formats import FORMATS
from slopilot.engine.sim.workload import DEFAULT_VOCAB_SIZE, ClassMix

WORKLOAD_TYPES = ("open_loop", "sessions", "trace")


@dataclass(frozen=True, slots=True)
class OpenLoopSpec:
    phases: tuple[OpenLoopPhase, ...]
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def build(self, *, seed: int, duration_s: float,
              vocab_size: int | None = None) -> OpenLoopWorkload:
        return OpenLoopWorkload(self.phases, duration_s=duration_s, seed=seed,
                                vocab_size=vocab_size or self.vocab_size)


@dataclass(frozen=True, slots=True)
class SessionSpec:
    phases: tuple[SessionPhase, ...]
    vocab_size: int = DEFAULT_VOCAB_SIZE
    ramp_s: float | None = None

    def build(self, *, seed: int, duration_s: float,
              vocab_size: int | None = None) -> SessionWorkload:
        return SessionWorkload(self.phases, duration_s=duration_s, seed=seed,
                               vocab_size=vocab_size or self.vocab_size, ramp_s=self.ramp_s)


@dataclass(frozen=True, slots=True)
class TraceSpec:
    trace: str  # a shipped trace's name or a resolved file path
    fmt: str | None = None
    model: str | None = None
    """Replay only this model's rows (``--trace-model``; BurstGPT's ``Model`` column)."""
    time_scale: float | None = None
    target_rate: float | None = None
    start_s: float = 0.0
    end_s: float | None = None
    max_requests: int | None = None
    classes: ClassMix = ClassMix()
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def records(self) -> list[TraceRecord]:
        """The windowed, time-scaled records this spec replays; refused where they span
        a gap that sets a stray time apart from the rest (``trace_span.py``)."""
        trace = read_cached(self.trace, self.fmt, self.model)
        picked = window(trace.records, start_s=self.start_s, end_s=self.end_s,
                        max_requests=self.max_requests)
        if trace.stray is not None:
            trace.stray.refuse(picked)
        return rescale(picked, time_scale=self.time_scale, target_rate=self.target_rate)

    def scale(self) -> float | None:
        """The factor ``records()`` multiplies every time by (a ``target_rate``'s picked
        from the cut's mean rate); None where neither field is given."""
        if self.target_rate is None:
            return self.time_scale
        trace = read_cached(self.trace, self.fmt, self.model)
        picked = window(trace.records, start_s=self.start_s, end_s=self.end_s,
                        max_requests=self.max_requests)
        return mean_rate(picked) / self.target_rate

    def build(self, *, seed: int, duration_s: float,
              vocab_size: int | None = None) -> TraceWorkload:
        return TraceWorkload(self.records(), seed=seed, classes=self.classes,
                             vocab_size=vocab_size or self.vocab_size, duration_s=duration_s)


WorkloadSpec = OpenLoopSpec | SessionSpec | TraceSpec


def parse_workload(r: Reader, *, base_dir: Path) -> WorkloadSpec:
    kind = r.text("type", choices=WORKLOAD_TYPES)
    vocab = r.integer("vocab_size", DEFAULT_VOCAB_SIZE, lo=12, hi=1_000_000)
    spec: WorkloadSpec
    if kind == "trace":
        spec = _trace(r, vocab, base_dir)
    elif kind == "open_loop":
        spec = OpenLoopSpec(_phases(r, _open_loop_phase, base_dir), vocab)
    else:
        ramp = r.optional_float("ramp_s", lo=0.0)
        spec = SessionSpec(_phases(r, _session_phase, base_dir), vocab, ramp)
    r.finish()
    return spec


_PhaseParser = Callable[[Reader, dict[str, Any] | None, float, Path], Any]


def _phases(r: Reader, parse: _PhaseParser, base_dir: Path) -> tuple[Any, ...]:
    first = parse(r, None, 0.0, base_dir)
    phases = [first]
    raw = r.raw("shift", None)
    shifts = [] if raw is None else raw if isinstance(raw, list) else [raw]
    for i, item in enumerate(shifts):
        path = f"{r.qualify('shift')}[{i}]" if isinstance(raw, list) else r.qualify("shift")
        sr = Reader(item, source=r.source, path=path, files=r.files)
        at = sr.number("at_s", lo=0.0, lo_open=True)
        if at <= phases[-1].start_s:
            raise sr.error("at_s", at, f"must be later than the previous phase's start "
                           f"({phases[-1].start_s} s)")
        phases.append(parse(sr, _fields_of(phases[-1]), at, base_dir))
        sr.finish()
    return tuple(phases)


def _fields_of(phase: Any) -> dict[str, Any]:
    return {name: getattr(phase, name) for name in phase.__dataclass_fields__}


def _field(r: Reader, base: dict[str, Any] | None, key: str, parse: Callable[[], Any]) -> Any:
    """Parse ``key`` if given (always in the first phase), else inherit it from ``base``."""
    if base is not None and not r.has(key):
        r.raw(key, None)  # mark as known for the did-you-mean list
        return base[key]
    return parse()


def _open_loop_phase(r: Reader, base: dict[str, Any] | None, start: float,
                     base_dir: Path) -> OpenLoopPhase:
    return build(
        r, OpenLoopPhase, start_s=start,
        arrivals=_field(r, base, "arrivals", lambda: _arrivals(r)),
        prompt_tokens=_field(r, base, "prompt_tokens",
                             lambda: parse_distribution(r, "prompt_tokens", base_dir)),
        output_tokens=_field(r, base, "output_tokens",
                             lambda: parse_distribution(r, "output_tokens", base_dir)),
        classes=_field(r, base, "classes", lambda: _classes(r)),
        shared_prefix_tokens=_field(r, base, "shared_prefix_tokens",
                                    lambda: r.integer("shared_prefix_tokens", 0, lo=0)))


def _session_phase(r: Reader, base: dict[str, Any] | None, start: float,
                   base_dir: Path) -> SessionPhase:
    def d(key: str, default: float | None = None) -> Any:
        if default is not None and not r.has(key):
            r.raw(key, None)
            return dist.Fixed(value=default)
        return parse_distribution(r, key, base_dir)

    if base is not None and not r.has("long_context"):
        r.raw("long_context", None)
        fraction, long_tokens = base["long_context_fraction"], base["long_context_tokens"]
    else:
        fraction, long_tokens = _long_context(r, base_dir)
    return build(
        r, SessionPhase, start_s=start,
        concurrency=_field(r, base, "concurrency",
                           lambda: r.integer("concurrency", lo=1, hi=1_000_000)),
        turns=_field(r, base, "turns", lambda: d("turns", 1)),
        question_tokens=_field(r, base, "question_tokens", lambda: d("question_tokens")),
        output_tokens=_field(r, base, "output_tokens", lambda: d("output_tokens")),
        think_time_s=_field(r, base, "think_time_s", lambda: d("think_time_s", 0.0)),
        user_tokens=_field(r, base, "user_tokens", lambda: d("user_tokens", 64)),
        system_prompt_tokens=_field(r, base, "system_prompt_tokens",
                                    lambda: d("system_prompt_tokens", 0)),
        num_system_prompts=_field(r, base, "num_system_prompts",
                                  lambda: r.integer("num_system_prompts", 1, lo=1, hi=100_000)),
        long_context_fraction=fraction, long_context_tokens=long_tokens,
        classes=_field(r, base, "classes", lambda: _classes(r)),
        max_context_tokens=_field(r, base, "max_context_tokens",
                                  lambda: r.optional_int("max_context_tokens", lo=2)))


def _long_context(r: Reader, base_dir: Path) -> tuple[float, dist.Distribution]:
    lr = r.sub("long_context", optional=True)
    if lr is None:
        return 0.0, dist.Fixed(value=0)
    fraction = lr.number("fraction", lo=0.0, hi=1.0)
    tokens = parse_distribution(lr, "tokens", base_dir)
    lr.finish()
    return fraction, tokens


def _arrivals(r: Reader) -> arr.ArrivalProcess:
    ar = r.section("arrivals")
    process = ar.text("process", choices=("poisson", "gamma", "on_off"))
    rate = ar.number("rate", lo=0.0, lo_open=True)
    out: arr.ArrivalProcess
    if process == "poisson":
        out = arr.Poisson(rate=rate)
    elif process == "gamma":
        out = build(ar, arr.Gamma, rate=rate, cv=ar.number("cv", lo=0.05, hi=20.0))
    else:
        out = build(ar, arr.OnOff, rate=rate, on_s=ar.number("on_s", lo=0.0, lo_open=True),
                     off_s=ar.number("off_s", lo=0.0, lo_open=True),
                     off_rate=ar.number("off_rate", 0.0, lo=0.0))
    ar.finish()
    return out


def _classes(r: Reader) -> ClassMix:
    cr = r.sub("classes", optional=True)
    if cr is None:
        return ClassMix()
    weights = tuple(cr.number(k, 0.0, lo=0.0) for k in ("p0", "p1", "p2"))
    cr.finish()
    if sum(weights) <= 0:
        raise ScenarioError(f"{r.source}: {cr.path}: all weights are 0; give at least one "
                            "class a positive share, e.g. {p0: 0.1, p1: 0.6, p2: 0.3}")
    return ClassMix(weights)  # type: ignore[arg-type]


def _trace(r: Reader, vocab: int, base_dir: Path) -> TraceSpec:
    fmt = r.raw("format", None)
    if fmt is not None:
        fmt = r.text("format", choices=FORMATS)
    time_scale = r.optional_float("time_scale", lo=0.0, lo_open=True)
    target_rate = r.optional_float("target_rate", lo=0.0, lo_open=True)
    if time_scale is not None and target_rate is not None:
        raise r.error("target_rate", target_rate, "give time_scale or target_rate, not both")
    spec = build(
        r, TraceSpec, trace=trace_name(r, "trace", base_dir), fmt=fmt,
        time_scale=time_scale, target_rate=target_rate, start_s=r.number("start_s", 0.0, lo=0),
        end_s=r.optional_float("end_s", lo=0.0, lo_open=True),
        max_requests=r.optional_int("max_requests", lo=1), classes=_classes(r), vocab_size=vocab)
    try:
        spec.records()  # read now so a malformed trace fails at load, not mid-run
    except TraceError as e:
        raise ScenarioError(f"{r.source}: {r.path or 'workload'}: {e}") from None
    return spec
