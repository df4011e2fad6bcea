#!/usr/bin/env bash
# Issue 8's recording cost with the shared clock (trace_clock=shared, the
# default) against every event reading the TSC (trace_clock=exact), in one
# job: `unimem bench alloc --scenario record` with each, alternating, ROUNDS
# runs each, on three CPUs of separate cores (the timed thread, the trace's
# writer, the ticker), on two (the writer and the ticker share the second)
# and on one (no ticker: one CPU turns the shared clock off). The log line
# of each run says how many event times came from the ticker. Then ctest
# with the GPU present in what time is left.
# Usage: bench/gpu/record_clock.sh [ROUNDS]  (results under $OUT)
set -u
ROUNDS=${1:-3}
TOTAL=${TOTAL:-560}
source "$(dirname "$0")/job_steps.sh"
CORE=${CORE:-3}
core_of() { lscpu -p=CPU,CORE | awk -F, -v c="$1" '$1 == c { print $2 }'; }
# CPUs on cores other than those of the CPUs given.
other_cpu() {
  local used=" " c
  for c in "$@"; do used="$used$(core_of "$c") "; done
  lscpu -p=CPU,CORE | awk -F, -v u="$used" '!/^#/ && index(u, " " $2 " ") == 0 { print $1; exit }'
}
SECOND=$(other_cpu "$CORE"); THIRD=$(other_cpu "$CORE" "$SECOND")
echo "CPUs: $CORE, $SECOND, $THIRD"
cc -O2 bench/clock_cost.c -o /tmp/clock_cost && taskset -c "$CORE" /tmp/clock_cost | tee "$OUT/clock_cost.txt"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="shared exact"; else order="exact shared"; fi
  for cpus in "$CORE,$SECOND,$THIRD" "$CORE,$SECOND" "$CORE"; do
    for c in $order; do
      f=$OUT/record_${c}_cpus${cpus//,/+}_$r.txt
      UNIMEM_CONF=log_level=info,trace_clock=$c TMPDIR=/dev/shm taskset -c "$cpus" \
        timeout "$(left 60)" build-dev/unimem bench alloc --scenario record > "$f" 2>&1
      echo "round $r cpus $cpus $c rc=$?: $(grep -E 'a recorded event|pair, median|from the ticker' "$f" | sed 's/unimem info: trace_file: //' | tr '\n' ' ')"
    done
  done
done
mark "record runs"
(cd build-dev && timeout "$(left 240)" ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
mark "ctest rc=$?"; grep -E "tests passed|Failed|\*\*\*|Skipped|Not Run" "$OUT/ctest.txt" | tail -12
