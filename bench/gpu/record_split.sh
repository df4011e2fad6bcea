#!/usr/bin/env bash
# Where a recorded event's time goes on the GPU machine (issue 8): this
# tree's `unimem bench alloc --scenario record` ("real") against two
# copies of it patched here, never committed: "fake", whose recorder reads
# a counter instead of the TSC; "clock", whose recorder reads the TSC but
# stores no record; "nofwrite", whose writer thread takes the full buffers
# (and checks their order) but does not write them to the spill file. The
# four alternate, ROUNDS runs each, pinned to
# one core (CORE, the writer thread sharing it) and to two (CORE and one
# on another core, SECOND, for the writer); bench/clock_cost.c gives what one
# rdtsc, rdtscp and clock_gettime cost. real - fake is the clock read
# inside the recorded path, real - clock the record's store (and the
# writer thread's share, on one core), real - nofwrite what the writer's
# copies into the spill file cost the recording thread.
# Usage: bench/gpu/record_split.sh [ROUNDS]  (results under $OUT; CORE: the core, default 3)
set -u
ROUNDS=${1:-3}
CORE=${CORE:-3}
. "$(dirname "$0")/cpus.sh"
OUT=${OUT:-out}
mkdir -p "$OUT"
EV=src/trace/events.c
variant() { # NAME SED-SCRIPT COUNT: a copy of the tree with EV patched, COUNT lines changed
  local d=/tmp/record_split_$1
  rm -rf "$d" && mkdir -p "$d"
  git ls-files -z | xargs -0 cp --parents -t "$d"
  sed -i -e "$2" "$d/$EV"
  [ "$(diff "$EV" "$d/$EV" | grep -c '^>')" = "$3" ] || { echo "the $1 patch did not apply"; diff "$EV" "$d/$EV"; exit 1; }
}
# The counter is a plain global: the record scenario records from one thread.
variant fake 's/^#define HAVE_TSC 1$/#define HAVE_TSC 1\nstatic uint64_t fake_tsc_n;\nstatic inline uint64_t fake_tsc(void) { return fake_tsc_n += 3; }/; s/return __rdtsc();/return fake_tsc();/; s/instant(e, kind, dev, __rdtsc(), a0, a1);/instant(e, kind, dev, fake_tsc(), a0, a1);/' 4
variant nofwrite 's/^    bool ok = !e->spill_failed \&\& fwrite(c->recs, sizeof c->recs\[0\], c->n, e->spill) == c->n;$/    bool ok = true;/' 1
variant clock 's/^        c->recs\[c->n++\] = instant_rec(kind, dev, t, a0, a1);$/        __asm__ volatile("" : : "r"(t), "r"(a0), "r"(a1));/' 1
. "$(dirname "$0")/trees.sh"
build_cli_trees "$OUT" . /tmp/record_split_fake /tmp/record_split_clock /tmp/record_split_nofwrite || exit 1
cc -O2 bench/clock_cost.c -o /tmp/clock_cost && taskset -c "$CORE" /tmp/clock_cost > "$OUT/clock_cost.txt" 2>&1
cat "$OUT/clock_cost.txt"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="real fake clock nofwrite"; else order="nofwrite clock fake real"; fi
  for cpus in "$CORE" "$CORE,$SECOND"; do
    for w in $order; do
      if [ "$w" = real ]; then u=build-dev/unimem; else u=/tmp/record_split_$w/build-dev/unimem; fi
      f=$OUT/record_${w}_cpus${cpus/,/+}_$r.txt
      TMPDIR=/dev/shm taskset -c "$cpus" timeout 120 "$u" bench alloc --scenario record > "$f" 2>&1
      echo "round $r cpus $cpus $w rc=$?: $(grep -E 'a recorded event|pair, median' "$f" | tr '\n' ' ')"
    done
  done
done
