#!/usr/bin/env bash
# One job for issue 3's GPT-2 step time: build, then bench/gpu/gpt2_lockstep.py
# (PyTorch's allocator, PyTorch's again as the control, and unimem, taking
# their steps in turns) once for each CPU set named, ROUNDS rounds each.
#   Usage: bench/gpu/gpt2_lockstep_run.sh ROUNDS CPUS...   (e.g. 300 0-14 2-5)
# LIMIT: seconds one run may take (default 300); LOCKSTEP_ARGS: more options. Results under $OUT: lockstep_N.{txt,json} and the processes' logs in lockstep_logs.tar.gz.
set -u
TOTAL=${TOTAL:-570} # seconds the whole job may take
ROUNDS=${1:-300}
shift
source "$(dirname "$0")/job_steps.sh"
lscpu -e=CPU,NODE,SOCKET,CORE > "$OUT/lscpu.txt" 2>&1; head -20 "$OUT/lscpu.txt"
n=0
for cpus in "${@:-0-14}"; do
  n=$((n + 1))
  timeout "$(left "${LIMIT:-300}")" python3 bench/gpu/gpt2_lockstep.py --steps "$ROUNDS" --cpus "$cpus" \
    --lib build-dev/integrations/torch/libunimem_torch.so --log-dir "$OUT/lockstep_$n" \
    --out "$OUT/lockstep_$n.json" ${LOCKSTEP_ARGS:-} > "$OUT/lockstep_$n.txt" 2>&1
  mark "lockstep run $n (cpus $cpus) rc=$?"; tail -9 "$OUT/lockstep_$n.txt"
done
tar -czf "$OUT/lockstep_logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d lockstep_*/) && rm -rf "$OUT"/lockstep_*/
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null
