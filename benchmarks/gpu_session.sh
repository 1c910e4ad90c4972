#!/usr/bin/env bash
# The whole device session as one prepared run: gpu_check.sh and gpu_step_jitter.py (both
# into gpu_check.log), then gpu_twin.sh, with the machine watched beside them (GPU clocks and power state, host load and CPU steal every
# half second into $OUT/machine.csv): a host-bound engine's iteration times follow both,
# and a calibration whose rounds disagree needs to say which moved.
#
#   OUT=... benchmarks/gpu_session.sh        # on the device machine (device tool: run)
#
# Each step has its own time limit so that what finished comes back when a later one
# overruns; TWIN_* variables pass through to gpu_twin.sh (REPEATS, TOLERANCE, TIME_LIMIT).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_session}"
mkdir -p "$out"
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
timeout "${CHECK_LIMIT:-150}" bash benchmarks/gpu_check.sh
echo "gpu_check rc=$?"
# Where an iteration's time goes, and a served decode beside the harness's (a cost paid
# per new shape, as cuDNN's attention plans were, shows there first).
PYTHONPATH="$PWD" timeout "${JITTER_LIMIT:-90}" python3 benchmarks/gpu_step_jitter.py \
  --iters 60 2>&1 | grep -v USDT >> "$out/gpu_check.log"
echo "gpu_step_jitter rc=$?"
timeout "${TWIN_LIMIT:-360}" bash benchmarks/gpu_twin.sh > /dev/null 2>&1
echo "gpu_twin rc=$?"
grep -E "^(RESULT|slopilot calibrate)|s, [0-9]+ repeats" "$out"/calibrate.log "$out"/fidelity.log
