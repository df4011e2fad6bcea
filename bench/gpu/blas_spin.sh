#!/usr/bin/env bash
# Whether OpenBLAS's thread pool weighs on issue 8's recording figure. The
# unimem binary no longer links OpenBLAS (the demo loads it); preloading the
# library (LD_PRELOAD) runs its constructor at start as linking did, so its
# threads spin (sched_yield) for about 2^28 cycles beside the command.
# `unimem bench alloc --scenario record`, --quick rounds then full runs,
# with and without the preload, alternating; spill file in /dev/shm.
# Usage: TOTAL=s bench/gpu/blas_spin.sh [ROUNDS]   (results under $OUT)
set -u
TOTAL=${TOTAL:-200}
source "$(dirname "$0")/job_steps.sh"
BLAS=$(ldconfig -p | awk '/libopenblas\.so\.0 / {print $NF; exit}')
echo "OpenBLAS: ${BLAS:-not found}; ldd of the binary: $(ldd build-dev/unimem | grep -c blas) BLAS lines"
rec() { # $1 = none|preload, $2.. = bench arguments
  local how=$1; shift
  if [ "$how" = preload ]; then export LD_PRELOAD=$BLAS; else unset LD_PRELOAD; fi
  echo "$how $*: $(TMPDIR=/dev/shm timeout "$(left 60)" build-dev/unimem bench alloc \
    --scenario record "$@" | sed -n '2p;3p' | tr '\n' ' ')"
  unset LD_PRELOAD
}
for r in $(seq "${1:-4}"); do
  if [ $((r % 2)) = 1 ]; then rec none --quick; rec preload --quick
  else rec preload --quick; rec none --quick; fi
done
rec none; rec preload
