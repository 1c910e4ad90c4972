"""A calibrated cost profile: what ``slopilot calibrate`` writes and every twin reads.

One YAML file describes one (device, model, dtype, threads) pairing: the model's shape
(for KV sizing), the coefficients of the linear shape-feature cost model
(``slopilot.engine.sim.shape``) for the executor and for the engine loop around it,
how well they fit, and where they came from (library versions, a digest of the
executor's code, the date, the machine's load). Layout::

    schema: slopilot.dev/cost-profile/v1
    name: smollm2-135m on cpu
    created: 2026-05-01T12:00:00+00:00
    device: {type: cpu, name: AMD EPYC (2 cores), threads: 1, kernels: native}
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
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import yaml

from slopilot.engine.bounded_read import FileTooLarge, read_bounded
from slopilot.engine.models import REGISTRY
from slopilot.engine.read_errors import unreadable
from slopilot.engine.sim.output_paths import output_target
from slopilot.engine.sim.profile_parse import parse_profile
from slopilot.engine.sim.profile_types import (
    DEVICE_TYPES,
    RECALIBRATE,
    SCHEMA,
    ClassFit,
    CostProfile,
    DeviceInfo,
    FitReport,
    ProfileFileError,
    StaleProfileWarning,
)
from slopilot.engine.sim.profiles import ProfileError, canonical_model_name
from slopilot.engine.sim.spec_reader import ScenarioError
from slopilot.engine.sim.yaml_load import (
    YAMLDuplicateKeyError,
    YAMLValueError,
    safe_load_bounded,
)

__all__ = ["DEVICE_TYPES", "RECALIBRATE", "SCHEMA", "ClassFit", "CostProfile", "DeviceInfo",
           "FitReport", "ProfileFileError", "StaleProfileWarning", "check_profile_for",
           "dump_profile", "executor_code_hash", "load_profile", "profile_to_dict",
           "write_bytes_atomically", "write_profile", "write_text_atomically"]


# The source that sets an iteration's time on the torch executor, under slopilot/engine/:
# the forward pass and its ops (torch's, or the fused CPU kernels'), the batch, the cache,
# sampling, and the loop around them.
EXECUTOR_SOURCES = (
    "executors/torch_runner.py", "executors/llama.py", "executors/batch.py",
    "executors/kv_cache.py", "executors/sampler.py", "executors/kernels.py",
    "executors/native_kernels.py", "executors/csrc/cpu_kernels.cpp",
    "executors/decode_graphs.py", "engine.py",
    "scheduler.py", "block_manager.py")


def executor_code_hash(root: Path | None = None) -> str:
    """A digest of ``EXECUTOR_SOURCES`` (under ``root``, default this package's engine/).

    Read as files, not imported, so the simulator can check a profile without torch.
    """
    import hashlib

    root = Path(__file__).resolve().parents[1] if root is None else root
    digest = hashlib.sha256()
    for rel in EXECUTOR_SOURCES:
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
                   "threads": p.device.threads, "cache_bytes": p.device.cache_bytes,
                   **({} if p.device.kernels is None else {"kernels": p.device.kernels})},
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
    text = dump_profile(p)
    load_profile(text, warn=False)  # never write what could not be read back
    return write_text_atomically(Path(path), text)


def write_text_atomically(target: Path, text: str) -> Path:
    """``text`` into ``target`` via a temporary file beside it, fsync and a rename: a
    reader sees the old file or the whole new one, never half of it."""
    return write_bytes_atomically(target, text.encode("utf-8"))


def write_bytes_atomically(target: Path, data: bytes) -> Path:
    """``write_text_atomically`` for bytes. A symlink is written through (the file it
    leads to is replaced, the link stays); a device, FIFO, socket or folder at the path
    is refused (``OutputTargetError``), never replaced by a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    real = output_target(target)  # checked again here: the path may have changed since
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        # mkstemp makes it 0600; the file gets the mode the one it replaces had, or that
        # a plain open() would give, so others who could read it still can.
        os.fchmod(fd, _mode_for(real))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _mode_for(target: Path) -> int:
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # read by setting: the CLIs write from one thread
        os.umask(umask)
        return 0o666 & ~umask


# ---------------------------------------------------------------------------- reading

def load_profile(path_or_text: str | Path, *, warn: bool = True) -> CostProfile:
    """Read a profile from a file path or from YAML text; errors name the field and fix.

    ``warn`` emits a ``StaleProfileWarning`` for each ``staleness`` item.
    """
    text, source = _read(path_or_text)
    profile = parse_profile_text(text, source)
    if warn:
        for problem in profile.staleness(executor_code_hash()):
            warnings.warn(problem, StaleProfileWarning, stacklevel=2)
    return profile


def parse_profile_text(text: str, source: str) -> CostProfile:
    """A profile from YAML text that is never taken for a path (``source`` names where it
    came from, e.g. a ConfigMap): what reads profiles a tenant wrote. No staleness check:
    the caller asks ``staleness`` and decides."""
    if len(text.encode()) > MAX_PROFILE_BYTES:
        raise ProfileFileError(f"{source}: {len(text.encode())} bytes is no cost profile "
                               f"(they are a few KiB, at most {MAX_PROFILE_BYTES})")
    try:
        doc = safe_load_bounded(text)
    except YAMLValueError as exc:  # valid YAML, a value its type cannot hold
        raise ProfileFileError(f"{source}: {exc}; {RECALIBRATE}") from None
    except YAMLDuplicateKeyError as exc:  # an edit by hand: the fix is in the message
        raise ProfileFileError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileFileError(f"{source}: not valid YAML ({exc}); {RECALIBRATE}") from None
    try:
        return parse_profile(doc, source)
    except ScenarioError as exc:
        raise ProfileFileError(f"{exc}; {RECALIBRATE}") from None
    except ProfileError as exc:
        raise ProfileFileError(f"{source}: model.shape: {exc}; {RECALIBRATE}") from None


# A profile is a few KiB; a bigger "profile" (a ConfigMap anyone may edit) is refused
# before YAML sees it.
MAX_PROFILE_BYTES = 256 * 1024


def _read(path_or_text: str | Path) -> tuple[str, str]:
    if isinstance(path_or_text, Path) or "\n" not in str(path_or_text):
        path = Path(path_or_text)
        try:
            return read_bounded(path, MAX_PROFILE_BYTES).decode("utf-8"), str(path)
        except FileTooLarge as exc:
            size = f"more than {exc.limit}" if exc.size is None else f"{exc.size}"
            raise ProfileFileError(
                f"{path}: {size} bytes is no cost profile (they are a few KiB, at most "
                f"{MAX_PROFILE_BYTES}); check the path") from None
        except FileNotFoundError as exc:
            raise ProfileFileError(f"{path}: {unreadable(exc)}; write one with "
                                   "`slopilot calibrate --model ... --out FILE`") from None
        except OSError as exc:
            raise ProfileFileError(f"{path}: {unreadable(exc)}") from None
        except UnicodeDecodeError:
            raise ProfileFileError(f"{path}: not UTF-8 text; a profile is the YAML "
                                   "`slopilot calibrate` writes") from None
    text = str(path_or_text)
    if len(text.encode()) > MAX_PROFILE_BYTES:
        raise ProfileFileError(f"<profile text>: {len(text.encode())} bytes is no cost "
                               f"profile (at most {MAX_PROFILE_BYTES})")
    return text, "<profile text>"


def check_profile_for(profile: CostProfile, *, model: str | None = None,
                      device: str | None = None, tp: int | None = None) -> None:
    """Refuse a profile calibrated for another model, device type or TP degree."""
    src = profile.source
    if model is not None and \
            canonical_model_name(model) != canonical_model_name(profile.model.name):
        # calibrate's --model takes a registered model or a checkpoint directory; a
        # scenario's model (llama-3-8b) is neither, and `--model llama-3-8b` is refused.
        how = (f"`slopilot calibrate --model {model} ...`" if model.strip().lower() in REGISTRY
               else f"`slopilot calibrate --model DIR ...` with DIR a checkpoint of {model!r}")
        raise ProfileFileError(
            f"{src} was calibrated for model {profile.model.name!r}, not {model!r}; use a "
            f"profile calibrated for {model!r} ({how}) "
            "or drop the profile to use the datasheet roofline")
    if device is not None and device.split(":")[0] != profile.device.type:
        raise ProfileFileError(
            f"{src} was calibrated on a {profile.device.type} device "
            f"({profile.device.name}), not {device!r}; calibrate on the device that serves")
    if tp is not None and tp != profile.tp:
        raise ProfileFileError(
            f"{src} was calibrated at tp={profile.tp}, not tp={tp}; calibrate at tp={tp}")
