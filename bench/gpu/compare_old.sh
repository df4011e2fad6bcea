#!/usr/bin/env bash
# The same out-of-core runs from an older tree and from this one, on the
# same machine in one job: tells a slower figure's cause (the code, or the
# machine) apart. Usage: bench/gpu/compare_old.sh OLD_TREE [TILES]
# OLD_TREE is an unpacked `git archive` of the older commit; results under
# $OUT (stdout gets the summary lines).
set -u
OLD=$1
TILES=${2:-2048 8192}
OUT=${OUT:-out}
mkdir -p "$OUT"
{ cmake -S "$OLD" -B "$OLD/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build "$OLD/build" -j "$(nproc)" --target unimem_cli; } > "$OUT/old_build.txt" 2>&1 ||
  { tail -20 "$OUT/old_build.txt"; exit 1; }
for t in $TILES; do
  for which in old new; do
    um=build-dev/unimem
    [ $which = old ] && um=$OLD/build/unimem
    timeout 60 $um demo gemm --device cuda:0 --limit 8G --n 32768 --tile "$t" \
      > "$OUT/${which}_gemm_t$t.txt" 2>&1
    echo "$which demo gemm tile $t rc=$?: $(grep -E '^sched cost' "$OUT/${which}_gemm_t$t.txt")"
    grep -E "^  [0-9] " "$OUT/${which}_gemm_t$t.txt" | cut -c1-80
  done
done
for which in old new; do
  um=build-dev/unimem
  [ $which = old ] && um=$OLD/build/unimem
  timeout 90 $um bench oversub --quick > "$OUT/${which}_oversub.txt" 2>&1
  echo "$which bench oversub --quick rc=$?"; grep -E "stream|random" "$OUT/${which}_oversub.txt" | head -6
done
