#!/usr/bin/env bash
# Why the pool runs the out-of-core GEMM slower than bufcache on a real GPU
# (allocators_ooc.sh, 2026-12-07: 2.0-2.5 s against 1.4-1.7 s at n 32768):
# each run writes a Chrome trace, summarised by trace_summary.py, and the
# pool also runs with the options that change how it gets pages at the
# limit. Everything is packed into one archive. Usage:
# TOTAL=seconds [ROUNDS=n] [SHOW=regex] [CONFIGS="N TILE LIMIT;..."] [VARIANTS="name:conf;..."]
# bench/gpu/ooc_trace.sh   (results under $OUT)
set -u
ROUNDS=${ROUNDS:-1}
TOTAL=${TOTAL:-400}
source "$(dirname "$0")/job_steps.sh"
mkdir -p "$OUT/runs"
IFS=';' read -ra configs <<< "${CONFIGS:-32768 8192 2G;32768 8192 4G}"
IFS=';' read -ra variants <<< "${VARIANTS:-pool:allocator=pool;bufcache:allocator=bufcache;pool-norecycle:allocator=pool,recycle_pages=0;pool-page256M:allocator=pool,cuda_page_size=256M}"
for r in $(seq "$ROUNDS"); do
for c in "${configs[@]}"; do
  set -- $c
  for v in "${variants[@]}"; do
    name=${v%%:*} conf=${v#*:}
    f="$OUT/runs/gemm_${1}_${3}_${name}_$r"
    UNIMEM_CONF="$conf" UNIMEM_SHOW_STATS=1 timeout "$(left 90)" build-dev/unimem demo gemm --device cuda:0 \
      --n "$1" --tile "$2" --limit "$3" --gpu-only --no-verify --timeline "$f.json" > "$f.txt" 2>&1
    mark "gemm n $1 tile $2 limit $3 $name round $r rc=$?"; grep -E "makespan" "$f.txt"
    python3 bench/gpu/trace_summary.py "$f.json" > "$f.summary" 2>&1
    grep -E "${SHOW:-idle|backend create|evict|alloc waits}" "$f.summary"
  done
done
done
gzip -q "$OUT"/runs/*.json
tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs && rm -rf "$OUT/runs"
