# Shared by the one-job GPU scripts (pending_run.sh, issues_run.sh): the
# results folder, a time limit per step out of TOTAL seconds, the machine's
# description and the build. Sourced; TOTAL must be set first.
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
# Prints a line with the seconds since the job began.
mark() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# The limit for a step that wants $1 seconds: what is left of TOTAL, if less.
left() { local l=$(( TOTAL - ($(date +%s) - T0) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 1 ? l : 1 )); }
# Issue 8's recording cost, three rounds of `bench alloc --scenario record
# --quick` (the spill file in /dev/shm), each to $OUT/record_R.txt.
record_rounds() {
  for r in 1 2 3; do
    TMPDIR=/dev/shm timeout "$(left 40)" build-dev/unimem bench alloc --scenario record --quick > "$OUT/record_$r.txt" 2>&1
    mark "record round $r rc=$?"; head -3 "$OUT/record_$r.txt"
  done
}
# The whole ctest suite with the GPU present, to $OUT/ctest.txt, in at most
# $1 seconds of what is left.
ctest_all() {
  (cd build-dev && timeout "$(left "$1")" ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
  mark "ctest rc=$?"; grep -E "tests passed|Failed|\*\*\*|Skipped|Not Run" "$OUT/ctest.txt" | tail -12
}
{ date -u; nproc; lscpu | grep -E "Model name"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
mark "build ok"
