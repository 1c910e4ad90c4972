#!/usr/bin/env bash
# The twin on CUDA (issue 9), one prepared device check to run after gpu_check.sh:
# calibrate the torch executor on the GPU, then the fidelity benchmark against that
# profile (the same requests through the real engine and the twin, the calibrated twin
# and the one corrected live). A GPU is far steadier than the shared 2-core CPU box, whose
# own noise (iteration_noise_floor ~0.095) sits above the 5 % iteration target.
#
#   benchmarks/gpu_twin.sh                                   # on the device machine
#   DEVICE=cpu MODEL=tiny-random QUICK=1 benchmarks/gpu_twin.sh   # the same steps here
#
# REPEAT: the loads served twice, to measure the engine's own repeatability (default
# near,over; "" for none).
# MODEL: a model name or checkpoint directory; by default a seeded random model of
# exactly SmolLM2-135M's shape (its GGUF is too large to carry to the device machine;
# random weights cost the same per token). Everything lands in $OUT (or ./gpu_twin):
# calibrate.log, profile.yaml, samples.json, fidelity.log, fidelity.json, twin_fidelity.png.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_twin}"
mkdir -p "$out"
device="${DEVICE:-cuda}"
dtype="${DTYPE:-bfloat16}"  # what serving runs on CUDA
quick=()
if [[ -n "${QUICK:-}" ]]; then quick=(--quick); fi
# REPEATS, TOLERANCE: calibrate's --repeats and --tolerance, when set (a first run on a
# new machine may need a looser tolerance to get a profile the fidelity run can judge).
calib=()
if [[ -n "${REPEATS:-}" ]]; then calib+=(--repeats "$REPEATS"); fi
if [[ -n "${TOLERANCE:-}" ]]; then calib+=(--tolerance "$TOLERANCE"); fi
# PIECEWISE=1: calibrate (and so serve, in the fidelity run) with the passes that carry
# prefill chunks replayed piecewise as well (--piecewise-graphs cuda).
if [[ -n "${PIECEWISE:-}" ]]; then calib+=(--piecewise-graphs cuda); fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
model="${MODEL:-}"
if [[ -z "$model" ]]; then
  # Outside $OUT: the weights are not a result, and too large to come back.
  model="${TMPDIR:-/tmp}/smollm2-shaped-random"
  python3 - "$model" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from gpu_check import SMOLLM2_SHAPE  # noqa: E402

from slopilot.engine.executors.tiny_random import build_tiny_random  # noqa: E402

build_tiny_random(Path(sys.argv[1]), seed=0, shape=SMOLLM2_SHAPE)
EOF
fi
if [[ "$device" == cuda* ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/calibrate.log"
fi
python3 -m slopilot.cli calibrate --model "$model" --device "$device" --dtype "$dtype" \
  --kv-cache-gb "${KV_CACHE_GB:-4}" "${quick[@]}" "${calib[@]}" --out "$out/profile.yaml" \
  --samples-out "$out/samples.json" 2>&1 | tee -a "$out/calibrate.log"
python3 benchmarks/twin_fidelity.py --profile "$out/profile.yaml" --model "$model" \
  "${quick[@]}" --time-limit "${TIME_LIMIT:-60}" --json "$out/fidelity.json" \
  --plot "$out/twin_fidelity.png" --repeat-real "${REPEAT-near,over}" \
  2>&1 | tee "$out/fidelity.log"
