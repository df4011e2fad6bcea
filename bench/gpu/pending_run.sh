#!/usr/bin/env bash
# The GPU checks the two audits of 2026-12-05 left waiting, in one job under
# the device's 10-minute limit: build, the CUDA tests (the wrapped-stream
# check among them), the tests that use streams and torch against the real
# driver and PyTorch, GPT-2 with the torch hooks, and `bench oversub` after
# its timing fix. Every step has its own time limit, so a slow one cannot
# take the rest's results with it.  Usage: bench/gpu/pending_run.sh (results under $OUT)
set -u
TOTAL=${TOTAL:-570} # seconds the whole job may take
source "$(dirname "$0")/job_steps.sh"
grep -E "unimem_torch:" "$OUT/build.txt"
timeout "$(left 120)" build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1; mark "test_cuda rc=$?"; tail -6 "$OUT/test_cuda.txt"
(cd build-dev && timeout "$(left 120)" ctest --output-on-failure -R torch) > "$OUT/ctest_torch.txt" 2>&1
mark "ctest (torch) rc=$?"; grep -E "Test +#|tests passed|Failed|Skipped" "$OUT/ctest_torch.txt" | tail -8
timeout "$(left 240)" taskset -c 0-14 python3 bench/gpu/gpt2_e2e.py --lib build-dev/integrations/torch/libunimem_torch.so \
  --rounds 1 --out "$OUT/gpt2_e2e.json" > "$OUT/gpt2_e2e.txt" 2>&1
mark "gpt2_e2e rc=$?"; tail -16 "$OUT/gpt2_e2e.txt"
(cd build-dev && timeout "$(left 150)" ctest -j 4 --output-on-failure \
  -R "test_stream_use$|test_buffer$|test_context$|test_task$") > "$OUT/ctest_gpu.txt" 2>&1
mark "ctest (stream_use, buffer, context, task) rc=$?"; grep -E "Test +#|tests passed|Failed|Skipped" "$OUT/ctest_gpu.txt" | tail -8
timeout "$(left 600)" build-dev/unimem bench oversub --json > "$OUT/bench_oversub.json" 2> "$OUT/bench_oversub.err"
mark "bench oversub rc=$?"; cat "$OUT/bench_oversub.json"; tail -5 "$OUT/bench_oversub.err"
