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
    past it is killed, whatever the host has (``_cgroup_room``)."""
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
    """What the container's memory limit leaves: the limit less what the cgroup uses
    beyond the page cache it may drop; None without a limit (or without a cgroup).

    The usage counts the page cache of every file the cgroup read (the weights just
    loaded among them), which the kernel reclaims before it kills anything, and which
    ``MemAvailable`` counts as available: limit less usage refused a cache that fitted.
    Only the inactive file pages are taken as reclaimable, as the kubelet's working set
    (what it evicts pods by) takes them: the active ones were used again lately and go
    last, so counting them too would be optimistic. cgroup v2 (``memory.max``,
    ``memory.current``, ``inactive_file``) or v1 (the ``memory`` controller's
    ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, and ``total_inactive_file``,
    the hierarchy's)."""
    for folder, files in ((cgroup, _V2), (cgroup / "memory", _V1)):
        try:
            return _room_under(folder, *files)
        except (OSError, ValueError):  # not this version's files (or unreadable)
            continue
    return None


# The limit, the usage and the reclaimable counter in memory.stat, by cgroup version.
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _room_under(folder: Path, limit_file: str, usage_file: str,
                reclaimable: str) -> int | None:
    """The room under one version's files, None without a limit; OSError or ValueError
    where they are not there. v1 writes no limit as its largest page count, in bytes:
    so large a room that the host's bounds it anyway."""
    limit = (folder / limit_file).read_text().strip()
    if limit == "max":
        return None
    limit_bytes = int(limit)
    usage = int((folder / usage_file).read_text().strip())
    cache = min(_stat(folder / "memory.stat", reclaimable), usage)
    return max(0, limit_bytes - (usage - cache))


def _stat(path: Path, key: str) -> int:
    """One counter of a cgroup's ``memory.stat`` (bytes); 0 where it is not there."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return max(0, int(value))
    except (OSError, ValueError):
        pass
    return 0
