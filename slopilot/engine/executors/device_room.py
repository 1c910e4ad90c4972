"""How much memory a KV cache may take on its device, known before it is allocated.

A cache sized by flag (``serve --num-gpu-blocks``, ``calibrate --kv-cache-gb``) past the
device's memory failed in torch's allocator, after the model had loaded, as a
RuntimeError traceback that named neither the flag nor how much there was. The torch
executor compares the size asked for with this room first (``TorchExecutor``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Room:
    bytes: int
    what: str
    """Which memory, as a refusal names it: "host memory available", "free memory of
    cuda:0"."""


def device_room(device: torch.device) -> Room:
    """The memory a new allocation on ``device`` can take now: on CUDA the device's free
    memory (the weights already loaded); on CPU the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return Room(int(free), f"free memory of {device}")
    return Room(host_available_bytes(), "host memory available")


def host_available_bytes(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int:
    """What the host can give without swapping (``MemAvailable``: free memory and the page
    cache it may drop), and within this container's cgroup limit where one is set: a pod
    past it is killed, whatever the host has."""
    available = _meminfo_available(meminfo)
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = 0
    limit = _cgroup_room(cgroup)
    return available if limit is None else min(available, limit)


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(cgroup: Path) -> int | None:
    """cgroup v2's ``memory.max`` less ``memory.current``; None without a limit."""
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((cgroup / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None
