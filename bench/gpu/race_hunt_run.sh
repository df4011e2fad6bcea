#!/usr/bin/env bash
# The forty-third session's GPU job: build; ctest with the GPU; then the
# stand-in driver's multi-threaded test (test_event_faults_mt) and the
# single-threaded random one (test_cuda_order) with random seeds on every
# CPU (seed_hunt.sh), race stacks on, to count failures after the fix of
# a failed fill's memory; between them, issue 8's recording cost (three
# rounds, record_rounds). Usage: TOTAL=s MT_SECS=s ORDER_SECS=s
# bench/gpu/race_hunt_run.sh   (results under $OUT)
set -u
TOTAL=${TOTAL:-560}
source "$(dirname "$0")/job_steps.sh"
ctest_all 240
record_rounds
export FAKE_CUDA_LAZY_BACKTRACE=1
SECS=$(left "${MT_SECS:-200}") OUT="$OUT/hunt_mt" bench/gpu/seed_hunt.sh test_event_faults_mt
mark "hunt test_event_faults_mt done"
SECS=$(left "${ORDER_SECS:-60}") OUT="$OUT/hunt_order" bench/gpu/seed_hunt.sh test_cuda_order
mark "hunt test_cuda_order done"
