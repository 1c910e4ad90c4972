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


GIB = 1 << 30
# Past the counters the room reads, what a real memory.stat holds around them.
STAT_V2 = """anon {anon}
file {file}
kernel 52428800
shmem 0
file_mapped 0
file_dirty 0
active_anon {anon}
inactive_file {inactive}
active_file {active}
unevictable 0
"""


def _cgroup_v2(root: Path, *, limit: int, current: int, inactive: int, active: int) -> Path:
    root.mkdir()
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.current").write_text(f"{current}\n")
    (root / "memory.stat").write_text(STAT_V2.format(
        anon=current - inactive - active, file=inactive + active, inactive=inactive,
        active=active))
    return root


def _meminfo(tmp_path: Path) -> Path:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    return meminfo


def test_the_page_cache_the_cgroup_may_drop_is_room(tmp_path: Path) -> None:
    # A pod limited to 4 GiB that has just read its 1.5 GiB of weights: memory.current
    # counts that page cache, which the kernel drops before it kills anyone (MemAvailable
    # counts it as available too). max - current said 1 GiB, and refused a 2 GiB cache
    # that fits. The inactive file pages are reclaimable; the active ones are left out
    # (recently used twice, the kernel takes them last), as the kubelet's working set
    # leaves them in.
    cgroup = _cgroup_v2(tmp_path / "cg", limit=4 * GIB, current=3 * GIB,
                        inactive=3 * GIB // 2, active=GIB // 2)
    assert host_available_bytes(_meminfo(tmp_path), cgroup) == 4 * GIB - 3 * GIB // 2


def test_reclaimable_cache_never_counts_past_the_limit(tmp_path: Path) -> None:
    cgroup = _cgroup_v2(tmp_path / "cg", limit=GIB, current=GIB + GIB // 4,
                        inactive=GIB // 2, active=0)
    assert host_available_bytes(_meminfo(tmp_path), cgroup) == GIB // 4
    # A memory.stat without the counter (or none at all): max - current, as before.
    (cgroup / "memory.stat").write_text("anon 1\n")
    assert host_available_bytes(_meminfo(tmp_path), cgroup) == 0
    (cgroup / "memory.stat").unlink()
    (cgroup / "memory.current").write_text(f"{GIB // 2}\n")
    assert host_available_bytes(_meminfo(tmp_path), cgroup) == GIB // 2


def test_a_cgroup_v1_limit_is_the_bound_too(tmp_path: Path) -> None:
    # cgroup v1 (an older node): the memory controller's own folder, other file names,
    # and the hierarchy's inactive file pages as total_inactive_file.
    memory = tmp_path / "cg" / "memory"
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{3 * GIB}\n")
    (memory / "memory.stat").write_text(
        f"cache {2 * GIB}\nrss {GIB}\ninactive_file 1\ntotal_inactive_file {GIB}\n"
        f"total_active_file {GIB}\n")
    assert host_available_bytes(_meminfo(tmp_path), tmp_path / "cg") == 2 * GIB
    # No limit: v1 writes the largest page count it has, in bytes.
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert host_available_bytes(_meminfo(tmp_path), tmp_path / "cg") == 8_000_000 * 1024
