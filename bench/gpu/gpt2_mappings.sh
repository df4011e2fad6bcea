#!/usr/bin/env bash
# GPT-2 small training (bench/gpu/gpt2_e2e.py, one run per process) on three
# kinds of memory in alternating order: PyTorch's caching allocator
# (cudaMalloc segments), unimem with its 2 MiB VMM pages (the default) and
# unimem with cuMemAlloc segments (cuda_vmm=0). It tells whether the memory
# unimem maps moves the step time, apart from the allocator's own cost.
# Usage: bench/gpu/gpt2_mappings.sh [CYCLES]  (default 3: ABC CBA ABC)
# Needs build-dev/integrations/torch/libunimem_torch.so. The summary goes
# to stdout and $OUT/summary.txt; each run's JSON and log, packed, to
# $OUT/runs.tgz (the device tool brings back only a few files).
set -u
CYCLES=${1:-3}
FINAL=${OUT:-out}
OUT=$FINAL/runs
mkdir -p "$OUT"
trap 'tar czf "$FINAL/runs.tgz" -C "$FINAL" runs && rm -rf "$OUT"' EXIT
LIB=build-dev/integrations/torch/libunimem_torch.so
run() { # NAME N
  local name=$1 n=$2 f="$OUT/gpt2_$1_$2"
  case $name in
    torch) timeout 110 python3 bench/gpu/gpt2_e2e.py --allocator torch --out "$f.json" > "$f.txt" 2>&1 ;;
    pages) timeout 110 python3 bench/gpu/gpt2_e2e.py --allocator unimem --lib $LIB --out "$f.json" > "$f.txt" 2>&1 ;;
    segments) UNIMEM_CONF=cuda_vmm=0 timeout 110 python3 bench/gpu/gpt2_e2e.py --allocator unimem --lib $LIB \
      --out "$f.json" > "$f.txt" 2>&1 ;;
  esac
  echo "$name $n rc=$?"
}
for c in $(seq "$CYCLES"); do
  if [ $((c % 2)) = 1 ]; then order="torch pages segments"; else order="segments pages torch"; fi
  for name in $order; do run "$name" "$c"; done
done
python3 - "$OUT" <<'PY' | tee "$FINAL/summary.txt"
import glob, json, statistics, sys
out = sys.argv[1]
losses = set()
for name in ("torch", "pages", "segments"):
    meds, fast, ratio = [], [], []
    for f in sorted(glob.glob(f"{out}/gpt2_{name}_*.json")):
        try:
            r = json.load(open(f))
        except (OSError, ValueError):
            print(f"{f}: no result")
            continue
        st = r["step_times_s"][4:]
        meds.append(statistics.median(st) * 1e3)
        fast.append(min(st) * 1e3)
        ratio.append(r["peak_reserved_bytes"] / r["peak_live_bytes"])
        losses.add(tuple(r["losses"]))
    if meds:
        print(f"{name}: run medians {' '.join('%.1f' % m for m in meds)} ms (median "
              f"{statistics.median(meds):.1f}); fastest steps {' '.join('%.1f' % m for m in fast)} ms; "
              f"reserved/live {' '.join('%.4f' % x for x in ratio)}")
if not losses:
    print("no run finished")
else:
    print("losses identical in every run" if len(losses) == 1 else f"losses differ: {len(losses)} sequences")
PY
