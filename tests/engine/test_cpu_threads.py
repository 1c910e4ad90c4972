"""OpenMP thread pinning for the CPU engine: when it pins, when it must not, and that the
real runtime pins its worker threads while the server's own threads stay free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slopilot.engine.executors.cpu_threads import (
    PLACEMENT_VARS,
    apply_openmp_binding,
    openmp_binding,
)


def test_one_thread_per_cpu_of_the_mask_pins_to_exactly_those_cpus() -> None:
    b = openmp_binding({}, {4, 5, 6, 9})
    assert b.pinned
    assert b.env == {"OMP_PROC_BIND": "close", "OMP_PLACES": "{4},{5},{6},{9}",
                     "OMP_NUM_THREADS": "4"}
    assert "GNU OpenMP thread pinned to each of CPUs 4-6,9" in b.reason
    assert b.cpus == frozenset({4, 5, 6, 9})


def test_intel_openmp_preloaded_gets_its_own_variable() -> None:
    # OMP_PROC_BIND would make the GNU runtime that torch links pin the main thread to
    # CPU 0 first; Intel's runtime would then see one CPU and stack both threads there.
    b = openmp_binding({"LD_PRELOAD": "/opt/preload/libtcmalloc_minimal.so.4:"
                                      "/opt/preload/libiomp5.so"}, {0, 1})
    assert b.env == {"KMP_AFFINITY": "granularity=fine,explicit,proclist=[0,1]",
                     "OMP_NUM_THREADS": "2"}
    assert "Intel OpenMP" in b.reason


@pytest.mark.parametrize("var", ["OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                                 "KMP_AFFINITY"])
def test_a_placement_the_user_set_is_left_alone(var: str) -> None:
    b = openmp_binding({var: "spread"}, {0, 1})
    assert not b.pinned and var in b.reason


def test_the_gnu_variables_under_intel_openmp_are_named_as_the_trap_they_are() -> None:
    b = openmp_binding({"OMP_PROC_BIND": "close", "LD_PRELOAD": "/x/libiomp5.so"}, {0, 1})
    assert not b.pinned and "use KMP_AFFINITY instead" in b.reason


def test_off_is_the_default() -> None:
    env: dict[str, str] = {}
    assert not apply_openmp_binding(environ=env, allowed_cpus={0, 1}).pinned
    assert env == {}


def test_fewer_threads_than_cpus_would_stack_engines_on_the_first_cpus() -> None:
    # Two such engines on a shared node would both pin to CPUs 0-1 of 64.
    b = openmp_binding({"OMP_NUM_THREADS": "2"}, set(range(64)))
    assert not b.pinned
    assert "OMP_NUM_THREADS=2 on 64 CPUs" in b.reason


def test_as_many_threads_as_cpus_pins() -> None:
    assert openmp_binding({"OMP_NUM_THREADS": "2"}, {0, 1}).pinned


def test_one_cpu_has_nothing_to_pin() -> None:
    assert not openmp_binding({}, {3}).pinned


def test_off_and_a_bad_mode() -> None:
    env: dict[str, str] = {}
    assert not apply_openmp_binding("off", env, {0, 1}).pinned
    assert env == {}
    with pytest.raises(ValueError, match=r"--cpu-bind 'on'.*auto, off"):
        apply_openmp_binding("on", env, {0, 1})


def test_too_late_once_torch_is_loaded() -> None:
    import torch  # noqa: F401  (loaded: its OpenMP runtime has read its settings)

    env: dict[str, str] = {}
    b = apply_openmp_binding("auto", env, {0, 1})
    assert not b.pinned and env == {} and "already loaded" in b.reason


def test_before_torch_it_sets_the_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    env: dict[str, str] = {}
    b = apply_openmp_binding("auto", env, {0, 1})
    assert b.pinned and env["OMP_PLACES"] == "{0},{1}"


_PROBE = """
import json, os, sys
from slopilot.engine.executors.cpu_threads import apply_openmp_binding
binding = apply_openmp_binding("auto", allowed_cpus={0, 1})
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
for _ in range(20):
    a @ a
def masks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list"):
                    out[tid] = line.split()[1]
    return out
before = masks()
binding.release_calling_thread()
after = masks()
print(json.dumps({"pinned": binding.pinned, "main": str(os.getpid()),
                  "before": before, "after": after}))
"""


def _intel_openmp() -> str | None:
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(lib) if lib.exists() else None


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
@pytest.mark.parametrize("runtime", ["gnu", "intel"])
def test_the_real_runtime_pins_its_worker_and_frees_the_main_thread(runtime: str) -> None:
    unset = (*PLACEMENT_VARS, "OMP_NUM_THREADS", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if runtime == "intel":
        lib = _intel_openmp()
        if lib is None:
            pytest.skip("intel-openmp (the engine extra's libiomp5) is not installed")
        env["LD_PRELOAD"] = lib
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["pinned"]
    main = seen["main"]
    # OpenMP pinned the main thread (the team's master) and its worker to the other CPU
    assert seen["before"][main] == "0"
    assert "1" in {m for tid, m in seen["before"].items() if tid != main}
    # ... and the main thread gets both back, so threads it starts later are free.
    assert seen["after"][main] == "0-1"
