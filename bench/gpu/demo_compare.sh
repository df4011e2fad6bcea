#!/usr/bin/env bash
# Real out-of-core runs of an older tree and of this one, alternating in
# one job (old, new, new, old, ...), so that a change to the task runtime
# is timed against the code before it on the same machine at the same
# time. Usage: bench/gpu/demo_compare.sh OLD_TREE ROUNDS "WORKLOAD N TILE" ...
# OLD_TREE is an unpacked `git archive` of the older commit; this tree is
# built in build-dev. Prints each run's makespan; files under $OUT.
set -u
OLD=$1 ROUNDS=$2
shift 2
OUT=${OUT:-out}
mkdir -p "$OUT"
{ cmake -S "$OLD" -B "$OLD/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build "$OLD/build" -j "$(nproc)" --target unimem_cli; } > "$OUT/old_build.txt" 2>&1 ||
  { tail -20 "$OUT/old_build.txt"; exit 1; }
for run in "$@"; do
  set -- $run
  for r in $(seq 1 "$ROUNDS"); do
    order="old new"
    [ $((r % 2)) = 0 ] && order="new old"
    for which in $order; do
      um=build-dev/unimem
      [ $which = old ] && um=$OLD/build/unimem
      f="$OUT/${which}_$1_$2_$3_r$r.json"
      timeout 120 $um demo "$1" --device cuda:0 --limit 8G --n "$2" --tile "$3" --gpu-only --json \
        > "$f" 2> "${f%.json}.err"
      echo "$1 $2 $3 round $r $which rc=$?: makespan $(grep -o '"makespan_s":[0-9.]*' "$f" | head -1 | cut -d: -f2)" \
           "verified $(grep -o '"verified":[a-z]*' "$f" | head -1 | cut -d: -f2)"
    done
  done
done
