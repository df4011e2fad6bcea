#!/bin/bash
# On a machine with two GPUs: the GPU tests, the topology and link costs,
# and buffer copies between the GPUs (peer access, then two hops through
# pinned host memory with peer_copies=0). Results under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$OUT/build.txt" 2>&1 &&
  cmake --build build-dev -j "$(nproc)" >> "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt"
build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1; echo "test_cuda rc=$?"; grep -E "two GPUs|passed" "$OUT/test_cuda.txt"
build-dev/unimem info > "$OUT/info.txt" 2>&1; tail -12 "$OUT/info.txt"
build-dev/unimem bench copy --device cuda > "$OUT/bench_copy.txt" 2>&1; echo "bench copy rc=$?"; cat "$OUT/bench_copy.txt"
UNIMEM_CONF=peer_copies=0 build-dev/unimem bench copy --device cuda > "$OUT/bench_copy_two_hops.txt" 2>&1
echo "peer_copies=0 rc=$?"; grep -E "d2d" "$OUT/bench_copy_two_hops.txt"
