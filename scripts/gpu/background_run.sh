#!/usr/bin/env bash
# Sourced by zoo_whole.sh and suite_whole.sh: a run longer than the device's 10-minute call,
# started in its own process session (setsid), which the device lets outlive the call that
# started it; a later call in the same warm machine waits for it. Nothing else should run on
# the GPU meanwhile (the zoo's timings, the suite's CUDA memory).
#   background_run NAME start|wait WAIT_S COMMAND   # COMMAND is run by bash -c; its output goes
#                                                   # to /tmp/NAME/log, its exit status to done
# Prints "exit N" once it has ended, else "still running after WAIT_S s".
# Sourcing it also sets the environment of wheel_session.sh's steps (ONNX Runtime's GPU
# libraries unpacked into /tmp/ortgpu, the small wheels in /tmp/site) and $out, the folder the
# device tool brings back.
export AITUNE_ORT_LIBRARY=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1 PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out"
background_run() {
  local name=$1 step=$2 wait_s=$3 command=$4
  local run=/tmp/$name
  mkdir -p "$run"
  if [ "$step" = start ]; then
    rm -f "$run/done"
    setsid nohup bash -c "$command > $run/log 2>&1; echo \"exit \$?\" > $run/done" \
      </dev/null >/dev/null 2>&1 &
  fi
  local start=$SECONDS
  while [ ! -f "$run/done" ] && [ $((SECONDS - start)) -lt "$wait_s" ]; do sleep 5; done
  if [ -f "$run/done" ]; then cat "$run/done"; else echo "still running after ${wait_s} s"; fi
}
