#!/usr/bin/env bash
# GPT-2 small end to end (bench/gpu/gpt2_e2e.py) with unimem's GPU pages at
# the driver's 2 MiB and at a larger size: what larger pages change in the
# first steps (where the pool creates and moves its pages) and in the
# steady steps. Results under $OUT.
# Usage: bench/gpu/page_size_gpt2.sh [ROUNDS [PAGE_SIZE]]   (default 4 8M)
set -u
OUT=${OUT:-out}
ROUNDS=${1:-4}
PAGE=${2:-8M}
mkdir -p "$OUT"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
LIB=build-dev/integrations/torch/libunimem_torch.so
for conf in cuda_page_size=0 "cuda_page_size=$PAGE"; do
  tag=${conf#cuda_page_size=}
  taskset -c 0-14 python3 bench/gpu/gpt2_e2e.py --lib $LIB --rounds "$ROUNDS" \
    --unimem-conf "$conf" --out "$OUT/gpt2_$tag.json" > "$OUT/gpt2_$tag.txt" 2>&1
  echo "== $conf rc=$?"
  tail -14 "$OUT/gpt2_$tag.txt"
done
