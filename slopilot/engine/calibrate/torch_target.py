"""Build the torch executor calibration times, and describe it for the profile."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from slopilot.engine.calibrate.design import GridOptions, design
from slopilot.engine.calibrate.harness import BlockPlan
from slopilot.engine.calibrate.runner import Target
from slopilot.engine.device_flag import check_device
from slopilot.engine.sim.profile_file import DeviceInfo
from slopilot.engine.sim.profiles import ModelProfile

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class CalibrationError(ValueError):
    """Calibration cannot start (device, model, sizes); the message names the fix."""


def device_info(device: str, threads: int | None, kernels: str | None = None
                ) -> DeviceInfo:
    """The device as the profile records it, with what its steps ran on
    (``kernel_modes.PROFILE_KERNELS``; a CPU's default: torch's ops)."""
    import torch

    from slopilot.engine.device_cache import device_cache_bytes

    cache = device_cache_bytes(device)
    if device.startswith("cuda"):
        return DeviceInfo("cuda", torch.cuda.get_device_name(torch.device(device)), None,
                          cache, kernels)
    return DeviceInfo("cpu", _cpu_name(), threads or torch.get_num_threads(), cache,
                      kernels or "torch")


def _cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores)"


def torch_target(model: str, grid: GridOptions, *, device: str = "cpu",
                 dtype: str | None = None, threads: int | None = None,
                 kv_cache_gb: float | None = None, cpu_kernels: str = "auto",
                 decode_graphs: str = "auto", piecewise_graphs: str = "off") -> Target:
    """Load ``model`` into a ``TorchExecutor`` sized for ``grid``; check the device first.

    ``cpu_kernels`` as ``slopilot serve --cpu-kernels``: calibrate with what the engine
    will serve with (the default of both is ``auto``); ``decode_graphs`` likewise, as
    ``serve --decode-graphs``."""
    check_device(device)
    import numpy
    import scipy
    import torch

    from slopilot.engine.executors.loader import read_config
    from slopilot.engine.executors.torch_runner import TorchExecutor
    from slopilot.engine.models import resolve_model

    path = resolve_model(model)
    config, _ = read_config(path)
    if grid.max_context > config.max_position_embeddings:
        raise CalibrationError(
            f"--max-context {grid.max_context} exceeds {model}'s context of "
            f"{config.max_position_embeddings} tokens; lower it")
    plan = BlockPlan.for_specs(design(grid), 16)
    executor = TorchExecutor(path, device=device, dtype=dtype, kv_cache_gb=kv_cache_gb,
                             num_cpu_blocks=plan.cpu_blocks, block_size=16,
                             max_model_len=grid.max_context, num_threads=threads,
                             cpu_kernels=cpu_kernels, decode_graphs=decode_graphs,
                             piecewise_graphs=piecewise_graphs)
    dtype_name = str(executor.dtype).removeprefix("torch.")
    profile = ModelProfile(
        name=_model_name(model, path), num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=config.max_position_embeddings,
        dtype_bytes=_DTYPE_BYTES[dtype_name])
    versions = {"torch": torch.__version__, "numpy": numpy.__version__,
                "scipy": scipy.__version__}
    return Target(executor, profile, device_info(device, threads, executor.profile_kernels),
                  dtype_name,
                  executor.num_gpu_blocks * executor.block_bytes, versions)


def _model_name(model: str, path: Path) -> str:
    from slopilot.engine.models import REGISTRY

    return model if model in REGISTRY else path.resolve().name
