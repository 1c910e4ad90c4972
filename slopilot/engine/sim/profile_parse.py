"""Strict reading of a profile document: every error names the field, value and fix."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from slopilot.engine.executors.kernel_modes import PROFILE_KERNELS
from slopilot.engine.sim.profile_types import (
    DEVICE_TYPES,
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_BYTES,
    MIN_STEP_S,
    PROFILE_DTYPES,
    SCHEMA,
    ClassFit,
    CostProfile,
    DeviceInfo,
    FitReport,
)
from slopilot.engine.sim.profiles import model_from_dict
from slopilot.engine.sim.shape import FEATURES, FORM_NAME, FORM_VERSION
from slopilot.engine.sim.spec_reader import Reader, ScenarioError

# No feature costs a minute per unit; a bigger figure is a corrupt or hostile file.
MAX_COEFFICIENT_S = 60.0
# The dimensions that size the KV cache, at several times any released model's: past
# them one token's K and V outgrew the cache, and the error blamed memory.kv_cache_bytes.
_SHAPE_LIMITS = (
    ("num_layers", 1024, "the deepest released LLMs have under 200 layers"),
    ("num_heads", 1024, "released LLMs have at most a few hundred attention heads"),
    ("head_dim", 1024, "released LLMs' heads are 64 to 256 wide"),
    ("dtype_bytes", 8, "the widest dtype, float64, takes 8"),
)


def parse_profile(doc: object, source: str) -> CostProfile:
    r = Reader(doc, source=source)
    schema = r.raw("schema", None)
    if schema != SCHEMA:
        raise r.error("schema", schema, f"not a slopilot cost profile (expected {SCHEMA!r})")
    dev = r.section("device")
    kernels = (None if dev.raw("kernels", None) is None
               else dev.text("kernels", choices=PROFILE_KERNELS))
    device = DeviceInfo(dev.text("type", choices=DEVICE_TYPES), dev.text("name"),
                        dev.optional_int("threads", lo=1, hi=4096),
                        dev.optional_int("cache_bytes", lo=1, hi=1 << 40), kernels)
    dev.finish()
    m = r.section("model")
    model_name = m.text("name")
    dtype = m.text("dtype", choices=PROFILE_DTYPES)
    tp = m.integer("tp", 1, lo=1, hi=64)
    shape = m.raw("shape")
    if not isinstance(shape, Mapping):
        raise m.error("shape", shape, "expected a mapping of model dimensions")
    model = model_from_dict({**shape, "name": model_name}, f"{source}: model.shape")
    for key, most, why in _SHAPE_LIMITS:
        if getattr(model, key) > most:
            raise m.error(f"shape.{key}", getattr(model, key), f"must be at most {most:,} "
                          f"({why})")
    m.finish()
    mem = r.section("memory")
    block_size = mem.integer("block_size", lo=1, hi=MAX_BLOCK_SIZE)
    kv_bytes = mem.integer("kv_cache_bytes", lo=0, hi=MAX_KV_CACHE_BYTES)
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
    if not isinstance(versions, Mapping):
        raise r.error("versions", versions, "expected a mapping (versions: {slopilot: "
                      "0.1.0, torch: ...}, as `slopilot calibrate` writes it)")
    if not isinstance(code, Mapping):
        raise r.error("code", code, "expected a mapping (code: {executor: HASH}, as "
                      "`slopilot calibrate` writes it)")
    profile = CostProfile(
        name=r.text("name"), device=device, model=model, dtype=dtype, executor=executor,
        host=host, block_size=block_size, kv_cache_bytes=kv_bytes, tp=tp, form=form,
        form_version=version, form_digest=digest, created=str(r.raw("created", "")),
        versions=MappingProxyType({str(k): str(v) for k, v in versions.items()}),
        executor_code=str(code.get("executor", "")), fit=fit, source=source)
    r.finish()
    _check_cheapest_step(profile, source)
    return profile


def _check_cheapest_step(profile: CostProfile, source: str) -> None:
    cheapest = profile.cheapest_step_s()
    if cheapest >= MIN_STEP_S:
        return
    raise ScenarioError(
        f"{source}: cost_model: the cheapest step it prices (one decode of a one-token "
        f"prompt, or a two-token chunk) takes {cheapest * 1e6:.3g} us (executor.iteration="
        f"{profile.executor.get('iteration', 0.0):g} s, host.iteration="
        f"{profile.host.get('iteration', 0.0):g} s); no engine step takes under "
        f"{MIN_STEP_S * 1e6:g} us (a GPU kernel launch alone takes ~5 us; the cheapest "
        "calibrated here take 0.5 ms and more), and a twin on it would serve without "
        "limit: the file is hand-edited or corrupt")


def _coefficients(r: Reader, key: str) -> Mapping[str, float]:
    sub = r.section(key)
    out = {}
    for name in sub.data:
        if name not in FEATURES:
            raise sub.error(name, sub.data[name], f"unknown feature of {FORM_NAME} "
                            f"v{FORM_VERSION} (known: {', '.join(FEATURES)})")
        value = _number(sub, name)
        if not 0 <= value <= MAX_COEFFICIENT_S:
            raise sub.error(name, value, "a time per unit must be in [0, "
                            f"{MAX_COEFFICIENT_S:g}] seconds (it cannot be negative)")
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
