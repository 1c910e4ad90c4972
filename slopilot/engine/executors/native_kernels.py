"""Builds and loads the fused float32 CPU kernels (``csrc/cpu_kernels.cpp``).

The library is compiled once per source, torch version and instruction set, with
torch's own extension builder, into ``$SLOPILOT_KERNEL_DIR`` (default
``~/.cache/slopilot/kernels``). The image builds it at image build time, so a pod
needs no compiler; elsewhere the first engine that wants it builds it in a child
process (about a minute on two cores) and every later one loads the file. The build
runs apart from the server's process so a compiler that hangs or fails costs a clear
error, not the server.

Modes, as ``slopilot serve --cpu-kernels`` takes them:

- ``auto``: the native kernels when the executor is CPU float32 and the library loads
  (or builds); torch's ops otherwise, with the reason logged.
- ``native``: the same, but a library that cannot be had is an error.
- ``torch``: torch's ops only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from slopilot.engine.executors.kernel_modes import KERNEL_CHOICES
from slopilot.engine.executors.kernels import Projection, TorchKernels

KERNEL_DIR_ENV = "SLOPILOT_KERNEL_DIR"
SOURCE = Path(__file__).with_name("csrc") / "cpu_kernels.cpp"
# A cold build of one file against torch's headers takes ~40-70 s on two busy cores.
BUILD_TIMEOUT_S = 900.0
# FMA contraction off: the elementwise kernels then round as torch's separate ops do.
# OpenMP on: at::parallel_for is an inline OpenMP loop, serial in a build without it; it
# then shares the OpenMP runtime torch already loaded (GNU's, or Intel's preloaded).
_COMMON_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp")
# ATen's Vectorized<float> picks its AVX2 or AVX-512 body (and Sleef's exp) only under
# these macros; the AVX-512 flags are the ones torch's own AVX512 kernels are built with.
_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"),
    "avx2": ("-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"),
    "generic": (),
}
# Every build there is: the image compiles each, so no pod needs a compiler.
ISAS = tuple(_ISA_FLAGS)
# torch.backends.cpu.get_cpu_capability() -> the build whose Vectorized body is the same.
_ISA_OF_CAPABILITY = {"AVX512": "avx512", "AVX2": "avx2"}

log = logging.getLogger(__name__)


class KernelError(RuntimeError):
    """The native kernels were asked for and cannot be had; the message says why."""


@dataclass(frozen=True, slots=True)
class KernelBuild:
    """One build of the library: where it lives and the flags it is compiled with."""

    isa: str
    name: str
    directory: Path
    flags: tuple[str, ...]

    @property
    def library(self) -> Path:
        return self.directory / f"{self.name}.so"


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """What the executor runs its non-GEMM ops with, and why."""

    kernels: TorchKernels
    native: bool
    reason: str


def cpu_isa(capability: str | None = None, machine: str | None = None) -> str:
    """The build for the instruction set torch's own CPU kernels dispatch to.

    Not the CPU's best: the elementwise kernels round exactly as torch's ops only when
    both run the same Vectorized body (an AVX2 silu differs from torch's AVX-512 one in
    the last bit), and ``ATEN_CPU_CAPABILITY`` may hold torch below what the CPU has.
    ``capability`` defaults to ``torch.backends.cpu.get_cpu_capability()``.
    """
    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return "generic"
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    return _ISA_OF_CAPABILITY.get(capability, "generic")


def kernel_root() -> Path:
    configured = os.environ.get(KERNEL_DIR_ENV, "").strip()
    return Path(configured) if configured else Path.home() / ".cache" / "slopilot" / "kernels"


def kernel_build(isa: str, root: Path | None = None) -> KernelBuild:
    """The build for ``isa``; its name changes with the source, torch and the flags."""
    if isa not in _ISA_FLAGS:
        raise KernelError(f"isa={isa!r}: use one of {', '.join(_ISA_FLAGS)}")
    flags = _COMMON_FLAGS + _ISA_FLAGS[isa]
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(" ".join(flags).encode())
    name = f"slopilot_cpu_kernels_{isa}_{digest.hexdigest()[:16]}"
    return KernelBuild(isa=isa, name=name, directory=(root or kernel_root()) / name,
                       flags=flags)


def compile_library(build: KernelBuild) -> Path:
    """Compile in this process (needs ninja and a C++ compiler on PATH), unless the
    library is already there: its name is its source, torch and flags, and it is only
    ever renamed into place whole, so one found is this build (a corrupt one is
    ``load_library``'s to report)."""
    if build.library.is_file():
        return build.library
    from torch.utils import cpp_extension

    # Built apart and renamed into place: a process that finds the library finds it
    # whole, even while another one is still compiling.
    scratch = build.directory / f"build-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(name=build.name, sources=[str(SOURCE)],
                           extra_cflags=list(build.flags), extra_ldflags=["-fopenmp"],
                           build_directory=str(scratch),
                           is_python_module=False, verbose=False)
        built = scratch / f"{build.name}.so"
        if not built.is_file():
            raise KernelError(f"the build finished without {built}")
        os.replace(built, build.library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return build.library


def build_in_child(build: KernelBuild, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """Compile in a child process; the venv's bin (where pip puts ninja) joins PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [sys.executable, "-m", "slopilot.engine.executors.native_kernels", "build",
           "--isa", build.isa, "--dir", str(build.directory.parent)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise KernelError(f"building the CPU kernels took over {timeout_s:.0f} s; build "
                          f"them ahead with `{' '.join(cmd[1:])}`") from None
    if done.returncode != 0 or not build.library.is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise KernelError(
            f"building the CPU kernels failed (exit {done.returncode}); they need a C++ "
            f"compiler and ninja (`pip install ninja`), or run with --cpu-kernels torch:\n"
            f"{tail}")
    return build.library


_loaded: Path | None = None


def load_library(build: KernelBuild) -> None:
    """Register torch.ops.slopilot from ``build``, building it first if it is missing.

    A process can hold one build only: two libraries would both define the namespace.
    """
    global _loaded
    if _loaded is not None:
        if _loaded != build.library:
            raise KernelError(f"{_loaded} is already loaded; one process runs one build")
        return
    if not build.library.is_file():
        log.info("building the CPU kernels into %s (once)", build.directory)
        build_in_child(build)
    try:
        torch.ops.load_library(str(build.library))
    except OSError as exc:
        raise KernelError(f"cannot load {build.library}: {exc}; delete it to rebuild") \
            from None
    _loaded = build.library


class NativeKernels(TorchKernels):
    """The layer's non-GEMM ops from the native library; prefill attention stays torch's.

    On the ``avx512`` and ``avx2`` builds the GEMMs of small batches (decode's) run the
    library's small-batch kernel too; larger ones stay oneDNN's
    (``kernels.SMALL_BATCH_ROWS``).
    """

    native = True

    def __init__(self, isa: str) -> None:
        self.isa = isa

    @property
    def small_batch_gemm(self) -> bool:
        return self.isa in ("avx512", "avx2")

    def prepare(self, projections: Iterable[Projection]) -> None:
        if self.small_batch_gemm:
            for proj in projections:
                proj.use_small_batch_kernel()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dim() != 2:
            return super().rms_norm(x, weight, eps)
        out: torch.Tensor = torch.ops.slopilot.rms_norm(x, weight, eps)
        return out

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.slopilot.silu_and_mul(gate_up)
        return out

    def swiglu(self, gate_up: Projection, x: torch.Tensor) -> torch.Tensor:
        fused = gate_up.small_batch_swiglu(x)
        return fused if fused is not None else super().swiglu(gate_up, x)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor,
               signed_sin: torch.Tensor) -> torch.Tensor:
        torch.ops.slopilot.rotary_(x, cos, signed_sin)
        return x

    def write_kv(self, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor) -> None:
        torch.ops.slopilot.write_kv(k_flat, v_flat, slots, k, v)

    def decode_bias(self, lengths: torch.Tensor, width: int, dtype: torch.dtype, *,
                    static: bool = False) -> torch.Tensor | None:
        return None  # the kernel reads each row's length instead

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] == 0:
            return super().argmax(logits)
        out: torch.Tensor = torch.ops.slopilot.argmax_rows(logits)
        return out

    def decode_attention(self, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
                         slots: torch.Tensor, lengths: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
        out: torch.Tensor = torch.ops.slopilot.decode_attention(
            q, k_flat, v_flat, slots, lengths, q.shape[-1] ** -0.5)
        return out


def choose_kernels(mode: str, device: torch.device, dtype: torch.dtype) -> KernelChoice:
    """The kernels an executor on ``device`` in ``dtype`` runs, by ``mode``."""
    if mode not in KERNEL_CHOICES:
        raise KernelError(f"cpu_kernels={mode!r}: use one of {', '.join(KERNEL_CHOICES)}")
    if mode == "torch":
        return KernelChoice(TorchKernels(), False, "torch ops (--cpu-kernels torch)")
    if device.type != "cpu" or dtype != torch.float32:
        why = f"the native kernels are CPU float32 only, not {device.type} {dtype}"
        if mode == "native":
            raise KernelError(f"{why}; use --cpu-kernels auto or torch")
        return KernelChoice(TorchKernels(), False, f"torch ops: {why}")
    build = kernel_build(cpu_isa())
    try:
        load_library(build)
    except KernelError as exc:
        if mode == "native":
            raise
        log.warning("CPU kernels unavailable, running torch's ops: %s", exc)
        return KernelChoice(TorchKernels(), False, f"torch ops: {exc}")
    kernels = NativeKernels(build.isa)
    gemm = ", small-batch GEMM" if kernels.small_batch_gemm else ""
    return KernelChoice(kernels, True,
                        f"native {build.isa} kernels{gemm} ({build.library})")


def main(argv: list[str] | None = None) -> int:
    """``python -m slopilot.engine.executors.native_kernels build [--isa X] [--dir D]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="native_kernels", description=main.__doc__)
    sub = ap.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("build", help="compile the CPU kernels (the image runs this)")
    b.add_argument("--isa", action="append", choices=ISAS,
                   help="instruction set to build for (repeatable; default: this CPU's)")
    b.add_argument("--dir", type=Path, help=f"where to put them (default ${KERNEL_DIR_ENV} "
                   "or ~/.cache/slopilot/kernels)")
    args = ap.parse_args(argv)
    isas = args.isa or [cpu_isa()]
    builds = [kernel_build(isa, args.dir) for isa in isas]
    if len(builds) == 1:
        print(compile_library(builds[0]))
        return 0
    # Building loads the library, and a process holds one (both would register
    # torch.ops.slopilot): with several to build, each is built in a child of its own,
    # the children at once (each a compiler on one core for a minute or more), printed
    # in the order asked.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(builds), os.cpu_count() or 1)) as pool:
        for library in pool.map(build_in_child, builds):
            print(library)
    return 0


if __name__ == "__main__":
    sys.exit(main())
