#!/usr/bin/env bash
# One job for issue 3's GPT-2 step time: build, then bench/gpu/gpt2_lockstep.py
# (PyTorch's allocator, PyTorch's again as the control, and unimem, taking
# their steps in turns) RUNS times.  Usage: bench/gpu/gpt2_lockstep_run.sh [RUNS [ROUNDS]]
# (results under $OUT).
set -u
TOTAL=${TOTAL:-570} # seconds the whole job may take
RUNS=${1:-2}
ROUNDS=${2:-300}
source "$(dirname "$0")/job_steps.sh"
for r in $(seq 1 "$RUNS"); do
  taskset -c 0-14 timeout "$(left 300)" python3 bench/gpu/gpt2_lockstep.py --steps "$ROUNDS" \
    --lib build-dev/integrations/torch/libunimem_torch.so --log-dir "$OUT/lockstep_$r" \
    --out "$OUT/lockstep_$r.json" > "$OUT/lockstep_$r.txt" 2>&1
  mark "lockstep run $r rc=$?"; tail -9 "$OUT/lockstep_$r.txt"
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null
