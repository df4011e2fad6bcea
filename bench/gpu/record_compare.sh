#!/usr/bin/env bash
# What recording costs per event (`trace_file`), this tree against
# OLD_TREE, on the GPU machine: for each round, each tree in turn (the
# order alternating) runs `unimem bench alloc --quick` for the small and
# the threads scenarios without and with recording into tmpfs, and the
# cost of an event is (pair with recording - pair without) / 2, a pair
# being an allocation event and a free event.
# Usage: bench/gpu/record_compare.sh OLD_TREE [ROUNDS]   (results under $OUT)
set -u
OLD=${1:?usage: record_compare.sh OLD_TREE [ROUNDS]}
ROUNDS=${2:-3}
FINAL=${OUT:-out}
mkdir -p "$FINAL"
. "$(dirname "$0")/trees.sh"
build_cli_trees "$FINAL" . "$OLD" || exit 1
TRACE=/dev/shm/record_compare.json
# ns a pair of one row: scenario, live (small) or threads (threads), file.
pair_ns() { awk -v sc="$1" -v key="$2" '$1 == sc && ((sc == "small" && $2 == key) || (sc == "threads" && $3 == key)) { print $5; exit }' "$3"; }
printf "%-5s %-4s %-8s %6s %10s %10s %10s\n" round tree scenario L_or_T off_ns on_ns per_event | tee "$FINAL/record_compare.txt"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in $order; do
    if [ "$w" = old ]; then u=$OLD/build-dev/unimem; else u=build-dev/unimem; fi
    for sc in small threads; do
      off=$FINAL/${w}_${sc}_off_$r.txt on=$FINAL/${w}_${sc}_on_$r.txt
      timeout 100 "$u" bench alloc --quick --scenario "$sc" > "$off" 2>&1
      rm -f "$TRACE"
      UNIMEM_CONF=trace_file=$TRACE timeout 200 "$u" bench alloc --quick --scenario "$sc" > "$on" 2>&1
      rm -f "$TRACE"
      if [ "$sc" = small ]; then keys="10 100 1000 10000"; else keys="1 2 4"; fi
      for k in $keys; do
        a=$(pair_ns "$sc" "$k" "$off") b=$(pair_ns "$sc" "$k" "$on")
        printf "%-5s %-4s %-8s %6s %10s %10s %10s\n" "$r" "$w" "$sc" "$k" "${a:--}" "${b:--}" \
          "$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.1f", (b - a) / 2; else print "-" }')" |
          tee -a "$FINAL/record_compare.txt"
      done
    done
  done
done
