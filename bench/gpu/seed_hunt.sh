#!/usr/bin/env bash
# Runs one test on the stand-in driver's lazy mode with random seeds, on
# every CPU at once, for SECS seconds, to catch a rare failure: each failing
# run's whole output goes to $OUT/fail_SEED.txt. Usage (from the tree, after
# a build in build-dev): SECS=200 bench/gpu/seed_hunt.sh test_cuda_order
# With FAKE_CUDA_LAZY_BACKTRACE=1 set, the stand-in driver prints the call
# stacks at each race; the frames in the test's binary are resolved here,
# in place, with addr2line.
set -u
T=${1:-test_cuda_order}
SECS=${SECS:-200}
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build-dev/tests
end=$(( $(date +%s) + SECS ))
# Appends function and line to each backtrace frame of the test binary.
resolve() {
  while IFS= read -r line; do
    if [[ $line =~ ^(.*/)?$T\(\+(0x[0-9a-f]+)\) ]]; then
      echo "$line  $(addr2line -f -i -p -e "$B/$T" "$(printf '%#x' $((BASH_REMATCH[2] - 1)))")"
    else
      echo "$line"
    fi
  done
}
hunt() {
  local n=0
  while [ "$(date +%s)" -lt "$end" ]; do
    local s=$(( (RANDOM << 30) ^ (RANDOM << 15) ^ RANDOM ^ ($1 << 45) ))
    local o
    o=$(UM_TEST_SEED=$s LD_LIBRARY_PATH=$B/fakecuda UM_TEST_FAKE_CUDA=1 FAKE_CUDA_LAZY_QUERIES=3 \
        FAKE_CUDA_GPUS=4 timeout 120 "$B/$T" 2>&1)
    n=$((n + 1))
    if ! echo "$o" | grep -q " 0 failed$"; then echo "$o" | resolve > "$OUT/fail_$s.txt"; fi
  done
  echo "$n" > "$OUT/runs_$1.txt"
}
for i in $(seq 1 "$(nproc)"); do hunt "$i" & done
wait
echo "$T: $(cat "$OUT"/runs_*.txt | awk '{n += $1} END {print n}') runs, $(ls "$OUT"/fail_*.txt 2>/dev/null | wc -l) failed"
