"""The libraries vLLM's CPU backend asks to have preloaded, found on this machine.

vLLM warns at start-up when LD_PRELOAD lacks them ("libtcmalloc is not found in
LD_PRELOAD", "libiomp is not found in LD_PRELOAD") and its CPU guide sets both:
Debian's tcmalloc (package libtcmalloc-minimal4) and the Intel OpenMP runtime
(PyPI's intel-openmp, installed into the vLLM venv by benchmarks/peers/setup_vllm_cpu.sh,
and into slopilot's by its `engine` extra). slopilot's engine is preloaded the same way.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

TCMALLOC = "libtcmalloc_minimal.so.4"
IOMP = "libiomp5.so"
# vLLM's own warning, one per missing library (vllm/v1/worker/cpu_worker.py).
WARNING = re.compile(r"(lib\w+) is not found in LD_PRELOAD")
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
             "/usr/lib64", "/usr/lib")


class PreloadError(RuntimeError):
    """A library to preload is not installed; the message says how to install it."""


def find_tcmalloc() -> Path:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                                 check=False).stdout
    except OSError:
        listing = ""
    for line in listing.splitlines():
        name, _, path = line.partition("=>")
        if name.strip().startswith(TCMALLOC) and Path(path.strip()).is_file():
            return Path(path.strip())
    for folder in _LIB_DIRS:
        if (Path(folder) / TCMALLOC).is_file():
            return Path(folder) / TCMALLOC
    raise PreloadError(f"{TCMALLOC} not found; install it with `apt-get install "
                       "libtcmalloc-minimal4` (benchmarks/peers/setup_vllm_cpu.sh does)")


def find_iomp(venv: Path) -> Path:
    for candidate in sorted((venv / "lib").glob(f"**/{IOMP}")):
        return candidate
    raise PreloadError(f"{IOMP} not found under {venv}/lib; install PyPI's intel-openmp "
                       "into that venv (slopilot's engine extra and "
                       "benchmarks/peers/setup_vllm_cpu.sh do)")


def with_preload(env: Mapping[str, str], libs: list[Path]) -> dict[str, str]:
    """``env`` with ``libs`` in front of any LD_PRELOAD it already had."""
    out = dict(env)
    existing = [p for p in out.get("LD_PRELOAD", "").split(":") if p]
    out["LD_PRELOAD"] = ":".join([str(p) for p in libs] + existing)
    return out


def without_preload(env: Mapping[str, str]) -> dict[str, str]:
    out = dict(env)
    out.pop("LD_PRELOAD", None)
    return out


def missing_preload_warnings(log: str) -> list[str]:
    """The libraries vLLM's start-up log says are missing from LD_PRELOAD."""
    return sorted(set(WARNING.findall(log)))
