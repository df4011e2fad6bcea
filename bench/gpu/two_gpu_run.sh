#!/usr/bin/env bash
# Issue 10 on the two-GPU machine (two H200 joined by NVLink NV18, peer
# access, 32 cores, 256 GiB): build, the topology and `unimem info`, copies
# between the GPUs, the tests on the real GPUs, out-of-core GEMM and
# Cholesky on one GPU and on both (cuBLAS in core and cuBLASXt on one and
# both GPUs as baselines), and data 1.5x-2x the sum of the GPUs' limits.
# Every result goes under $OUT: results.tgz at the end (a run killed before
# that leaves the plain files in $OUT/r); stdout gets a compact summary,
# also kept as summary.txt.
#
# Usage: bench/gpu/two_gpu_run.sh [STEP...]
#   STEP: build info copy tests gemm oversub tiles cholbig (default: all). Named steps run
#   in that order, whatever order they are given in.
#
# Wall time per step, estimated from docs/BENCHMARKS.md's single-H200
# figures and the build and test times of this project's machine (the
# sequence has not run on two GPUs yet):
#   build    ~30 s  cmake and the build on 32 cores (60 CPU-seconds here)
#   info     ~5 s   nvidia-smi topo -m; unimem info, text and JSON
#   copy     ~20 s  bench copy --device cuda, then again with peer_copies=0
#                   (1 MiB to 1 GiB, 6 copies of each kind: ~10 s each)
#   tests    ~100 s test_cuda ~25 s; test_buffer, test_reclaim, test_task on
#                   the GPUs ~30 s (1-8 s each on sim here); ctest -j8 ~45 s
#   gemm     ~170 s nvcc ~15 s; sgemm_compare --gpus 1 ~50 s (12 GiB pinned
#                   and filled ~7 s, in core 4 x 1.3 s + tiled 9 x 1.35 s,
#                   cuBLASXt 3 x (4.2 + 2.1 + 1.4) s); --gpus 2 without the
#                   in-core part ~25 s; 6 demo gemm ~60 s (makespan 0.8-1.4 s
#                   plus ~8 s of 12 GiB of tiles, cuBLAS start and the check
#                   each); 2 demo cholesky ~20 s
#   oversub  ~55 s  --all-devices on both GPUs: 4 runs, 24-32 GiB of inputs
#                   written to pinned host memory each (~6-8 s; up to twice
#                   that if pinning runs below 5 GB/s) and 0.5-1 s of
#                   streaming ~35 s; the same on cuda:0 alone ~20 s
#   tiles    ~25 s  nvcc ~15 s; tile_times (4 ops x 4 tiles x 12 calls)
#   cholbig  ~60 s  demo cholesky n 65536, tile 8192 on GPU 0, then both
#   total    ~460 s (7.7 min; ~500 s with the slower pinning)
# Every command runs under `timeout`; each step has an allowance (about
# twice its estimate) so that a hang in one step leaves the later ones
# their time, and no command runs past BUDGET_S (default 575 s) from the
# start.
#
# SKIP_BASELINES=1 skips sgemm_compare (cuBLAS and cuBLASXt) when an
# earlier run has its figures; OVERSUB_QUICK=1 gives bench oversub --quick.
# GEMM_N, GEMM_TILES, CHOL_TILE and LIMIT (defaults 32768, "2048 4096 8192",
# 4096, 8G: issue 10's sizes) are there for a dry run at small sizes, for
# example with the stand-in driver of tests/gpu (LD_LIBRARY_PATH=
# build-dev/tests/fakecuda FAKE_CUDA_GPUS=2).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ALL_STEPS="build info copy tests gemm oversub tiles cholbig"
STEPS=${*:-$ALL_STEPS}
for s in $STEPS; do
  case " $ALL_STEPS " in
    *" $s "*) ;;
    *) echo "two_gpu_run: unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2 ;;
  esac
done

# Absolute paths: the ctest step runs from inside the build folder.
FINAL=$(mkdir -p "${OUT:-out}" && cd "${OUT:-out}" && pwd) || exit 1
R=$FINAL/r
SUM=$R/summary.txt
mkdir -p "$R"
cd "$(dirname "$0")/../.." || exit 1
# Few files travel back faster than many: one archive at the end.
trap 'tar czf "$FINAL/results.tgz" -C "$FINAL" r && rm -rf "$R"' EXIT
trap 'exit 130' INT TERM

BUDGET_S=${BUDGET_S:-575}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || echo nvcc)
UM=build-dev/unimem
GEMM_N=${GEMM_N:-32768}
GEMM_TILES=${GEMM_TILES:-2048 4096 8192}
CHOL_TILE=${CHOL_TILE:-4096}
LIMIT=${LIMIT:-8G}
START=$(date +%s)
STEP_END=$START

has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
say() { printf '%s\n' "$*" | tee -a "$SUM"; }
show() { tee -a "$SUM"; }
elapsed() { echo $(($(date +%s) - START)); }
# What a status means: timeout(1) gives 124 (137 once it had to kill), and
# t gives 125 for a command it did not start.
rcs() {
  case $1 in
    0) echo ok ;;
    124 | 137) echo "TIMED OUT" ;;
    125) echo "skipped (no time left)" ;;
    *) echo "FAILED rc=$1" ;;
  esac
}
# begin NAME SECONDS: a step may run for SECONDS from now.
begin() {
  STEP_END=$(($(date +%s) + $2))
  say ""
  say "== $1 (at $(elapsed) s; allowed $2 s)"
}
# t LIMIT CMD...: runs CMD under timeout with LIMIT seconds at most, and at
# most what is left of the step's allowance and of the whole budget.
t() {
  local limit=$1 now left
  shift
  now=$(date +%s)
  left=$((STEP_END - now))
  [ $((START + BUDGET_S - now)) -lt "$left" ] && left=$((START + BUDGET_S - now))
  if [ "$left" -lt 3 ]; then
    say "  not started (no time left): $*"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout -k 5 "$limit" "$@"
}
# summarize demo|oversub FILE: one line per JSON record (the whole record
# when python3 is missing).
summarize() {
  if ! command -v python3 > /dev/null 2>&1; then
    cut -c1-400 "$2" | show
    return
  fi
  python3 - "$@" << 'EOF' | show
import json, sys

kind, path = sys.argv[1], sys.argv[2]
for line in open(path, errors="replace"):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        d = json.loads(line)
        if kind == "demo":
            per = d["per_device"]
            tasks = " ".join("%s:%d" % (p["name"], p["tasks"]) for p in per)
            gib_in = sum(p["bytes_in"] for p in per[1:]) / 2**30
            print("  %s %s tile %d: %.3f s, %.2f TFLOP/s, %s %s (max error %s); tasks %s; "
                  "%.1f GiB into the GPUs, %d evictions"
                  % (d["workload"], d["devices"], d["tile"], d["makespan_s"], d["gflops"] / 1e3,
                     d["check"], "verified" if d["verified"] else "WRONG", d["max_error"], tasks,
                     gib_in, sum(p["evictions"] for p in per)))
        else:
            per = " ".join("%s %.3f (h2d %.1f, %.1f at once)"
                           % (p["name"], p["throughput_over_bound"], p["h2d_gbps"],
                              p["h2d_gbps_concurrent"]) for p in d["per_device"])
            print("  %.1fx %-4s %d GPU%s: moved/MIN %.3f, %.3f s, bound %.3f s, tp/bound %.3f "
                  "(links at once: %.3f), %.1f GB/s; per GPU %s"
                  % (d["oversubscription"], d["policy"], d["devices"],
                     "" if d["devices"] == 1 else "s", d["moved_over_min"], d["seconds"],
                     d["bound_s"], d["throughput_over_bound"],
                     d["throughput_over_concurrent_bound"], d["moved_gbps"], per))
    except (ValueError, KeyError, TypeError) as e:
        print("  (%s: %s) %s" % (type(e).__name__, e, line[:300]))
EOF
}

{
  date -u; uname -a; nproc; free -g; git rev-parse HEAD 2> /dev/null; git status --short 2> /dev/null | head -20
  nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,memory.used,driver_version --format=csv 2> /dev/null
} > "$R/machine.txt" 2>&1
say "two_gpu_run: steps: $STEPS; budget $BUDGET_S s; GEMM_N=$GEMM_N GEMM_TILES=\"$GEMM_TILES\" CHOL_TILE=$CHOL_TILE LIMIT=$LIMIT"

step_build() {
  begin build 120
  { t 60 cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    t 120 cmake --build build-dev -j "$(nproc)"; } > "$R/build.txt" 2>&1
  local rc=$?
  say "build: $(rcs $rc) ($(elapsed) s)"
  # Nothing after this can run without the build.
  [ $rc -eq 0 ] || { tail -30 "$R/build.txt" | show; exit 1; }
}

step_info() {
  begin info 45
  t 30 nvidia-smi topo -m > "$R/topo.txt" 2>&1
  say "nvidia-smi topo -m: $(rcs $?)"
  head -4 "$R/topo.txt" | show
  t 60 "$UM" info > "$R/info.txt" 2>&1
  say "unimem info: $(rcs $?)"
  sed -n '/^CUDA driver/,$p' "$R/info.txt" | head -12 | show
  t 60 "$UM" info --json > "$R/info.json" 2> "$R/info_json.err"
  say "unimem info --json: $(rcs $?)"
}

# Device to device: rows d2d against cuMemcpyAsync between the GPUs (peer
# to peer), then the two pipelined hops through pinned host memory.
step_copy() {
  begin copy 90
  t 60 "$UM" bench copy --device cuda > "$R/bench_copy.txt" 2>&1
  say "bench copy --device cuda: $(rcs $?)"
  grep -E "^(dir|d2d)|1.00 GiB" "$R/bench_copy.txt" | show
  t 60 env UNIMEM_CONF=peer_copies=0 "$UM" bench copy --device cuda > "$R/bench_copy_two_hops.txt" 2>&1
  say "bench copy --device cuda, peer_copies=0: $(rcs $?)"
  grep -E "^(dir|d2d)" "$R/bench_copy_two_hops.txt" | show
}

# The GPU test, then the buffer, reclaim and task tests on the real GPUs
# (their devices from UM_TEST_*_DEVICES), then the whole suite.
step_tests() {
  begin tests 180
  t 120 build-dev/tests/test_cuda > "$R/test_cuda.txt" 2>&1
  say "test_cuda: $(rcs $?)"
  grep -E "two GPUs|passed|FAIL" "$R/test_cuda.txt" | tail -4 | show
  local x rc
  for x in buffer reclaim task; do
    t 90 env "UM_TEST_${x^^}_DEVICES=cuda" "build-dev/tests/test_$x" > "$R/test_${x}_cuda.txt" 2>&1
    say "test_$x on the GPUs (UM_TEST_${x^^}_DEVICES=cuda): $(rcs $?)"
    tail -3 "$R/test_${x}_cuda.txt" | show
  done
  (cd build-dev && t 150 ctest -j 8 --output-on-failure) > "$R/ctest.txt" 2>&1
  rc=$?
  say "ctest -j 8: $(rcs $rc)"
  grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" "$R/ctest.txt" | tail -12 | show
  # Cut short, ctest prints no summary: its last lines say how far it got.
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && tail -2 "$R/ctest.txt" | show
}

# run_demo SECONDS NAME WORKLOAD ARGS...: `unimem demo WORKLOAD ARGS` on
# GPU 0 (`--device cuda:0`: the host and GPU 0), then on every GPU
# (`--device cuda`), each GPU limited to $LIMIT, each run SECONDS at most.
# NAME is a printf pattern for the result files, %s the number of GPUs.
run_demo() {
  local limit=$1 name=$2 workload=$3 g dev f
  shift 3
  for g in 1 2; do
    dev=cuda
    [ "$g" -eq 1 ] && dev=cuda:0
    # shellcheck disable=SC2059 # name is the caller's pattern
    f=$R/$(printf "$name" "$g")
    t "$limit" "$UM" demo "$workload" --device $dev --limit "$LIMIT" "$@" --json \
      > "$f.json" 2> "$f.err"
    say "demo $workload --device $dev $*: $(rcs $?)"
    summarize demo "$f.json"
    grep -v "tasks:" "$f.err" | tail -3 | show
  done
}

# Out-of-core SGEMM at N = 32768 (A, B, C 4 GiB each) with every GPU
# limited to 8 GiB, tiles 2048-8192, on GPU 0 and on both; cuBLAS in core
# (GPU 0) and cuBLASXt on one and on both GPUs as baselines; then a tiled
# Cholesky on one GPU and on both. `--device cuda:0` is the host and GPU 0,
# `--device cuda` the host and every GPU.
step_gemm() {
  begin gemm 260
  t 120 "$NVCC" -O2 -std=c++17 bench/gpu/sgemm_compare.cu -lcublas -o build-dev/sgemm_compare \
    > "$R/sgemm_build.txt" 2>&1
  local rc=$?
  say "nvcc sgemm_compare: $(rcs $rc)"
  if [ -n "${SKIP_BASELINES:-}" ]; then
    say "sgemm_compare: skipped (SKIP_BASELINES set: the baselines of an earlier run count)"
  elif [ $rc -eq 0 ]; then
    t 120 build-dev/sgemm_compare --n "$GEMM_N" --gpus 1 --json "$R/sgemm_compare_g1.json" \
      > "$R/sgemm_compare_g1.txt" 2>&1
    say "sgemm_compare --gpus 1: $(rcs $?)"
    show < "$R/sgemm_compare_g1.txt"
    # The in-core references are GPU 0's alone and the run above has them.
    t 90 build-dev/sgemm_compare --n "$GEMM_N" --gpus 2 --skip-in-core --json "$R/sgemm_compare_g2.json" \
      > "$R/sgemm_compare_g2.txt" 2>&1
    say "sgemm_compare --gpus 2: $(rcs $?)"
    show < "$R/sgemm_compare_g2.txt"
  else
    tail -20 "$R/sgemm_build.txt" 2> /dev/null | show
  fi
  local tile
  for tile in $GEMM_TILES; do
    run_demo 60 "demo_gemm_g%s_t$tile" gemm --n "$GEMM_N" --tile "$tile"
  done
  run_demo 90 "demo_cholesky_g%s" cholesky --n "$GEMM_N" --tile "$CHOL_TILE"
}

# Data 1.5x and 2x the sum of the GPUs' 8 GiB limits, spilling to the host:
# each GPU streams its own share on its own thread (cost and LRU), against
# the slowest GPU's MIN bytes at its own host link. GPU 0 alone in the same
# mode (1.5x and 2x its limit) is the single-GPU reference.
step_oversub() {
  begin oversub 150
  t 110 "$UM" bench oversub --device cuda --all-devices --limit "$LIMIT" ${OVERSUB_QUICK:+--quick} --json \
    > "$R/oversub_all.json" 2> "$R/oversub_all.err"
  say "bench oversub --device cuda --all-devices: $(rcs $?)"
  summarize oversub "$R/oversub_all.json"
  tail -3 "$R/oversub_all.err" | show
  t 70 "$UM" bench oversub --device cuda:0 --all-devices --limit "$LIMIT" ${OVERSUB_QUICK:+--quick} --json \
    > "$R/oversub_gpu0.json" 2> "$R/oversub_gpu0.err"
  say "bench oversub --device cuda:0 --all-devices: $(rcs $?)"
  summarize oversub "$R/oversub_gpu0.json"
  tail -3 "$R/oversub_gpu0.err" | show
}

# One tile kernel's compute time on GPU 0 (cuBLAS GEMM, TRSM, SYRK and
# cuSOLVER POTRF, tiles 1024-8192): the simulator's H200 tables.
step_tiles() {
  begin tiles 60
  t 60 "$NVCC" -O2 -std=c++17 bench/gpu/tile_times.cu -lcublas -lcusolver -o build-dev/tile_times \
    > "$R/tile_times_build.txt" 2>&1
  say "nvcc tile_times: $(rcs $?)"
  t 45 build-dev/tile_times --json "$R/tile_times.json" > "$R/tile_times.txt" 2>&1
  say "tile_times: $(rcs $?)"
  show < "$R/tile_times.txt"
}

# A Cholesky large enough for two GPUs: n 65536 in tiles of 8192 (36 lower
# tiles of 256 MiB, 9 GiB; 94 TFLOP), every GPU limited as above.
step_cholbig() {
  begin cholbig 110
  run_demo 55 "demo_cholesky_big_g%s" cholesky --n 65536 --tile 8192
}

for s in $ALL_STEPS; do
  if has "$s"; then "step_$s"; fi
done
say ""
say "two_gpu_run: done after $(elapsed) s"
