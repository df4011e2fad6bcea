#!/usr/bin/env bash
# One build-test-benchmark sequence for the GPU machine: writes every result
# under $OUT (default ./out). Usage: bench/device_run.sh [quick]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
{
  date -u; uname -a; nproc; lscpu | grep -E 'Model name|Socket|Thread|Core'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
} > "$OUT/machine.txt" 2>&1
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$OUT/build.txt" 2>&1 &&
  cmake --build build-dev -j "$(nproc)" >> "$OUT/build.txt" 2>&1 || { tail -50 "$OUT/build.txt"; exit 1; }
(cd build-dev && ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
tail -5 "$OUT/ctest.txt"
for t in data/*.trace.gz; do
  n=$(basename "$t" .trace.gz)
  build-dev/unimem replay "$t" --min-limit --json > "$OUT/replay_$n.json" 2> "$OUT/replay_$n.err"
  build-dev/unimem replay "$t" --min-limit >> "$OUT/replay_tables.txt" 2>&1
done
build-dev/unimem bench alloc --json > "$OUT/bench_alloc.json" 2> "$OUT/bench_alloc.err"
for t in data/*.trace.gz; do
  n=$(basename "$t" .trace.gz)
  echo "{\"$n\": $(cat "$OUT/replay_$n.json")}"
done > "$OUT/replay_all.json"
build-dev/unimem bench alloc > "$OUT/bench_alloc.txt" 2>&1
# The trace-size ring of 10,000 live blocks holds ~300 GiB: a larger
# simulated device (sparse, nothing is touched) lets it run.
build-dev/unimem bench alloc --device sim:320G > "$OUT/bench_alloc_320g.txt" 2>&1
cat "$OUT/replay_tables.txt" "$OUT/bench_alloc.txt" "$OUT/bench_alloc_320g.txt"
