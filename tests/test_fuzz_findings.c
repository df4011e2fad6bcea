/* What the fuzzers of tests/fuzz found, kept as regressions:
 *   F1: a trace whose gzip data is corrupt could not be rewound;
 *   F2: a request larger than the memory limit evicted every buffer of the
 *       device before it failed;
 *   F3: with the limit set to SIZE_MAX, a request near SIZE_MAX wrapped when
 *       rounded up and sent the pool past its page table (ASan: a heap
 *       overflow), or "succeeded" with a block of 0 bytes;
 *   F4: fuzz_sim: on a machine whose links to and from the host share one
 *       resource, a copy between two GPUs through the host crossed it
 *       twice, the network model refused the route, and the model engine
 *       stalled under eager and round_robin (UM_ERR_INTERNAL). */
#include "harness.h"
#include "base/options.h"
#include "vsim/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_rewind_after_corrupt_gzip(void)
{
    char path[] = "/tmp/unimem_test_fuzz_findings_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    /* A gzip header, then "a 1 2\n" where deflate data should be. */
    static const unsigned char bytes[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3,
                                          'a', ' ', '1', ' ', '2', '\n'};
    CHECK(write(fd, bytes, sizeof bytes) == (ssize_t)sizeof bytes);
    close(fd);
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(path, &t));
    if (t) {
        um_trace_event ev;
        int done = 0;
        CHECK_STATUS(um_trace_next(t, &ev, &done), UM_ERR_IO);
        CHECK_ERROR_MENTIONS("corrupt gzip data", NULL, NULL);
        CHECK_OK(um_trace_rewind(t));
        /* Read again from the start: the same error, named the same way. */
        CHECK_STATUS(um_trace_next(t, &ev, &done), UM_ERR_IO);
        CHECK_ERROR_MENTIONS("corrupt gzip data", NULL, NULL);
        um_trace_close(t);
    }
    remove(path);
}

static void test_impossible_request_evicts_nothing(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,link_cache=none", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 16u << 20));
    enum { N = 4 };
    um_buffer *b[N] = {0};
    static char data[1 << 20];
    memset(data, 7, sizeof data);
    for (int i = 0; i < N; i++) {
        void *p = NULL;
        CHECK_OK(um_buffer_create(ctx, sizeof data, NULL, &b[i]));
        CHECK_OK(um_buffer_acquire(b[i], 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
        if (p)
            memcpy(p, data, sizeof data); /* the only copy is on sim1 */
        CHECK_OK(um_buffer_release(b[i], 1, NULL));
    }
    static const size_t sizes[] = {SIZE_MAX - 255, (size_t)65 << 20, (size_t)17 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        um_reclaim_stats before, after;
        CHECK_OK(um_reclaim_stats_get(ctx, 1, &before));
        void *p = NULL;
        CHECK_STATUS(um_malloc(ctx, 1, sizes[k], NULL, &p), UM_ERR_NOMEM);
        CHECK_ERROR_MENTIONS("exceeds the limit", NULL, NULL);
        CHECK_OK(um_reclaim_stats_get(ctx, 1, &after));
        CHECK_EQ(after.evictions, before.evictions);
    }
    /* Nor does one under the limit whose 2 MiB granules exceed it (14 MiB
     * and a byte spans 16 MiB of a 15 MiB limit). */
    CHECK_OK(um_set_memory_limit(ctx, 1, 15u << 20));
    um_reclaim_stats before, after;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &before));
    void *p = NULL;
    CHECK_STATUS(um_malloc(ctx, 1, (14u << 20) + 1, NULL, &p), UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("exceeds the limit", NULL, NULL);
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &after));
    CHECK_EQ(after.evictions, before.evictions);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(um_buffer_replica_state(b[i], 1), UM_REPLICA_OWNER);
        CHECK_OK(um_buffer_destroy(b[i]));
    }
    um_shutdown(ctx);
}

static void test_huge_requests_under_a_huge_limit(const char *allocator)
{
    char conf[96];
    snprintf(conf, sizeof conf, "devices=sim:64M,allocator=%s", allocator);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    static const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX - 4096, SIZE_MAX / 2 + 1,
                                   (size_t)1 << 40};
    for (int dev = 0; dev < um_device_count(ctx); dev++) {
        /* A limit above the capacity is the capacity. */
        CHECK_OK(um_set_memory_limit(ctx, dev, SIZE_MAX));
        um_device_info info;
        CHECK_OK(um_device_info_get(ctx, dev, &info));
        CHECK_EQ(info.memory_limit, info.capacity);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            void *p = NULL;
            CHECK_STATUS(um_malloc(ctx, dev, sizes[i], NULL, &p), UM_ERR_NOMEM);
            CHECK(p == NULL);
        }
        um_stats st;
        CHECK_OK(um_stats_get(ctx, dev, &st));
        CHECK_EQ(st.active_blocks, 0ull);
    }
    um_shutdown(ctx);
}

static void test_sim_copy_through_a_shared_bus(void)
{
    static const char machine[] =
        "machine name=small\n"
        "device name=host kind=host memory=28G model=cpu\n"
        "device name=gpu count=8 kind=gpu memory=1G granularity=2M model=g\n"
        "device name=s kind=sim memory=512M model=g\n"
        "link from=host to=gpu bandwidth=25G latency=10us shared=pcie\n"
        "link from=gpu to=host bandwidth=25G latency=10us shared=pcie\n"
        "link from=gpu4 to=gpu bandwidth=300G latency=5us switched=1\n"
        "link from=host to=s bandwidth=1G latency=1ms\n"
        "link from=s to=host bandwidth=2G\n"
        "compute model=g kernel=gemm fit=1e-12,3,1e-5\n"
        "compute model=g kernel=potrf gflops=100\n"
        "compute model=cpu kernel=trsm gflops=20\n"
        "compute model=g kernel=syrk fit=0,1,2\n";
    static const char trace[] =
        "# unimem task trace 1\n"
        "task 1 gemm 33554432 1:262144:r 2:262144:r 3:262144:wd\n"
        "task 2 gemm 33554432 4:262144:r 5:262144:r 3:262144:rw\n"
        "task 3 gemm 33554432 1:262144:r 6:262144:r 7:262144:wd\n"
        "task 4 gemm 33554432 4:262144:r 8:262144:r 7:262144:rw\n"
        "task 5 potrf 11184810 9:262144:rw\n"
        "task 6 trsm 33554432 9:262144:r 3:262144:rw\n"
        "task 7 syrk 33554432 3:262144:r 7:262144:rw\n"
        "task 8 copy 0 7:262144:r 10:262144:w\n";
    char path[] = "/tmp/unimem_test_fuzz_findings_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, trace, sizeof trace - 1) == (ssize_t)(sizeof trace - 1));
    close(fd);
    um__vs_machine *m = malloc(sizeof *m);
    um__vs_result *r = malloc(sizeof *r);
    um__vs_dag d = {0};
    CHECK(m != NULL && r != NULL);
    if (m && r) {
        CHECK_OK(um__vs_machine_parse(machine, "fuzz_sim finding", m));
        CHECK_OK(um__vs_dag_trace(path, &d));
        static const int policies[] = {UM_SCHED_EAGER, UM_SCHED_ROUND_ROBIN,
                                       UM_SCHED_LOCALITY, UM_SCHED_COST};
        for (int p = 0; p < 4; p++) {
            CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
            CHECK(isfinite(r->makespan_s) && r->makespan_s >= r->lower_bound_s);
        }
        um__vs_dag_free(&d);
    }
    free(r);
    free(m);
    remove(path);
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_rewind_after_corrupt_gzip();
    test_impossible_request_evicts_nothing();
    test_huge_requests_under_a_huge_limit("pool");
    test_huge_requests_under_a_huge_limit("direct");
    test_huge_requests_under_a_huge_limit("bufcache");
    test_sim_copy_through_a_shared_bus();
    return harness_finish("test_fuzz_findings");
}
