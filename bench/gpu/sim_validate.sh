#!/usr/bin/env bash
# The virtual-time simulator against real runs, in one job on the GPU
# machine: `unimem demo gemm|cholesky` on the GPU (memory limit 8 GiB) and
# `unimem sim --machine h200x1 --limit 8G` on the same graph, printing the
# simulated makespan beside the real one (both from the first submission to
# the last task's end).
# Usage: [GPU_ONLY=--gpu-only] [TIMELINE=1] bench/gpu/sim_validate.sh   (after a build in build-dev)
set -u
FINAL=${OUT:-out}
mkdir -p "$FINAL"
U=build-dev/unimem
printf "%-9s %6s %5s %10s %10s %8s\n" workload n tile real_s sim_s error | tee "$FINAL/sim_validate.txt"
# GPU_ONLY=--gpu-only keeps the tasks off the host, which the built-in
# machines give no compute.
for run in "gemm 32768 2048" "gemm 32768 4096" "gemm 32768 8192" "cholesky 32768 4096" \
           "cholesky 32768 8192" "cholesky 65536 8192"; do
  set -- $run
  # TIMELINE=1 keeps each real run's timeline (trace_file) beside its JSON.
  tl=()
  [ -n "${TIMELINE:-}" ] && tl=(--timeline "$FINAL/timeline_$1_$2_$3.json")
  real=$($U demo "$1" --device cuda:0 --limit 8G --n "$2" --tile "$3" ${GPU_ONLY:-} "${tl[@]}" --json 2> "$FINAL/demo_$1_$2_$3.err" |
         tee "$FINAL/demo_$1_$2_$3.json" | grep -o '"makespan_s":[0-9.]*' | head -1 | cut -d: -f2)
  sim=$($U sim --machine h200x1 --limit 8G --workload "$1" --n "$2" --tile "$3" --policy cost --json |
        tee "$FINAL/sim_$1_$2_$3.json" | grep -o '"makespan_s":[0-9.]*' | cut -d: -f2)
  err=$(awk -v r="${real:-0}" -v s="${sim:-0}" 'BEGIN { if (r > 0) printf "%+.1f%%", 100 * (s - r) / r; else print "-" }')
  printf "%-9s %6s %5s %10s %10s %8s\n" "$1" "$2" "$3" "${real:--}" "${sim:--}" "$err" | tee -a "$FINAL/sim_validate.txt"
done
