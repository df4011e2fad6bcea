// What PyTorch's CUDAPluggableAllocator can pass on beyond alloc and free,
// connected to unimem: Tensor.record_stream, torch.cuda.empty_cache and
// torch.cuda.set_per_process_memory_fraction. Python's CUDAPluggableAllocator
// exposes only alloc and free, so unimem_torch.install() calls
// unimem_torch_connect() once the allocator is PyTorch's current one, and
// this sets the other functions on it through PyTorch's C++ API. Built only
// where PyTorch's C++ headers and libtorch_cuda are found and this file
// compiles against them (integrations/torch/CMakeLists.txt).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/util/Exception.h>

#include <memory>
#include <string>

#include "unimem_torch.h"

namespace {

// A failure reaches the Python caller as RuntimeError: a record_stream that
// silently did nothing would let a stream reuse memory another still reads.
// (Memory unimem does not manage is no failure: it is skipped, as PyTorch's
// allocator skips tensors it did not allocate.)
void throw_last(const char *what)
{
    C10_THROW_ERROR(Error, std::string(what) + ": " + unimem_torch_last_error());
}

} // namespace

extern "C" __attribute__((visibility("default"))) int unimem_torch_connect(void)
{
    namespace plug = torch::cuda::CUDAPluggableAllocator;
    auto current = std::dynamic_pointer_cast<plug::CUDAPluggableAllocator>(
        plug::getCurrentAllocator());
    if (!current)
        return 0;
    current->set_record_stream_fn([](void *ptr, cudaStream_t stream) {
        if (unimem_torch_record_stream(ptr, stream) != 0)
            throw_last("Tensor.record_stream");
    });
    current->set_reset_fn([]() {
        if (unimem_torch_empty_cache() != 0)
            throw_last("torch.cuda.empty_cache");
    });
    current->set_memory_fraction_fn([](double fraction, int device) {
        if (unimem_torch_set_memory_fraction(fraction, device) != 0)
            throw_last("torch.cuda.set_per_process_memory_fraction");
    });
    return 1;
}
