#!/usr/bin/env bash
# A short GPU check of this tree, for a session with little device time
# left: build, test_cuda (event_time against the host's clock, a copy's
# busy time after a kernel), one `unimem bench copy --quick`, then the
# whole ctest suite in what time is left.
# Usage: TOTAL=seconds bench/gpu/check_run.sh   (results under $OUT)
set -u
TOTAL=${TOTAL:-330}
source "$(dirname "$0")/job_steps.sh"
timeout "$(left 90)" build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1
mark "test_cuda rc=$?"; grep -E "event_time|busy|passed|failed" "$OUT/test_cuda.txt" | tail -8
timeout "$(left 60)" build-dev/unimem bench copy --quick > "$OUT/copy.txt" 2>&1
mark "copy rc=$?"; grep -E "^(h2d|d2h)|acquire" "$OUT/copy.txt"
ctest_all 300
