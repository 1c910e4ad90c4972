"""Cost profiles built in code: a known model on a made-up device, known coefficients."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from slopilot.engine.sim.profile_file import (
    ClassFit,
    CostProfile,
    DeviceInfo,
    FitReport,
    write_profile,
)
from slopilot.engine.sim.profiles import get_model

COEFFICIENTS: Mapping[str, float] = MappingProxyType({
    "iteration": 4e-3, "tokens": 2e-5, "sampled": 1e-5, "decode_seqs": 2e-5,
    "decode_batches": 5e-4, "prefill_seqs": 3e-4, "decode_context": 1e-7,
    "decode_padded_context": 5e-8, "prefill_context": 2e-8, "prefill_attention": 1e-9,
    "prefill_attention_dense": 5e-10, "swap_batches": 5e-5, "swap_blocks": 2e-5})
HOST: Mapping[str, float] = MappingProxyType({"iteration": 3e-4, "decode_seqs": 1e-5})


def make_profile(model: str = "llama-3-8b", *, device: str = "cuda",
                 executor: Mapping[str, float] = COEFFICIENTS,
                 host: Mapping[str, float] = HOST, kv_gib: float = 40.0,
                 **changes: object) -> CostProfile:
    profile = CostProfile(
        name=f"{model} on a test {device}", device=DeviceInfo(device, "Test Device 1", None),
        model=get_model(model), dtype="bfloat16", executor=MappingProxyType(dict(executor)),
        host=MappingProxyType(dict(host)), block_size=16,
        kv_cache_bytes=int(kv_gib * 1024 ** 3), created="2026-01-01T00:00:00+00:00",
        versions=MappingProxyType({"slopilot": "0.1.0", "torch": "2.13.0"}),
        executor_code="",
        fit=FitReport(repeats=5, shapes=3, mape=0.02, max_err=0.05, classes=MappingProxyType(
            {"decode": ClassFit(3, 0.02, 0.05, "8 decodes@512")}), cpu_share=0.98,
            load_average=0.4, seconds=12.0, token_budget=512, max_num_seqs=32,
            max_context=1024))
    return dataclasses.replace(profile, **changes)  # type: ignore[arg-type]


def profile_file(tmp_path: Path, name: str = "profile.yaml", **kw: object) -> Path:
    return write_profile(make_profile(**kw), tmp_path / name)  # type: ignore[arg-type]
