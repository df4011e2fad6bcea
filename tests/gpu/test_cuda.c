/*
 * The pool on a real GPU: driver facts, data kept intact through random
 * churn (pages are unmapped and mapped elsewhere underneath), unimem's
 * reserved bytes against the driver's own count, stream-ordered reuse
 * across two streams with a long-running kernel in between, a memory
 * limit, pinned host memory with asynchronous copies, and wrapped streams.
 * With two GPUs or more, the first two together: unified buffers kept
 * coherent across them, eviction from a full GPU to the other one, and
 * tasks placed by load and by free memory.
 *
 * Device memory is written and read only through the driver (copies and a
 * kernel), never by the host (CI checks that with the stand-in driver's
 * FAKE_CUDA_OPAQUE=1). Exits 77 (skipped) when there is no driver or no
 * GPU, saying why.
 */
#include "backend/backend.h"
#include "backend/cuda_driver.h"
#include "harness.h"

#include <stdatomic.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define SKIP 77

/* spin_fill(p, n, ns, v): waits `ns` nanoseconds of GPU time, then writes
 * v + i to the 32-bit word i of p for i < n (grid-stride loop). PTX, so
 * the driver compiles it for whatever GPU runs the test. */
static const char spin_fill_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry spin_fill(.param .u64 spin_fill_p, .param .u64 spin_fill_n,\n"
    "    .param .u64 spin_fill_ns, .param .u32 spin_fill_v)\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<10>;\n"
    "    .reg .b64 %rd<12>;\n"
    "    ld.param.u64 %rd1, [spin_fill_p];\n"
    "    ld.param.u64 %rd2, [spin_fill_n];\n"
    "    ld.param.u64 %rd3, [spin_fill_ns];\n"
    "    ld.param.u32 %r1, [spin_fill_v];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    mov.u64 %rd4, %globaltimer;\n"
    "SPIN:\n"
    "    mov.u64 %rd5, %globaltimer;\n"
    "    sub.u64 %rd6, %rd5, %rd4;\n"
    "    setp.lt.u64 %p1, %rd6, %rd3;\n"
    "    @%p1 bra SPIN;\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "    cvt.u64.u32 %rd7, %r5;\n"
    "    mov.u32 %r6, %nctaid.x;\n"
    "    mul.lo.u32 %r7, %r6, %r3;\n"
    "    cvt.u64.u32 %rd8, %r7;\n"
    "LOOP:\n"
    "    setp.ge.u64 %p2, %rd7, %rd2;\n"
    "    @%p2 bra DONE;\n"
    "    shl.b64 %rd9, %rd7, 2;\n"
    "    add.u64 %rd10, %rd1, %rd9;\n"
    "    cvt.u32.u64 %r8, %rd7;\n"
    "    add.u32 %r9, %r1, %r8;\n"
    "    st.global.u32 [%rd10], %r9;\n"
    "    add.u64 %rd7, %rd7, %rd8;\n"
    "    bra LOOP;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

typedef struct gpu {
    um_context *ctx;
    int dev; /* unimem device of GPU 0 */
    const um__cuda_api *cu;
    um_cuContext cuctx;
    um_cuModule mod;
    um_cuFunction spin_fill;
} gpu;

static bool launch_spin_fill(gpu *g, void *p, size_t words, uint64_t ns, uint32_t v, um_stream s)
{
    unsigned long long dp = (unsigned long long)(uintptr_t)p;
    unsigned long long n = words, wait = ns;
    void *params[] = {&dp, &n, &wait, &v};
    um_cuResult r = g->cu->LaunchKernel(g->spin_fill, 264, 1, 1, 256, 1, 1, 0,
                                        (um_cuStream)um_stream_native(s), params, NULL);
    if (r != UM_CU_SUCCESS)
        fprintf(stderr, "cuLaunchKernel failed: %d\n", r);
    return r == UM_CU_SUCCESS;
}

/* Copies a device block to the host and checks the pattern of `id`. */
static bool block_intact(gpu *g, const void *dptr, size_t size, uint64_t id, unsigned char *buf)
{
    if (um_memcpy(g->ctx, buf, dptr, size) != UM_OK) {
        fprintf(stderr, "um_memcpy back failed: %s\n", um_last_error());
        return false;
    }
    unsigned char got, want;
    size_t bad = harness_pattern_find_bad(buf, size, id, &got, &want);
    if (bad != SIZE_MAX)
        fprintf(stderr, "block %" PRIu64 " (%zu bytes at %p): byte %zu is 0x%02x, not 0x%02x\n",
                id, size, dptr, bad, got, want);
    return bad == SIZE_MAX;
}

static void check_driver_facts(gpu *g)
{
    um_device_info info;
    CHECK_OK(um_device_info_get(g->ctx, g->dev, &info));
    printf("device %d: %s (%s), %.1f GiB, cc %d.%d, PCI %s, page %zu KiB, vmm %d\n", g->dev,
           info.name, info.product, (double)info.capacity / (1 << 30), info.cc_major,
           info.cc_minor, info.pci_bus_id, info.granularity >> 10, info.vmm);
    CHECK(info.product[0] != '\0');
    CHECK_EQ(info.kind, UM_DEVICE_CUDA);
    CHECK_EQ(info.ordinal, 0);
    CHECK(info.cc_major >= 6);
    CHECK(strlen(info.pci_bus_id) >= 7);
    CHECK_EQ(info.vmm, 1);
    CHECK(info.granularity >= 64 * 1024);
    size_t free_b = 0, total = 0;
    CHECK_OK(um_device_memory_get(g->ctx, g->dev, &free_b, &total));
    CHECK_EQ(total, info.capacity);
    CHECK(free_b > 0 && free_b <= total);
    um_link_info link;
    CHECK_OK(um_device_link_get(g->ctx, g->dev, g->dev, &link));
    CHECK_EQ(link.peer_access, 1);
    CHECK_OK(um_device_info_get(g->ctx, 0, &info));
    printf("device 0: host memory %s\n", info.pinned ? "pinned (CUDA VMM host pages)" : "pageable");
}

/* Random churn with a reference model: every live block holds its id's
 * pattern, written by a copy; blocks are checked at random and all at the
 * end. Sizes span slabs, single pages and multi-page blocks, so pages are
 * recycled under live neighbours. */
static void check_churn(gpu *g)
{
    enum { SLOTS = 64, STEPS = 1500 };
    uint64_t seed = harness_seed("test_cuda.churn"), rng = seed;
    void *ptr[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    uint64_t id[SLOTS] = {0}, next_id = 1;
    unsigned char *buf = malloc(64 * MIB), *back = malloc(64 * MIB);
    CHECK(buf && back);
    if (!buf || !back)
        return;
    for (int step = 0; step < STEPS; step++) {
        int k = (int)(harness_rand(&rng) % SLOTS);
        if (ptr[k]) {
            if (harness_rand(&rng) % 4 == 0)
                CHECK(block_intact(g, ptr[k], size[k], id[k], back));
            CHECK_OK(um_free(g->ctx, ptr[k], NULL));
            ptr[k] = NULL;
            continue;
        }
        uint64_t band = harness_rand(&rng) % 10;
        size_t sz = band < 6   ? 1 + harness_rand(&rng) % (32 * 1024)
                    : band < 9 ? 1 + harness_rand(&rng) % (4 * MIB)
                               : 1 + harness_rand(&rng) % (64 * MIB);
        CHECK_OK(um_malloc(g->ctx, g->dev, sz, NULL, &ptr[k]));
        if (!ptr[k])
            continue;
        CHECK_EQ((uintptr_t)ptr[k] % 256, 0);
        CHECK_EQ(um_pointer_device(g->ctx, ptr[k]), g->dev);
        size[k] = sz;
        id[k] = next_id++;
        harness_pattern_fill(buf, sz, id[k]);
        CHECK_OK(um_memcpy(g->ctx, ptr[k], buf, sz));
    }
    int bad = 0;
    for (int k = 0; k < SLOTS; k++) {
        if (ptr[k]) {
            bad += !block_intact(g, ptr[k], size[k], id[k], back);
            CHECK_OK(um_free(g->ctx, ptr[k], NULL));
        }
    }
    CHECK_EQ(bad, 0);
    um_stats st;
    CHECK_OK(um_stats_get(g->ctx, g->dev, &st));
    CHECK_EQ(st.active_bytes, 0);
    CHECK_EQ(st.active_blocks, 0);
    printf("churn: %d steps, seed %" PRIu64 ", peak reserved %zu MiB, %" PRIu64 " backend calls\n",
           STEPS, seed, st.peak_reserved_bytes / MIB, st.num_backend_calls);
    free(buf);
    free(back);
}

/* unimem's reserved bytes against cuMemGetInfo: what the pool says it
 * holds is what the driver says is gone, and a trim gives it back. */
static void check_driver_agrees(gpu *g)
{
    CHECK_OK(um_trim(g->ctx, g->dev));
    size_t free0, free1, free2, total;
    um_stats st;
    CHECK_OK(um_device_memory_get(g->ctx, g->dev, &free0, &total));
    void *p[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(um_malloc(g->ctx, g->dev, 128 * MIB + (size_t)i * 4096, NULL, &p[i]));
    CHECK_OK(um_device_memory_get(g->ctx, g->dev, &free1, &total));
    CHECK_OK(um_stats_get(g->ctx, g->dev, &st));
    double driver = (double)(free0 - free1), ours = (double)st.reserved_bytes;
    printf("driver agreement: unimem reserved %.1f MiB, the driver's used memory grew %.1f MiB\n",
           ours / MIB, driver / MIB);
    /* The driver may add page-table memory of its own: allow 2%. */
    CHECK(driver >= ours * 0.999 && driver <= ours * 1.02 + 4.0 * MIB);
    for (int i = 0; i < 8; i++)
        CHECK_OK(um_free(g->ctx, p[i], NULL));
    CHECK_OK(um_trim(g->ctx, g->dev));
    CHECK_OK(um_device_memory_get(g->ctx, g->dev, &free2, &total));
    CHECK_OK(um_stats_get(g->ctx, g->dev, &st));
    CHECK_EQ(st.reserved_bytes, 0);
    CHECK(free2 + 4 * MIB >= free0);
}

/* A block freed on s1 while a kernel on s1 still writes it must not be
 * handed to s2 until that kernel is done, but s1 itself may reuse it at
 * once (its later work is ordered after the kernel). */
static void check_stream_order(gpu *g)
{
    const size_t size = 16 * MIB, words = size / 4;
    um_stream s1 = NULL, s2 = NULL;
    CHECK_OK(um_stream_create(g->ctx, g->dev, &s1));
    CHECK_OK(um_stream_create(g->ctx, g->dev, &s2));
    if (!s1 || !s2)
        return;
    CHECK_OK(um_trim(g->ctx, g->dev));
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(um_malloc(g->ctx, g->dev, size, s1, &a));
    uint64_t t0 = um__now_ns();
    CHECK(launch_spin_fill(g, a, words, 400000000ull, 7, s1)); /* 0.4 s, then fill */
    CHECK_OK(um_free(g->ctx, a, s1));
    CHECK_OK(um_malloc(g->ctx, g->dev, size, s2, &b));
    uint64_t t_b = um__now_ns() - t0;
    CHECK_OK(um_malloc(g->ctx, g->dev, size, s1, &c));
    printf("stream order: A=%p freed on s1 under a 0.4 s kernel; s2 got %p after %.2f ms, s1 got "
           "%p\n",
           a, b, (double)t_b / 1e6, c);
    /* b must not overlap a: the kernel is still writing a. */
    CHECK((uintptr_t)b + size <= (uintptr_t)a || (uintptr_t)a + size <= (uintptr_t)b);
    CHECK(t_b < 200000000ull); /* no waiting for the kernel */
    CHECK(c == a);
    CHECK_EQ(g->cu->MemsetD8Async((um_cuDeviceptr)(uintptr_t)b, 0xcd, size,
                                  (um_cuStream)um_stream_native(s2)),
             UM_CU_SUCCESS);
    CHECK_OK(um_stream_synchronize(g->ctx, s1));
    CHECK_OK(um_stream_synchronize(g->ctx, s2));
    uint32_t *host = malloc(size);
    if (host) {
        CHECK_OK(um_memcpy(g->ctx, host, c, size));
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < words && bad == SIZE_MAX; i++)
            if (host[i] != 7u + (uint32_t)i)
                bad = i;
        CHECK_EQ(bad, SIZE_MAX);
        CHECK_OK(um_memcpy(g->ctx, host, b, size));
        const unsigned char *hb = (const unsigned char *)host;
        bad = SIZE_MAX;
        for (size_t i = 0; i < size && bad == SIZE_MAX; i++)
            if (hb[i] != 0xcd)
                bad = i;
        CHECK_EQ(bad, SIZE_MAX);
        free(host);
    }
    /* Once s1's work is done, s2 may have the block. */
    CHECK_OK(um_free(g->ctx, c, s1));
    CHECK_OK(um_stream_synchronize(g->ctx, s1));
    void *d = NULL;
    CHECK_OK(um_malloc(g->ctx, g->dev, size, s2, &d));
    CHECK(d == a);
    CHECK_OK(um_free(g->ctx, d, s2));
    CHECK_OK(um_free(g->ctx, b, s2));

    CHECK_OK(um_stream_destroy(g->ctx, s1));
    CHECK_OK(um_stream_destroy(g->ctx, s2));
}

/* A wrapped stream is the program's CUDA stream; destroying the wrapper
 * waits for its work (the fences recorded on it must be complete once the
 * wrapper's memory may name another stream) and leaves the stream usable. */
static void check_wrapped_stream(gpu *g)
{
    um_stream s = NULL, w = NULL;
    CHECK_OK(um_stream_create(g->ctx, g->dev, &s));
    if (!s)
        return;
    CHECK(um_stream_native(s) != NULL);
    CHECK_OK(um_stream_wrap(g->ctx, g->dev, um_stream_native(s), &w));
    CHECK(um_stream_native(w) == um_stream_native(s));
    void *e = NULL, *f = NULL;
    CHECK_OK(um_malloc(g->ctx, g->dev, 4096, w, &e));
    CHECK_OK(um_malloc(g->ctx, g->dev, 5 * MIB, w, &f));
    CHECK_OK(um_free(g->ctx, e, w));
    CHECK_OK(um_free(g->ctx, f, w));
    CHECK_OK(um_stream_destroy(g->ctx, w));
    CHECK_EQ(g->cu->StreamSynchronize((um_cuStream)um_stream_native(s)), UM_CU_SUCCESS);
    if (g->spin_fill) {
        const size_t words = MIB / 4;
        void *p = NULL;
        CHECK_OK(um_stream_wrap(g->ctx, g->dev, um_stream_native(s), &w));
        CHECK_OK(um_malloc(g->ctx, g->dev, words * 4, w, &p));
        uint64_t t0 = um__now_ns();
        CHECK(p && launch_spin_fill(g, p, words, 300000000ull, 3, w)); /* 0.3 s */
        CHECK_OK(um_free(g->ctx, p, w));
        CHECK_OK(um_stream_destroy(g->ctx, w));
        uint64_t waited = um__now_ns() - t0;
        if (waited < 250000000ull)
            harness_report(__FILE__, __LINE__,
                           "destroying a wrapper took %.3f s while its stream ran 0.3 s of work",
                           (double)waited / 1e9);
        else
            harness_checks++;
    }
    CHECK_OK(um_stream_destroy(g->ctx, s));
    /* A NULL native stream is the legacy default stream, wrapped too. */
    CHECK_OK(um_stream_wrap(g->ctx, g->dev, NULL, &w));
    CHECK(um_stream_native(w) == NULL);
    CHECK_OK(um_stream_destroy(g->ctx, w));
    /* Pinned host memory is a CUDA device too: a CUDA stream may order it. */
    um_device_info info;
    CHECK_OK(um_device_info_get(g->ctx, 0, &info));
    CHECK_STATUS(um_stream_wrap(g->ctx, 0, NULL, &w), info.pinned ? UM_OK : UM_ERR_UNSUPPORTED);
    if (info.pinned)
        CHECK_OK(um_stream_destroy(g->ctx, w));
}

static void check_memory_limit(gpu *g)
{
    CHECK_OK(um_trim(g->ctx, g->dev));
    CHECK_OK(um_set_memory_limit(g->ctx, g->dev, 256 * MIB));
    void *p[8] = {0};
    int got = 0;
    um_status st = UM_OK;
    while (got < 8 && (st = um_malloc(g->ctx, g->dev, 64 * MIB, NULL, &p[got])) == UM_OK)
        got++;
    CHECK_EQ(got, 4);
    CHECK_EQ(st, UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("limit", NULL, NULL);
    um_stats s;
    CHECK_OK(um_stats_get(g->ctx, g->dev, &s));
    CHECK(s.reserved_bytes <= 256 * MIB);
    CHECK(s.num_ooms >= 1);
    for (int i = 0; i < got; i++)
        CHECK_OK(um_free(g->ctx, p[i], NULL));
    CHECK_OK(um_set_memory_limit(g->ctx, g->dev, 0));
}

static int launch_nothing(const um_task_exec *e)
{
    (void)e;
    return 0;
}

static int wait_for_gate(const um_task_exec *e)
{
    _Atomic int *gate = e->user;
    while (!atomic_load(gate))
        usleep(1000);
    return 0;
}

/* A GPU task whose buffer cannot be had fails without running: counted as
 * failed, with no busy time and no bytes in (the time from its launch to
 * its landing was added before, and a trace span recorded, for work that
 * never ran). The GPU's limit drops under the buffer after the task is
 * submitted (submission refuses a task that cannot fit), while a host task
 * that writes the buffer holds it back. */
static void check_failed_task_not_busy(gpu *g)
{
    um_task_stats before, after;
    CHECK_OK(um_trim(g->ctx, g->dev));
    CHECK_OK(um_task_stats_get(g->ctx, g->dev, &before));
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(g->ctx, 32 * MIB, NULL, &b));
    _Atomic int gate = 0;
    um_task w = {.name = "writer", .cpu = wait_for_gate, .device = 0, .nbuffers = 1,
                 .user = &gate};
    w.buffers[0] = b;
    w.modes[0] = UM_ACCESS_WRITE_DISCARD;
    um_task t = {.name = "too_big", .cuda = launch_nothing, .device = g->dev, .nbuffers = 1};
    t.buffers[0] = b;
    t.modes[0] = UM_ACCESS_READ;
    um_task_id wid, id;
    CHECK_OK(um_task_submit(g->ctx, &w, &wid));
    CHECK_OK(um_task_submit(g->ctx, &t, &id));
    CHECK_OK(um_set_memory_limit(g->ctx, g->dev, 16 * MIB));
    atomic_store(&gate, 1);
    CHECK_OK(um_task_wait(g->ctx, wid));
    CHECK_STATUS(um_task_wait(g->ctx, id), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("could not be had", NULL, NULL);
    CHECK_OK(um_task_stats_get(g->ctx, g->dev, &after));
    CHECK_EQ(after.failed - before.failed, 1);
    CHECK_EQ(after.tasks, before.tasks);
    CHECK_EQ(after.busy_ns, before.busy_ns);
    CHECK_EQ(after.bytes_in, before.bytes_in);
    (void)um_wait_all(g->ctx); /* the failure is reported once */
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_set_memory_limit(g->ctx, g->dev, 0));
}

/* Host blocks of device 0 are pinned when a GPU is present: a round trip
 * host -> GPU -> host through asynchronous copies on one stream. */
static void check_pinned_copies(gpu *g)
{
    um_device_info info;
    CHECK_OK(um_device_info_get(g->ctx, 0, &info));
    if (!info.pinned) {
        printf("pinned copies: skipped, host memory is pageable on this driver\n");
        return;
    }
    const size_t size = 8 * MIB + 123;
    void *h1 = NULL, *h2 = NULL, *d = NULL;
    um_stream s = NULL;
    CHECK_OK(um_stream_create(g->ctx, g->dev, &s));
    CHECK_OK(um_malloc(g->ctx, 0, size, NULL, &h1));
    CHECK_OK(um_malloc(g->ctx, 0, size, NULL, &h2));
    CHECK_OK(um_malloc(g->ctx, g->dev, size, s, &d));
    if (h1 && h2 && d && s) {
        harness_pattern_fill(h1, size, 42); /* pinned host memory: the CPU writes it */
        memset(h2, 0, size);
        CHECK_OK(um_memcpy_async(g->ctx, d, h1, size, s));
        CHECK_OK(um_memcpy_async(g->ctx, h2, d, size, s));
        CHECK_OK(um_stream_synchronize(g->ctx, s));
        unsigned char got, want;
        CHECK_EQ(harness_pattern_find_bad(h2, size, 42, &got, &want), SIZE_MAX);
    }
    /* A pinned block freed on the GPU stream of the copy that fills it:
     * that stream may reuse it at once, the host's own stream only memory
     * the copy (here behind a 0.3 s kernel) can no longer write: whatever
     * the host writes into its new block must survive the copy. (The pool
     * may wait for the copy and then recycle the freed pages; what the
     * reused block holds is undefined, as after any free.) */
    const size_t words = size / 4;
    if (h1 && h2 && d && s && g->spin_fill && launch_spin_fill(g, d, words, 300000000ull, 9, s)) {
        void *x = NULL, *y = NULL;
        CHECK_OK(um_memcpy_async(g->ctx, h2, d, words * 4, s));
        CHECK_OK(um_free(g->ctx, h2, s));
        CHECK_OK(um_malloc(g->ctx, 0, size, NULL, &x));
        CHECK(x != h2);
        if (x)
            harness_pattern_fill(x, size, 77);
        CHECK_OK(um_malloc(g->ctx, 0, size, s, &y));
        CHECK(y == h2);
        CHECK_OK(um_stream_synchronize(g->ctx, s));
        unsigned char got, want;
        if (x)
            CHECK_EQ(harness_pattern_find_bad(x, size, 77, &got, &want), SIZE_MAX);
        CHECK_OK(um_free(g->ctx, x, NULL));
        h2 = y;
    }
    CHECK_OK(um_free(g->ctx, d, s));
    CHECK_OK(um_free(g->ctx, h1, NULL));
    CHECK_OK(um_free(g->ctx, h2, NULL));
    CHECK_OK(um_stream_destroy(g->ctx, s));
    /* Overlapping ranges and NULL pointers are refused with a reason. */
    CHECK_STATUS(um_memcpy(g->ctx, NULL, h1, 16), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("destination", NULL, NULL);
}

/* cuda_page_size: pages of several driver pages. A block is backed by
 * fewer, larger pages (fewer driver calls), its data survive, the driver
 * sees what the statistics say, and a size that is not a power of two at
 * least the driver's page is refused with the option's name. */
static void check_page_size(void)
{
    um_context *ctx = NULL;
    CHECK_STATUS(um_init("devices=cuda:0,cuda_page_size=3M", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("cuda_page_size", "power of two", NULL);
    CHECK(ctx == NULL);
    CHECK_STATUS(um_init("devices=cuda:0,cuda_page_size=64K", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("cuda_page_size", "granularity", NULL);
    CHECK(ctx == NULL);

    /* The calls that back one 40 MiB block on a fresh context, per page size. */
    const size_t size = 40 * MIB + 4096;
    const char *confs[3] = {"devices=cuda:0", "devices=cuda:0,cuda_page_size=8M",
                            "devices=cuda:0,large_page=8M"};
    uint64_t calls[3] = {0, 0, 0};
    unsigned char *buf = malloc(size), *back = malloc(size);
    CHECK(buf && back);
    for (int k = 0; k < 3 && buf && back; k++) {
        ctx = NULL;
        CHECK_OK(um_init(confs[k], &ctx));
        if (!ctx)
            continue;
        um_device_info info;
        CHECK_OK(um_device_info_get(ctx, 1, &info));
        if (k == 1)
            CHECK_EQ(info.granularity, 8 * MIB);
        size_t free0, free1, total;
        um_stats st;
        CHECK_OK(um_device_memory_get(ctx, 1, &free0, &total));
        CHECK_OK(um_stats_get(ctx, 1, &st));
        uint64_t before = st.num_backend_calls;
        void *p = NULL;
        CHECK_OK(um_malloc(ctx, 1, size, NULL, &p));
        CHECK_OK(um_stats_get(ctx, 1, &st));
        calls[k] = st.num_backend_calls - before;
        CHECK_OK(um_device_memory_get(ctx, 1, &free1, &total));
        CHECK_EQ(st.reserved_bytes % info.granularity, 0);
        CHECK(st.reserved_bytes >= size && st.reserved_bytes < size + 2 * info.granularity);
        double driver = (double)(free0 - free1), ours = (double)st.reserved_bytes;
        printf("%s: a %zu MiB block took %" PRIu64 " backend calls, %.1f MiB "
               "reserved, the driver's used memory grew %.1f MiB\n",
               confs[k], size / MIB, calls[k], ours / MIB, driver / MIB);
        CHECK(driver >= ours * 0.999 && driver <= ours * 1.02 + 4.0 * MIB);
        harness_pattern_fill(buf, size, 77 + (uint64_t)k);
        CHECK_OK(um_memcpy(ctx, p, buf, size));
        memset(back, 0, size);
        CHECK_OK(um_memcpy(ctx, back, p, size));
        unsigned char got, want;
        CHECK_EQ(harness_pattern_find_bad(back, size, 77 + (uint64_t)k, &got, &want), SIZE_MAX);
        CHECK_OK(um_free(ctx, p, NULL));
        CHECK_OK(um_trim(ctx, 1));
        CHECK_OK(um_stats_get(ctx, 1, &st));
        CHECK_EQ(st.reserved_bytes, 0);
        um_shutdown(ctx);
    }
    /* 21 pages of 2 MiB against 6 of 8 MiB: a create and a map each. With
     * large pages, at least four of 8 MiB and at most five single pages;
     * the trim gave the large pages back whole (the stand-in driver refuses
     * to unmap part of a mapping). */
    CHECK(calls[1] > 0 && calls[1] * 3 <= calls[0]);
    CHECK(calls[2] > 0 && calls[2] * 2 <= calls[0]);
    free(buf);
    free(back);

    /* cuMemAlloc segments have no pages: the option is ignored with a
     * warning, not an error. */
    ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0,cuda_vmm=0,cuda_page_size=8M", &ctx));
    if (ctx) {
        um_device_info info;
        CHECK_OK(um_device_info_get(ctx, 1, &info));
        CHECK_EQ(info.vmm, 0);
        CHECK_EQ(info.granularity, 2 * MIB);
        um_shutdown(ctx);
    }
}

/* cuda_vmm=0: the GPU is served from cuMemAlloc segments by the buffer
 * cache. Data survive, freed buffers are reused, the driver sees what the
 * statistics say, and a trim gives the segments back. */
static void check_segments(gpu *g)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0,cuda_vmm=0", &ctx));
    if (!ctx)
        return;
    um_device_info info;
    CHECK_OK(um_device_info_get(ctx, 1, &info));
    CHECK_EQ(info.vmm, 0);
    CHECK(strcmp(info.allocator, "bufcache") == 0);
    size_t free0, free1, free2, total;
    CHECK_OK(um_device_memory_get(ctx, 1, &free0, &total));
    enum { N = 6 };
    size_t size[N] = {1000, 64 * 1024, 3 * MIB + 5, 16 * MIB, 40 * MIB + 1, 100};
    void *p[N] = {0};
    unsigned char *buf = malloc(64 * MIB), *back = malloc(64 * MIB);
    CHECK(buf && back);
    for (int i = 0; i < N && buf; i++) {
        CHECK_OK(um_malloc(ctx, 1, size[i], NULL, &p[i]));
        harness_pattern_fill(buf, size[i], (uint64_t)i + 100);
        CHECK_OK(um_memcpy(ctx, p[i], buf, size[i]));
    }
    for (int i = 0; i < N && back; i++) {
        CHECK_OK(um_memcpy(ctx, back, p[i], size[i]));
        unsigned char got, want;
        CHECK_EQ(harness_pattern_find_bad(back, size[i], (uint64_t)i + 100, &got, &want),
                 SIZE_MAX);
    }
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_OK(um_device_memory_get(ctx, 1, &free1, &total));
    printf("segments: %zu KiB reserved by the buffer cache, the driver's used memory grew %zu "
           "KiB\n",
           st.reserved_bytes >> 10, (free0 - free1) >> 10);
    /* cuMemAlloc rounds to its own granularity: allow 2 MiB per segment. */
    CHECK(free0 - free1 >= st.reserved_bytes && free0 - free1 <= st.reserved_bytes + N * 2 * MIB);
    /* A freed 16 MiB buffer serves the next 16 MiB request without a driver call. */
    void *again = NULL;
    CHECK_OK(um_free(ctx, p[3], NULL));
    uint64_t calls = st.num_backend_calls;
    CHECK_OK(um_malloc(ctx, 1, 16 * MIB, NULL, &again));
    CHECK(again == p[3]);
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK(st.num_backend_calls - calls <= 3); /* at most an event record, query and destroy */
    p[3] = again;
    for (int i = 0; i < N; i++)
        CHECK_OK(um_free(ctx, p[i], NULL));
    CHECK_OK(um_trim(ctx, 1));
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, 0);
    CHECK_OK(um_device_memory_get(ctx, 1, &free2, &total));
    CHECK(free2 + 2 * MIB >= free0);
    free(buf);
    free(back);
    um_shutdown(ctx);
    UM_UNUSED(g);
}

/* ------------------------------------------------ two GPUs: buffers, tasks */

/* The cost in ns the transfer engine reckons for n bytes from `from` to
 * `to`: the link figures it picks sources and write-back targets by
 * (measured, read from the link cache, or the model), as
 * um_link_stats_get reports them. */
static double link_cost(um_context *ctx, int from, int to, size_t n)
{
    um_link_stats ls;
    CHECK_OK(um_link_stats_get(ctx, from, to, &ls));
    return ls.bandwidth_gbps > 0 ? ls.latency_us * 1000.0 + (double)n / ls.bandwidth_gbps : 1e300;
}

/* Device a or b, whichever costs less; -1 when the two are within 1% of
 * each other (the engine, which does the same sums from unrounded
 * figures, may then take either). */
static int cheaper(double cost_a, int a, double cost_b, int b)
{
    if (cost_a < cost_b * 0.99)
        return a;
    if (cost_b < cost_a * 0.99)
        return b;
    return -1;
}

/* Bytes copied so far on every link of a context of the host and two GPUs. */
typedef struct links3 {
    uint64_t bytes[3][3];
} links3;

static links3 links_now(um_context *ctx)
{
    links3 l;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) {
            um_link_stats ls = {0};
            CHECK_OK(um_link_stats_get(ctx, i, j, &ls));
            l.bytes[i][j] = ls.bytes;
        }
    }
    return l;
}

/* Bytes copied from `from` to `to` since `base`. */
static uint64_t copied_since(um_context *ctx, const links3 *base, int from, int to)
{
    return links_now(ctx).bytes[from][to] - base->bytes[from][to];
}

static void check_replicas(um_buffer *b, um_replica_state host, um_replica_state gpu1,
                           um_replica_state gpu2, int line)
{
    um_replica_state want[3] = {host, gpu1, gpu2};
    for (int d = 0; d < 3; d++) {
        um_replica_state got = um_buffer_replica_state(b, d);
        harness_checks++;
        if (got != want[d])
            harness_report(__FILE__, line, "replica on device %d is %s, the protocol says %s", d,
                           um_replica_state_name(got), um_replica_state_name(want[d]));
    }
}
#define CHECK_REPLICAS(b, host, gpu1, gpu2)                                                   \
    check_replicas((b), UM_REPLICA_##host, UM_REPLICA_##gpu1, UM_REPLICA_##gpu2, __LINE__)

/* Whether n bytes at got are those at want; prints the first that is not. */
static bool same_bytes(const void *got, const void *want, size_t n, const char *what)
{
    const unsigned char *g = got, *w = want;
    if (memcmp(g, w, n) == 0)
        return true;
    size_t i = 0;
    while (g[i] == w[i])
        i++;
    fprintf(stderr, "%s: byte %zu of %zu is 0x%02x, not 0x%02x\n", what, i, n, g[i], w[i]);
    return false;
}

/* Whether device memory at dptr holds the n bytes at want: copied out
 * with um_memcpy (on the default stream of its device, where an
 * acquisition with a NULL stream makes the data ready) into scratch. */
static bool device_holds(um_context *ctx, const void *dptr, const void *want, size_t n,
                         void *scratch, const char *what)
{
    if (um_memcpy(ctx, scratch, dptr, n) != UM_OK) {
        fprintf(stderr, "%s: um_memcpy out of %p failed: %s\n", what, dptr, um_last_error());
        return false;
    }
    return same_bytes(scratch, want, n, what);
}

/* Coherence across GPUs, step by step: written on the host; acquired for
 * writing on GPU 1 (copied in) and changed there, by a kernel where there
 * is one; read on GPU 2 (one copy over the 1 -> 2 link); written on GPU 2
 * (no copy: its replica is valid); read on the host; read again on GPU 1,
 * whose stale replica is refreshed from the cheaper valid one. After every
 * step: every byte (copied out, never read in place), every replica's
 * state, and the bytes on every link. */
static void check_coherence_across_gpus(gpu *g)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0+cuda:1", &ctx));
    if (!ctx)
        return;
    um_link_info link;
    CHECK_OK(um_device_link_get(ctx, 1, 2, &link));
    const size_t words = (3u << 20) + 5, n = words * 4;
    uint32_t *want = malloc(n), *gpu1_data = malloc(n);
    unsigned char *out = malloc(n);
    um_buffer *b = NULL;
    um_stream s1 = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    CHECK_OK(um_stream_create(ctx, 1, &s1));
    if (!want || !gpu1_data || !out || !b || !s1) {
        harness_report(__FILE__, __LINE__, "coherence: no memory for %zu bytes", n);
        um_shutdown(ctx);
        free(want);
        free(gpu1_data);
        free(out);
        return;
    }

    /* On the host: its replica is the owner. */
    harness_pattern_fill(want, n, 501);
    CHECK_OK(um_buffer_write(b, 0, want, n));
    CHECK_REPLICAS(b, OWNER, INVALID, INVALID);
    links3 base = links_now(ctx);

    /* For writing on GPU 1, on stream s1: copied in from the host, which
     * goes invalid. What arrived is copied out on s1, then every word i
     * becomes 0x1000 + i (the kernel; a copy where the driver runs none). */
    void *p1 = NULL;
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ_WRITE, s1, &p1));
    CHECK_REPLICAS(b, INVALID, OWNER, INVALID);
    CHECK_EQ(copied_since(ctx, &base, 0, 1), n);
    for (size_t i = 0; i < words; i++)
        gpu1_data[i] = 0x1000u + (uint32_t)i;
    if (p1) {
        CHECK_OK(um_memcpy_async(ctx, out, p1, n, s1));
        CHECK_OK(um_stream_synchronize(ctx, s1));
        CHECK(same_bytes(out, want, n, "GPU 1 after the copy in"));
        if (g->spin_fill)
            CHECK(launch_spin_fill(g, p1, words, 0, 0x1000u, s1));
        else
            CHECK_OK(um_memcpy_async(ctx, p1, gpu1_data, n, s1));
    }
    /* No synchronisation: the release on s1 alone orders what follows. */
    CHECK_OK(um_buffer_release(b, 1, s1));
    memcpy(want, gpu1_data, n);

    /* Read on GPU 2: one copy over the 1 -> 2 link (peer to peer where the
     * driver reports peer access, else in two hops through the host,
     * which count on that link too); GPU 1 stays the owner. */
    void *p2 = NULL;
    CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_READ, NULL, &p2));
    CHECK_REPLICAS(b, INVALID, OWNER, SHARED);
    CHECK_EQ(copied_since(ctx, &base, 1, 2), n);
    CHECK_EQ(copied_since(ctx, &base, 0, 2), 0);
    CHECK(p2 && device_holds(ctx, p2, want, n, out, "GPU 2 reading GPU 1's data"));
    CHECK_OK(um_buffer_release(b, 2, NULL));

    /* Written on GPU 2: nothing is copied (its replica is valid), it
     * becomes the owner and GPU 1's copy goes stale. A middle range
     * changes; the rest keeps GPU 1's data. */
    CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_WRITE, NULL, &p2));
    CHECK_REPLICAS(b, INVALID, INVALID, OWNER);
    const size_t off = words / 3, len = words / 4;
    for (size_t i = off; i < off + len; i++)
        want[i] = 0xc0de0000u ^ (uint32_t)i;
    if (p2)
        CHECK_OK(um_memcpy(ctx, (uint32_t *)p2 + off, want + off, len * 4));
    CHECK_OK(um_buffer_release(b, 2, NULL));
    CHECK_EQ(copied_since(ctx, &base, 1, 2), n);
    CHECK_EQ(copied_since(ctx, &base, 2, 1), 0);

    /* Read on the host, from GPU 2 (the only valid replica): first into
     * program memory, then into the host's own replica, read in place. */
    memset(out, 0, n);
    CHECK_OK(um_buffer_read(b, 0, out, n));
    CHECK(same_bytes(out, want, n, "um_buffer_read after GPU 2's write"));
    CHECK_EQ(copied_since(ctx, &base, 2, 0), n);
    void *h = NULL;
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &h));
    CHECK(h && same_bytes(h, want, n, "the host's replica after GPU 2's write"));
    CHECK_OK(um_buffer_release(b, 0, NULL));
    CHECK_REPLICAS(b, SHARED, INVALID, OWNER);
    CHECK_EQ(copied_since(ctx, &base, 2, 0), 2 * n);
    CHECK_EQ(copied_since(ctx, &base, 1, 0), 0);

    /* Read again on GPU 1: from the valid replica with the cheaper link
     * to it (GPU 2 over the peer link, or the host), by the engine's
     * figures. */
    int src = cheaper(link_cost(ctx, 0, 1, n), 0, link_cost(ctx, 2, 1, n), 2);
    links3 before = links_now(ctx);
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ, s1, &p1));
    uint64_t from_host = copied_since(ctx, &before, 0, 1),
             from_gpu2 = copied_since(ctx, &before, 2, 1);
    CHECK_EQ(from_host + from_gpu2, n);
    if (src >= 0)
        CHECK_EQ(src == 0 ? from_host : from_gpu2, n);
    CHECK_REPLICAS(b, SHARED, SHARED, OWNER);
    if (p1) {
        CHECK_OK(um_memcpy_async(ctx, out, p1, n, s1));
        CHECK_OK(um_stream_synchronize(ctx, s1));
        CHECK(same_bytes(out, want, n, "GPU 1 after the refresh"));
    }
    CHECK_OK(um_buffer_release(b, 1, s1));
    printf("two GPUs: coherence: host -> GPU 1 (%s) -> GPU 2 -> host -> GPU 1, %zu bytes, peer "
           "access %d: every byte right; GPU 1 refreshed from %s\n",
           g->spin_fill ? "kernel" : "copy", n, link.peer_access,
           from_gpu2 ? "GPU 2" : "the host");
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_stream_destroy(ctx, s1));
    free(want);
    free(gpu1_data);
    free(out);
    um_shutdown(ctx);
}

/* Whether option peer_copies is on in ctx. */
static bool peer_copies_on(um_context *ctx)
{
    for (int i = 0; i < um_option_count(); i++) {
        um_option_info o;
        char v[32] = "";
        if (um_option_get(i, &o) == UM_OK && !strcmp(o.name, "peer_copies"))
            return um_option_current(ctx, i, v, sizeof v) == UM_OK && strcmp(v, "0") != 0;
    }
    return true;
}

/* Eviction from one GPU to another with room: GPU 1, limited to four
 * 2 MiB buffers, holds the only valid copy of each; two more buffers
 * written there make reclaim evict two. Each evicted buffer's data must
 * go to the cheapest target by the engine's link figures, which is GPU 2
 * (plenty of room) where the peer link beats the host's (always with
 * links=model: 400 GB/s against 50), and every byte must survive.
 * `links`: the links option. */
static void check_eviction_to_peer(const char *links)
{
    enum { OLD = 4, NEW = 2 };
    const size_t size = (size_t)2 << 20;
    char conf[160];
    /* No background reclaimer (high mark at 100%): every eviction is one
     * an allocation at the limit asked for, so the counts are exact. */
    snprintf(conf, sizeof conf,
             "devices=cuda:0+cuda:1,watermark_high=100,watermark_low=100,links=%s", links);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    /* The link figures (measured now, before GPU 1 is limited) and the
     * write-back target they make cheapest. */
    int target = cheaper(link_cost(ctx, 1, 0, size), 0, link_cost(ctx, 1, 2, size), 2);
    um_link_info li;
    CHECK_OK(um_device_link_get(ctx, 1, 2, &li));
    /* Without peer copies (UNIMEM_CONF=peer_copies=0) the copy to GPU 2
     * crosses the host link twice, so the host is cheaper. */
    if (!strcmp(links, "model") && li.peer_access)
        CHECK_EQ(target, peer_copies_on(ctx) ? 2 : 0);
    CHECK_OK(um_set_memory_limit(ctx, 1, OLD * size));
    unsigned char *h = malloc(size);
    um_buffer *b[OLD + NEW] = {0};
    links3 base = {{{0}}};
    for (int i = 0; i < OLD + NEW && h; i++) {
        if (i == OLD) {
            /* GPU 1 is full of the only copies, and nothing was evicted. */
            um_reclaim_stats rs;
            CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
            CHECK_EQ(rs.evictions, 0);
            base = links_now(ctx);
        }
        void *p = NULL;
        CHECK_OK(um_buffer_create(ctx, size, NULL, &b[i]));
        CHECK_OK(um_buffer_acquire(b[i], 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
        harness_pattern_fill(h, size, 600 + (uint64_t)i);
        if (p)
            CHECK_OK(um_memcpy(ctx, p, h, size));
        CHECK_OK(um_buffer_release(b[i], 1, NULL));
        CHECK_REPLICAS(b[i], INVALID, OWNER, INVALID);
    }
    um_reclaim_stats rs, rs2;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_OK(um_reclaim_stats_get(ctx, 2, &rs2));
    int evicted = 0;
    for (int i = 0; i < OLD + NEW && h; i++) {
        if (um_buffer_replica_state(b[i], 1) != UM_REPLICA_INVALID) {
            CHECK_EQ(um_buffer_replica_state(b[i], 1), UM_REPLICA_OWNER);
            continue;
        }
        /* Written back, then dropped: the copy it went to is the owner. */
        evicted++;
        um_replica_state on_host = um_buffer_replica_state(b[i], 0),
                         on_gpu2 = um_buffer_replica_state(b[i], 2);
        if (target == 2)
            CHECK_REPLICAS(b[i], INVALID, INVALID, OWNER);
        else if (target == 0)
            CHECK_REPLICAS(b[i], OWNER, INVALID, INVALID);
        else
            CHECK((on_host == UM_REPLICA_OWNER) != (on_gpu2 == UM_REPLICA_OWNER));
    }
    /* Exactly two were needed; a pool that could not yet reuse an
     * evicted replica's memory (its copy out still running) evicts one
     * more rather than wait, which a real GPU may do. */
    CHECK(evicted >= NEW);
    if (getenv("UM_TEST_FAKE_CUDA"))
        CHECK_EQ(evicted, NEW);
    CHECK_EQ(rs.evictions, (uint64_t)evicted);
    CHECK_EQ(rs.written_back, rs.evictions);
    CHECK_EQ(rs.written_back_bytes, rs.evictions * size);
    CHECK_EQ(rs.spilled, 0);
    CHECK_EQ(rs.failed, 0);
    CHECK(rs.sync_reclaims >= NEW);
    CHECK_EQ(rs2.evictions, 0);
    uint64_t to_gpu2 = copied_since(ctx, &base, 1, 2), to_host = copied_since(ctx, &base, 1, 0);
    CHECK_EQ(to_gpu2 + to_host, (uint64_t)evicted * size);
    if (target >= 0)
        CHECK_EQ(target == 2 ? to_gpu2 : to_host, (uint64_t)evicted * size);
    /* Every byte, wherever it lives now. */
    unsigned char *back = malloc(size);
    int wrong = 0;
    for (int i = 0; i < OLD + NEW && h && back; i++) {
        CHECK_OK(um_buffer_read(b[i], 0, back, size));
        unsigned char got, want;
        wrong += harness_pattern_find_bad(back, size, 600 + (uint64_t)i, &got, &want) != SIZE_MAX;
    }
    CHECK_EQ(wrong, 0);
    printf("two GPUs: eviction (links=%s): GPU 1 at %d x 2 MiB evicted %d buffers, %.1f MiB "
           "written back to GPU 2 and %.1f MiB to the host (cheapest: %s); %d wrong\n",
           links, OLD, evicted, (double)to_gpu2 / (1 << 20), (double)to_host / (1 << 20),
           target == 2 ? "GPU 2" : target == 0 ? "the host" : "a tie", wrong);
    for (int i = 0; i < OLD + NEW; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    free(back);
    free(h);
    um_shutdown(ctx);
}

/* Tasks placed across two GPUs (sched=cost). Each task has only a GPU
 * implementation, so the host never takes one. It records where it ran
 * and queues a copy of its own pattern into its buffer on the task's
 * stream (GPU work, ordered by the stream; the host never touches the
 * GPU's memory), then keeps its device's worker busy for 1 ms, so that
 * both GPUs' measured times stand for the same load whatever the copies
 * cost. */
typedef struct place_job {
    um_context *ctx;
    const unsigned char *src;
    _Atomic int device;
} place_job;

static int copy_on_gpu(const um_task_exec *e)
{
    place_job *j = e->user;
    atomic_store(&j->device, e->device);
    um_stream s = NULL;
    um_status st = um_stream_wrap(j->ctx, e->device, e->stream, &s);
    if (st == UM_OK)
        st = um_memcpy_async(j->ctx, e->ptrs[0], j->src, e->sizes[0], s);
    if (s)
        (void)um_stream_destroy(j->ctx, s); /* the wrapper only: the copy stays queued */
    if (st != UM_OK)
        fprintf(stderr, "copy_on_gpu: %s\n", um_last_error());
    usleep(1000);
    return st != UM_OK;
}

/* The same on the host. */
static int copy_on_host(const um_task_exec *e)
{
    place_job *j = e->user;
    atomic_store(&j->device, e->device);
    memcpy(e->ptrs[0], j->src, e->sizes[0]);
    return 0;
}

/* Submits ntasks tasks, task k writing its pattern into its own buffer
 * on a GPU (and, given flops, on the host too: the task then has a cpu
 * implementation), waits, and checks every buffer and where it ran:
 * per_device gets the tasks each device ran by what they reported, which
 * must be what um_task_stats_get counts. */
static void run_tasks(um_context *ctx, int ntasks, size_t size, double cpu_flops,
                      int per_device[3])
{
    um_buffer **b = calloc((size_t)ntasks, sizeof *b);
    place_job *jobs = calloc((size_t)ntasks, sizeof *jobs);
    unsigned char *src = malloc((size_t)ntasks * size), *back = malloc(size);
    CHECK(b && jobs && src && back);
    if (!b || !jobs || !src || !back) {
        free(b);
        free(jobs);
        free(src);
        free(back);
        return;
    }
    for (int k = 0; k < ntasks; k++) {
        jobs[k].ctx = ctx;
        jobs[k].src = src + (size_t)k * size;
        atomic_init(&jobs[k].device, -1);
        harness_pattern_fill(src + (size_t)k * size, size, 700 + (uint64_t)k);
        CHECK_OK(um_buffer_create(ctx, size, NULL, &b[k]));
        um_task t = {0};
        t.name = "copy_pattern";
        t.cuda = copy_on_gpu;
        t.cpu = cpu_flops > 0 ? copy_on_host : NULL;
        t.nbuffers = 1;
        t.buffers[0] = b[k];
        t.modes[0] = UM_ACCESS_WRITE_DISCARD;
        t.flops = cpu_flops > 0 ? cpu_flops : 1e6;
        t.device = -1;
        t.user = &jobs[k];
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
    }
    CHECK_OK(um_wait_all(ctx));
    per_device[0] = per_device[1] = per_device[2] = 0;
    int wrong = 0;
    for (int k = 0; k < ntasks; k++) {
        int d = atomic_load(&jobs[k].device);
        CHECK(d == 1 || d == 2 || (cpu_flops > 0 && d == 0));
        if (d < 0 || d > 2)
            continue;
        per_device[d]++;
        /* The task's write made its GPU's replica the owner. */
        CHECK_EQ(um_buffer_replica_state(b[k], d), UM_REPLICA_OWNER);
        CHECK_OK(um_buffer_read(b[k], 0, back, size));
        unsigned char got, want;
        wrong += harness_pattern_find_bad(back, size, 700 + (uint64_t)k, &got, &want) != SIZE_MAX;
    }
    CHECK_EQ(wrong, 0);
    for (int d = 0; d < 3; d++) {
        um_task_stats ts;
        CHECK_OK(um_task_stats_get(ctx, d, &ts));
        CHECK_EQ(ts.tasks, (uint64_t)per_device[d]);
        CHECK_EQ(ts.failed, 0);
    }
    for (int k = 0; k < ntasks; k++)
        CHECK_OK(um_buffer_destroy(b[k]));
    free(b);
    free(jobs);
    free(src);
    free(back);
}

static void run_placed_tasks(um_context *ctx, int ntasks, size_t size, int per_device[3])
{
    run_tasks(ctx, ntasks, size, 0.0, per_device);
}

/* Placement by load: 64 independent tasks of the same kind and size on
 * two idle GPUs of the same kind; each GPU takes at least a quarter.
 * Placement by free memory: with GPU 1 limited below a task's working
 * set and GPU 2 with room, every task runs on GPU 2. */
static void check_placement_across_gpus(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0+cuda:1,sched=cost,links=model", &ctx));
    if (!ctx)
        return;
    enum { TASKS = 64 };
    int ran[3];
    run_placed_tasks(ctx, TASKS, (size_t)256 << 10, ran);
    CHECK_EQ(ran[0], 0);
    CHECK_EQ(ran[1] + ran[2], TASKS);
    CHECK(ran[1] >= TASKS / 4);
    CHECK(ran[2] >= TASKS / 4);
    printf("two GPUs: placement by load: %d tasks ran %d on GPU 1, %d on GPU 2\n", TASKS, ran[1],
           ran[2]);
    um_shutdown(ctx);

    ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0+cuda:1,sched=cost,links=model", &ctx));
    if (!ctx)
        return;
    /* A task's working set is one 4 MiB buffer; GPU 1 may hold 2 MiB. */
    CHECK_OK(um_set_memory_limit(ctx, 1, (size_t)2 << 20));
    run_placed_tasks(ctx, 16, (size_t)4 << 20, ran);
    CHECK_EQ(ran[1], 0);
    CHECK_EQ(ran[2], 16);
    printf("two GPUs: placement by free memory: GPU 1 limited to 2 MiB, 16 tasks of 4 MiB ran %d "
           "on GPU 1, %d on GPU 2\n", ran[1], ran[2]);
    um_shutdown(ctx);

    /* Placement by speed before any measurement: tasks of 1 TFLOP that
     * could run on the host (tens of times slower than a GPU by the
     * devices' nominal rates, the pinned host memory's backend included)
     * go to the GPUs; none is handed to the host to measure it. */
    ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0+cuda:1,sched=cost,links=model", &ctx));
    if (!ctx)
        return;
    run_tasks(ctx, 16, (size_t)256 << 10, 1e12, ran);
    CHECK_EQ(ran[0], 0);
    CHECK_EQ(ran[1] + ran[2], 16);
    printf("two GPUs: placement by speed: 16 tasks of 1 TFLOP with a host implementation ran %d on "
           "the host, %d and %d on the GPUs\n", ran[0], ran[1], ran[2]);
    um_shutdown(ctx);
}

/* Every GPU in one context (run where the driver reports two or more, as
 * the stand-in driver does with FAKE_CUDA_GPUS=2): each is a device with
 * its own pool, the link between them is what the driver reports, and a
 * copy from one GPU's block to another's (peer where the driver allows)
 * keeps every byte. Then buffers and tasks on the first two GPUs. */
static void check_two_gpus(gpu *g, int gpus)
{
    if (gpus < 2) {
        printf("two GPUs: skipped, the driver reports %d\n", gpus);
        return;
    }
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda", &ctx));
    if (!ctx)
        return;
    CHECK_EQ(um_device_count(ctx), 1 + gpus);
    um_link_info l;
    CHECK_OK(um_device_link_get(ctx, 1, 2, &l));
    printf("two GPUs: link 1 -> 2: peer access %d, rank %d, atomics %d\n", l.peer_access,
           l.performance_rank, l.native_atomics);
    const size_t n = 6 * MIB + 300;
    void *a = NULL, *b = NULL;
    unsigned char *h = malloc(n);
    CHECK_OK(um_malloc(ctx, 1, n, NULL, &a));
    CHECK_OK(um_malloc(ctx, 2, n, NULL, &b));
    CHECK_EQ(um_pointer_device(ctx, a), 1);
    CHECK_EQ(um_pointer_device(ctx, b), 2);
    if (a && b && h) {
        harness_pattern_fill(h, n, 77);
        CHECK_OK(um_memcpy(ctx, a, h, n));
        CHECK_OK(um_memcpy(ctx, b, a, n));
        memset(h, 0, n);
        CHECK_OK(um_memcpy(ctx, h, b, n));
        unsigned char got, want;
        CHECK_EQ(harness_pattern_find_bad(h, n, 77, &got, &want), SIZE_MAX);
    }
    /* A stream of GPU 1 cannot order GPU 2's memory. */
    um_stream s = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s));
    CHECK_STATUS(um_free(ctx, b, s), UM_ERR_WRONG_DEVICE);
    CHECK_OK(um_stream_destroy(ctx, s));
    CHECK_OK(um_free(ctx, a, NULL));
    CHECK_OK(um_free(ctx, b, NULL));
    free(h);
    um_shutdown(ctx);

    /* Unified buffers and tasks on the first two GPUs. */
    check_coherence_across_gpus(g);
    check_eviction_to_peer("model");
    check_eviction_to_peer("measure");
    check_placement_across_gpus();
}

/* Unified buffers on the GPU: round trips host -> GPU -> host from 1 byte
 * to 4 GiB, odd sizes and offsets, through the pinned host replica and
 * through the program's pageable memory (staged). Device memory is only
 * read back through copies. */
static void check_buffer_round_trips(gpu *g, bool fake)
{
    static const size_t sizes[] = {1, 3, 4095, 65537, (1u << 20) + 1, (64u << 20) + 7,
                                   ((size_t)1 << 30) + 3, (size_t)4 << 30};
    size_t nsizes = fake ? 6 : sizeof sizes / sizeof sizes[0];
    for (size_t k = 0; k < nsizes; k++) {
        size_t n = sizes[k];
        unsigned char *src = malloc(n), *out = malloc(n);
        if (!src || !out) {
            free(src);
            free(out);
            printf("test_cuda: no host memory for the %zu-byte round trip: skipped\n", n);
            continue;
        }
        harness_pattern_fill(src, n, 100 + k);
        um_buffer *b = NULL;
        CHECK_OK(um_buffer_create(g->ctx, n, NULL, &b));
        if (!b) {
            free(src);
            free(out);
            continue;
        }
        uint64_t t0 = um__now_ns();
        CHECK_OK(um_buffer_write(b, 0, src, n)); /* a new buffer: the host replica */
        void *p = NULL;
        CHECK_OK(um_buffer_acquire(b, g->dev, UM_ACCESS_READ_WRITE, NULL, &p)); /* host -> GPU */
        CHECK_OK(um_buffer_release(b, g->dev, NULL));
        CHECK_EQ(um_buffer_replica_state(b, 0), UM_REPLICA_INVALID);
        memset(out, 0, n);
        CHECK_OK(um_buffer_read(b, 0, out, n)); /* GPU -> program memory */
        uint64_t t1 = um__now_ns();
        CHECK(memcmp(out, src, n) == 0);
        size_t off = n / 3 | 1, len = n - off - (n > 8 ? 5 : 0);
        if (off < n && len) {
            CHECK_OK(um_buffer_read(b, off, out, len));
            CHECK(memcmp(out, src + off, len) == 0);
            /* A write at an odd offset lands in the GPU's replica. */
            harness_pattern_fill(out, len, 200 + k);
            CHECK_OK(um_buffer_write(b, off, out, len));
            memcpy(src + off, out, len);
            CHECK_EQ(um_buffer_replica_state(b, g->dev), UM_REPLICA_OWNER);
        }
        /* GPU -> the pinned host replica, read there directly. */
        CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &p));
        CHECK(p && memcmp(p, src, n) == 0);
        CHECK_OK(um_buffer_release(b, 0, NULL));
        CHECK_OK(um_buffer_destroy(b));
        if (n >= (64u << 20))
            printf("test_cuda: buffer round trip of %zu bytes: %.1f ms (write, to GPU, read)\n", n,
                   (double)(t1 - t0) / 1e6);
        free(src);
        free(out);
    }
}

/* A kernel writes a buffer on a stream of the program's; the release on
 * that stream is all that orders later copies after the kernel. */
/* The busy time of the GPU's link to the host so far. */
static uint64_t gpu_to_host_busy(gpu *g)
{
    um_link_stats st = {0};
    CHECK_OK(um_link_stats_get(g->ctx, g->dev, 0, &st));
    return st.busy_ns;
}

/* Each read below waits 0.3 s for a kernel before its copy of 4 MiB (well
 * under 10 ms) runs; the link counts the copy, not the wait. */
static void check_busy_after_kernel(uint64_t before, uint64_t after, const char *what)
{
    uint64_t busy = after - before;
    printf("test_cuda: %s after a 300 ms kernel: the link to the host was busy %.3f ms\n", what,
           (double)busy / 1e6);
    CHECK(busy < 100000000ull);
}

/* A timed event's time on the host's clock (event_time, which places the
 * copies of a trace), against the host's clock around it: events before
 * the backend's anchor and after it, and one behind a 200 ms kernel,
 * which completes when the kernel ends, not when it was recorded. */
static void check_event_time(gpu *g)
{
    um__backend *b = NULL;
    CHECK_OK(um__cuda_backend_create(0, 1, 0, &b));
    if (!b)
        return;
    /* Launch latency, and a busy host (a sanitizer's build, two CPUs for
     * the whole suite), which may deschedule the thread at any step. */
    const uint64_t slack = 5000000;
    uint64_t t0 = um__now_ns(), at = 0;
    um__bevent *e0 = NULL, *e1 = NULL, *e2 = NULL;
    CHECK_OK(um__be_event_record_timed(b, NULL, &e0));
    CHECK_OK(um__be_event_sync(b, e0));
    void *p = NULL;
    uint64_t t1 = 0, t2 = 0;
    if (g->spin_fill) {
        CHECK_OK(um_malloc(g->ctx, g->dev, 4096 * 4, NULL, &p));
        CHECK(p && launch_spin_fill(g, p, 4096, 200000000ull, 3, NULL));
        CHECK_OK(um__be_event_record_timed(b, NULL, &e1));
        t1 = um__now_ns();
        CHECK_OK(um__be_event_sync(b, e1));
        t2 = um__now_ns();
    }
    /* The anchor is made now, after them. */
    CHECK_OK(um__be_event_time(b, e0, &at));
    printf("test_cuda: event_time: an event %.3f ms after it was recorded\n",
           ((double)at - (double)t0) / 1e6);
    CHECK(at + slack >= t0 && at <= t0 + slack);
    if (e1) {
        CHECK_OK(um__be_event_time(b, e1, &at));
        printf("test_cuda: event_time: behind a 200 ms kernel, %.3f ms after its record, "
               "%.3f ms before its wait ended\n",
               ((double)at - (double)t1) / 1e6, ((double)t2 - (double)at) / 1e6);
        CHECK(at >= t1 + 150000000ull && at <= t2 + slack);
    }
    uint64_t t3 = um__now_ns();
    CHECK_OK(um__be_event_record_timed(b, NULL, &e2));
    CHECK_OK(um__be_event_sync(b, e2));
    CHECK_OK(um__be_event_time(b, e2, &at));
    CHECK(at + slack >= t3 && at <= um__now_ns() + slack);
    um__be_event_destroy_timed(b, e0);
    if (e1)
        um__be_event_destroy_timed(b, e1);
    um__be_event_destroy_timed(b, e2);
    if (p)
        CHECK_OK(um_free(g->ctx, p, NULL));
    um__backend_destroy(b);
}

static void check_buffer_stream_order(gpu *g)
{
    const size_t words = 1u << 20, n = words * 4;
    um_stream s;
    CHECK_OK(um_stream_create(g->ctx, g->dev, &s));
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(g->ctx, n, NULL, &b));
    void *p = NULL;
    CHECK_OK(um_buffer_acquire(b, g->dev, UM_ACCESS_WRITE_DISCARD, s, &p));
    CHECK(p && launch_spin_fill(g, p, words, 300000000ull, 5, s)); /* 0.3 s, then fill */
    CHECK_OK(um_buffer_release(b, g->dev, s));
    uint32_t *out = malloc(n);
    uint64_t busy0 = gpu_to_host_busy(g);
    CHECK_OK(um_buffer_read(b, 0, out, n)); /* program memory: staged */
    check_busy_after_kernel(busy0, gpu_to_host_busy(g), "a read into program memory");
    size_t bad = 0;
    for (size_t i = 0; i < words; i++)
        bad += out[i] != 5 + (uint32_t)i;
    CHECK_EQ(bad, 0);
    /* Again into the host replica, for a read acquisition there. */
    CHECK_OK(um_buffer_acquire(b, g->dev, UM_ACCESS_WRITE, s, &p));
    CHECK(p && launch_spin_fill(g, p, words, 300000000ull, 9, s));
    CHECK_OK(um_buffer_release(b, g->dev, s));
    uint32_t *h = NULL;
    busy0 = gpu_to_host_busy(g);
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, (void **)&h)); /* on a copy stream */
    check_busy_after_kernel(busy0, gpu_to_host_busy(g), "a copy into the host's replica");
    bad = 0;
    for (size_t i = 0; h && i < words; i++)
        bad += h[i] != 9 + (uint32_t)i;
    CHECK_EQ(bad, 0);
    CHECK_OK(um_buffer_release(b, 0, NULL));
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_stream_destroy(g->ctx, s));
    free(out);
}

/* Tasks across the host and the GPU: a kernel fills a buffer, the host
 * adds 1 to every word, a kernel fills it again, the host checks; each
 * step waits for the one before through the buffer's access modes. */
typedef struct fill_job {
    gpu *g;
    uint32_t v;
    _Atomic size_t bad;
    _Atomic int device;
} fill_job;

static int fill_on_gpu(const um_task_exec *e)
{
    fill_job *j = e->user;
    atomic_store(&j->device, e->device);
    unsigned long long dp = (unsigned long long)(uintptr_t)e->ptrs[0];
    unsigned long long n = e->sizes[0] / 4, wait = 20000000ull;
    uint32_t v = j->v;
    void *params[] = {&dp, &n, &wait, &v};
    return j->g->cu->LaunchKernel(j->g->spin_fill, 264, 1, 1, 256, 1, 1, 0,
                                  (um_cuStream)e->stream, params, NULL) != UM_CU_SUCCESS;
}

static int add_one_on_host(const um_task_exec *e)
{
    fill_job *j = e->user;
    atomic_store(&j->device, e->device);
    uint32_t *w = e->ptrs[0];
    for (size_t i = 0; i < e->sizes[0] / 4; i++)
        w[i] += 1;
    return 0;
}

static int check_on_host(const um_task_exec *e)
{
    fill_job *j = e->user;
    atomic_store(&j->device, e->device);
    const uint32_t *w = e->ptrs[0];
    size_t bad = 0;
    for (size_t i = 0; i < e->sizes[0] / 4; i++)
        bad += w[i] != j->v + (uint32_t)i;
    atomic_store(&j->bad, bad);
    return bad != 0;
}

static void check_tasks(gpu *g)
{
    const size_t words = 4u << 20;
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(g->ctx, words * 4, NULL, &b));
    fill_job f1 = {g, 3, 0, -1}, add = {g, 0, 0, -1}, c1 = {g, 4, 0, -1}, f2 = {g, 100, 0, -1},
             c2 = {g, 100, 0, -1};
    struct step {
        um_task_fn cpu, cuda;
        um_access mode;
        fill_job *job;
    } steps[] = {{NULL, fill_on_gpu, UM_ACCESS_WRITE_DISCARD, &f1},
                 {add_one_on_host, NULL, UM_ACCESS_READ_WRITE, &add},
                 {check_on_host, NULL, UM_ACCESS_READ, &c1},
                 {NULL, fill_on_gpu, UM_ACCESS_WRITE, &f2},
                 {check_on_host, NULL, UM_ACCESS_READ, &c2}};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        um_task t = {0};
        t.name = steps[k].cuda ? "fill" : "host";
        t.cpu = steps[k].cpu;
        t.cuda = steps[k].cuda;
        t.nbuffers = 1;
        t.buffers[0] = b;
        t.modes[0] = steps[k].mode;
        t.device = -1;
        t.user = steps[k].job;
        um_task_id id;
        CHECK_OK(um_task_submit(g->ctx, &t, &id));
    }
    CHECK_OK(um_wait_all(g->ctx));
    CHECK_EQ(atomic_load(&f1.device), g->dev);
    CHECK_EQ(atomic_load(&add.device), 0);
    CHECK_EQ(atomic_load(&c1.bad), 0);
    CHECK_EQ(atomic_load(&c2.bad), 0);
    um_task_stats ts;
    CHECK_OK(um_task_stats_get(g->ctx, g->dev, &ts));
    CHECK_EQ(ts.tasks, 2);
    printf("tasks: GPU fill, host +1, host check, GPU fill, host check: %s\n",
           atomic_load(&c1.bad) + atomic_load(&c2.bad) ? "WRONG" : "all words right");
    CHECK_OK(um_buffer_destroy(b));
}

int main(void)
{
    char why[256];
    int version = 0, gpus = 0;
    if (um_cuda_driver_info(&version, &gpus, why, sizeof why) != UM_OK || gpus < 1) {
        printf("test_cuda: SKIPPED: %s\n", gpus < 1 && !why[0] ? "the driver reports no GPU" : why);
        return SKIP;
    }
    printf("test_cuda: driver %d.%d, %d GPU%s\n", version / 1000, version % 1000 / 10, gpus,
           gpus == 1 ? "" : "s");
    gpu g = {0};
    g.cu = um__cuda_load(NULL, 0);
    CHECK_OK(um_init("devices=cuda:0", &g.ctx));
    if (!g.ctx)
        return harness_finish("test_cuda");
    g.dev = 1;
    um_cuDevice d0;
    CHECK_EQ(g.cu->DeviceGet(&d0, 0), UM_CU_SUCCESS);
    CHECK_EQ(g.cu->DevicePrimaryCtxRetain(&g.cuctx, d0), UM_CU_SUCCESS);
    CHECK_EQ(g.cu->CtxSetCurrent(g.cuctx), UM_CU_SUCCESS);
    um_cuResult r = g.cu->ModuleLoadData(&g.mod, spin_fill_ptx);
    if (r == UM_CU_SUCCESS)
        r = g.cu->ModuleGetFunction(&g.spin_fill, g.mod, "spin_fill");
    /* The stand-in driver of CI (tests/gpu/fake_cuda.c) runs no kernels:
     * there the checks that need one are skipped; on a GPU they must run. */
    bool fake = getenv("UM_TEST_FAKE_CUDA") != NULL;
    if (r != UM_CU_SUCCESS && fake) {
        printf("test_cuda: the fake driver runs no kernels: stream-order checks skipped\n");
        g.spin_fill = NULL;
    } else {
        CHECK_EQ(r, UM_CU_SUCCESS);
    }

    check_driver_facts(&g);
    check_churn(&g);
    check_driver_agrees(&g);
    if (g.spin_fill)
        check_stream_order(&g);
    check_wrapped_stream(&g);
    check_memory_limit(&g);
    check_pinned_copies(&g);
    check_segments(&g);
    check_page_size();
    check_two_gpus(&g, gpus);
    check_buffer_round_trips(&g, fake);
    check_failed_task_not_busy(&g);
    check_event_time(&g);
    if (g.spin_fill) {
        check_buffer_stream_order(&g);
        check_tasks(&g);
    }

    if (g.mod)
        (void)g.cu->ModuleUnload(g.mod);
    um_shutdown(g.ctx);
    (void)g.cu->DevicePrimaryCtxRelease(d0);
    return harness_finish("test_cuda");
}
