"""A calibrated cost profile: what ``slopilot calibrate`` writes and every twin reads.

One YAML file describes one (device, model, dtype, threads) pairing: the model's shape
(for KV sizing), the coefficients of the linear shape-feature cost model
(``slopilot.engine.sim.shape``) for the executor and for the engine loop around it,
how well they fit, and where they came from (library versions, a digest of the
executor's code, the date, the machine's load). Layout::

    schema: slopilot.dev/cost-profile/v1
    name: smollm2-135m on cpu
    created: 2026-05-01T12:00:00+00:00
    device: {type: cpu, name: AMD EPYC (2 cores), threads: 1}
    model: {name: smollm2-135m, dtype: float32, tp: 1, shape: {num_layers: 30, ...}}
    memory: {block_size: 16, kv_cache_bytes: 2147483648}
    cost_model:
      form: linear-shape-features
      version: 1
      hash: 0123456789abcdef
      executor: {iteration: 0.0021, tokens: 0.0009, ...}   # seconds per unit
      host: {iteration: 0.0003, decode_seqs: 1.0e-05, ...}
    fit: {repeats: 5, shapes: 60, mape: 0.02, max_err: 0.06, classes: {...}, ...}
    versions: {slopilot: 0.1.0, python: 3.11.9, torch: 2.13.0+cpu, ...}
    code: {executor: 89abcdef01234567}

``load_profile`` refuses a malformed file with the field, the value and the fix;
``CostProfile.staleness`` lists what makes an intact profile out of date (an older
cost-model form, other executor code), which callers print as warnings.
``write_profile`` writes atomically: a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from slopilot.engine.sim.profiles import (
    ModelProfile,
    ProfileError,
    canonical_model_name,
    model_from_dict,
)
from slopilot.engine.sim.shape import FEATURES, FORM_NAME, FORM_VERSION, form_hash
from slopilot.engine.sim.spec_reader import Reader, ScenarioError

SCHEMA = "slopilot.dev/cost-profile/v1"
DEVICE_TYPES = ("cpu", "cuda")
RECALIBRATE = "re-run `slopilot calibrate` for this model and device to write a new one"


class ProfileFileError(ProfileError):
    """A profile file is missing, malformed, or for another model or device."""


class StaleProfileWarning(UserWarning):
    """A profile is readable but older than the code that uses it."""


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "cpu" or "cuda"
    name: str  # "AMD EPYC (2 cores)", "NVIDIA H100 80GB HBM3"
    threads: int | None = None  # torch intra-op threads (CPU)


@dataclass(frozen=True)
class ClassFit:
    """How well the fitted model reproduces one class of measured shapes."""

    shapes: int
    mape: float
    max_err: float
    worst: str = ""


@dataclass(frozen=True)
class FitReport:
    repeats: int
    shapes: int
    mape: float
    max_err: float
    classes: Mapping[str, ClassFit] = field(default_factory=lambda: MappingProxyType({}))
    host_steps: int = 0
    host_mape: float = 0.0
    cpu_share: float | None = None  # process CPU time / wall time while timing
    load_average: float | None = None  # 1-minute load average when it finished
    seconds: float = 0.0
    # The calibrated domain: outside it the twin extrapolates.
    token_budget: int = 0
    max_num_seqs: int = 0
    max_context: int = 0
    statistic: str = "median"  # each shape's figure over its repeats: median or min


@dataclass(frozen=True)
class CostProfile:
    name: str
    device: DeviceInfo
    model: ModelProfile
    dtype: str
    executor: Mapping[str, float]  # seconds per unit of each feature, executor only
    host: Mapping[str, float]  # the engine loop around the executor
    block_size: int = 16
    kv_cache_bytes: int = 0
    tp: int = 1
    form: str = FORM_NAME
    form_version: int = FORM_VERSION
    form_digest: str = field(default_factory=form_hash)
    created: str = ""
    versions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    executor_code: str = ""
    fit: FitReport | None = None
    source: str = "<memory>"  # where it was read from; not written

    def coefficient(self, feature: str) -> float:
        """Executor plus host seconds per unit of ``feature`` (0 when not fitted)."""
        return self.executor.get(feature, 0.0) + self.host.get(feature, 0.0)

    def staleness(self, executor_code: str | None = None) -> list[str]:
        """Why this profile may not describe today's engine (empty when current)."""
        out = []
        if self.form_version < FORM_VERSION or self.form_digest != form_hash():
            out.append(
                f"{self.source}: fitted on cost-model form {self.form} v{self.form_version} "
                f"({self.form_digest}); this engine uses {FORM_NAME} v{FORM_VERSION} "
                f"({form_hash()}): features it lacks count as 0; {RECALIBRATE}")
        if executor_code and self.executor_code and executor_code != self.executor_code:
            out.append(
                f"{self.source}: calibrated on executor code {self.executor_code}, this "
                f"engine's is {executor_code}: its times may have changed; {RECALIBRATE}")
        return out


def executor_code_hash() -> str:
    """A digest of the source that sets an iteration's time on the torch executor.

    Read as files, not imported, so the simulator can check a profile without torch.
    """
    import hashlib

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for rel in ("executors/torch_runner.py", "executors/llama.py", "executors/batch.py",
                "executors/kv_cache.py", "executors/sampler.py", "engine.py",
                "scheduler.py", "block_manager.py"):
        path = root / rel
        digest.update(rel.encode())
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------- writing

def profile_to_dict(p: CostProfile) -> dict[str, Any]:
    shape = {k: v for k, v in dataclasses.asdict(p.model).items() if k != "name"}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "name": p.name,
        "created": p.created,
        "device": {"type": p.device.type, "name": p.device.name,
                   "threads": p.device.threads},
        "model": {"name": p.model.name, "dtype": p.dtype, "tp": p.tp, "shape": shape},
        "memory": {"block_size": p.block_size, "kv_cache_bytes": p.kv_cache_bytes},
        "cost_model": {"form": p.form, "version": p.form_version, "hash": p.form_digest,
                       "executor": {k: float(v) for k, v in p.executor.items()},
                       "host": {k: float(v) for k, v in p.host.items()}},
        "versions": {str(k): str(v) for k, v in p.versions.items()},
        "code": {"executor": p.executor_code},
    }
    if p.fit is not None:
        fit = {f.name: _plain(getattr(p.fit, f.name)) for f in dataclasses.fields(p.fit)
               if f.name != "classes"}
        fit["classes"] = {k: {f.name: _plain(getattr(v, f.name))
                              for f in dataclasses.fields(v)}
                          for k, v in p.fit.classes.items()}
        doc["fit"] = fit
    return doc


def _plain(value: Any) -> Any:
    """Builtin types only (numpy scalars and str subclasses would not dump as YAML)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def dump_profile(p: CostProfile) -> str:
    header = (f"# slopilot cost profile: {p.name}. Written by `slopilot calibrate`; "
              "see docs/twin.md.\n")
    return header + yaml.safe_dump(profile_to_dict(p), sort_keys=False, width=100)


def write_profile(p: CostProfile, path: str | Path) -> Path:
    """Write ``p`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    target = Path(path)
    text = dump_profile(p)
    load_profile(text, warn=False)  # never write what could not be read back
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


# ---------------------------------------------------------------------------- reading

def load_profile(path_or_text: str | Path, *, warn: bool = True) -> CostProfile:
    """Read a profile from a file path or from YAML text; errors name the field and fix.

    ``warn`` emits a ``StaleProfileWarning`` for each ``staleness`` item.
    """
    text, source = _read(path_or_text)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileFileError(f"{source}: not valid YAML ({exc}); {RECALIBRATE}") from None
    try:
        profile = _parse(doc, source)
    except ScenarioError as exc:
        raise ProfileFileError(f"{exc}; {RECALIBRATE}") from None
    except ProfileError as exc:
        raise ProfileFileError(f"{source}: model.shape: {exc}; {RECALIBRATE}") from None
    if warn:
        for problem in profile.staleness(executor_code_hash()):
            warnings.warn(problem, StaleProfileWarning, stacklevel=2)
    return profile


def _read(path_or_text: str | Path) -> tuple[str, str]:
    if isinstance(path_or_text, Path) or "\n" not in str(path_or_text):
        path = Path(path_or_text)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except FileNotFoundError:
            raise ProfileFileError(
                f"profile file {str(path)!r} does not exist; write one with "
                "`slopilot calibrate --model ... --out FILE`") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileFileError(f"cannot read profile file {str(path)!r}: {exc}") from None
    return str(path_or_text), "<profile text>"


def _parse(doc: object, source: str) -> CostProfile:
    r = Reader(doc, source=source)
    schema = r.raw("schema", None)
    if schema != SCHEMA:
        raise r.error("schema", schema, f"not a slopilot cost profile (expected {SCHEMA!r})")
    dev = r.section("device")
    device = DeviceInfo(dev.text("type", choices=DEVICE_TYPES), dev.text("name"),
                        dev.optional_int("threads", lo=1, hi=4096))
    dev.finish()
    m = r.section("model")
    model_name = m.text("name")
    dtype = m.text("dtype", choices=("float32", "bfloat16", "float16"))
    tp = m.integer("tp", 1, lo=1, hi=64)
    shape = m.raw("shape")
    if not isinstance(shape, Mapping):
        raise m.error("shape", shape, "expected a mapping of model dimensions")
    model = model_from_dict({**shape, "name": model_name}, f"{source}: model.shape")
    m.finish()
    mem = r.section("memory")
    block_size = mem.integer("block_size", lo=1, hi=1024)
    kv_bytes = mem.integer("kv_cache_bytes", lo=0)
    mem.finish()
    cm = r.section("cost_model")
    form = cm.text("form")
    if form != FORM_NAME:
        raise cm.error("form", form, f"this engine evaluates only {FORM_NAME!r}")
    version = cm.integer("version", lo=1)
    if version > FORM_VERSION:
        raise cm.error("version", version, f"written by a newer slopilot (this one knows "
                       f"up to v{FORM_VERSION}); upgrade slopilot")
    digest = cm.text("hash")
    executor = _coefficients(cm, "executor")
    host = _coefficients(cm, "host")
    cm.finish()
    fit = _fit(r.sub("fit", optional=True))
    versions = r.raw("versions", None) or {}
    code = r.raw("code", None) or {}
    if not isinstance(versions, Mapping) or not isinstance(code, Mapping):
        raise r.error("versions", versions, "versions and code must be mappings")
    profile = CostProfile(
        name=r.text("name"), device=device, model=model, dtype=dtype, executor=executor,
        host=host, block_size=block_size, kv_cache_bytes=kv_bytes, tp=tp, form=form,
        form_version=version, form_digest=digest, created=str(r.raw("created", "")),
        versions=MappingProxyType({str(k): str(v) for k, v in versions.items()}),
        executor_code=str(code.get("executor", "")), fit=fit, source=source)
    r.finish()
    return profile


def _coefficients(r: Reader, key: str) -> Mapping[str, float]:
    sub = r.section(key)
    out = {}
    for name in sub.data:
        if name not in FEATURES:
            raise sub.error(name, sub.data[name], f"unknown feature of {FORM_NAME} "
                            f"v{FORM_VERSION} (known: {', '.join(FEATURES)})")
        value = _number(sub, name)
        if value < 0:
            raise sub.error(name, value, "a time per unit cannot be negative")
        out[name] = value
    return MappingProxyType(out)


def _number(r: Reader, key: str) -> float:
    value = r.raw(key)
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            raise r.error(key, value, "expected a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise r.error(key, value, "expected a finite number")
    return float(value)


def _fit(r: Reader | None) -> FitReport | None:
    if r is None:
        return None
    classes = {}
    raw = r.raw("classes", None) or {}
    for name, value in (raw.items() if isinstance(raw, Mapping) else ()):
        c = r.child(f"classes.{name}", value)
        classes[str(name)] = ClassFit(c.integer("shapes", lo=0), c.number("mape", lo=0),
                                      c.number("max_err", lo=0), str(c.raw("worst", "")))
        c.finish()
    report = FitReport(
        repeats=r.integer("repeats", lo=1), shapes=r.integer("shapes", lo=0),
        mape=r.number("mape", lo=0), max_err=r.number("max_err", lo=0),
        classes=MappingProxyType(classes), host_steps=r.integer("host_steps", 0, lo=0),
        host_mape=r.number("host_mape", 0.0, lo=0),
        cpu_share=r.optional_float("cpu_share", lo=0),
        load_average=r.optional_float("load_average", lo=0),
        seconds=r.number("seconds", 0.0, lo=0),
        token_budget=r.integer("token_budget", 0, lo=0),
        max_num_seqs=r.integer("max_num_seqs", 0, lo=0),
        max_context=r.integer("max_context", 0, lo=0),
        statistic=r.text("statistic", "median", choices=("median", "min")))
    r.finish()
    return report


def check_profile_for(profile: CostProfile, *, model: str | None = None,
                      device: str | None = None, tp: int | None = None) -> None:
    """Refuse a profile calibrated for another model, device type or TP degree."""
    src = profile.source
    if model is not None and \
            canonical_model_name(model) != canonical_model_name(profile.model.name):
        raise ProfileFileError(
            f"{src} was calibrated for model {profile.model.name!r}, not {model!r}; use a "
            f"profile calibrated for {model!r} (`slopilot calibrate --model {model} ...`) "
            "or drop the profile to use the datasheet roofline")
    if device is not None and device.split(":")[0] != profile.device.type:
        raise ProfileFileError(
            f"{src} was calibrated on a {profile.device.type} device "
            f"({profile.device.name}), not {device!r}; calibrate on the device that serves")
    if tp is not None and tp != profile.tp:
        raise ProfileFileError(
            f"{src} was calibrated at tp={profile.tp}, not tp={tp}; calibrate at tp={tp}")
