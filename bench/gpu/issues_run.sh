#!/usr/bin/env bash
# One job for the open issues' GPU figures after the fourth audit: build;
# issue 3's `unimem bench gpu` (quick, verified) and
# replays on cuda:0 against the sim device; issue 8's recording cost
# (`unimem bench alloc --scenario record`, three rounds); then the whole
# ctest suite with the GPU present (test_torch against real PyTorch among
# it) in what time is left. Each step has its
# own limit out of TOTAL seconds.  Usage: bench/gpu/issues_run.sh (results under $OUT)
# BENCH_GPU_ARGS: the options of `unimem bench gpu` (default --quick; empty: the full run).
set -u
TOTAL=${TOTAL:-560} # seconds the whole job may take
BENCH_GPU_ARGS=${BENCH_GPU_ARGS---quick}
source "$(dirname "$0")/job_steps.sh"
timeout "$(left 240)" build-dev/unimem bench gpu $BENCH_GPU_ARGS --verify --json "$OUT/alloc_compare.json" > "$OUT/alloc_compare.txt" 2>&1
mark "bench gpu rc=$?"; cat "$OUT/alloc_compare.txt" | tail -40
for t in data/*.trace.gz; do
  n=$(basename "$t" .trace.gz)
  timeout "$(left 40)" build-dev/unimem replay "$t" --device cuda:0 --json > "$OUT/replay_cuda_$n.json" 2>&1
  timeout "$(left 40)" build-dev/unimem replay "$t" --json > "$OUT/replay_sim_$n.json" 2>&1
done
mark "replays"
python3 - "$OUT" <<'PY'
import json, glob, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "replay_cuda_*.json"))):
    n = f.split("replay_cuda_")[1][:-5]
    try:
        c = json.loads(open(f).read().strip().splitlines()[-1]); s = json.loads(open(f.replace("cuda_", "sim_")).read().strip().splitlines()[-1])
        print(n, "cuda", c.get("reserved_over_live"), "sim", s.get("reserved_over_live"), "driver_over_reserved", c.get("driver_over_reserved"))
    except Exception as e:
        print(n, "unreadable:", e)
PY
record_rounds
ctest_all 240
