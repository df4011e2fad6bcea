#!/usr/bin/env bash
# GPT-2 small end to end (bench/gpu/gpt2_e2e.py) with unimem's default GPU
# pages and with a page setting: what larger pages change in the first
# steps (where the pool creates and moves its pages) and in the steady
# steps. Each run has PyTorch's rounds beside it. Results under $OUT.
# Usage: bench/gpu/page_size_gpt2.sh [ROUNDS [CONF]]   (default 4 cuda_page_size=8M;
# e.g. CONF large_page=8M)
set -u
OUT=${OUT:-out}
ROUNDS=${1:-4}
CONF=${2:-cuda_page_size=8M}
mkdir -p "$OUT"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
LIB=build-dev/integrations/torch/libunimem_torch.so
for conf in "" "$CONF"; do
  tag=${conf//=/_}
  tag=${tag:-default}
  taskset -c 0-14 python3 bench/gpu/gpt2_e2e.py --lib $LIB --rounds "$ROUNDS" \
    --unimem-conf "$conf" --out "$OUT/gpt2_$tag.json" > "$OUT/gpt2_$tag.txt" 2>&1
  echo "== ${conf:-default} rc=$?"
  tail -14 "$OUT/gpt2_$tag.txt"
done
