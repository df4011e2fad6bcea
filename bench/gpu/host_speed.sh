#!/usr/bin/env bash
# Runs GPT-2 (bench/gpu/gpt2_e2e.py) or the allocator comparison
# (alloc_compare) with bench/cpu_probe.c sampling the host's speed beside
# them, then lines the two up (bench/gpu/host_speed.py): whether GPT-2's
# two step-time plateaus and alloc_compare's swings follow the host.
# Usage:
#   bench/gpu/host_speed.sh gpt2 [CYCLES [STEPS]]    torch, unimem alternating (ABBA...)
#   bench/gpu/host_speed.sh compare OLD_TREE [ROUNDS] alloc_compare old, new alternating
# gpt2 needs build-dev/integrations/torch/libunimem_torch.so (built here
# when missing); compare builds both trees' alloc_compare as
# hot_path_compare.sh does. The probe runs on the last core and the jobs on
# the others. Summary to stdout and $OUT/summary.txt; everything in
# $OUT/runs.tgz.
set -u
MODE=${1:?usage: host_speed.sh gpt2 [CYCLES [STEPS]] | compare OLD_TREE [ROUNDS]}
shift
FINAL=${OUT:-out}
OUT=$FINAL/runs
mkdir -p "$OUT"
trap 'tar czf "$FINAL/runs.tgz" -C "$FINAL" runs && rm -rf "$OUT"' EXIT
if [ "$(nproc)" -lt 2 ]; then
  echo "host_speed.sh: needs at least 2 cores (the probe takes one of its own)" >&2
  exit 2
fi
PROBE_CORE=$(($(nproc) - 1))
JOB_CORES=0-$((PROBE_CORE - 1))
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
{ date -u; nproc; git rev-parse HEAD 2>/dev/null; lscpu | grep -E "Model name|MHz|L2|L3|Hypervisor"
  nvidia-smi --query-gpu=name,driver_version --format=csv 2>/dev/null; } > "$OUT/machine.txt" 2>&1
mkdir -p build-dev
cc -O2 bench/cpu_probe.c -o build-dev/cpu_probe || exit 1

case $MODE in
gpt2)
  CYCLES=${1:-2}
  STEPS=${2:-60}
  if [ ! -e build-dev/integrations/torch/libunimem_torch.so ]; then
    { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
      cmake --build build-dev -j "$(nproc)" --target unimem_torch; } > "$OUT/build.txt" 2>&1 ||
      { tail -30 "$OUT/build.txt"; exit 1; }
  fi
  build-dev/cpu_probe "$PROBE_CORE" 590 > "$OUT/probe.txt" 2> "$OUT/probe_err.txt" &
  probe=$!
  sleep 3 # the probe's first second runs on a cold buffer
  for c in $(seq "$CYCLES"); do
    if [ $((c % 2)) = 1 ]; then order="torch unimem"; else order="unimem torch"; fi
    for a in $order; do
      f=$OUT/gpt2_${a}_$c
      timeout 150 taskset -c "$JOB_CORES" python3 bench/gpu/gpt2_e2e.py --allocator "$a" --steps "$STEPS" \
        --lib build-dev/integrations/torch/libunimem_torch.so --out "$f.json" > "$f.txt" 2>&1
      echo "gpt2 $a cycle $c rc=$?"
    done
  done
  kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null
  python3 bench/gpu/host_speed.py "$OUT/probe.txt" "$OUT"/gpt2_*.json | tee "$FINAL/summary.txt"
  ;;
compare)
  OLD=${1:?compare needs OLD_TREE}
  ROUNDS=${2:-2}
  for t in . "$OLD"; do
    { cmake -S "$t" -B "$t/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
      cmake --build "$t/build-dev" -j "$(nproc)" --target unimem_static &&
      bench/gpu/build_compare.sh "$t/build-dev" "$t/build-dev/alloc_compare"; } \
      > "$OUT/build_$(basename "$t").txt" 2>&1 || { tail -30 "$OUT/build_$(basename "$t").txt"; exit 1; }
  done
  build-dev/cpu_probe "$PROBE_CORE" 590 > "$OUT/probe.txt" 2> "$OUT/probe_err.txt" &
  probe=$!
  sleep 3
  for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
      tree=.
      [ $which = old ] && tree=$OLD
      f=$OUT/alloc_compare_${which}_$round
      start=$(mono)
      timeout 240 "$tree/build-dev/alloc_compare" --json "$f.json" --pin 3 > "$f.txt" 2>&1
      rc=$?
      echo "alloc_compare_${which}_$round $start $(mono)" >> "$OUT/intervals.txt"
      echo "alloc_compare $which round $round rc=$rc"
      grep -E "live-10k-mixed|pair-by-size" "$f.txt" | grep -E "unimem|torch" | head -14
    done
  done
  kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null
  python3 bench/gpu/host_speed.py "$OUT/probe.txt" --intervals "$OUT/intervals.txt" | tee "$FINAL/summary.txt"
  ;;
*)
  echo "host_speed.sh: unknown mode '$MODE' (gpt2 or compare)" >&2
  exit 2
  ;;
esac
