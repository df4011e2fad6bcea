#!/usr/bin/env bash
# Runs bench/gpu/record_proto.c (what a recorded event costs the recording
# thread under different buffer designs, outside the library) on the GPU
# machine: each mode with the TSC and with a counter for a clock, spill
# files in /dev/shm, rounds alternating. Usage: bench/gpu/record_proto.sh [ROUNDS]
set -u
OUT=${OUT:-/tmp}
cc -O2 -o "$OUT/record_proto" "$(dirname "$0")/record_proto.c" -lpthread || exit 1
export TMPDIR=/dev/shm
P="$OUT/record_proto"
for r in $(seq "${1:-3}"); do
  echo "== round $r"
  for c in tsc fake; do
    $P plain $c 4000000; $P ring $c 4000000
    for pf in 0 8 16 32; do PF=$pf $P writer $c 4000000; done
  done
  CHUNK_KB=64 $P writer tsc 4000000
  CHUNK_KB=64 PF=16 $P writer tsc 4000000
  for pf in 0 16; do PF=$pf taskset -c 3 $P writer tsc 4000000 | sed 's/^/cpu3 /'; done
  for pf in 0 16; do PF=$pf taskset -c 3,0 $P writer tsc 4000000 | sed 's/^/cpu3,0 /'; done
done
