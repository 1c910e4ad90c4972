"""Pin a CPU engine's OpenMP threads one to a CPU, as vLLM's CPU backend does (opt-in).

A decode step is ~120 parallel GEMMs with ~1,400 small serial ops between them. An
unpinned worker thread that the kernel moves to the other CPU between two GEMMs finds
its half of the activations in the other core's cache. Pinned, each thread keeps its
share warm. On the 2-core VM measured (docs/benchmarks.md) that was worth about 5 % of a
lone decode step and nothing measurable end to end, so it is off unless asked for.

Pinning is only safe on CPUs this process owns: a pod with an exclusive cpuset (the
kubelet's static CPU manager), or a machine of its own. Two engines that each pinned
two threads to the first two CPUs of a shared 64-CPU node would stack on them. So the
threads are pinned only when there is one per CPU of the process's affinity mask (the
mask is the cpuset), and never when the environment already says how to place them.

OpenMP reads its placement from the environment once, when the runtime loads: this
must run before torch is imported, and says so when it is too late.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

# Each of these already tells one OpenMP runtime (GNU's or Intel's) where threads go.
PLACEMENT_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
BIND_CHOICES = ("auto", "off")


@dataclass(frozen=True)
class Binding:
    """What to add to the environment (nothing when not pinning) and why, for the log."""

    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    cpus: frozenset[int] = frozenset()

    @property
    def pinned(self) -> bool:
        return bool(self.env)

    def release_calling_thread(self) -> None:
        """Give the calling thread all of the process's CPUs back.

        OpenMP pins the thread that loads it (the main thread) to the first place, and
        every thread it starts later inherits that: the server's event loop and the
        engine's thread would share one CPU. Called once torch has loaded, after which
        only OpenMP's own worker threads stay pinned.
        """
        if self.pinned:
            os.sched_setaffinity(0, self.cpus)


def openmp_binding(environ: Mapping[str, str], allowed_cpus: set[int]) -> Binding:
    """The placement for one OpenMP thread per CPU of ``allowed_cpus``, or why not."""
    intel = "libiomp" in environ.get("LD_PRELOAD", "")
    for var in PLACEMENT_VARS:
        if var in environ:
            trap = ""
            if intel and var in ("OMP_PROC_BIND", "OMP_PLACES"):
                trap = ("; with Intel OpenMP preloaded that pins the main thread before "
                        "Intel's runtime starts, and every thread lands on one CPU: use "
                        "KMP_AFFINITY instead")
            return Binding(reason=f"{var}={environ[var]!r} is set: OpenMP places the "
                           f"threads as it says{trap}")
    cpus = sorted(allowed_cpus)
    if len(cpus) < 2:
        return Binding(reason=f"{len(cpus)} CPU(s) to run on: nothing to pin")
    threads = environ.get("OMP_NUM_THREADS", "").strip()
    if threads and threads != str(len(cpus)):
        return Binding(reason=f"OMP_NUM_THREADS={threads} on {len(cpus)} CPUs: pinned, "
                       "the threads of several such processes would share the first "
                       f"{threads} CPUs; unpinned (one thread per CPU pins)")
    proclist = ",".join(map(str, cpus))
    if intel:
        # Intel's runtime, preloaded over the GNU one torch links: libgomp still loads
        # and acts on OMP_PROC_BIND (pinning the main thread before Intel's runtime
        # starts, which then sees one CPU), so Intel's runtime gets its own variable.
        env = {"KMP_AFFINITY": f"granularity=fine,explicit,proclist=[{proclist}]"}
        runtime = "Intel OpenMP"
    else:
        env = {"OMP_PROC_BIND": "close", "OMP_PLACES": ",".join(f"{{{c}}}" for c in cpus)}
        runtime = "GNU OpenMP"
    # The thread count too, so that it is one per CPU whatever the runtime counts.
    env["OMP_NUM_THREADS"] = str(len(cpus))
    return Binding(env=env, reason=f"one {runtime} thread pinned to each of CPUs "
                   f"{_ranges(cpus)}", cpus=frozenset(cpus))


def apply_openmp_binding(mode: str = "off",
                         environ: MutableMapping[str, str] | None = None,
                         allowed_cpus: set[int] | None = None) -> Binding:
    """Set the placement in ``environ`` (the process's own by default) before torch loads."""
    if mode not in BIND_CHOICES:
        raise ValueError(f"--cpu-bind {mode!r}: use one of {', '.join(BIND_CHOICES)}")
    if mode == "off":
        return Binding(reason="--cpu-bind off: OpenMP threads unpinned")
    env = os.environ if environ is None else environ
    if "torch" in sys.modules:
        return Binding(reason="torch is already loaded and its OpenMP runtime with it: "
                       "threads stay unpinned")
    binding = openmp_binding(env, os.sched_getaffinity(0) if allowed_cpus is None
                             else allowed_cpus)
    env.update(binding.env)
    return binding


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
