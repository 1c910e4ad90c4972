"""The device's last-level cache, which places the knee of the ``decode_spill`` feature.

The decodes' batched attention gathers every row's keys and values, padded to the
longest row, into one tensor per layer. While that tensor fits the last-level cache
(a CPU's L3, a GPU's L2) the attention reads it back from cache; beyond, from DRAM, and
each further padded token costs more (sim/shape.py). The engine, calibration and the
profile all take the cache size from here, so the feature means the same everywhere.
"""

from __future__ import annotations

from pathlib import Path

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def cpu_cache_bytes(root: Path = _SYSFS_CACHE) -> int | None:
    """The largest-level data or unified cache of cpu0 from sysfs (None if unreadable)."""
    best: tuple[int, int] | None = None
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            size = _size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size and (best is None or level > best[0]):
            best = (level, size)
    return best[1] if best else None


def _size(text: str) -> int | None:
    if not text:
        return None
    unit = _UNITS.get(text[-1].upper())
    return int(text[:-1]) * unit if unit else int(text)


def device_cache_bytes(device: str) -> int | None:
    """The last-level cache of ``device`` (``cpu``, ``cuda``, ``cuda:N``), or None."""
    if device.startswith("cuda"):
        import torch

        size = getattr(torch.cuda.get_device_properties(torch.device(device)),
                       "L2_cache_size", 0)
        return int(size) or None
    return cpu_cache_bytes()


def kv_bytes_per_layer_token(block_bytes: int, block_size: int, num_layers: int) -> int:
    """One layer's K and V bytes per token, from a paged cache's bytes per block."""
    return block_bytes // (block_size * num_layers)


def executor_decode_knee(device: str, block_bytes: int, block_size: int,
                         num_layers: int) -> int | None:
    """The ``decode_spill`` knee of a torch executor's paged cache on ``device``: what a
    serving engine stamps on its iterations (``TorchExecutor.decode_knee_tokens``)."""
    from slopilot.engine.sim.shape import decode_knee_tokens

    return decode_knee_tokens(device_cache_bytes(device),
                              kv_bytes_per_layer_token(block_bytes, block_size, num_layers))
