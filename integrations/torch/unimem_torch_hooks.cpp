// What PyTorch's CUDAPluggableAllocator can pass on beyond alloc and free,
// connected to unimem: Tensor.record_stream, torch.cuda.empty_cache,
// torch.cuda.set_per_process_memory_fraction, and the start of a CUDA graph
// capture, which is refused. Python's CUDAPluggableAllocator exposes only
// alloc and free, so unimem_torch.install() calls unimem_torch_connect()
// once the allocator is PyTorch's current one, and this sets the other
// functions on it through PyTorch's C++ API. Built only where PyTorch's C++
// headers and libtorch_cuda are found and this file compiles against them
// (integrations/torch/CMakeLists.txt).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/util/Exception.h>

#include <memory>
#include <string>

#include "unimem_torch.h"

namespace
{

// A failure reaches the Python caller as RuntimeError: a record_stream that
// silently did nothing would let a stream reuse memory another still reads.
// (Pointers that are not a live unimem block's start are no failure: they
// are skipped, as PyTorch's allocator skips DataPtrs it did not allocate.)
[[noreturn]] void throw_last(const char *what)
{
    C10_THROW_ERROR(Error, std::string(what) + ": " + unimem_torch_last_error());
}

// CUDA graphs need the allocator to give a capture a private pool that
// stays reserved for the graph's replays (PyTorch's beginAllocateToPool,
// endAllocateToPool, releasePool). A CUDAPluggableAllocator whose hooks are
// unset does nothing there, so a capture would take unimem's general pool:
// replays would write into memory later given to eager tensors, and
// unimem would record and query events on the capturing stream. The begin
// hook refuses instead. PyTorch calls it before cudaStreamBeginCapture, so
// the exception leaves no capture open (in PyTorch 2.1 and earlier it came
// after; the error is the same, and that stream then stays capturing).
// It also refuses torch.cuda.MemPool's allocation to a pool, which rests on
// the same hook.
[[noreturn]] void refuse_graph_capture(int device)
{
    unimem_torch_begin_graph_capture(device);
    C10_THROW_ERROR(Error, unimem_torch_last_error());
}

// Sets the refusal on whichever hook this PyTorch has: set_begin_allocate_to_pool
// (PyTorch 2.3 and later: device, pool id, stream filter) or
// set_begin_allocate_stream_to_pool (earlier: device, stream, pool id).
// False when it has neither.
template <class Allocator> bool refuse_graph_captures(Allocator &allocator)
{
    auto refuse = [](int device, auto &&...) { refuse_graph_capture(device); };
    if constexpr (requires { allocator.set_begin_allocate_to_pool(refuse); }) {
        allocator.set_begin_allocate_to_pool(refuse);
        return true;
    } else if constexpr (requires { allocator.set_begin_allocate_stream_to_pool(refuse); }) {
        allocator.set_begin_allocate_stream_to_pool(refuse);
        return true;
    } else {
        return false;
    }
}

} // namespace

extern "C" __attribute__((visibility("default"))) int unimem_torch_connect(void)
{
    namespace plug = torch::cuda::CUDAPluggableAllocator;
    auto current =
        std::dynamic_pointer_cast<plug::CUDAPluggableAllocator>(plug::getCurrentAllocator());
    if (!current)
        return 0;
    // PyTorch passes the stream alone (a cudaStream_t, its device lost), so
    // the shim asks the driver which GPU the stream is on (-1).
    current->set_record_stream_fn([](void *ptr, cudaStream_t stream) {
        if (unimem_torch_record_stream(ptr, stream, -1) != 0)
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
    // Without the refusal a capture would silently corrupt memory: not
    // connected then, so that install() says so.
    return refuse_graph_captures(*current) ? 1 : 0;
}
