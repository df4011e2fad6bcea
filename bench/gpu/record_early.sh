#!/usr/bin/env bash
# Issue 8: whether a recorded allocation's TSC read costs less when it is
# taken before the allocation (its latency hidden under the allocator's
# work, as a recorded free's already is) than after it. This tree's
# `unimem bench alloc --scenario record` ("real") against a copy whose
# src/pool/record.c is patched here, never committed ("early"), the two
# alternating, ROUNDS rounds each, unpinned and on two CPUs of different
# cores (CORE and another).
# Usage: bench/gpu/record_early.sh [ROUNDS]  (results under $OUT)
set -u
ROUNDS=${1:-3}
CORE=${CORE:-3}
. "$(dirname "$0")/cpus.sh"
OUT=${OUT:-out}
mkdir -p "$OUT"
RC=src/pool/record.c
d=/tmp/record_early
rm -rf "$d" && mkdir -p "$d"
git ls-files -z | xargs -0 cp --parents -t "$d"
sed -i -e 's/^    um_status st = r->inner->alloc(a, size, s, ptr);$/    uint64_t t = um__events_clock(r->events);\n&/' \
  -e 's/um__event_instant(r->events, UM_EVENT_ALLOC, a->dev, size,/um__event_instant_at(r->events, UM_EVENT_ALLOC, a->dev, t, size,/' "$d/$RC"
[ "$(diff "$RC" "$d/$RC" | grep -c '^>')" = 2 ] || { echo "the early patch did not apply"; diff "$RC" "$d/$RC"; exit 1; }
. "$(dirname "$0")/trees.sh"
build_cli_trees "$OUT" . "$d" || exit 1
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="real early"; else order="early real"; fi
  for cpus in all "$CORE,$SECOND"; do
    for w in $order; do
      if [ "$w" = real ]; then u=build-dev/unimem; else u=$d/build-dev/unimem; fi
      f=$OUT/early_${w}_cpus${cpus/,/_}_$r.txt
      if [ "$cpus" = all ]; then pin=(); else pin=(taskset -c "$cpus"); fi
      TMPDIR=/dev/shm timeout 120 "${pin[@]}" "$u" bench alloc --scenario record > "$f" 2>&1
      echo "round $r cpus $cpus $w rc=$?: $(grep -E 'a recorded event|pair, median' "$f" | tr '\n' ' ')"
    done
  done
done
