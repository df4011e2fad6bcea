#!/usr/bin/env bash
# Out-of-core GEMM on the GPU with the default pool and with the baseline
# caching allocator (bufcache), alternating, ROUNDS rounds: whether the
# pool's host waits for fenced memory at the limit, which the runtime
# engine in virtual time shows costing 13-45% of the makespan, happen on
# a real GPU. With OLD_TREE (a tree without the room fix of 4c6808b),
# its pool runs beside them as "pool-old". Then test_cuda. Usage:
# TOTAL=seconds [CONFIGS="N TILE LIMIT;..."] [OLD_TREE=dir]
# bench/gpu/allocators_ooc.sh [ROUNDS]   (results under $OUT)
set -u
ROUNDS=${1:-2}
TOTAL=${TOTAL:-400}
source "$(dirname "$0")/job_steps.sh"
variants="pool bufcache"
if [ -n "${OLD_TREE:-}" ]; then
  { cmake -S "$OLD_TREE" -B "$OLD_TREE/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$OLD_TREE/build-dev" -j "$(nproc)" --target unimem_cli; } > "$OUT/build_old.txt" 2>&1 ||
    { tail -20 "$OUT/build_old.txt"; exit 1; }
  mark "old tree built"
  variants="pool bufcache pool-old"
fi
for r in $(seq "$ROUNDS"); do
  IFS=';' read -ra configs <<< "${CONFIGS:-32768 8192 4G;32768 8192 2G;65536 8192 8G}"
  for c in "${configs[@]}"; do
    set -- $c
    for a in $variants; do
      f="$OUT/gemm_${1}_${3}_${a}_$r.txt"
      um=build-dev/unimem
      [ "$a" = pool-old ] && um="$OLD_TREE/build-dev/unimem"
      UNIMEM_CONF=allocator=${a%-old} timeout "$(left 90)" $um demo gemm --device cuda:0 \
        --n "$1" --tile "$2" --limit "$3" --gpu-only --no-verify > "$f" 2>&1
      mark "gemm n $1 tile $2 limit $3 $a round $r rc=$?"; grep -E "makespan|cuda0" "$f" | head -3
    done
  done
done
timeout "$(left 90)" build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1
mark "test_cuda rc=$?"; tail -1 "$OUT/test_cuda.txt"
