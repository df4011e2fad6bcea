/*
 * The pool on a real GPU: driver facts, data kept intact through random
 * churn (pages are unmapped and mapped elsewhere underneath), unimem's
 * reserved bytes against the driver's own count, stream-ordered reuse
 * across two streams with a long-running kernel in between, a memory
 * limit, pinned host memory with asynchronous copies, and wrapped streams.
 *
 * Device memory is written and read only through the driver (copies and a
 * kernel), never by the host. Exits 77 (skipped) when there is no driver
 * or no GPU, saying why.
 */
#include "backend/cuda_driver.h"
#include "harness.h"

#include <stdatomic.h>

#include <stdlib.h>
#include <string.h>

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
 * leaves the stream usable. */
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

/* Every GPU in one context (run where the driver reports two or more, as
 * the stand-in driver does with FAKE_CUDA_GPUS=2): each is a device with
 * its own pool, the link between them is what the driver reports, and a
 * copy from one GPU's block to another's (peer where the driver allows)
 * keeps every byte. */
static void check_two_gpus(int gpus)
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
    CHECK_OK(um_buffer_read(b, 0, out, n));
    size_t bad = 0;
    for (size_t i = 0; i < words; i++)
        bad += out[i] != 5 + (uint32_t)i;
    CHECK_EQ(bad, 0);
    /* Again into the host replica, for a read acquisition there. */
    CHECK_OK(um_buffer_acquire(b, g->dev, UM_ACCESS_WRITE, s, &p));
    CHECK(p && launch_spin_fill(g, p, words, 300000000ull, 9, s));
    CHECK_OK(um_buffer_release(b, g->dev, s));
    uint32_t *h = NULL;
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, (void **)&h));
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
    check_two_gpus(gpus);
    check_buffer_round_trips(&g, fake);
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
