#!/usr/bin/env bash
# What larger GPU pages (`cuda_page_size`) change on the GPU machine: the
# driver calls' cost by handle size (vmm_cost), replays on cuda:0 with 2, 4
# and 8 MiB pages (reserved/live, calls, us an event, the driver's view),
# and test_cuda's page-size check on the real driver. Results under $OUT.
# Usage: bench/gpu/page_size_run.sh [TRACE...]   (default: the three in data/
# and, when python3 is there, a 40,000-step ring from bench/ring_trace.py)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
cc -O2 -Isrc -Iinclude bench/gpu/vmm_cost.c build-dev/libunimem.a -lz -lpthread -ldl -lm \
  -o build-dev/vmm_cost && build-dev/vmm_cost > "$OUT/vmm_cost.txt" 2>&1
cat "$OUT/vmm_cost.txt"
build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1
echo "test_cuda rc=$?"; grep -E "page size|passed" "$OUT/test_cuda.txt"
TRACES=("$@")
if [ ${#TRACES[@]} -eq 0 ]; then
  TRACES=(data/gpt2_train.trace.gz data/resnet50_train.trace.gz data/pipeline_two_streams.trace.gz)
  if python3 bench/ring_trace.py "$OUT/ring40k.trace" 40000 > /dev/null; then
    TRACES+=("$OUT/ring40k.trace")
  fi
fi
for t in "${TRACES[@]}"; do
  n=$(basename "$t" | sed 's/\..*//')
  for ps in 0 4M 8M; do
    UNIMEM_CONF=cuda_page_size=$ps build-dev/unimem replay "$t" --device cuda:0 --json \
      > "$OUT/replay_${n}_$ps.json" 2>&1
    python3 - "$OUT/replay_${n}_$ps.json" "$n" "$ps" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]:24s} page {sys.argv[3]:3s} reserved/live {d['reserved_over_live']} "
          f"calls {d['backend_calls']} us/event {d['ns_per_event'] / 1e3:.2f} "
          f"driver/reserved {d['driver_over_reserved']}")
except Exception as e:
    print(sys.argv[2], sys.argv[3], "no result:", e)
EOF
  done
done
rm -f "$OUT/ring40k.trace"
