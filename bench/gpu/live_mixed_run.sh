#!/bin/bash
# bench/live_mixed.c on the GPU machine: the live-10k-mixed pairs of
# alloc_compare on unimem alone, round by round, with the backend calls
# each round made, on cuda:0 and on a sim device of the same size in
# turns (the sim's backend calls cost microseconds where the driver's cost
# tens). What a round's driver calls add to its pairs is the difference.
#
#   bench/gpu/live_mixed_run.sh [RUNS [ROUNDS [PAIRS]]] [-- CONF_EXTRA...]
#
# Each CONF_EXTRA (for example plan=0) adds one more cuda run per turn with
# that option. Writes $OUT/live_mixed_*.txt and prints a summary.
set -u
OUT=${OUT:-/tmp/live_mixed_out}
mkdir -p "$OUT"
RUNS=${1:-2}
ROUNDS=${2:-30}
PAIRS=${3:-200000}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")

{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)" --target unimem_static; } > "$OUT/build.txt" 2>&1 ||
  { tail -30 "$OUT/build.txt"; exit 1; }
cc -O2 -g -Iinclude -Ibench bench/live_mixed.c build-dev/libunimem.a -lz -lpthread -ldl -lm \
  -o "$OUT/live_mixed" || exit 1

# One run: the per-round lines, then the steady half's median ns and
# backend calls per 1,000 pairs.
run() {
  local name=$1 conf=$2 f="$OUT/live_mixed_$1.txt"
  taskset -c "${PIN:-3}" "$OUT/live_mixed" "$conf" "$ROUNDS" "$PAIRS" > "$f" 2>&1
  echo "rc=$?" >> "$f"
  local half=$(( ROUNDS / 2 + 1 ))
  local med calls
  med=$(awk -v h="$half" '/^round/ && $2 + 0 >= h { print $3 }' "$f" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "none" }')
  calls=$(awk -v h="$half" -v pairs="$PAIRS" '
    /^round/ { c = $9; gsub(/[^0-9]/, "", c); if ($2 + 0 == h - 1) a = c; if ($2 + 0 >= h) { b = c; n++ } }
    END { if (n) printf "%.2f", (b - a) * 1000 / (n * pairs); else print "none" }' "$f")
  printf "%-28s steady rounds %d-%d: median %s ns a pair, %s backend calls per 1k pairs\n" \
    "$name" "$half" "$ROUNDS" "$med" "$calls"
}

for i in $(seq 1 "$RUNS"); do
  run "cuda_$i" "devices=cuda"
  run "sim_$i" "devices=sim:141G"
  for x in "${EXTRA[@]}"; do
    run "cuda_${x//[^a-z0-9_]/_}_$i" "devices=cuda,$x"
  done
done
