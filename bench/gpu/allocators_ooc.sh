#!/usr/bin/env bash
# Out-of-core GEMM on the GPU with the default pool and with the baseline
# caching allocator (bufcache), alternating, ROUNDS rounds: whether the
# pool's host waits for fenced memory at the limit, which the runtime
# engine in virtual time shows costing 13-45% of the makespan, happen on
# a real GPU. Then test_cuda. Usage: TOTAL=seconds [CONFIGS="N TILE LIMIT;..."]
# bench/gpu/allocators_ooc.sh [ROUNDS]   (results under $OUT)
set -u
ROUNDS=${1:-2}
TOTAL=${TOTAL:-400}
source "$(dirname "$0")/job_steps.sh"
for r in $(seq "$ROUNDS"); do
  IFS=';' read -ra configs <<< "${CONFIGS:-32768 8192 4G;32768 8192 2G;65536 8192 8G}"
  for c in "${configs[@]}"; do
    set -- $c
    for a in pool bufcache; do
      f="$OUT/gemm_${1}_${3}_${a}_$r.txt"
      UNIMEM_CONF=allocator=$a timeout "$(left 90)" build-dev/unimem demo gemm --device cuda:0 \
        --n "$1" --tile "$2" --limit "$3" --gpu-only --no-verify > "$f" 2>&1
      mark "gemm n $1 tile $2 limit $3 $a round $r rc=$?"; grep -E "makespan|cuda0" "$f" | head -3
    done
  done
done
timeout "$(left 90)" build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1
mark "test_cuda rc=$?"; tail -1 "$OUT/test_cuda.txt"
