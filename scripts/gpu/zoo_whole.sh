#!/usr/bin/env bash
# The whole zoo in ONE run of benchmarks/zoo.py (issue 28 asks for the six rows from one run),
# which takes longer than the device's 10-minute call (background_run.sh says how).
#   scripts/gpu/zoo_whole.sh start WAIT_S [zoo.py ARGS]   # start, then wait up to WAIT_S
#   scripts/gpu/zoo_whole.sh wait WAIT_S                  # wait up to WAIT_S more
# Both copy the log and the JSON so far to $OUT (zoo-whole.txt, zoo-whole.json).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
source scripts/gpu/background_run.sh
mkdir -p /tmp/zoo-whole
step=${1:?start or wait}; shift
wait_s=${1:?WAIT_S}; shift
background_run zoo-whole "$step" "$wait_s" \
  "python3 benchmarks/zoo.py --iterations 100 --json /tmp/zoo-whole/zoo.json $*"
cp /tmp/zoo-whole/log "$out/zoo-whole.txt" 2>/dev/null
cp /tmp/zoo-whole/zoo.json "$out/zoo-whole.json" 2>/dev/null
grep -E "^\| " /tmp/zoo-whole/log | tail -12
