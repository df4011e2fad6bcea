#!/usr/bin/env bash
# Whether OpenBLAS's thread pool, which the `unimem` binary starts at load
# and whose threads spin (sched_yield) for about 2^28 cycles, weighs on issue
# 8's recording figure: `unimem bench alloc --scenario record --quick` with
# OpenBLAS's default threads and with OPENBLAS_NUM_THREADS=1 (no pool),
# alternating; spill file in /dev/shm. Usage: TOTAL=s bench/gpu/blas_spin.sh [ROUNDS]
set -u
TOTAL=${TOTAL:-200}
source "$(dirname "$0")/job_steps.sh"
for r in $(seq "${1:-4}"); do
  for e in default 1; do
    if [ $e = 1 ]; then export OPENBLAS_NUM_THREADS=1; else unset OPENBLAS_NUM_THREADS; fi
    echo "openblas threads $e: $(TMPDIR=/dev/shm timeout "$(left 30)" build-dev/unimem bench alloc \
      --scenario record --quick | sed -n '2p;3p' | tr '\n' ' ')"
  done
done
unset OPENBLAS_NUM_THREADS
for e in default 1; do
  if [ $e = 1 ]; then export OPENBLAS_NUM_THREADS=1; else unset OPENBLAS_NUM_THREADS; fi
  echo "full run, openblas threads $e: $(TMPDIR=/dev/shm timeout "$(left 60)" build-dev/unimem bench alloc \
    --scenario record | sed -n '2p;3p' | tr '\n' ' ')"
done
