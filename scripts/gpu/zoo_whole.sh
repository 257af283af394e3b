#!/usr/bin/env bash
# The whole zoo in ONE run of benchmarks/zoo.py (issue 28 asks for the six rows from one run),
# which takes longer than the device's 10-minute call: the run is started in its own process
# session (setsid), which the device lets outlive the call that started it, and a later call
# in the same warm machine waits for it. Nothing else should run on the GPU meanwhile.
#   scripts/gpu/zoo_whole.sh start WAIT_S [zoo.py ARGS]   # start, then wait up to WAIT_S
#   scripts/gpu/zoo_whole.sh wait WAIT_S                  # wait up to WAIT_S more
# Both copy the log and the JSON so far to $OUT (zoo-whole.txt, zoo-whole.json).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/aitune-gpu}
run=/tmp/zoo-whole
mkdir -p "$out" "$run"
export AITUNE_ORT_LIBRARY=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1 PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
step=${1:?start or wait}; shift
wait_s=${1:?WAIT_S}; shift
if [ "$step" = start ]; then
  setsid nohup bash -c "python3 benchmarks/zoo.py --iterations 100 --json $run/zoo.json $* \
    > $run/zoo.txt 2>&1; echo \"exit \$?\" > $run/done" </dev/null >/dev/null 2>&1 &
fi
start=$SECONDS
while [ ! -f "$run/done" ] && [ $((SECONDS - start)) -lt "$wait_s" ]; do sleep 5; done
cp "$run/zoo.txt" "$out/zoo-whole.txt" 2>/dev/null
cp "$run/zoo.json" "$out/zoo-whole.json" 2>/dev/null
if [ -f "$run/done" ]; then cat "$run/done"; else echo "still running after ${wait_s} s"; fi
grep -E "^\| " "$run/zoo.txt" | tail -12
