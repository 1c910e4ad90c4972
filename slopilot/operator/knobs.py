"""Where each engine knob lives in an LLMDeployment, and its schema, from EngineConfig.

The CRD's ranges and the handler's checks both come from ``EngineConfig``'s field
metadata, so a range changes in one place (slopilot/engine/config.py) only.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from slopilot.engine.config import EngineConfig

# spec.engine path (camelCase, as users write it) -> EngineConfig field name.
KNOB_PATHS: dict[tuple[str, ...], str] = {
    ("tokenBudget",): "token_budget",
    ("budgetAlign",): "budget_align",
    ("chunkSize",): "chunk_size",
    ("maxNumSeqs",): "max_num_seqs",
    ("kvWatermark",): "kv_watermark",
    ("blockSize",): "block_size",
    ("swapSpaceGb",): "swap_space_gb",
    ("maxWaiting",): "max_waiting",
    ("enablePrefixCaching",): "enable_prefix_caching",
    ("preemption", "mode"): "preemption_mode",
    ("preemption", "recomputeMaxTokens"): "recompute_max_tokens",
    ("preemption", "maxPerStep"): "max_preemptions_per_step",
    ("preemption", "swapTimeoutMs"): "swap_timeout_ms",
    ("preemption", "p0Utilization"): "p0_preempt_utilization",
}
FIELD_PATHS: dict[str, tuple[str, ...]] = {f: p for p, f in KNOB_PATHS.items()}


def engine_field(name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(EngineConfig):
        if f.name == name:
            return f
    raise KeyError(f"EngineConfig has no knob {name!r}")


def knob_range(name: str) -> tuple[float, float]:
    """The knob's [lo, hi] from EngineConfig (both ends inclusive)."""
    meta = engine_field(name).metadata
    if meta.get("lo") is None or meta.get("hi") is None:
        raise KeyError(f"knob {name!r} has no numeric range")
    return meta["lo"], meta["hi"]


def knob_schema(name: str) -> dict[str, Any]:
    """OpenAPI v3 schema of one knob: type from the default, bounds and enums from metadata."""
    f = engine_field(name)
    meta, default = f.metadata, f.default
    schema: dict[str, Any] = {"description": meta["doc"]}
    choices = meta.get("choices")
    if isinstance(default, enum.Enum):
        schema["type"] = "string"
        schema["enum"] = [c.value for c in choices or type(default)]
    elif isinstance(default, bool):
        schema["type"] = "boolean"
    elif isinstance(default, int):
        schema["type"] = "integer"
    else:
        schema["type"] = "number"
    if choices is not None and not isinstance(default, enum.Enum):
        schema["enum"] = list(choices)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    return schema


def spec_path(name: str) -> str:
    """``spec.engine.preemption.mode`` for ``preemption_mode``: how users see a knob."""
    return "spec.engine." + ".".join(FIELD_PATHS[name])
