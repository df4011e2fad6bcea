#!/usr/bin/env bash
# Issue 5's stream workload on the GPU with the pool's pages as they are
# (2 MiB handles) and with large pages (option large_page), alternating,
# ROUNDS rounds: `unimem bench oversub --workload stream --policy cost`,
# whose first pass makes the device's 8 GiB of pages while the copies run.
# Then one run with trace_file, whose backend spans say how long the
# driver's create, map and access calls took (bench/gpu/backend_time.py).
# Usage: bench/gpu/oversub_pages.sh [ROUNDS]  (results under $OUT; TOTAL seconds in all)
set -u
ROUNDS=${1:-2}
TOTAL=${TOTAL:-540}
CONFS=${CONFS:-"default large_page=8M large_page=32M"}
source "$(dirname "$0")/job_steps.sh"
for r in $(seq "$ROUNDS"); do
  for c in $CONFS; do
    conf=$c; [ "$c" = default ] && conf=
    name=os_${r}_${c//[^a-zA-Z0-9]/_}
    UNIMEM_CONF=$conf timeout "$(left 120)" build-dev/unimem bench oversub --workload stream \
      --policy cost > "$OUT/$name.txt" 2>&1
    mark "$name rc=$?"; grep -E "^stream|^1 " "$OUT/$name.txt"
  done
done
UNIMEM_CONF=trace_file=/dev/shm/os_trace.json timeout "$(left 150)" build-dev/unimem bench oversub \
  --workload stream --policy cost > "$OUT/os_traced.txt" 2>&1
mark "traced rc=$?"; grep -E "^stream" "$OUT/os_traced.txt"
python3 "$(dirname "$0")/backend_time.py" /dev/shm/os_trace.json | tee "$OUT/os_backend.txt"
rm -f /dev/shm/os_trace.json
