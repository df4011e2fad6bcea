# Shared by the one-job GPU scripts (pending_run.sh, issues_run.sh): the
# results folder, a time limit per step out of TOTAL seconds, the machine's
# description and the build. Sourced; TOTAL must be set first.
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
# Prints a line with the seconds since the job began.
mark() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# The limit for a step that wants $1 seconds: what is left of TOTAL, if less.
left() { local l=$(( TOTAL - ($(date +%s) - T0) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 1 ? l : 1 )); }
{ date -u; nproc; lscpu | grep -E "Model name"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
mark "build ok"
