#!/usr/bin/env bash
# Issue 2's "no slower with 10,000 live blocks than with 10": every
# `unimem bench alloc` scenario at 10 and at 10,000 live blocks, the two
# alternating in each round so that the machine's drift hits both, on one
# pinned core (the GPU machine's speed is bimodal between runs; a pinned
# process does not move between cores mid-run). Prints each round's ns per
# pair (unimem, glibc) and, per scenario, the median of the rounds' ratios
# t(10,000) / t(10).
# Usage: bench/gpu/live_blocks.sh UNIMEM_BINARY [ROUNDS] [CORE]
set -u
UM=$1
ROUNDS=${2:-8}
CORE=${3:-3}
OUT=${OUT:-out}
mkdir -p "$OUT"
log=$OUT/live_blocks.txt
: > "$log"
for round in $(seq 1 "$ROUNDS"); do
  for sc in trace-pattern small large trace-sizes; do
    for live in 10 10000; do
      dev=sim:320G
      # The large sizes' ring of 10,000 holds up to 432 GiB.
      [ $sc = large ] && [ $live = 10000 ] && dev=sim:480G
      line=$(taskset -c "$CORE" timeout 60 "$UM" bench alloc --json --device $dev --scenario $sc \
               --live $live --max-seconds 0.5 --pairs 1000000 2>&1)
      echo "$round $sc $live $(echo "$line" | sed -E \
        's/.*"unimem_ns_per_pair":([0-9.]+),"malloc_ns_per_pair":([0-9.]+).*/\1 \2/')" | tee -a "$log"
    done
  done
done
echo "median over $ROUNDS rounds of t(10,000)/t(10), unimem and glibc; rounds with unimem's ratio <= 1:"
awk '{ k = $2; if ($3 == 10) { u10[k, $1] = $4; m10[k, $1] = $5 } else { ur[k] = ur[k] " " $4 / u10[k, $1]; mr[k] = mr[k] " " $5 / m10[k, $1] } }
     function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     function le1(s,   a, n, i, c) { n = split(s, a, " "); c = 0; for (i = 1; i <= n; i++) c += a[i] <= 1; return c "/" n }
     END { for (k in ur) printf "  %-13s unimem %.3f  glibc %.3f  %s\n", k, med(ur[k]), med(mr[k]), le1(ur[k]) }' "$log"
