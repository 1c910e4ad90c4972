"""A calibration's raw timings in a file: ``--samples-out FILE`` writes, ``--refit FILE``
fits them again without re-timing.

Timing takes minutes; trying a change to the cost model's form should not. The file
keeps what the timings were of (each shape's ``(new tokens, context, samples)`` rows and
swaps, not its features, so a changed form recomputes them), every round's time, the
engine-loop steps likewise, and what the profile says about the device and model::

    {"schema": "slopilot.dev/calibration-samples/v1",
     "device": {...}, "model": {...}, "dtype": "float32", "grid": {...},
     "samples": [{"group": "decode", "rows": [[1, 127, true], ...], "swap_out": 0,
                  "swap_in": 0, "seconds": 0.012, "times": [...], ...}, ...],
     "host_steps": [{"rows": [...], "step_s": ..., "executor_s": ..., ...}, ...], ...}

JSON: numbers round-trip exactly and a hostile file cannot build objects; every field is
checked on reading, and an error names the file, the field and the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slopilot.engine.bounded_read import FileTooLarge, read_bounded
from slopilot.engine.calibrate.design import DesignError, GridOptions, ShapeSpec
from slopilot.engine.calibrate.harness import STATISTICS, Sample
from slopilot.engine.calibrate.host import HostStep
from slopilot.engine.calibrate.runner import Recording
from slopilot.engine.executors.kernel_modes import PROFILE_KERNELS
from slopilot.engine.json_keys import DuplicateKey, loads_unique
from slopilot.engine.read_errors import unreadable
from slopilot.engine.sim.profile_file import DeviceInfo, write_text_atomically
from slopilot.engine.sim.profile_types import (
    DEVICE_TYPES,
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_BYTES,
    PROFILE_DTYPES,
)
from slopilot.engine.sim.profiles import ProfileError, model_from_dict
from slopilot.engine.sim.shape import shape_of_rows

SCHEMA = "slopilot.dev/calibration-samples/v1"
MAX_BYTES = 256 * 1024 ** 2
_SAMPLE_FIELDS = ("spread", "cpu_share", "cpu_seconds")


class SamplesFileError(ValueError):
    """A samples file is missing or malformed; the message names the file and field."""


def write_samples(rec: Recording, path: str | Path) -> Path:
    """Write ``rec`` to ``path`` atomically (a temporary file beside it, then rename)."""
    return write_text_atomically(Path(path), json.dumps(_to_dict(rec), separators=(",", ":")))


def _to_dict(rec: Recording) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "created": rec.created,
        "device": dataclasses.asdict(rec.device),
        "model": dataclasses.asdict(rec.model),
        "dtype": rec.dtype, "kv_cache_bytes": rec.kv_cache_bytes,
        "block_size": rec.block_size, "versions": dict(rec.versions),
        "executor_code": rec.executor_code, "grid": dataclasses.asdict(rec.grid),
        "repeats": rec.repeats, "statistic": rec.statistic, "seconds": rec.seconds,
        "cpu_share": rec.cpu_share, "load_average": rec.load_average,
        "samples": [{"group": s.spec.group, "rows": [list(r) for r in s.spec.rows],
                     "swap_out": s.spec.swap_out, "swap_in": s.spec.swap_in,
                     "seconds": s.seconds, "times": list(s.times),
                     "cpu_times": list(s.cpu_times),
                     **{f: getattr(s, f) for f in _SAMPLE_FIELDS}} for s in rec.samples],
        "host_steps": [{"label": h.label, "rows": [list(r) for r in h.rows],
                        "swaps": list(h.swaps), "after_idle": h.after_idle,
                        "step_s": h.step_s, "executor_s": h.executor_s}
                       for h in rec.host_steps],
    }


def read_samples(path: str | Path) -> Recording:
    """The recording in ``path``; a ``SamplesFileError`` names what is wrong."""
    p = Path(path)
    try:
        text = read_bounded(p, MAX_BYTES).decode("utf-8")
    except FileTooLarge:
        raise SamplesFileError(f"{p}: larger than {MAX_BYTES} bytes; not a samples file") \
            from None
    except OSError as exc:
        raise SamplesFileError(f"{p}: cannot read calibration samples ({unreadable(exc)}); "
                               "write one with `slopilot calibrate ... --samples-out FILE`"
                               ) from None
    except UnicodeDecodeError as exc:
        raise SamplesFileError(f"{p}: cannot read calibration samples ({exc}); write one "
                               "with `slopilot calibrate ... --samples-out FILE`") from None
    try:
        doc = loads_unique(text)
    except DuplicateKey as exc:  # an edit by hand; the fix is in the message
        raise SamplesFileError(f"{p}: cannot read calibration samples ({exc})") from None
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError; an integer past 4,300 digits; brackets past the recursion limit.
        why = (str(exc) if isinstance(exc, json.JSONDecodeError) else
               "nested too deep" if isinstance(exc, RecursionError) else "a number too long")
        raise SamplesFileError(f"{p}: cannot read calibration samples (not valid JSON: "
                               f"{why}); write one with `slopilot calibrate ... --samples-out "
                               "FILE`") from None
    return _from_dict(doc, str(p))


def _from_dict(doc: Any, src: str) -> Recording:
    get = _Fields(doc, src, "")
    if get.raw("schema") != SCHEMA:
        raise get.error("schema", f"expected {SCHEMA!r}: not a calibration samples file "
                        "(`slopilot calibrate --samples-out` writes one)")
    dev = _Fields(get.raw("device"), src, "device")
    kernels = dev.doc.get("kernels")
    if kernels is not None and kernels not in PROFILE_KERNELS:
        raise dev.error("kernels", f"expected one of {', '.join(PROFILE_KERNELS)}, got "
                        f"{kernels!r:.40}")
    device = DeviceInfo(dev.choice("type", DEVICE_TYPES), dev.text("name"),
                        dev.integer("threads", True), dev.integer("cache_bytes", True), kernels)
    try:
        model = model_from_dict(get.mapping("model"), f"{src}: model")
        grid = GridOptions(**get.mapping("grid"))
    except (ProfileError, DesignError, TypeError) as exc:
        raise SamplesFileError(f"{src}: {exc}") from None
    samples = [_sample(_Fields(s, src, f"samples[{i}]"))
               for i, s in enumerate(get.items("samples"))]
    steps = [_host_step(_Fields(h, src, f"host_steps[{i}]"))
             for i, h in enumerate(get.items("host_steps"))]
    if not samples:
        raise get.error("samples", "is empty: nothing to fit")
    versions = {str(k): str(v) for k, v in get.mapping("versions").items()}
    return Recording(
        model=model, device=device, dtype=get.choice("dtype", PROFILE_DTYPES),
        kv_cache_bytes=get.whole("kv_cache_bytes", 0, MAX_KV_CACHE_BYTES),
        block_size=get.whole("block_size", 1, MAX_BLOCK_SIZE), versions=versions,
        executor_code=get.text("executor_code", allow_empty=True), grid=grid,
        repeats=get.integer("repeats") or 1, statistic=get.choice("statistic", STATISTICS),
        samples=samples, host_steps=steps, seconds=get.number("seconds"),
        cpu_share=get.number("cpu_share", True), load_average=get.number("load_average", True),
        created=get.text("created", allow_empty=True))


def _sample(f: _Fields) -> Sample:
    spec = ShapeSpec(f.rows("rows"), f.text("group"), f.integer("swap_out") or 0,
                     f.integer("swap_in") or 0)
    # A time of 0 or less is the file's fault (an edit), said of the file: the fit's own
    # check blamed "the executor".
    seconds = f.positive("seconds")
    times = f.numbers("times")
    if any(not t > 0 for t in times):
        raise f.error("times", "expected positive seconds, got "
                      f"{next(t for t in times if not t > 0)!r}")
    return Sample(spec, seconds, f.number("spread"), f.number("cpu_share"),
                  tuple(times), f.number("cpu_seconds"), tuple(f.numbers("cpu_times")))


def _host_step(f: _Fields) -> HostStep:
    rows = f.rows("rows")
    swaps = f.numbers("swaps")
    if len(swaps) != 2:
        raise f.error("swaps", "expected [blocks out, blocks in]")
    out, into = int(swaps[0]), int(swaps[1])
    idle = f.raw("after_idle")
    if not isinstance(idle, bool):
        raise f.error("after_idle", "expected true or false")
    step, executor = f.positive("step_s"), f.number("executor_s")
    if executor < 0:
        raise f.error("executor_s", f"expected seconds >= 0, got {executor!r:.40}")
    # The executor runs inside the step (the engine times the step around it): a longer
    # executor left the loop a negative time, which the host fit took as a free loop.
    if executor > step:
        raise SamplesFileError(f"{f.src}: {f.where}.executor_s={executor!r} exceeds "
                               f"step_s={step!r}: the executor runs inside the step; "
                               "re-record the samples with `slopilot calibrate ... "
                               "--samples-out FILE`")
    return HostStep(shape_of_rows(rows, out, into, after_idle=idle), step, float(executor),
                    f.text("label"), rows, (out, into), idle)


class _Fields:
    """Typed reads from one JSON object; errors say ``FILE: field: problem``."""

    def __init__(self, doc: Any, src: str, where: str) -> None:
        if not isinstance(doc, Mapping):
            raise SamplesFileError(f"{src}: {where or 'the file'}: expected an object")
        self.doc, self.src, self.where = doc, src, where

    def error(self, key: str, problem: str) -> SamplesFileError:
        name = f"{self.where}.{key}" if self.where else key
        return SamplesFileError(f"{self.src}: {name}: {problem}; write the file again with "
                                "`slopilot calibrate ... --samples-out FILE`")

    def raw(self, key: str) -> Any:
        if key not in self.doc:
            raise self.error(key, "missing")
        return self.doc[key]

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.raw(key)
        if not isinstance(value, Mapping):
            raise self.error(key, "expected an object")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(key, "expected a list")
        return value

    def text(self, key: str, allow_empty: bool = False) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not (value or allow_empty):
            raise self.error(key, f"expected a non-empty string, got {value!r:.40}")
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.raw(key)
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r:.40}")
        return str(value)

    def whole(self, key: str, lo: int, hi: int) -> int:
        """A whole number in [lo, hi] (a float such as 2.0 too: JSON writers differ)."""
        value = self.raw(key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.error(key, f"expected a whole number from {lo} to {hi}, got "
                             f"{value!r:.40}")
        return value

    def number(self, key: str, optional: bool = False) -> Any:
        value = self.raw(key) if not optional else self.doc.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value \
                or value in (float("inf"), float("-inf")):
            raise self.error(key, f"expected a finite number, got {value!r:.40}")
        return value

    def positive(self, key: str) -> float:
        value = self.number(key)
        if not value > 0:
            raise self.error(key, f"expected positive seconds, got {value!r:.40}")
        return float(value)

    def integer(self, key: str, optional: bool = False) -> int | None:
        value = self.doc.get(key) if optional else self.raw(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(key, f"expected a non-negative integer, got {value!r:.40}")
        return value

    def numbers(self, key: str) -> list[float]:
        values = self.items(key)
        if not all(not isinstance(v, bool) and isinstance(v, int | float) for v in values):
            raise self.error(key, "expected a list of numbers")
        return [float(v) for v in values]

    def rows(self, key: str) -> tuple[tuple[int, int, bool], ...]:
        out = []
        for row in self.items(key):
            if (not isinstance(row, list) or len(row) != 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in row[:2])
                    or not isinstance(row[2], bool) or row[0] < 1 or row[1] < 0):
                raise self.error(key, f"row {row!r:.40}: expected [new_tokens >= 1, "
                                 "context >= 0, samples]")
            out.append((row[0], row[1], row[2]))
        return tuple(out)
