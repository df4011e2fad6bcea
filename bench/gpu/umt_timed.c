/* unimem's PyTorch allocator functions with their own time counted, for
 * bench/gpu/torch_alloc_cost.py: the same code as libunimem_torch.so
 * (integrations/torch/unimem_torch.c, compiled in), plus timed_alloc and
 * timed_free, which CUDAPluggableAllocator loads instead and which add the
 * TSC ticks spent inside unimem to counters that timed_read returns. So the
 * share of a tensor's host time that is unimem's own is measured in the
 * process that makes the tensors, not inferred from two processes that the
 * host's drift sets apart. x86-64 only.
 *
 *   cc -O2 -shared -fPIC -Iinclude -Iintegrations/torch bench/gpu/umt_timed.c \
 *      -Lbuild-dev -lunimem -Wl,-rpath,$PWD/build-dev -o build-dev/umt_timed.so
 */
#include "unimem_torch.c"

#include <x86intrin.h>

static uint64_t alloc_ticks, alloc_calls, free_ticks, free_calls;

UMT_EXPORT void *timed_alloc(size_t size, int device, void *stream)
{
    uint64_t t = __rdtsc();
    void *p = unimem_torch_alloc(size, device, stream);
    alloc_ticks += __rdtsc() - t;
    alloc_calls++;
    return p;
}

UMT_EXPORT void timed_free(void *ptr, size_t size, int device, void *stream)
{
    uint64_t t = __rdtsc();
    unimem_torch_free(ptr, size, device, stream);
    free_ticks += __rdtsc() - t;
    free_calls++;
}

/* out: ticks and calls of the allocations, then of the frees, then the TSC
 * now (to convert ticks to seconds against the caller's clock). The
 * counters are the calling threads' sum, unsynchronized: the measurement
 * allocates from one thread. */
UMT_EXPORT void timed_read(uint64_t out[5])
{
    out[0] = alloc_ticks;
    out[1] = alloc_calls;
    out[2] = free_ticks;
    out[3] = free_calls;
    out[4] = __rdtsc();
}
