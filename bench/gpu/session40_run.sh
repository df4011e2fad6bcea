#!/usr/bin/env bash
# The fortieth session's last GPU job: build; ctest with the GPU; `unimem
# bench gpu` with a bad argument (exit 2 expected); issue 8's recording
# figure, five full runs of `bench alloc --scenario record` (spill file in
# /dev/shm). Usage: TOTAL=s bench/gpu/session40_run.sh   (results under $OUT)
set -u
TOTAL=${TOTAL:-400}
source "$(dirname "$0")/job_steps.sh"
ctest_all 240
build-dev/unimem bench gpu --no-such-flag > "$OUT/bench_gpu_bad.txt" 2>&1
mark "bench gpu --no-such-flag rc=$? (2 expected)"; head -2 "$OUT/bench_gpu_bad.txt"
for r in 1 2 3 4 5; do
  echo "record full run $r: $(TMPDIR=/dev/shm timeout "$(left 30)" build-dev/unimem bench alloc \
    --scenario record | sed -n '2p;3p' | tr '\n' ' ')"
done
