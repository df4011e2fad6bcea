/* The C functions of libunimem_torch.so that PyTorch's allocator hooks call
 * (unimem_torch_record_stream, unimem_torch_empty_cache,
 * unimem_torch_set_memory_fraction), run on the stand-in CUDA driver
 * (gpu/fake_cuda.c, one GPU of FAKE_CUDA_MEM bytes), so CI checks them
 * without PyTorch or a GPU: a marked block is taken back only after its
 * free, misuse is refused with a reason, the fraction caps what can be
 * allocated, and emptying the cache gives every page back. Built without
 * PyTorch's headers, a failed allocation returns NULL. Where PyTorch is
 * installed, tests/gpu/test_torch.py checks the same through PyTorch. */
#include "harness.h"
#include "unimem_torch.h"

#include <stdlib.h>
#include <string.h>

#define MB ((size_t)1 << 20)

static bool last_error_mentions(const char *what)
{
    return strstr(unimem_torch_last_error(), what) != NULL;
}

static um_stats stats0(void)
{
    um_stats st = {.version = UM_STATS_VERSION};
    CHECK_EQ(unimem_torch_stats(0, &st), 0);
    return st;
}

int main(void)
{
    if (!getenv("UM_TEST_FAKE_CUDA")) {
        printf("test_torch_shim: skipped: runs on the stand-in CUDA driver only "
               "(ctest sets UM_TEST_FAKE_CUDA and its library path)\n");
        return 77;
    }
    /* Native streams are opaque to the stand-in driver: any distinct
     * non-NULL pointers serve. */
    static char compute_stream, comm_stream;
    void *compute = &compute_stream, *comm = &comm_stream;

    void *p = unimem_torch_alloc(4 * MB, 0, comm);
    CHECK(p != NULL);
    CHECK_EQ(unimem_torch_record_stream(p, compute), 0);
    CHECK_EQ(unimem_torch_record_stream(p, compute), 0); /* twice is once */
    CHECK_EQ(unimem_torch_record_stream(p, NULL), 0);    /* the legacy default stream */
    /* Memory unimem does not manage (a tensor shared from another process)
     * and an empty tensor's NULL are skipped, as PyTorch's allocator does:
     * NCCL records streams on such tensors, and a refusal raised there. */
    int local = 0;
    CHECK_EQ(unimem_torch_record_stream(&local, compute), 0);
    CHECK_EQ(unimem_torch_record_stream(NULL, compute), 0);
    CHECK_EQ(unimem_torch_record_stream((char *)p + 4096, compute), UM_ERR_INVALID_POINTER);
    CHECK(last_error_mentions("inside"));
    CHECK_EQ(stats0().active_bytes, 4 * MB);
    unimem_torch_free(p, 4 * MB, 0, comm);
    /* The stand-in driver's events are complete at once: the next
     * allocation takes the block back first. */
    void *q = unimem_torch_alloc(4 * MB, 0, comm);
    CHECK(q == p);
    CHECK_EQ(stats0().active_bytes, 4 * MB);
    unimem_torch_free(q, 4 * MB, 0, comm);
    CHECK_EQ(unimem_torch_record_stream(q, compute), UM_ERR_INVALID_POINTER);
    CHECK(last_error_mentions("not a live allocation"));

    /* torch.cuda.set_per_process_memory_fraction: FAKE_CUDA_MEM is 64 MiB. */
    CHECK_EQ(unimem_torch_set_memory_fraction(1.5, 0), UM_ERR_INVALID);
    CHECK(last_error_mentions("not in (0, 1]"));
    CHECK_EQ(unimem_torch_set_memory_fraction(0.0, 0), UM_ERR_INVALID);
    CHECK_EQ(unimem_torch_set_memory_fraction(0.5, 9), UM_ERR_NO_DEVICE);
    CHECK_EQ(unimem_torch_set_memory_fraction(0.5, 0), 0);
    CHECK(unimem_torch_alloc(40 * MB, 0, comm) == NULL);
    CHECK(last_error_mentions("cannot allocate"));
    void *half = unimem_torch_alloc(24 * MB, 0, comm);
    CHECK(half != NULL);
    unimem_torch_free(half, 24 * MB, 0, comm);
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 0), 0);
    void *big = unimem_torch_alloc(40 * MB, 0, comm);
    CHECK(big != NULL);
    unimem_torch_free(big, 40 * MB, 0, comm);

    /* torch.cuda.empty_cache: nothing live, nothing kept. */
    CHECK(stats0().reserved_bytes > 0);
    CHECK_EQ(unimem_torch_empty_cache(), 0);
    CHECK_EQ(stats0().reserved_bytes, 0);

    /* A fraction too small for one byte allows nothing (its limit of 0
     * bytes used to mean the whole GPU). */
    CHECK_EQ(unimem_torch_set_memory_fraction(1e-12, 0), 0);
    CHECK(unimem_torch_alloc(2 * MB, 0, comm) == NULL);
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 0), 0);
    void *again = unimem_torch_alloc(2 * MB, 0, comm);
    CHECK(again != NULL);
    unimem_torch_free(again, 2 * MB, 0, comm);
    return harness_finish("test_torch_shim");
}
