#!/usr/bin/env bash
# The GPU machine's whole sequence for the CUDA backend: build, every test
# (the GPU ones included), `unimem info`, replays on cuda:0 with the driver's
# view, the allocator comparison, and (when torch is there) the PyTorch
# end-to-end run. Every result goes under $OUT.
# Usage: bench/gpu/gpu_run.sh [quick] [STEP...]   STEP: build test asan info vmm replay compare copy managed oversub gemm tiles torch e2e e2e_variants
set -u
FINAL=${OUT:-out}
# Results gather in one folder and leave as one archive (the transfer back
# takes few files).
OUT=$FINAL/r
mkdir -p "$OUT"
trap 'tar czf "$FINAL/results.tgz" -C "$FINAL" r && rm -rf "$OUT"' EXIT
QUICK=
if [ "${1:-}" = quick ]; then QUICK=--quick; shift; fi
STEPS=${*:-build test asan info vmm replay compare torch e2e e2e_variants}
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
{
  date -u; uname -a; nproc; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null
} > "$OUT/machine.txt" 2>&1
if has build; then
  { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build build-dev -j "$(nproc)"; } > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
  echo "build ok"
fi
if has test; then
  build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1; echo "test_cuda rc=$?"; tail -25 "$OUT/test_cuda.txt"
  (cd build-dev && ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1; echo "ctest rc=$?"; tail -8 "$OUT/ctest.txt"
fi
# The GPU test under AddressSanitizer and UndefinedBehaviorSanitizer.
# protect_shadow_gap=0 lets the CUDA driver map what it needs; leak checks
# stay off here because the driver keeps allocations to process exit (the
# same pool code is leak-checked on the sim device by `make asan`).
if has asan; then
  { cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DUM_SANITIZE=address &&
    cmake --build build-asan -j "$(nproc)" --target test_cuda; } > "$OUT/build_asan.txt" 2>&1 || tail -20 "$OUT/build_asan.txt"
  ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 build-asan/tests/test_cuda > "$OUT/test_cuda_asan.txt" 2>&1
  echo "test_cuda (ASan+UBSan) rc=$?"; tail -3 "$OUT/test_cuda_asan.txt"
fi
if has info; then
  build-dev/unimem info > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
  build-dev/unimem info --json > "$OUT/info.json" 2>&1
fi
if has vmm; then
  cc -O2 -Isrc -Iinclude bench/gpu/vmm_cost.c build-dev/libunimem.a -lz -lpthread -ldl -o build-dev/vmm_cost &&
    build-dev/vmm_cost > "$OUT/vmm_cost.txt" 2>&1; cat "$OUT/vmm_cost.txt"
fi
if has replay; then
  for t in data/*.trace.gz; do
    n=$(basename "$t" .trace.gz)
    build-dev/unimem replay "$t" --device cuda:0 > "$OUT/replay_cuda_$n.txt" 2>&1
    build-dev/unimem replay "$t" --device cuda:0 --json > "$OUT/replay_cuda_$n.json" 2>&1
    build-dev/unimem replay "$t" --json > "$OUT/replay_sim_$n.json" 2>&1
    tail -8 "$OUT/replay_cuda_$n.txt"
  done
fi
if has compare; then
  # alloc_compare is built with unimem (bench/gpu/CMakeLists.txt) and run
  # by `unimem bench gpu`.
  build-dev/unimem bench gpu $QUICK --verify --json "$OUT/alloc_compare.json" > "$OUT/alloc_compare.txt" 2>&1
  echo "unimem bench gpu rc=$?"; cat "$OUT/alloc_compare.txt"
  # The caching mode (no page moves below the limit), unimem only.
  UNIMEM_CONF=recycle_pages=0 build-dev/unimem bench gpu $QUICK --skip-torch --json "$OUT/alloc_compare_norecycle.json" \
    > "$OUT/alloc_compare_norecycle.txt" 2>&1
  echo "alloc_compare recycle_pages=0 rc=$?"; grep -A3 -E "^(size|mixed|1 |16 )" "$OUT/alloc_compare_norecycle.txt" | grep -E "unimem|mixed" 
fi
# Unified buffers: host<->GPU copies against cuMemcpyAsync, and how the
# staged (pageable) path scales with its copy threads.
if has copy; then
  build-dev/unimem bench copy > "$OUT/bench_copy.txt" 2>&1; echo "bench copy rc=$?"; cat "$OUT/bench_copy.txt"
  build-dev/unimem bench copy --json > "$OUT/bench_copy.json" 2>&1
  # Every copy recorded as a Chrome trace event; the file must parse.
  UNIMEM_CONF=trace_file=$OUT/copies.json build-dev/unimem bench copy --quick > /dev/null 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); e=[x for x in d['traceEvents'] if x.get('cat')=='copy']; print('trace_file: %d copy events, %.1f GB' % (len(e), sum(x['args']['bytes'] for x in e)/1e9))" "$OUT/copies.json"
  for t in ${COPY_THREADS:-}; do
    UNIMEM_CONF=copy_threads=$t build-dev/unimem bench copy --quick > "$OUT/bench_copy_t$t.txt" 2>&1
    echo "copy_threads=$t:"; grep pageable "$OUT/bench_copy_t$t.txt"
  done
fi
# CUDA managed memory (cudaMallocManaged with prefetch hints, and without)
# against unified buffers on the same workloads, with data that fits on the
# GPU; it needs the build step's build-dev/libunimem.a.
if has managed; then
  /usr/local/cuda/bin/nvcc -O2 -std=c++17 -Iinclude bench/gpu/managed_compare.cu build-dev/libunimem.a \
    -lz -lpthread -ldl -o build-dev/managed_compare > "$OUT/managed_build.txt" 2>&1 || tail -30 "$OUT/managed_build.txt"
  build-dev/managed_compare $QUICK --json "$OUT/managed_compare.json" > "$OUT/managed_compare.txt" 2>&1
  echo "managed_compare rc=$?"; cat "$OUT/managed_compare.txt"
fi
# Out-of-core SGEMM as tasks (issue 6): N = 32768 with the GPU limited to
# 8 GiB (below A, B and C's 12 GiB), tiles 2048-8192, next to cuBLAS in
# core and cuBLASXt from pinned host memory in the same run; then one
# tiled Cholesky.
if has gemm; then
  /usr/local/cuda/bin/nvcc -O2 -std=c++17 bench/gpu/sgemm_compare.cu -lcublas \
    -o build-dev/sgemm_compare > "$OUT/sgemm_build.txt" 2>&1 || tail -30 "$OUT/sgemm_build.txt"
  build-dev/sgemm_compare --json "$OUT/sgemm_compare.json" > "$OUT/sgemm_compare.txt" 2>&1
  echo "sgemm_compare rc=$?"; cat "$OUT/sgemm_compare.txt"
  for t in 2048 4096 8192; do
    build-dev/unimem demo gemm --device cuda:0 --limit 8G --n 32768 --tile $t \
      > "$OUT/demo_gemm_t$t.txt" 2>&1
    echo "demo gemm tile $t rc=$?"; grep -v "tasks:" "$OUT/demo_gemm_t$t.txt" | tail -12
  done
  build-dev/unimem demo cholesky --device cuda:0 --limit 8G --n 32768 --tile 4096 \
    > "$OUT/demo_cholesky.txt" 2>&1
  echo "demo cholesky rc=$?"; grep -v "tasks:" "$OUT/demo_cholesky.txt" | tail -8
fi
# One tile kernel's compute time (cuBLAS GEMM, TRSM, SYRK; cuSOLVER POTRF):
# the simulator's H200 tables.
if has tiles; then
  /usr/local/cuda/bin/nvcc -O2 -std=c++17 bench/gpu/tile_times.cu -lcublas -lcusolver \
    -o build-dev/tile_times > "$OUT/tile_times_build.txt" 2>&1 || tail -30 "$OUT/tile_times_build.txt"
  build-dev/tile_times --json "$OUT/tile_times.json" > "$OUT/tile_times.txt" 2>&1
  echo "tile_times rc=$?"; cat "$OUT/tile_times.txt"
fi
# Data larger than the device: the limit at 8 GiB, buffers of 256 MiB.
if has oversub; then
  build-dev/unimem bench oversub > "$OUT/bench_oversub.txt" 2>&1; echo "bench oversub rc=$?"; cat "$OUT/bench_oversub.txt"
  build-dev/unimem bench oversub --json > "$OUT/bench_oversub.json" 2>&1
  build-dev/tests/test_reclaim > "$OUT/test_reclaim.txt" 2>&1; echo "test_reclaim rc=$?"; tail -2 "$OUT/test_reclaim.txt"
fi
if has torch; then
  (cd build-dev && ctest -R torch --output-on-failure) > "$OUT/test_torch.txt" 2>&1; echo "test_torch rc=$?"; tail -30 "$OUT/test_torch.txt"
fi
if has e2e; then
  UNIMEM_TORCH_TRACE=$OUT/gpt2_e2e_unimem.trace python3 bench/gpu/gpt2_e2e.py \
    --lib build-dev/integrations/torch/libunimem_torch.so --out "$OUT/gpt2_e2e.json" > "$OUT/gpt2_e2e.txt" 2>&1
  echo "gpt2_e2e rc=$?"; tail -12 "$OUT/gpt2_e2e.txt"
  gzip -f "$OUT/gpt2_e2e_unimem.trace"
fi
# Pool variants on the same run (unimem only), chosen by UNIMEM_CONF.
if has e2e_variants; then
  for conf in ${E2E_CONFS:-recycle_pages=0 fence_wait_us=1000}; do
    UNIMEM_CONF=$conf python3 bench/gpu/gpt2_e2e.py --allocator unimem \
      --lib build-dev/integrations/torch/libunimem_torch.so --out "$OUT/gpt2_e2e_$conf.json" > "$OUT/gpt2_e2e_$conf.txt" 2>&1
    echo "gpt2_e2e [$conf] rc=$?"; tail -4 "$OUT/gpt2_e2e_$conf.txt"
  done
fi
