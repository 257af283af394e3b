#!/usr/bin/env bash
# The whole Python suite in ONE pytest run on the GPU host (issue 28: `make test` passes in
# full there), which takes longer than the device's 10-minute call (background_run.sh says
# how). Run after `wheel_session.sh build` (which builds and runs the C++ tests) in the same
# warm machine; it uses the same environment.
#   scripts/gpu/suite_whole.sh start WAIT_S [pytest ARGS]   # start, then wait up to WAIT_S
#   scripts/gpu/suite_whole.sh wait WAIT_S                  # wait up to WAIT_S more
# Both copy the log so far to $OUT (suite-whole.log) and print its last lines; -v, so a run cut
# short still names every test it finished.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
source scripts/gpu/background_run.sh
export CC=/usr/bin/gcc CXX=/usr/bin/g++ AITUNE_DEPS_INCLUDE=$repo/.gpu/deps/include
step=${1:?start or wait}; shift
wait_s=${1:?WAIT_S}; shift
background_run suite-whole "$step" "$wait_s" \
  "python3 -m pytest -q -rs -v -n 16 --dist loadfile --timeout 300 -p no:randomly $* tests/python"
cp /tmp/suite-whole/log "$out/suite-whole.log" 2>/dev/null
grep -E "(passed|failed|error)" /tmp/suite-whole/log | grep -E "^=|^FAILED|^ERROR" | tail -40
tail -3 /tmp/suite-whole/log
