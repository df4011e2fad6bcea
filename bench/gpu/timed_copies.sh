#!/usr/bin/env bash
# One job for the timed copies (a copy's busy time between timed events):
# builds this tree and OLD_TREE (an unpacked `git archive` of the commit
# before them), runs test_cuda (whose stream-order check now reads the
# link's busy time after a kernel), then `unimem bench copy --quick` and
# issue 5's stream workload (`unimem bench oversub --workload stream
# --policy cost`) from both trees, alternating, ROUNDS rounds, and the
# whole ctest suite in what time is left; last, bench/gpu/event_cost.c
# (what timed events and the queries that decide on them cost).
# Usage: OLD_TREE=DIR [OVERSUB=0] bench/gpu/timed_copies.sh [ROUNDS]   (results under $OUT; TOTAL seconds)
set -u
ROUNDS=${1:-2}
TOTAL=${TOTAL:-560}
source "$(dirname "$0")/job_steps.sh"
source "$(dirname "$0")/trees.sh"
build_cli_trees "$OUT" "$OLD_TREE" || exit 1
mark "old tree built"
timeout "$(left 120)" build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1
mark "test_cuda rc=$?"; grep -E "busy|passed|failed" "$OUT/test_cuda.txt" | tail -6
for r in $(seq "$ROUNDS"); do
  for which in old new; do
    um=build-dev/unimem; [ "$which" = old ] && um=$OLD_TREE/build-dev/unimem
    timeout "$(left 60)" $um bench copy --quick > "$OUT/copy_${which}_$r.txt" 2>&1
    mark "copy $which $r rc=$?"; grep -E "^(h2d|d2h)|acquire" "$OUT/copy_${which}_$r.txt"
    [ "${OVERSUB:-1}" = 0 ] && continue
    timeout "$(left 90)" $um bench oversub --workload stream --policy cost \
      > "$OUT/oversub_${which}_$r.txt" 2>&1
    mark "oversub $which $r rc=$?"; grep -E "^stream" "$OUT/oversub_${which}_$r.txt"
  done
done
ctest_all 200
cc -O2 -Isrc -Iinclude bench/gpu/event_cost.c build-dev/libunimem.a -lz -lpthread -ldl -lm \
  -o build-dev/event_cost && timeout "$(left 60)" build-dev/event_cost | tee "$OUT/event_cost.txt"
