#!/usr/bin/env bash
# One job for the two open issues' GPU figures (thirty-ninth session):
# build; issue 5's `unimem bench oversub` (full run, JSON) and its random
# workload at 16 and 64 slots (cost policy); issue 8's recording cost
# (`unimem bench alloc --scenario record --quick`, three rounds, spill file
# in /dev/shm); then the whole ctest suite with the GPU present, in what
# time is left. Each step has its own limit out of TOTAL seconds.
# Usage: TOTAL=560 bench/gpu/open_issues_run.sh (results under $OUT)
set -u
TOTAL=${TOTAL:-560} # seconds the whole job may take
source "$(dirname "$0")/job_steps.sh"
timeout "$(left 220)" build-dev/unimem bench oversub --json > "$OUT/oversub.json" 2>&1
mark "bench oversub rc=$?"; cat "$OUT/oversub.json"
for s in 16 64; do
  timeout "$(left 60)" build-dev/unimem bench oversub --workload random --policy cost --slots $s \
    --json > "$OUT/oversub_slots$s.json" 2>&1
  mark "bench oversub --slots $s rc=$?"; cat "$OUT/oversub_slots$s.json"
done
record_rounds
ctest_all 300
