/*
 * The CUDA backend's and the pool's error paths, through the stand-in
 * driver (fake_cuda.c) with FAKE_CUDA_FAIL_EVERY=N: every Nth cuMemCreate,
 * cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease and cuEventRecord
 * fails. Random allocations and frees run on; a failed allocation reports
 * a status and a message, the pool stays consistent after every step, and
 * at the end, once everything is freed and trimmed, the driver holds
 * exactly what unimem says it reserves: no page lost or counted twice.
 * Skips (77) unless UM_TEST_FAKE_CUDA is set: a real driver fails on its
 * own terms only.
 */
#include "core/core.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

int main(void)
{
    if (!getenv("UM_TEST_FAKE_CUDA") || !getenv("FAKE_CUDA_FAIL_EVERY")) {
        printf("test_cuda_faults: SKIPPED: needs the stand-in driver with FAKE_CUDA_FAIL_EVERY\n");
        return 77;
    }
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0", &ctx));
    if (!ctx)
        return harness_finish("test_cuda_faults");
    um__allocator *pool = ctx->devices[1].alloc;
    size_t free0, free_now, total;
    CHECK_OK(um_device_memory_get(ctx, 1, &free0, &total));
    enum { SLOTS = 48, STEPS = 3000 };
    uint64_t seed = harness_seed("test_cuda_faults"), rng = seed;
    void *ptr[SLOTS] = {0};
    int fails = 0, driver_named = 0;
    for (int step = 0; step < STEPS; step++) {
        int k = (int)(harness_rand(&rng) % SLOTS);
        if (ptr[k]) {
            CHECK_OK(um_free(ctx, ptr[k], NULL));
            ptr[k] = NULL;
        } else {
            size_t size = harness_rand(&rng) % 4 ? 1 + harness_rand(&rng) % (32 * 1024)
                                                 : 1 + harness_rand(&rng) % (16 * MIB);
            um_status st = um_malloc(ctx, 1, size, NULL, &ptr[k]);
            if (st != UM_OK) {
                fails++;
                CHECK(ptr[k] == NULL);
                CHECK(st == UM_ERR_NOMEM || st == UM_ERR_BACKEND || st == UM_ERR_INVALID);
                driver_named += strstr(um_last_error(), "CUDA_ERROR") != NULL;
            }
        }
        if (step % 100 == 0)
            CHECK_OK(pool->ops->check(pool));
    }
    for (int k = 0; k < SLOTS; k++)
        if (ptr[k])
            CHECK_OK(um_free(ctx, ptr[k], NULL));
    /* A trim may meet an injected failure; the pages it could not give back
     * stay counted and go at the next try. */
    um_status st = UM_ERR_BACKEND;
    for (int i = 0; i < 20 && st != UM_OK; i++)
        st = um_trim(ctx, 1);
    CHECK_OK(st);
    CHECK_OK(pool->ops->check(pool));
    um_stats s;
    CHECK_OK(um_stats_get(ctx, 1, &s));
    CHECK_OK(um_device_memory_get(ctx, 1, &free_now, &total));
    printf("test_cuda_faults: seed %llu, %d of the allocations failed (%d naming the driver's "
           "error); after trim unimem reserves %zu bytes, the driver holds %zu\n",
           (unsigned long long)seed, fails, driver_named, s.reserved_bytes, free0 - free_now);
    CHECK(fails > 0);
    CHECK(driver_named > 0);
    CHECK_EQ(s.active_bytes, 0);
    CHECK_EQ(s.reserved_bytes, free0 - free_now);
    CHECK_EQ(s.reserved_bytes, 0);
    um_shutdown(ctx);
    return harness_finish("test_cuda_faults");
}
