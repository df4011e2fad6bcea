#!/usr/bin/env bash
# What larger GPU pages (`cuda_page_size`) change on the GPU machine: the
# driver calls' cost by handle size (vmm_cost), replays on cuda:0 with 2, 4
# and 8 MiB pages (reserved/live, calls, us an event, the driver's view),
# and test_cuda's page-size check on the real driver. Results under $OUT.
# Usage: bench/gpu/page_size_run.sh [TRACE...]   (default: the three in data/
# and, when python3 is there, a 40,000-step ring from bench/ring_trace.py)
# CONFS: the UNIMEM_CONF settings compared (default: cuda_page_size=0, 4M,
# 8M); e.g. CONFS="large_page=0 large_page=8M".
set -u
CONFS=${CONFS:-cuda_page_size=0 cuda_page_size=4M cuda_page_size=8M}
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
  for conf in $CONFS; do
    tag=${conf//=/_}
    UNIMEM_CONF=$conf build-dev/unimem replay "$t" --device cuda:0 --json \
      > "$OUT/replay_${n}_$tag.json" 2>&1
    python3 - "$OUT/replay_${n}_$tag.json" "$n" "$conf" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]:24s} {sys.argv[3]:20s} reserved/live {d['reserved_over_live']} "
          f"calls {d['backend_calls']} us/event {d['ns_per_event'] / 1e3:.2f} "
          f"driver/reserved {d['driver_over_reserved']}")
except Exception as e:
    print(sys.argv[2], sys.argv[3], "no result:", e)
EOF
  done
done
# Where the ring's time goes: unimem alone (bench/step_calls, no lag) with
# its backend calls recorded as spans, summed by call.
if [ -f "$OUT/ring40k.trace" ]; then
  for ps in ${CONFS%% *} ${CONFS##* }; do
    tag=${ps//=/_}
    t0=$(date +%s.%N)
    build-dev/bench/step_calls "$OUT/ring40k.trace" 0 4000 0 \
      "devices=cuda:0,$ps,trace_file=$OUT/ring_$tag.json" > "$OUT/ring_steps_$tag.txt" 2>&1
    t1=$(date +%s.%N)
    python3 - "$OUT/ring_$tag.json" "$ps" "$t0" "$t1" <<'EOF'
import collections, json, sys
path, ps, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
try:
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
except Exception as e:
    sys.exit(f"ring {ps}: no trace: {e}")
sums, counts = collections.Counter(), collections.Counter()
for ev in events:
    if ev.get("cat") == "backend":
        sums[ev["name"]] += ev.get("dur", 0)
        counts[ev["name"]] += 1
total = sum(sums.values()) / 1e6
print(f"ring {ps}: {t1 - t0:.2f} s in all, {total:.2f} s in backend memory calls")
for name, us in sums.most_common():
    print(f"  {name:18s} {counts[name]:7d} calls {us / 1e6:7.3f} s {us / counts[name]:8.1f} us each")
EOF
    tail -3 "$OUT/ring_steps_$tag.txt"
    rm -f "$OUT/ring_$tag.json"
  done
fi
rm -f "$OUT/ring40k.trace"
