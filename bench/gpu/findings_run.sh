#!/usr/bin/env bash
# Issue 9's fixes of the stress test's findings, on the GPU machine, in two
# parts (each under the device's 10-minute limit per command):
#   part 1: build this tree and OLD_TREE (before the fixes); the small-block
#           fast path (`unimem bench alloc`, small and threads scenarios)
#           and `unimem bench oversub --quick` (unless OVERSUB=0), old and
#           new alternating;
#   part 2: the whole ctest suite with the GPU present (the stress test
#           included), then compute-sanitizer memcheck and racecheck on
#           test_cuda (tasks on the GPU release their buffers the new way).
# Usage: bench/gpu/findings_run.sh OLD_TREE 1|2   (results under $OUT)
set -u
OLD=$1
PART=$2
OUT=${OUT:-out}
mkdir -p "$OUT"
{ date -u; nproc; git rev-parse HEAD 2>/dev/null; lscpu | grep -E "Model name"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; } > "$OUT/machine_$PART.txt" 2>&1
build() {
  { cmake -S "$1" -B "$1/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$1/build-dev" -j "$(nproc)"; } > "$OUT/build_$2.txt" 2>&1 ||
    { tail -30 "$OUT/build_$2.txt"; exit 1; }
}
if [ "$PART" = 1 ]; then
  build . new
  build "$OLD" old
  echo "builds ok"
  for round in 1 2 3; do
    for which in old new; do
      u=build-dev/unimem
      [ $which = old ] && u=$OLD/build-dev/unimem
      for sc in small threads; do
        timeout 100 $u bench alloc --scenario $sc > "$OUT/alloc_${which}_${sc}_$round.txt" 2>&1
        grep -E "^$sc " "$OUT/alloc_${which}_${sc}_$round.txt" | sed "s/^/$which r$round /"
      done
    done
  done
  for which in old new; do
    [ "${OVERSUB:-1}" = 1 ] || break
    u=build-dev/unimem
    [ $which = old ] && u=$OLD/build-dev/unimem
    timeout 150 $u bench oversub --quick > "$OUT/oversub_$which.txt" 2>&1
    sed "s/^/$which /" "$OUT/oversub_$which.txt" | grep -E "cost|lru"
  done
fi
if [ "$PART" = 2 ]; then
  [ -x build-dev/tests/test_cuda ] || build . new
  (cd build-dev && timeout 420 ctest -j 8 --output-on-failure > "$OUT/ctest.txt" 2>&1)
  echo "ctest rc=$?"; grep -E "tests passed|Failed|Skipped|\*\*\*" "$OUT/ctest.txt" | head -20
  grep -E "^test_stress: [0-9]+ calls|passed, [0-9]+ failed" "$OUT/ctest.txt" | head -20
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  echo "compute-sanitizer: ${CS:-none}"
  if [ -n "$CS" ]; then
    for tool in memcheck racecheck; do
      timeout 200 "$CS" --tool $tool --error-exitcode 9 build-dev/tests/test_cuda \
        > "$OUT/cs_${tool}_test_cuda.txt" 2>&1
      echo "compute-sanitizer $tool test_cuda rc=$?"; tail -3 "$OUT/cs_${tool}_test_cuda.txt"
    done
  fi
fi
