"""Distributions in scenario YAML: a number, or ``{dist: ..., min, max}``.

    prompt_tokens: 128                                            # fixed
    prompt_tokens: {dist: uniform, low: 50, high: 400}
    prompt_tokens: {dist: lognormal, mean: 800, sigma: 0.9, min: 16, max: 7000}
    prompt_tokens: {dist: empirical, values: [100, 200], weights: [3, 1]}
    prompt_tokens: {dist: empirical, trace: azure-llm-2023-conv, field: prompt_tokens}
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slopilot.engine.sim import distributions as dist
from slopilot.engine.sim.spec_reader import Reader, ScenarioError
from slopilot.engine.sim.trace import BUILTIN_TRACES, Trace, TraceError, load_trace


def read_cached(trace: str, fmt: str | None, model: str | None = None) -> Trace:
    """``load_trace``, once per version of the file: parsing the shipped hour of Azure
    traffic takes a few tenths of a second, and a tuner builds the same scenario's
    workload for every trial. Keyed by the file's size, inode and modification time as
    well as its name, so a file rewritten in place is read again, not replayed stale."""
    return _read_version(trace, fmt, model, _version(trace))


def _version(trace: str) -> tuple[int, int, int] | None:
    if trace in BUILTIN_TRACES:
        return None  # a package's file, unchanged while the process runs
    try:
        st = os.stat(trace)
    except OSError:
        return None  # read_trace says why, naming the file
    return st.st_size, st.st_ino, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _read_version(trace: str, fmt: str | None, model: str | None,
                  version: tuple[int, int, int] | None) -> Trace:
    return load_trace(trace, fmt=fmt, model=model)


_DISTS = ("fixed", "uniform", "lognormal", "empirical")


def parse_distribution(r: Reader, key: str, base_dir: Path) -> dist.Distribution:
    """A number (fixed) or ``{dist: fixed|uniform|lognormal|empirical, ..., min, max}``."""
    raw = r.raw(key)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return build(r, dist.Fixed, value=r.number(key, lo=0.0))
    dr = r.child(key, raw)
    kind = dr.text("dist", choices=_DISTS)
    top = dr.optional_float("max", lo=0.0)
    clip = {"min": dr.number("min", 0.0, lo=0.0), "max": float("inf") if top is None else top}
    out: dist.Distribution
    if kind == "fixed":
        out = build(dr, dist.Fixed, value=dr.number("value", lo=0.0), **clip)
    elif kind == "uniform":
        out = build(dr, dist.Uniform, low=dr.number("low", lo=0.0),
                     high=dr.number("high", lo=0.0), **clip)
    elif kind == "lognormal":
        out = build(dr, dist.LogNormal, mean=dr.number("mean", lo=0.0, lo_open=True),
                     sigma=dr.number("sigma", lo=0.0, hi=5.0), **clip)
    else:
        out = _empirical(dr, base_dir, clip)
    dr.finish()
    return out


def _empirical(dr: Reader, base_dir: Path, clip: dict[str, float]) -> dist.Empirical:
    if dr.has("trace"):
        field = dr.text("field", choices=("prompt_tokens", "output_tokens"))
        trace = trace_name(dr, "trace", base_dir)
        try:
            records = read_cached(trace, None).records
        except TraceError as e:
            raise ScenarioError(f"{dr.source}: {dr.qualify('trace')}: {e}") from None
        values = tuple(float(getattr(rec, field)) for rec in records)
        return build(dr, dist.Empirical, values=values, **clip)
    raw_values = dr.raw("values")
    raw_weights = dr.raw("weights", None)
    if not isinstance(raw_values, list) or not raw_values:
        raise dr.error("values", raw_values, "expected a non-empty list of numbers "
                       "(or give trace: NAME and field: prompt_tokens|output_tokens)")
    values = tuple(_number_list(dr, "values", raw_values))
    weights = None if raw_weights is None else tuple(_number_list(dr, "weights", raw_weights))
    return build(dr, dist.Empirical, values=values, weights=weights, **clip)


def _number_list(dr: Reader, key: str, raw: object) -> list[float]:
    if not isinstance(raw, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        raise dr.error(key, raw, "expected a list of numbers")
    return [float(v) for v in raw]


def trace_name(r: Reader, key: str, base_dir: Path) -> str:
    name = r.text(key)
    if name in BUILTIN_TRACES:
        return name
    path = Path(name) if Path(name).is_absolute() else base_dir / name
    if not path.is_file():
        raise r.error(key, name, f"no such file (relative paths start at {base_dir}); "
                      f"or name a shipped trace: {', '.join(BUILTIN_TRACES)}")
    r.files.append(path)
    return str(path)




def build(r: Reader, cls: Callable[..., Any], **fields: Any) -> Any:
    """Construct ``cls``; its ValueError becomes a ScenarioError naming the YAML section."""
    try:
        return cls(**fields)
    except ValueError as e:
        raise ScenarioError(f"{r.source}: {r.path or 'workload'}: {e}") from None
