#!/usr/bin/env bash
# One job for the open issues' GPU figures after the fourth audit: build;
# the whole ctest suite with the GPU present (test_torch against real
# PyTorch among it); issue 3's `unimem bench gpu` (quick, verified) and
# replays on cuda:0 against the sim device; issue 8's recording cost
# (`unimem bench alloc --scenario record`, three rounds). Each step has its
# own limit out of TOTAL seconds.  Usage: bench/gpu/issues_run.sh (results under $OUT)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
TOTAL=${TOTAL:-560}
mark() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { local l=$(( TOTAL - ($(date +%s) - T0) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 1 ? l : 1 )); }
{ date -u; nproc; lscpu | grep -E "Model name"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
mark "build ok"
(cd build-dev && timeout "$(left 240)" ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
mark "ctest rc=$?"; grep -E "tests passed|Failed|\*\*\*|Skipped|Not Run" "$OUT/ctest.txt" | tail -12
timeout "$(left 150)" build-dev/unimem bench gpu --quick --verify --json "$OUT/alloc_compare.json" > "$OUT/alloc_compare.txt" 2>&1
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
for r in 1 2 3; do
  TMPDIR=/dev/shm timeout "$(left 40)" build-dev/unimem bench alloc --scenario record --quick > "$OUT/record_$r.txt" 2>&1
  mark "record round $r rc=$?"; head -3 "$OUT/record_$r.txt"
done
