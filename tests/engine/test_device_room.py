"""The memory a KV cache sized by hand may take on the host: what the kernel says is
available, within the container's cgroup limit (a pod past it is killed)."""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.executors.device_room import host_available_bytes

MEMINFO = "MemTotal:       24683784 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"


def test_available_memory_counts_the_page_cache_the_kernel_may_drop(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    assert host_available_bytes(meminfo, tmp_path / "no-cgroup") == 8_000_000 * 1024


def test_a_cgroup_limit_below_it_is_the_bound(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    (tmp_path / "memory.max").write_text(f"{4 << 30}\n")
    (tmp_path / "memory.current").write_text(f"{1 << 30}\n")
    assert host_available_bytes(meminfo, tmp_path) == 3 << 30
    (tmp_path / "memory.max").write_text("max\n")  # no limit
    assert host_available_bytes(meminfo, tmp_path) == 8_000_000 * 1024
