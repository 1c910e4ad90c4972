#!/usr/bin/env bash
# The whole device session as one prepared run, in stages: the CUDA tests (the decode
# graphs' and the executor's, tests.log), gpu_check.sh and gpu_step_jitter.py (both into
# gpu_check.log), then gpu_twin.sh, with the machine watched beside them (GPU clocks and
# power state, host load and CPU steal every half second into $OUT/machine.csv): a
# host-bound engine's iteration times follow both, and a calibration whose rounds
# disagree needs to say which moved.
#
#   OUT=... benchmarks/gpu_session.sh                  # on the device machine (device tool: run)
#   STAGES="tests check jitter" OUT=... benchmarks/gpu_session.sh   # a part of it
#
# STAGES: which of tests, check, jitter, twin to run (default: all four, in that order;
# split across two calls when one call's time limit is shorter than the whole). Each step
# has its own time limit so that what finished comes back when a later one overruns;
# TWIN_* variables pass through to gpu_twin.sh (REPEATS, TOLERANCE, TIME_LIMIT, PIECEWISE).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_session}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export OUT="$out" PYTHONUNBUFFERED=1
watch_machine() {
  echo "t_s,sm_mhz,mem_mhz,pstate,gpu_util,power_w,load1,steal_ticks,user_ticks"
  local t0=$SECONDS
  while :; do
    local gpu cpu
    gpu=$(nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw \
          --format=csv,noheader,nounits 2>/dev/null | tr -d ' ')
    read -r _ user _ _ _ _ _ _ steal _ < /proc/stat
    cpu="$(cut -d' ' -f1 /proc/loadavg),${steal},${user}"
    echo "$((SECONDS - t0)),${gpu:-,,,,},${cpu}"
    sleep 0.5
  done
}
watch_machine > "$out/machine.csv" &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT
stages=" ${STAGES:-tests check jitter twin} "
if [[ "$stages" == *" tests "* ]]; then
  # pytest from the carried wheels (.whl) when the machine has none, kept apart from the
  # other stages' imports.
  site=$(mktemp -d)
  if ! python3 -c "import pytest" 2>/dev/null && compgen -G ".whl/pytest/pytest-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      .whl/pytest/*.whl
  fi
  PYTHONPATH="$PWD:$site" timeout "${TESTS_LIMIT:-120}" python3 -m pytest -q \
    -p no:cacheprovider -o addopts="" tests/engine/test_decode_graphs.py \
    tests/engine/test_piecewise_graphs.py tests/engine/test_torch_runner.py \
    tests/engine/test_sampler.py \
    tests/engine/test_kernels.py > "$out/tests.log" 2>&1
  echo "tests rc=$?"
  tail -3 "$out/tests.log"
fi
if [[ "$stages" == *" check "* ]]; then
  timeout "${CHECK_LIMIT:-150}" bash benchmarks/gpu_check.sh
  echo "gpu_check rc=$?"
fi
if [[ "$stages" == *" jitter "* ]]; then
  # Where an iteration's time goes, decode graphs on and off side by side, and a served
  # decode beside the harness's (a cost paid per new shape, as cuDNN's attention plans
  # were, shows there first).
  (cd benchmarks && PYTHONPATH="$PWD/.." timeout "${JITTER_LIMIT:-90}" python3 \
    gpu_step_jitter.py --iters "${JITTER_ITERS:-40}" 2>&1 | grep -v USDT >> "$out/gpu_check.log")
  echo "gpu_step_jitter rc=$?"
  grep RESULT "$out/gpu_check.log"
fi
if [[ "$stages" == *" twin "* ]]; then
  timeout "${TWIN_LIMIT:-360}" bash benchmarks/gpu_twin.sh > /dev/null 2>&1
  echo "gpu_twin rc=$?"
  grep -E "^(RESULT|slopilot calibrate)|s, [0-9]+ repeats" "$out"/calibrate.log "$out"/fidelity.log
fi
