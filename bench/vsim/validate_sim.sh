#!/usr/bin/env bash
# Issue 7's validation on simulated devices: `unimem demo W --gpu-only` run
# for real on the host and three sim devices (compute and links modelled by
# sleeping: sim_gflops, sim_link_bandwidth), against `unimem sim` on the
# same machine described in bench/vsim/sim3x1G.machine (its link rate
# replaced by the one run). Prints one line per run: workload, link
# (bytes/s), real and simulated makespans, the error, and bytes moved.
# Usage: [ENGINE=model|runtime] bench/vsim/validate_sim.sh [UNIMEM] [ROUNDS] [LINK...]
#   LINK: sim_link_bandwidth values in bytes per second (default 1G 128M)
#   ENGINE: the simulator's engine (default model; runtime: the task
#   runtime itself in virtual time)
set -eu
UM=${1:-build/unimem}
ENGINE=${ENGINE:-model}
ROUNDS=${2:-2}
shift 2 2>/dev/null || shift $#
LINKS=${*:-1073741824 134217728}
here=$(cd "$(dirname "$0")" && pwd)
desc=$(mktemp)
trap 'rm -f "$desc"' EXIT
printf '%-9s %12s %5s %10s %10s %8s %12s %12s\n' workload link_Bps round real_s sim_s error real_bytes sim_bytes
for link in $LINKS; do
  rate=$(awk -v b="$link" 'BEGIN { printf "%.9fG", b / 1e9 }')
  sed "s/bandwidth=[0-9.]*G/bandwidth=$rate/" "$here/sim3x1G.machine" > "$desc"
  for w in gemm cholesky; do
    sim=$("$UM" sim --machine "$desc" --workload $w --n 3072 --tile 512 --policy cost \
          --limit 12M --engine "$ENGINE" --json)
    for r in $(seq 1 "$ROUNDS"); do
      real=$("$UM" demo $w --gpu-only --sim-bandwidth "$link" --json 2>/dev/null | grep '^{')
      python3 - "$w" "$link" "$r" "$real" "$sim" <<'PY'
import json, sys
w, link, r, real, sim = sys.argv[1:6]
a, b = json.loads(real), json.loads(sim)
assert a["verified"] and a["per_device"][0]["tasks"] == 0, "the host ran tasks or the check failed"
moved = sum(d["bytes_in"] for d in a["per_device"])
err = (b["makespan_s"] - a["makespan_s"]) / a["makespan_s"]
print("%-9s %12s %5s %10.4f %10.4f %+7.1f%% %12d %12d" % (w, link, r, a["makespan_s"],
      b["makespan_s"], 100 * err, moved, b["bytes_moved"]))
PY
    done
  done
done
