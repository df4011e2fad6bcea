#!/usr/bin/env bash
# Builds the GPU allocator comparison (bench/gpu/alloc_compare.cpp) against the
# libunimem.a of a CMake build, the CUDA runtime of /usr/local/cuda and, when
# python3 can import torch, PyTorch's c10 libraries (else without them).
# A CMake build of this tree makes alloc_compare itself (`unimem bench gpu`
# runs it); this script is for the library of another tree, such as an
# older commit's, whose build may not.
#
# Usage: bench/gpu/build_compare.sh BUILD_DIR OUT_BINARY
#   e.g. bench/gpu/build_compare.sh build-dev build-dev/alloc_compare
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_BINARY   (BUILD_DIR holds libunimem.a)" >&2
  exit 1
fi
build_dir=$1
out=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
C=/usr/local/cuda

if [ ! -f "$build_dir/libunimem.a" ]; then
  echo "build_compare: no $build_dir/libunimem.a: build the library first" \
       "(cmake -S . -B $build_dir && cmake --build $build_dir)" >&2
  exit 1
fi
if [ ! -f "$C/include/cuda_runtime_api.h" ] || [ ! -e "$C/lib64/libcudart.so" ]; then
  echo "build_compare: no CUDA toolkit at $C (need include/cuda_runtime_api.h and lib64/libcudart.so)" >&2
  exit 1
fi

# One libcudart must serve both this program and c10_cuda, so that the current
# device and the context are shared: both name libcudart.so.<major>, and the
# loader takes the first it finds, ours (rpath $C/lib64).
torch_flags=()
torch_libs=()
if T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null) &&
   [ -f "$T/include/c10/cuda/CUDACachingAllocator.h" ] && [ -e "$T/lib/libc10_cuda.so" ]; then
  version=$(python3 -c 'import torch;print(torch.__version__)')
  # The C++ ABI of std::string must match torch's (c10's error messages).
  abi=$(python3 -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  torch_flags=(-I"$T/include" -I"$T/include/torch/csrc/api/include"
               -D_GLIBCXX_USE_CXX11_ABI="$abi" -DUM_TORCH_VERSION="\"$version\"")
  torch_libs=(-L"$T/lib" -lc10_cuda -lc10 -Wl,-rpath,"$T/lib")
  echo "build_compare: with torch $version from $T"
else
  torch_flags=(-DUM_NO_TORCH)
  echo "build_compare: python3 cannot import torch (or it has no c10_cuda):" \
       "building WITHOUT PyTorch's allocator (-DUM_NO_TORCH)" >&2
fi

mkdir -p "$(dirname "$out")"
set -x
g++ -O2 -std=c++17 "${torch_flags[@]}" -I"$C/include" -I"$repo/include" \
  "$repo/bench/gpu/alloc_compare.cpp" "$build_dir/libunimem.a" \
  "${torch_libs[@]}" -L"$C/lib64" -lcudart -Wl,-rpath,"$C/lib64" \
  -lz -lpthread -ldl -lm -o "$out"
