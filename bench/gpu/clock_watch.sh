#!/usr/bin/env bash
# Runs `unimem demo cholesky` (n 32768, tile 4096, --gpu-only, limit 8 GiB:
# the case whose real makespan varied 0.30-0.47 s between jobs) several
# times, some after the GPU has idled and some right after the previous
# run, while nvidia-smi logs the SM clock, power and throttle reasons every
# 20 ms (it only reads them). Prints each run's makespan beside the SM
# clock seen during its tasks, to tell whether the variance follows the
# GPU's clock. Usage (after a build in build-dev):
#   bench/gpu/clock_watch.sh [RUNS [IDLE_S]]     (defaults 6 and 8)
set -u
RUNS=${1:-6}
IDLE=${2:-8}
FINAL=${OUT:-out}
mkdir -p "$FINAL"
U=build-dev/unimem
mono() { python3 -c 'import time; print(time.time())'; }
nvidia-smi --query-gpu=clocks.applications.graphics,clocks.max.sm,clocks.default_applications.graphics,persistence_mode,power.limit \
  --format=csv > "$FINAL/gpu_settings.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 20 > "$FINAL/clocks.csv" 2> "$FINAL/clocks.err" &
smi=$!
sleep 2
: > "$FINAL/runs.txt"
for i in $(seq "$RUNS"); do
  if [ $((i % 2)) = 1 ]; then mode=idle; sleep "$IDLE"; else mode=back; fi
  t0=$(mono)
  $U demo cholesky --device cuda:0 --limit 8G --n 32768 --tile 4096 --gpu-only --no-verify --json \
    > "$FINAL/demo_$i.json" 2> "$FINAL/demo_$i.err"
  rc=$?
  t1=$(mono)
  ms=$(grep -o '"makespan_s":[0-9.]*' "$FINAL/demo_$i.json" | head -1 | cut -d: -f2)
  echo "$i $mode $t0 $t1 ${ms:-none} rc=$rc" | tee -a "$FINAL/runs.txt"
done
sleep 1
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
python3 - "$FINAL/runs.txt" "$FINAL/clocks.csv" <<'PY' | tee "$FINAL/summary.txt"
import sys, datetime
runs = [l.split() for l in open(sys.argv[1]) if l.strip()]
rows = []
for l in open(sys.argv[2]):
    f = [x.strip() for x in l.split(',')]
    try:
        t = datetime.datetime.strptime(f[0], '%Y/%m/%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
        rows.append((t, float(f[1]), float(f[3]), int(f[5]), f[6]))
    except (ValueError, IndexError):
        pass
print('run mode  makespan_s  busy_samples  sm_MHz(min/median/max while busy)  power_W(median)  throttle reasons seen')
for r in runs:
    t0, t1 = float(r[2]), float(r[3])
    busy = [x for x in rows if t0 <= x[0] <= t1 and x[3] > 0]
    if not busy:
        print(r[0], r[1], r[4], 0); continue
    sm = sorted(x[1] for x in busy); pw = sorted(x[2] for x in busy)
    reasons = sorted(set(x[4] for x in busy))
    print(r[0], r[1], r[4], len(busy), '%.0f/%.0f/%.0f' % (sm[0], sm[len(sm)//2], sm[-1]), '%.0f' % pw[len(pw)//2], ' '.join(reasons))
PY
