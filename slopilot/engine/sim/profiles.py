"""GPU and model profiles for the cost model: vendor spec-sheet numbers as data.

GPU figures are the vendor's headline numbers for the SXM parts (dense, no sparsity);
the cost model applies its own efficiency factors on top, so these stay checkable
against the spec sheets. Memory sizes are what ``nvidia-smi`` reports (MiB), which is
what an engine can actually allocate from.

Sources:
  A100-80GB SXM: NVIDIA A100 datasheet (bf16 312 TFLOP/s, HBM2e 2,039 GB/s,
      NVLink 3 600 GB/s, PCIe Gen4 x16).
  H100-SXM: NVIDIA H100 datasheet (bf16 989 TFLOP/s dense = 1,979 with sparsity,
      HBM3 3.35 TB/s, NVLink 4 900 GB/s, PCIe Gen5 x16).
  H800 SXM: the export variant of H100 SXM: same SMs, clocks and HBM3, NVLink cut to
      400 GB/s (8 links instead of 18).
  H200 SXM: NVIDIA H200 datasheet (same compute as H100, 141 GB HBM3e at 4.8 TB/s).
NVLink figures are bidirectional totals as the sheets print them; a ring all-reduce
sends in one direction at a time, so the cost model uses half. PCIe Gen4/Gen5 x16 is
~32/~64 GB/s per direction before protocol overhead.

Model shapes come from each checkpoint's Hugging Face ``config.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slopilot.engine.bounded_read import read_bounded
from slopilot.engine.read_errors import unreadable
from slopilot.engine.sim.yaml_load import safe_load_bounded

_MIB = 1024 * 1024


class ProfileError(ValueError):
    """A profile name is unknown or a profile's numbers are invalid."""


def _check_positive(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ProfileError(
                f"{type(obj).__name__} {getattr(obj, 'name', '?')!r}: {name}={value!r} "
                "must be a positive number")


@dataclass(frozen=True)
class GPUProfile:
    """One accelerator's headline figures (per GPU, dense bf16)."""

    name: str
    peak_flops: float          # dense bf16 tensor-core FLOP/s
    hbm_bandwidth: float       # bytes/s
    memory_bytes: int          # allocatable device memory
    nvlink_bandwidth: float    # bytes/s, bidirectional total per GPU (0 = no NVLink)
    pcie_bandwidth: float      # bytes/s, one direction, host <-> device

    def __post_init__(self) -> None:
        _check_positive(self, ("peak_flops", "hbm_bandwidth", "memory_bytes",
                               "pcie_bandwidth"))
        if self.nvlink_bandwidth < 0:
            raise ProfileError(
                f"GPUProfile {self.name!r}: nvlink_bandwidth={self.nvlink_bandwidth!r} "
                "must be >= 0 (0 means no NVLink)")


@dataclass(frozen=True)
class ModelProfile:
    """A decoder-only transformer with a gated (SwiGLU) MLP and grouped-query attention."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    # The model's context in tokens (config.json's): no default, since the server and the
    # twin refuse a longer request (``context_limit``) and a guess would move that line.
    max_position_embeddings: int = field(kw_only=True)
    dtype_bytes: int = 2       # bf16 weights and KV cache

    def __post_init__(self) -> None:
        _check_positive(self, ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                               "head_dim", "intermediate_size", "vocab_size",
                               "max_position_embeddings", "dtype_bytes"))
        if self.num_heads % self.num_kv_heads:
            raise ProfileError(
                f"ModelProfile {self.name!r}: num_heads={self.num_heads} is not a multiple "
                f"of num_kv_heads={self.num_kv_heads}; grouped-query attention needs it")

    @property
    def attn_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    @property
    def linear_params(self) -> int:
        """Parameters every token multiplies through (all layers, no embeddings)."""
        return self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self.linear_params + heads * self.embedding_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers and KV heads (unsharded)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


GPUS: dict[str, GPUProfile] = {p.name.lower(): p for p in (
    GPUProfile("A100-80GB", peak_flops=312e12, hbm_bandwidth=2.039e12,
               memory_bytes=81920 * _MIB, nvlink_bandwidth=600e9, pcie_bandwidth=32e9),
    GPUProfile("H100-SXM", peak_flops=989e12, hbm_bandwidth=3.35e12,
               memory_bytes=81559 * _MIB, nvlink_bandwidth=900e9, pcie_bandwidth=64e9),
    GPUProfile("H800", peak_flops=989e12, hbm_bandwidth=3.35e12,
               memory_bytes=81559 * _MIB, nvlink_bandwidth=400e9, pcie_bandwidth=64e9),
    GPUProfile("H200", peak_flops=989e12, hbm_bandwidth=4.8e12,
               memory_bytes=143771 * _MIB, nvlink_bandwidth=900e9, pcie_bandwidth=64e9),
)}
_GPU_ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "h800-sxm": "h800",
                "h200-sxm": "h200"}

# meta-llama/Meta-Llama-3-8B and -70B
_LLAMA3_8B = ModelProfile("Llama-3-8B", num_layers=32, hidden_size=4096, num_heads=32,
                          num_kv_heads=8, head_dim=128, intermediate_size=14336,
                          vocab_size=128256, max_position_embeddings=8192)
_LLAMA3_70B = ModelProfile("Llama-3-70B", num_layers=80, hidden_size=8192, num_heads=64,
                           num_kv_heads=8, head_dim=128, intermediate_size=28672,
                           vocab_size=128256, max_position_embeddings=8192)

MODELS: dict[str, ModelProfile] = {p.name.lower(): p for p in (
    _LLAMA3_8B,
    _LLAMA3_70B,
    # meta-llama/Llama-3.1-8B and -70B: Llama 3's shapes, with a 128k context
    dataclasses.replace(_LLAMA3_8B, name="Llama-3.1-8B", max_position_embeddings=131072),
    dataclasses.replace(_LLAMA3_70B, name="Llama-3.1-70B", max_position_embeddings=131072),
    # deepseek-ai/deepseek-llm-67b-base (and -chat)
    ModelProfile("DeepSeek-67B", num_layers=95, hidden_size=8192, num_heads=64,
                 num_kv_heads=8, head_dim=128, intermediate_size=22016,
                 vocab_size=102400, max_position_embeddings=4096),
    # HuggingFaceTB/SmolLM2-135M(-Instruct)
    ModelProfile("SmolLM2-135M", num_layers=30, hidden_size=576, num_heads=9,
                 num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
                 tie_word_embeddings=True, max_position_embeddings=8192),
    # A seeded random Llama small enough to build in a test; no checkpoint exists.
    ModelProfile("tiny-random", num_layers=2, hidden_size=64, num_heads=4,
                 num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                 tie_word_embeddings=True, max_position_embeddings=2048),
)}
_MODEL_ALIASES = {"deepseek-llm-67b": "deepseek-67b", "llama3-8b": "llama-3-8b",
                  "llama3-70b": "llama-3-70b", "meta-llama-3-8b": "llama-3-8b",
                  "meta-llama-3-70b": "llama-3-70b", "llama3.1-8b": "llama-3.1-8b",
                  "llama3.1-70b": "llama-3.1-70b", "tiny": "tiny-random"}

_P = TypeVar("_P", GPUProfile, ModelProfile)


def _lookup(kind: str, name: str, table: Mapping[str, _P], aliases: Mapping[str, str]) -> _P:
    key = name.strip().lower()
    key = aliases.get(key, key)
    if key not in table:
        # No "pass a YAML file describing it": nothing resolves a name as a file. The short
        # names are listed because the shipped scenarios use them (gpu: A100, gpu: H100).
        known = ", ".join(p.name for p in table.values())
        short = ", ".join(sorted(aliases))
        raise ProfileError(f"unknown {kind} {name!r}; known {kind}s: {known}; or one of "
                           f"their short names: {short}")
    return table[key]


def get_gpu(name: str) -> GPUProfile:
    """The GPU profile for ``name`` (case-insensitive, e.g. "h800" or "H100-SXM")."""
    return _lookup("GPU", name, GPUS, _GPU_ALIASES)


def canonical_model_name(name: str) -> str:
    """``name`` lowercased with aliases resolved: the key two names of one model share.

    A checkpoint path counts by its last component (``/models/SmolLM2-135M/``).
    """
    key = name.strip().rstrip("/").rsplit("/", 1)[-1].lower()
    key = _MODEL_ALIASES.get(key, key)
    return MODELS[key].name.lower() if key in MODELS else key


def get_model(name: str) -> ModelProfile:
    """The model profile for ``name`` (case-insensitive, e.g. "deepseek-67b")."""
    return _lookup("model", name, MODELS, _MODEL_ALIASES)


_MISSING_HINTS = {
    "max_position_embeddings": "the model's context in tokens, config.json's "
                               "max_position_embeddings: requests longer than it are "
                               "refused, by the server and the twin; give it",
}


def _from_mapping(cls: type[_P], data: Mapping[str, Any], source: str) -> _P:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: expected a mapping of {cls.__name__} fields")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ProfileError(f"{source}: unknown field(s) {', '.join(unknown)}; "
                           f"{cls.__name__} fields are: {', '.join(sorted(fields))}")
    missing = sorted(
        f.name for f in dataclasses.fields(cls)
        if f.name not in data and f.default is dataclasses.MISSING)
    if missing:
        hints = "".join(f" ({_MISSING_HINTS[m]})" for m in missing if m in _MISSING_HINTS)
        raise ProfileError(f"{source}: missing field(s) {', '.join(missing)}{hints}")
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {name: _coerce(value, str(kinds[name]), f"{source}: {name}")
              for name, value in data.items()}
    return cls(**values)


def _coerce(value: Any, kind: str, where: str) -> Any:
    """YAML 1.1 reads ``362e12`` (no dot) as a string; accept it as the number it means."""
    if kind not in ("int", "float") or isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ProfileError(f"{where}={value!r}: expected a number") from None
    elif isinstance(value, float):
        number = value
    else:
        return value
    if kind == "float":
        return number
    if not number.is_integer():
        raise ProfileError(f"{where}={value!r}: expected a whole number")
    return int(number)


def gpu_from_dict(data: Mapping[str, Any], source: str = "GPU profile") -> GPUProfile:
    return _from_mapping(GPUProfile, data, source)


def model_from_dict(data: Mapping[str, Any], source: str = "model profile") -> ModelProfile:
    return _from_mapping(ModelProfile, data, source)


MAX_PROFILES_BYTES = 1 << 20
"""A file of a few GPU and model profiles is a few KiB."""


def load_profiles(path: str | Path) -> tuple[dict[str, GPUProfile], dict[str, ModelProfile]]:
    """Read extra profiles from YAML: top-level ``gpus:`` and/or ``models:`` lists."""
    p = Path(path)
    try:
        doc = safe_load_bounded(read_bounded(p, MAX_PROFILES_BYTES).decode("utf-8")) or {}
    except OSError as exc:
        raise ProfileError(f"cannot read profiles from {p}: {unreadable(exc)}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ProfileError(f"cannot read profiles from {p}: {exc}") from None
    if not isinstance(doc, Mapping) or not set(doc) <= {"gpus", "models"}:
        raise ProfileError(f"{p}: expected a mapping with 'gpus' and/or 'models' lists")
    gpus = [gpu_from_dict(d, f"{p}: gpus[{i}]") for i, d in enumerate(doc.get("gpus") or [])]
    models = [model_from_dict(d, f"{p}: models[{i}]")
              for i, d in enumerate(doc.get("models") or [])]
    return {g.name.lower(): g for g in gpus}, {m.name.lower(): m for m in models}


def resolve_gpu(spec: str | GPUProfile) -> GPUProfile:
    return spec if isinstance(spec, GPUProfile) else get_gpu(spec)


def resolve_model(spec: str | ModelProfile) -> ModelProfile:
    return spec if isinstance(spec, ModelProfile) else get_model(spec)
