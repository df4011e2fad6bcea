/*
 * Stream order through the CUDA backend, on the stand-in driver's lazy mode
 * (tests/gpu/fake_cuda.c, FAKE_CUDA_LAZY_QUERIES): there queued work stays
 * pending until something waits for it, and the driver reports memory
 * unmapped or freed under pending work ("unmap") and bytes two streams
 * touch with nothing ordering them ("race"). Work that completes at once,
 * as in the stand-in's default mode, hides both. Checks:
 *   - um_shutdown waits for the work of every stream before it gives the
 *     memory back (an own stream, and the default stream);
 *   - um_trim of the buffer cache gives back no block whose free-time work
 *     is pending, and gives it back once that work is done;
 *   - um_stream_wrap refuses CU_STREAM_PER_THREAD, and wraps CU_STREAM_LEGACY
 *     as the device's legacy default stream;
 *   - a context of GPU 1 alone retains no other GPU's primary context;
 *   - where the driver can neither record nor wait for an event (failures
 *     forced with fake_cuda_fail), no memory is handed on under a copy that
 *     may still use it: a copy between GPUs whose reading of its source
 *     can't be ordered fails, an eviction whose write-back can't be ordered
 *     before the memory's reuse keeps the memory, and so does the wait for
 *     a destroyed buffer's copy, and a um_buffer_read's or a spill's copy
 *     stays a use of the replica it reads; each fails saying why and works
 *     when tried again, and the buffers' bytes are their own; a fill whose
 *     copy fails before it is queued keeps none of the memory it took;
 *   - random use of buffers on two GPUs and the host at tight memory
 *     limits (eviction, write-back, spill), with failures of the calls
 *     that order GPU work, or queue copies and fills, forced before some
 *     library calls: every failure names its cause, no race or unmap
 *     report, every buffer's bytes as a model says (RF_TRACE=1 prints each
 *     forced failure and each failure);
 *   - random use from several threads on several streams (with
 *     um_record_stream) of the pool, the direct allocator, the buffer cache
 *     and the pinned host pool makes no unmap or race report.
 * The test sets FAKE_CUDA_LAZY_QUERIES=3 and FAKE_CUDA_GPUS=4 unless they
 * are set. Exits 77 (skipped), saying why, without the stand-in driver.
 */
#include "harness.h"
#include "lazy_driver.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define SKIP 77
#define BLOCK (4 * MIB)
#define CU_STREAM_LEGACY ((void *)0x1)
#define CU_STREAM_PER_THREAD ((void *)0x2)
/* Two stand-in GPUs (devices 1 and 2) with the model's links. */
#define TWO_GPUS "devices=cuda:0+cuda:1,links=model,link_cache=none"

/* um_shutdown with a kernel still queued on memory freed in stream order
 * (legal: the free is ordered after the kernel) must wait for the stream
 * before unmapping that memory: a GPU kernel running on unmapped memory
 * faults, a sticky error that breaks the process's use of the GPU. Once on
 * a created stream, once on the default stream. */
static void check_shutdown_waits(bool own_stream)
{
    counts c;
    um_context *ctx =
        check_open(own_stream ? "shutdown with a kernel pending on a created stream"
                              : "shutdown with a kernel pending on the default stream",
                   "devices=cuda:0", &c);
    if (!ctx)
        return;
    um_stream s = NULL;
    if (own_stream)
        CHECK_OK(um_stream_create(ctx, 1, &s));
    void *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, BLOCK, s, &p));
    if (p) {
        CHECK_EQ(lazy_launch(native_of(s), p, BLOCK), 0);
        CHECK_OK(um_free(ctx, p, s));
    }
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
}

/* The transfer engine, made by the first buffer, times the links with a
 * 16 MiB block of each device taken on the default stream and copies into
 * it on streams of its own. At the memory limit the pool may hand that
 * block memory another stream freed behind a kernel still queued, ordered
 * after the kernel for the default stream only (cross_stream_reuse): the
 * engine must wait for it before its copies write there. */
static void check_link_measurement_at_limit(void)
{
    counts c;
    um_context *ctx = check_open("the link measurement at the memory limit",
                                 "devices=cuda:0,memory_limit=64M,link_cache=none,plan=0", &c);
    if (!ctx)
        return;
    um_stream s = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s));
    void *freed = NULL, *keep = NULL;
    CHECK_OK(um_malloc(ctx, 1, 16 * MIB, s, &freed));
    CHECK_OK(um_malloc(ctx, 1, 48 * MIB, NULL, &keep));
    if (freed && keep) {
        CHECK_EQ(lazy_launch(native_of(s), freed, 16 * MIB), 0);
        CHECK_OK(um_free(ctx, freed, s));
        um_buffer *b = NULL;
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &b));
        CHECK_EQ(races_since(c), 0);
        um_link_stats link;
        /* The measurement had its block: the link was timed, not modelled. */
        CHECK_OK(um_link_stats_get(ctx, 0, 1, &link));
        CHECK_EQ(link.measured, 1);
        if (b)
            CHECK_OK(um_buffer_destroy(b));
    }
    if (keep)
        CHECK_OK(um_free(ctx, keep, NULL));
    CHECK_OK(um_stream_synchronize(ctx, s));
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
}

/* A check's context of GPU 1 with the buffer cache, and a stream *s of it
 * on which a block (BLOCK bytes) was freed while a kernel queued there
 * still writes it; NULL (the failure reported) where it can't be made. */
static um_context *bufcache_pending_free(const char *name, counts *c, um_stream *s)
{
    um_context *ctx = check_open(name, "devices=cuda:0,allocator=bufcache", c);
    if (!ctx)
        return NULL;
    CHECK_OK(um_stream_create(ctx, 1, s));
    void *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, BLOCK, *s, &p));
    if (p) {
        CHECK_EQ(lazy_launch(native_of(*s), p, BLOCK), 0);
        CHECK_OK(um_free(ctx, p, *s));
    }
    return ctx;
}

/* The buffer cache keeps a block freed on a stream with that stream's work
 * pending; um_trim must wait for that work or leave the block cached
 * rather than unmap memory a kernel still writes. Once the stream is
 * synchronized, a second um_trim must give the memory back. */
static void check_bufcache_trim(void)
{
    counts c;
    um_stream s = NULL;
    um_context *ctx =
        bufcache_pending_free("buffer cache: um_trim with a freed block's work pending", &c, &s);
    if (!ctx)
        return;
    CHECK_OK(um_trim(ctx, 1));
    CHECK_EQ(unmaps_since(c), 0);
    CHECK_OK(um_stream_synchronize(ctx, s));
    CHECK_OK(um_trim(ctx, 1));
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, 0);
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
}

/* The buffer cache's um_trim gives a block freed on a stream back only
 * after that stream's work: where the wait fails (cuStreamSynchronize),
 * the block stays mapped and the trim fails, saying why; the retry that
 * parked blocks get must wait again, not unmap unwaited. Trimmed again
 * once the wait works, the memory goes back. (The block had been parked
 * without its stream and unmapped by the same trim's retry, under the
 * kernel still writing it.) */
static void check_bufcache_trim_unwaited(void)
{
    counts c;
    um_stream s = NULL;
    um_context *ctx =
        bufcache_pending_free("buffer cache: um_trim whose wait for a freed block fails", &c, &s);
    if (!ctx)
        return;
    cuda_fail("cuStreamSynchronize", 0, 1000, 999);
    CHECK_STATUS(um_trim(ctx, 1), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cuStreamSynchronize", "stay mapped", NULL);
    CHECK_EQ(unmaps_since(c), 0);
    cuda_fail_clear();
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, BLOCK);
    CHECK_OK(um_trim(ctx, 1));
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, 0);
    CHECK_EQ(unmaps_since(c), 0);
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
}

/* A stream destroyed with a block freed on it cached in the buffer cache,
 * its kernel still queued, and the stream's work cannot be waited for
 * (cuStreamSynchronize fails): the block stays cached and the stream
 * stays, the destroy failing, saying why; destroyed again once the wait
 * works, and trimmed, the memory goes back. (The block had been unmapped
 * at once, under the kernel still writing it.) */
static void check_bufcache_stream_destroy_unwaited(void)
{
    counts c;
    um_stream s = NULL;
    um_context *ctx = bufcache_pending_free(
        "buffer cache: a stream destroyed whose work can't be waited for", &c, &s);
    if (!ctx)
        return;
    cuda_fail("cuStreamSynchronize", 0, 1000, 999);
    um_status st = um_stream_destroy(ctx, s);
    CHECK_STATUS(st, UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cuStreamSynchronize", "stay cached", NULL);
    CHECK_EQ(unmaps_since(c), 0);
    cuda_fail_clear();
    if (st != UM_OK)
        CHECK_OK(um_stream_destroy(ctx, s));
    CHECK_OK(um_trim(ctx, 1));
    um_stats stats;
    CHECK_OK(um_stats_get(ctx, 1, &stats));
    CHECK_EQ(stats.reserved_bytes, 0);
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
}

/* True when the last error names the per-thread stream, in any of the
 * spellings CUDA uses (CU_STREAM_PER_THREAD, cudaStreamPerThread,
 * "per-thread"). */
static bool error_names_per_thread(void)
{
    char squeezed[512];
    size_t n = 0;
    for (const char *e = um_last_error(); *e && n + 1 < sizeof squeezed; e++)
        if (isalpha((unsigned char)*e))
            squeezed[n++] = (char)tolower((unsigned char)*e);
    squeezed[n] = '\0';
    return strstr(squeezed, "perthread") != NULL;
}

/* CU_STREAM_PER_THREAD is a different stream in every thread that uses it:
 * a wrapper of it would order the frees of one thread by another thread's
 * stream, so wrapping it must fail, saying why. CU_STREAM_LEGACY is the
 * device's legacy default stream, wrapped as NULL is: a block freed on the
 * wrapper with its kernel pending and taken on the default stream, or the
 * other way round, is never handed out under that kernel (the fake driver
 * counts an unordered use as a race). */
static void check_special_handles(void)
{
    counts c;
    um_context *ctx = check_open("um_stream_wrap of CU_STREAM_PER_THREAD and CU_STREAM_LEGACY",
                                 "devices=cuda:0", &c);
    if (!ctx)
        return;
    um_stream per_thread = NULL;
    CHECK_STATUS(um_stream_wrap(ctx, 1, CU_STREAM_PER_THREAD, &per_thread), UM_ERR_UNSUPPORTED);
    harness_checks++;
    if (!error_names_per_thread())
        harness_report(__FILE__, __LINE__, "the error '%s' does not name CU_STREAM_PER_THREAD",
                       um_last_error());
    if (per_thread)
        CHECK_OK(um_stream_destroy(ctx, per_thread));

    um_stream legacy = NULL;
    CHECK_OK(um_stream_wrap(ctx, 1, CU_STREAM_LEGACY, &legacy));
    if (legacy) {
        CHECK_EQ(um_stream_device(legacy), 1);
        /* Freed on the wrapper, taken on the default stream. */
        void *p = NULL, *q = NULL;
        CHECK_OK(um_malloc(ctx, 1, BLOCK, legacy, &p));
        if (p) {
            CHECK_EQ(lazy_launch(CU_STREAM_LEGACY, p, BLOCK), 0);
            CHECK_OK(um_free(ctx, p, legacy));
            CHECK_OK(um_malloc(ctx, 1, BLOCK, NULL, &q));
            if (q) {
                CHECK_EQ(lazy_launch(NULL, q, BLOCK), 0);
                CHECK_OK(um_free(ctx, q, NULL));
            }
        }
        /* And the other way round. */
        p = q = NULL;
        CHECK_OK(um_malloc(ctx, 1, BLOCK, NULL, &p));
        if (p) {
            CHECK_EQ(lazy_launch(NULL, p, BLOCK), 0);
            CHECK_OK(um_free(ctx, p, NULL));
            CHECK_OK(um_malloc(ctx, 1, BLOCK, legacy, &q));
            if (q) {
                CHECK_EQ(lazy_launch(CU_STREAM_LEGACY, q, BLOCK), 0);
                CHECK_OK(um_free(ctx, q, legacy));
            }
        }
        CHECK_OK(um_stream_synchronize(ctx, legacy));
        CHECK_OK(um_stream_destroy(ctx, legacy));
    }
    check_end(ctx, c);
}

/* devices=cuda:1 names GPU 1 alone: GPU 0's primary context must stay
 * untouched, neither retained at um_init (for the pinned host memory of
 * the default host_memory=auto, say) nor later. A retained primary context
 * holds hundreds of MiB of the GPU's memory, and on a GPU another job or a
 * CUDA_VISIBLE_DEVICES split gave away, it may fail. */
static void check_one_gpu_context(void)
{
    (void)check_begin("devices=cuda:1 retains GPU 1's primary context only");
    char why[256];
    int version = 0, gpus = 0;
    CHECK_OK(um_cuda_driver_info(&version, &gpus, why, sizeof why));
    CHECK(gpus >= 2);
    if (gpus < 2)
        return;
    int gpu0 = lazy_retains(0), gpu1 = lazy_retains(1);
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:1", &ctx));
    if (!ctx)
        return;
    void *p = NULL, *h = NULL;
    CHECK_OK(um_malloc(ctx, 1, BLOCK, NULL, &p));
    CHECK_OK(um_malloc(ctx, 0, BLOCK, NULL, &h));
    if (p)
        CHECK_OK(um_free(ctx, p, NULL));
    if (h)
        CHECK_OK(um_free(ctx, h, NULL));
    CHECK_OK(um_trim(ctx, 1));
    CHECK_EQ(lazy_retains(0) - gpu0, 0);
    CHECK(lazy_retains(1) > gpu1);
    um_shutdown(ctx);
    CHECK_EQ(lazy_retains(0) - gpu0, 0);
}

/* --------------------------------------------------------------- stress */

enum { STRESS_STREAMS = 5, STRESS_LIVE = 24 };

typedef struct stress {
    const char *name;
    um_context *ctx;
    int dev;
    /* [0] is NULL, the GPU's default stream (for GPU memory only: NULL
     * means the host's own default stream for host memory). */
    um_stream streams[STRESS_STREAMS];
    int first_stream;
    int steps;
    uint64_t seed;
    _Atomic long failed_allocs;
} stress;

static int random_stream(stress *st, uint64_t *rng)
{
    int n = STRESS_STREAMS - st->first_stream;
    return st->first_stream + (int)(harness_rand(rng) % (uint64_t)n);
}

/* What a correct program does: each block is written by a "kernel" on its
 * allocation stream, sometimes also on another stream that it marks with
 * um_record_stream and orders after the first use (as an event would), and
 * freed in stream order. Trims and stream synchronizations come in
 * between, from any thread. */
static void *stress_worker(void *arg)
{
    harness_thread *t = arg;
    stress *st = t->shared;
    uint64_t rng = harness_mix64(st->seed ^ (uint64_t)(t->id + 1));
    void *p[STRESS_LIVE] = {0};
    size_t size[STRESS_LIVE] = {0};
    int on[STRESS_LIVE] = {0};
    for (int i = 0; i < st->steps; i++) {
        int k = (int)(harness_rand(&rng) % STRESS_LIVE);
        if (p[k]) {
            if (harness_rand(&rng) % 3 == 0) {
                int other = random_stream(st, &rng);
                if (other != on[k] &&
                    um_record_stream(st->ctx, p[k], st->streams[other]) == UM_OK) {
                    lazy_wait(native_of(st->streams[other]), native_of(st->streams[on[k]]));
                    lazy_launch(native_of(st->streams[other]), p[k], size[k]);
                }
            }
            /* NULL and the allocation stream mean the same to um_free. */
            um_stream how = harness_rand(&rng) % 3 == 0 ? NULL : st->streams[on[k]];
            CHECK_OK(um_free(st->ctx, p[k], how));
            p[k] = NULL;
        } else {
            int s = random_stream(st, &rng);
            size_t n = harness_rand(&rng) % 4 == 0 ? (size_t)(harness_rand(&rng) % 8 + 1) * MIB
                                                   : (size_t)(harness_rand(&rng) % 65536) + 1;
            if (um_malloc(st->ctx, st->dev, n, st->streams[s], &p[k]) == UM_OK) {
                size[k] = n;
                on[k] = s;
                lazy_launch(native_of(st->streams[s]), p[k], n);
            } else {
                p[k] = NULL;
                st->failed_allocs++;
            }
        }
        uint64_t r = harness_rand(&rng) % 1000;
        if (r == 0)
            CHECK_OK(um_trim(st->ctx, st->dev));
        else if (r == 1)
            CHECK_OK(um_stream_synchronize(
                st->ctx, st->streams[1 + harness_rand(&rng) % (STRESS_STREAMS - 1)]));
    }
    for (int k = 0; k < STRESS_LIVE; k++)
        if (p[k])
            CHECK_OK(um_free(st->ctx, p[k], st->streams[on[k]]));
    return NULL;
}

/* Random multi-thread, multi-stream use of one allocator: no unmap of
 * memory with work pending and no two streams on the same bytes unordered,
 * during the run or at the trim and shutdown after it. */
static void check_stress(const char *name, const char *conf, int dev, int steps, uint64_t seed)
{
    counts c = check_begin(name);
    stress st = {.name = name, .dev = dev, .seed = seed};
    /* Host memory is ordered by GPU streams only here: the host's default
     * stream runs no kernel. */
    st.first_stream = dev == 0 ? 1 : 0;
    st.steps = HARNESS_SANITIZED ? steps / 10 : steps;
    CHECK_OK(um_init(conf, &st.ctx));
    if (!st.ctx)
        return;
    for (int i = 1; i < STRESS_STREAMS; i++)
        CHECK_OK(um_stream_create(st.ctx, 1, &st.streams[i]));
    harness_run_threads(4, stress_worker, &st);
    long unmaps = unmaps_since(c), races = races_since(c);
    for (int i = 1; i < STRESS_STREAMS; i++)
        CHECK_OK(um_stream_synchronize(st.ctx, st.streams[i]));
    CHECK_OK(um_stream_synchronize(st.ctx, NULL));
    CHECK_OK(um_trim(st.ctx, dev));
    for (int i = 1; i < STRESS_STREAMS; i++)
        CHECK_OK(um_stream_destroy(st.ctx, st.streams[i]));
    um_shutdown(st.ctx);
    printf("%s: %ld unmap and %ld race reports during the run, %ld and %ld in all; %ld "
           "allocations failed\n",
           name, unmaps, races, unmaps_since(c), races_since(c), (long)st.failed_allocs);
    CHECK_EQ(unmaps_since(c), 0);
    CHECK_EQ(races_since(c), 0);
}

/* Writes n bytes `byte` into b on GPU dev, on stream s (a WRITE_DISCARD
 * acquisition): the acquisition's status. */
static um_status write_on(um_context *ctx, um_buffer *b, int dev, size_t n, int byte, um_stream s)
{
    void *p = NULL;
    um_status st = um_buffer_acquire(b, dev, UM_ACCESS_WRITE_DISCARD, s, &p);
    if (st != UM_OK)
        return st;
    unsigned char *h = malloc(n);
    memset(h, byte, n);
    CHECK_OK(um_memcpy_async(ctx, p, h, n, s));
    CHECK_OK(um_buffer_release(b, dev, s));
    CHECK_OK(um_stream_synchronize(ctx, s));
    free(h);
    return UM_OK;
}

/* The end of the checks whose failure left a copy out of b's replica on
 * GPU 1 in flight: a write there on the stream `writer` (another) runs
 * after that copy (no race since the check began, c), and b then holds the
 * write's bytes. */
static void check_written_after(um_context *ctx, um_buffer *b, size_t n, um_stream writer, counts c)
{
    CHECK_OK(write_on(ctx, b, 1, n, 0x5A, writer));
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(b, n, 0x5A), 0);
}

/* A buffer of n bytes `byte` on GPU dev (its only copy). */
static um_buffer *gpu_buffer(um_context *ctx, int dev, size_t n, int byte)
{
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    if (b)
        CHECK_OK(write_on(ctx, b, dev, n, byte, NULL));
    return b;
}

/* A copy of a buffer from GPU 1 to GPU 2 (its acquisition there) whose
 * use of GPU 1's replica can be neither recorded (cuEventRecord fails)
 * nor waited for (cuEventSynchronize and cuStreamSynchronize fail): the
 * copy's stream stands for that use, and the acquisition works. GPU 1's
 * memory, taken next by another buffer's write once reclaim drops b's
 * replica there as clean, is reused only after the copy: no race. (At
 * first GPU 2's replica let reclaim drop GPU 1's under the queued copy;
 * then the acquisition failed.) */
static void check_fill_use_unrecorded(void)
{
    counts c;
    um_context *ctx = check_open("a copy between GPUs whose reading of its source can't be ordered",
                                 TWO_GPUS ",watermark_high=100,watermark_low=100", &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1);
    /* The copy's own completion is recorded, the use after it is not, and
     * neither the copy's event nor its stream can be waited for. */
    cuda_fail("cuEventRecord", 1, 1, 999);
    cuda_fail("cuEventSynchronize", 0, 1, 999);
    cuda_fail("cuStreamSynchronize", 0, 1, 999);
    void *p = NULL;
    um_status st = um_buffer_acquire(b, 2, UM_ACCESS_READ, NULL, &p);
    CHECK_OK(st);
    cuda_fail_clear();
    if (st == UM_OK)
        CHECK_OK(um_buffer_release(b, 2, NULL));

    /* GPU 1 has room for one buffer: the next takes b's memory there. */
    CHECK_OK(um_set_memory_limit(ctx, 1, n));
    um_buffer *other = gpu_buffer(ctx, 1, n, 0x5A);
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(b, n, 0xA1), 0);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_buffer_destroy(other));
    check_end(ctx, c);
}

/* A copy from GPU 1 to GPU 2 whose reading of GPU 1 can be neither noted
 * (cuEventRecord fails after the copy's own event) nor waited for (through
 * its event or its stream): the acquisition works, and a write into GPU
 * 1's replica on another stream then runs after the copy: no race. (The
 * acquisition had failed with the copy still reading GPU 1, and the write
 * ran under it.) */
static void check_fill_use_written(void)
{
    counts c;
    um_context *ctx =
        check_open("a copy between GPUs whose reading of its source is written after", TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1);
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    if (b) {
        cuda_fail("cuEventRecord", 1, 1, 999);
        cuda_fail("cuEventSynchronize", 0, 1, 999);
        cuda_fail("cuStreamSynchronize", 0, 1, 999);
        void *p = NULL;
        um_status st = um_buffer_acquire(b, 2, UM_ACCESS_READ, NULL, &p);
        CHECK_OK(st);
        if (st == UM_OK)
            CHECK_OK(um_buffer_release(b, 2, NULL));
        cuda_fail_clear();
        check_written_after(ctx, b, n, writer, c);
        CHECK_OK(um_buffer_destroy(b));
    }
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
}

/* The eviction of a buffer's only copy from GPU 1 (for another buffer's
 * acquisition there) writes it back, then gives its memory back behind the
 * write-back, which still reads it. Where that can be neither ordered on
 * the stream that takes the memory next (cuStreamWaitEvent fails) nor
 * waited for (cuEventSynchronize fails), the memory is kept: the
 * acquisition fails, saying why, and works when tried again; the other
 * buffer's write does not race the write-back, and both buffers' bytes are
 * their own. (The memory had been given back regardless.) */
static void check_evict_unordered(void)
{
    counts c;
    um_context *ctx =
        check_open("an eviction whose write-back can't be ordered before the memory's reuse",
                   TWO_GPUS ",watermark_high=100,watermark_low=100", &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1), *other = NULL;
    CHECK_OK(um_set_memory_limit(ctx, 1, n));
    CHECK_OK(um_buffer_create(ctx, n, NULL, &other));
    /* The write-back's own order after b's last write waits; the wait
     * for the write-back before the memory's reuse does not. */
    cuda_fail("cuStreamWaitEvent", 1, 1, 999);
    cuda_fail("cuEventSynchronize", 0, 1, 999);
    um_status st = write_on(ctx, other, 1, n, 0x5A, NULL);
    CHECK_STATUS(st, UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("device 1's copy cannot be dropped", "cuEventSynchronize",
                         "the memory is kept");
    cuda_fail_clear();
    um_reclaim_stats rs;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_EQ(rs.evictions, 0);
    CHECK_EQ(rs.written_back, 1);
    /* Again: b's copy on GPU 1 is clean now, and goes without a copy. */
    if (st != UM_OK) {
        CHECK_OK(write_on(ctx, other, 1, n, 0x5A, NULL));
        CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
        CHECK_EQ(rs.evictions, 1);
        CHECK_EQ(rs.written_back, 1);
    }
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(b, n, 0xA1), 0);
    CHECK_EQ(buffer_count_not(other, n, 0x5A), 0);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_buffer_destroy(other));
    check_end(ctx, c);
}

/* A buffer destroyed with a copy into its GPU 2 replica still queued:
 * that memory is held until the copy is done. An allocation at GPU 2's
 * limit waits for it; where that wait fails (cuEventSynchronize), the
 * memory stays held and the allocation fails, saying why; tried again, it
 * works, and no write races the copy. (The memory had been given to the
 * allocation regardless, under the copy still writing it.) */
static void check_held_unwaited(void)
{
    counts c;
    um_context *ctx = check_open("memory of a destroyed buffer whose copy can't be waited for",
                                 TWO_GPUS ",watermark_high=100,watermark_low=100", &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1), *other = NULL;
    /* The copy's reader and the other buffer's writer are streams of
     * their own: only the engine's waits order them. */
    um_stream reader = NULL, writer = NULL;
    CHECK_OK(um_stream_create(ctx, 2, &reader));
    CHECK_OK(um_stream_create(ctx, 2, &writer));
    void *p = NULL;
    CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_READ, reader, &p));
    CHECK_OK(um_buffer_release(b, 2, reader));
    /* The copy stays queued: polls find it unfinished (CUDA_ERROR_NOT_READY). */
    cuda_fail("cuEventQuery", 0, 1000, 600);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_set_memory_limit(ctx, 2, n));
    CHECK_OK(um_buffer_create(ctx, n, NULL, &other));
    cuda_fail("cuEventSynchronize", 0, 1000, 999);
    um_status st = write_on(ctx, other, 2, n, 0x5A, writer);
    CHECK_STATUS(st, UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("device 2: no room", "memory of a destroyed buffer is kept",
                         "cuEventSynchronize");
    cuda_fail_clear();
    if (st != UM_OK)
        CHECK_OK(write_on(ctx, other, 2, n, 0x5A, writer));
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(other, n, 0x5A), 0);
    CHECK_OK(um_buffer_destroy(other));
    CHECK_OK(um_stream_destroy(ctx, reader));
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
}

/* A replica read on more streams at once than it keeps fences for
 * (UM_REPLICA_USES, 4): the release of a fifth reader merges the two
 * oldest, or waits for the oldest. Where neither works (cuStreamWaitEvent
 * and cuEventSynchronize fail, the readers still queued), the release
 * fails, saying why, and the buffer stays acquired; released again once
 * the driver works, a write on another stream waits for every reader: no
 * race. (The oldest reader's fence had been dropped, and the write ran
 * under its queued copy.) */
static void check_readers_unmerged(void)
{
    counts c;
    um_context *ctx =
        check_open("a fifth reader whose oldest can't be merged nor waited for", TWO_GPUS, &c);
    if (!ctx)
        return;
    enum { READERS = 5 };
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1);
    um_stream rs[READERS] = {NULL}, writer = NULL;
    unsigned char *out[READERS] = {NULL};
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    um_status st = UM_OK;
    for (int i = 0; i < READERS && b; i++) {
        CHECK_OK(um_stream_create(ctx, 1, &rs[i]));
        out[i] = malloc(n);
        void *p = NULL;
        CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ, rs[i], &p));
        if (!p)
            continue;
        /* A copy reading the replica, left queued on the reader's stream. */
        CHECK_OK(um_memcpy_async(ctx, out[i], p, n, rs[i]));
        if (i < READERS - 1) {
            CHECK_OK(um_buffer_release(b, 1, rs[i]));
            continue;
        }
        /* The readers stay unfinished; the merge's wait and the host's
         * wait fail. */
        cuda_fail("cuEventQuery", 0, 1000, 600);
        cuda_fail("cuStreamWaitEvent", 0, 1000, 999);
        cuda_fail("cuEventSynchronize", 0, 1000, 999);
        st = um_buffer_release(b, 1, rs[i]);
        CHECK_STATUS(st, UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("cuStreamWaitEvent", "cuEventSynchronize", "stays acquired");
        cuda_fail_clear();
        if (st != UM_OK)
            CHECK_OK(um_buffer_release(b, 1, rs[i]));
    }
    if (b) {
        check_written_after(ctx, b, n, writer, c);
        CHECK_OK(um_buffer_destroy(b));
    }
    for (int i = 0; i < READERS; i++) {
        if (rs[i]) {
            CHECK_OK(um_stream_synchronize(ctx, rs[i]));
            CHECK_OK(um_stream_destroy(ctx, rs[i]));
        }
        free(out[i]);
    }
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
}

/* The release of a read whose work can be neither fenced (cuEventRecord
 * fails) nor waited for (cuStreamSynchronize fails) fails, saying why, and
 * the buffer stays acquired; released again once the driver works, a
 * write on another stream waits for the read: no race. (It had counted as
 * released with nothing standing for the read, and the write ran under
 * the reader's queued copy.) */
static void check_release_unfenced(void)
{
    counts c;
    um_context *ctx =
        check_open("a release whose work can be neither fenced nor waited for", TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1);
    um_stream reader = NULL, writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &reader));
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    unsigned char *out = malloc(n);
    void *p = NULL;
    if (b)
        CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ, reader, &p));
    if (p) {
        CHECK_OK(um_memcpy_async(ctx, out, p, n, reader));
        cuda_fail("cuEventRecord", 0, 1, 999);
        cuda_fail("cuStreamSynchronize", 0, 1, 999);
        um_status st = um_buffer_release(b, 1, reader);
        CHECK_STATUS(st, UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("cuEventRecord", "cuStreamSynchronize", "stays acquired");
        cuda_fail_clear();
        if (st != UM_OK)
            CHECK_OK(um_buffer_release(b, 1, reader));
        check_written_after(ctx, b, n, writer, c);
    }
    if (b)
        CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_stream_synchronize(ctx, reader));
    CHECK_OK(um_stream_destroy(ctx, reader));
    CHECK_OK(um_stream_destroy(ctx, writer));
    free(out);
    check_end(ctx, c);
}

/* A wrapped buffer destroyed with a copy into the program's memory (a
 * prefetch from GPU 1) still queued, where that copy cannot be waited for
 * (cuEventSynchronize fails): the destroy fails, saying why, and the
 * buffer stays; destroyed again once the wait works, the program's next
 * use of its memory does not race the copy. (The destroy had returned
 * UM_OK with the copy still writing the program's memory.) */
static void check_wrapped_destroy_unwaited(void)
{
    counts c;
    um_context *ctx =
        check_open("a wrapped buffer destroyed with a copy into it unwaited", TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    unsigned char *host = calloc(1, n);
    um_buffer *b = NULL;
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    CHECK_OK(um_buffer_wrap(ctx, host, n, &b));
    void *g = NULL;
    CHECK_OK(um_malloc(ctx, 1, n, writer, &g));
    if (b && g) {
        CHECK_OK(write_on(ctx, b, 1, n, 0xA1, NULL));
        CHECK_OK(um_buffer_prefetch(b, 0));
        cuda_fail("cuEventQuery", 0, 1000, 600);
        cuda_fail("cuEventSynchronize", 0, 1000, 999);
        um_status st = um_buffer_destroy(b);
        CHECK_STATUS(st, UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("cuEventSynchronize", "wrapped host memory", "stays");
        cuda_fail_clear();
        if (st != UM_OK)
            CHECK_OK(um_buffer_destroy(b));
        /* The program writes its memory again, on a stream of its own. */
        CHECK_OK(um_memcpy_async(ctx, host, g, n, writer));
        CHECK_EQ(races_since(c), 0);
        CHECK_OK(um_stream_synchronize(ctx, writer));
    }
    if (g)
        CHECK_OK(um_free(ctx, g, writer));
    CHECK_OK(um_stream_synchronize(ctx, writer));
    CHECK_OK(um_stream_destroy(ctx, writer));
    free(host);
    check_end(ctx, c);
}

/* A um_buffer_read whose copy out of GPU 1 cannot be waited for
 * (cuEventSynchronize fails, the copy still queued) fails, saying why and
 * that the program's memory may still be written; the copy stays a use
 * of GPU 1's replica, so a write there on another stream waits for it: no
 * race, and the buffer holds the write's bytes. (The copy's fence had
 * been dropped, and the write ran under the copy still reading.) */
static void check_read_unwaited(void)
{
    counts c;
    um_context *ctx = check_open("a um_buffer_read whose copy can't be waited for", TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1);
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    unsigned char *out = malloc(n);
    if (b) {
        cuda_fail("cuEventQuery", 0, 1000, 600);
        cuda_fail("cuEventSynchronize", 0, 1000, 999);
        CHECK_STATUS(um_buffer_read(b, 0, out, n), UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("cuEventSynchronize", "may still be writing", "is kept");
        cuda_fail_clear();
        check_written_after(ctx, b, n, writer, c);
        CHECK_OK(um_buffer_destroy(b));
    }
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
    /* The copy into out is done once the driver has nothing pending. */
    lazy_drain();
    free(out);
}

/* The only copy of a buffer, on GPU 1, goes to the spill file for another
 * buffer's room (the host and GPU 2 have none), and that copy cannot be
 * waited for (cuEventSynchronize fails, the copy still queued): the
 * eviction fails, saying why, and the copy stays a use of GPU 1's replica,
 * so a write there on another stream runs after it: no race. (The copy's
 * fence had been dropped, and the write ran under the copy still reading.) */
static void check_spill_unwaited(void)
{
    char dir[] = "/tmp/unimem-order-XXXXXX", conf[200];
    if (!mkdtemp(dir)) {
        harness_report(__FILE__, __LINE__, "mkdtemp %s failed", dir);
        return;
    }
    snprintf(conf, sizeof conf, TWO_GPUS ",watermark_high=100,watermark_low=100,spill_dir=%s", dir);
    counts c;
    um_context *ctx = check_open("a spill whose copy can't be waited for", conf, &c);
    if (!ctx) {
        rmdir(dir);
        return;
    }
    const size_t n = 256 << 10;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1), *other = NULL;
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    CHECK_OK(um_set_memory_limit(ctx, 0, 4096));
    CHECK_OK(um_set_memory_limit(ctx, 2, 4096));
    /* GPU 1 has room for one page, which the other buffer fills. */
    CHECK_OK(um_set_memory_limit(ctx, 1, 2 * MIB));
    CHECK_OK(um_buffer_create(ctx, 2 * MIB, NULL, &other));
    if (b && other) {
        cuda_fail("cuEventQuery", 0, 1000, 600);
        cuda_fail("cuEventSynchronize", 0, 1000, 999);
        CHECK_STATUS(write_on(ctx, other, 1, 2 * MIB, 0x5A, NULL), UM_ERR_NOMEM);
        CHECK_ERROR_MENTIONS("spill file", "cuEventSynchronize", "is kept");
        cuda_fail_clear();
        CHECK_OK(write_on(ctx, b, 1, n, 0x5B, writer));
        CHECK_EQ(races_since(c), 0);
        CHECK_EQ(buffer_count_not(b, n, 0x5B), 0);
    }
    if (b)
        CHECK_OK(um_buffer_destroy(b));
    if (other)
        CHECK_OK(um_buffer_destroy(other));
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
    rmdir(dir);
}

/* ------------------------------------------------- random event faults */

/* The driver calls that order GPU work, and those that queue the copies
 * and fills they order, failed at random below. */
static const char *const rf_calls[] = {"cuEventRecord",     "cuEventSynchronize",  "cuEventQuery",
                                       "cuStreamWaitEvent", "cuStreamSynchronize", "cuMemcpyAsync",
                                       "cuMemsetD8Async"};

enum { RF_BUFFERS = 8, RF_STREAMS = 2, RF_GPUS = 2, RF_MAX = 2 * (int)MIB };

/* A buffer and what it must hold: model's bytes while known. A write
 * whose error says the range may be partly written makes them unknown
 * until the next write of the whole buffer. */
typedef struct rf_buffer {
    um_buffer *b;
    size_t size;
    unsigned char *model;
    bool known;
    bool pinned;
} rf_buffer;

typedef struct rf_state {
    um_context *ctx;
    uint64_t rng;
    rf_buffer buf[RF_BUFFERS];
    /* [dev][0] is NULL, the device's default stream; [dev][1..] are
     * created streams of GPU dev (the host uses its default stream only). */
    um_stream streams[1 + RF_GPUS][1 + RF_STREAMS];
    unsigned char *stage, *out;
    /* Earlier out buffers a failed read's copy may still write. */
    unsigned char *abandoned[64];
    int nabandoned;
    long op, armed, failures, reports;
    bool is_armed;
    char what[200];  /* the operation now, for reports */
    char fault[160]; /* the rules armed now, for reports */
    counts c;
    long violations; /* seen so far, reported once */
    uint64_t evictions, spilled;
} rf_state;

static size_t rf_below(rf_state *st, size_t n)
{
    return n ? (size_t)(harness_rand(&st->rng) % n) : 0;
}

/* A failure of one of the calls above (and, one time in three, of a
 * second: most failures have a way around them through another call),
 * forced before the next library call, about one call in eight. */
static bool rf_arm(rf_state *st)
{
    st->is_armed = false;
    if (rf_below(st, 8) != 0)
        return false;
    size_t ncalls = sizeof rf_calls / sizeof rf_calls[0];
    size_t first = rf_below(st, ncalls), rules = rf_below(st, 3) == 0 ? 2 : 1;
    int len = 0;
    for (size_t i = 0; i < rules; i++) {
        const char *call = rf_calls[(first + i * (1 + rf_below(st, ncalls - 1))) % ncalls];
        unsigned skip = (unsigned)rf_below(st, 4), times = 1 + (unsigned)rf_below(st, 3);
        /* A query may also answer "not ready" (CUDA_ERROR_NOT_READY). */
        int result = strcmp(call, "cuEventQuery") == 0 && rf_below(st, 2) ? 600 : 999;
        cuda_fail(call, skip, times, result);
        len += snprintf(st->fault + len, sizeof st->fault - (size_t)len,
                        "%s%s fails (skip %u, times %u, result %d)", i ? ", " : "", call, skip,
                        times, result);
    }
    st->armed++;
    st->is_armed = true;
    if (getenv("RF_TRACE"))
        printf("op %ld (%s): %s\n", st->op, st->what, st->fault);
    return true;
}

static void rf_disarm(rf_state *st)
{
    if (st->is_armed)
        cuda_fail_clear();
    st->is_armed = false;
}

static void rf_report(rf_state *st, const char *fmt, const char *detail)
{
    harness_checks++;
    if (st->reports++ < 20)
        harness_report(__FILE__, __LINE__, "op %ld (%s%s%s): %s %s", st->op, st->what,
                       st->is_armed ? "; " : "", st->is_armed ? st->fault : "", fmt, detail);
    else
        harness_failures++;
}

/* A library call that returned st: a failure must come with a forced
 * fault, and its message name the driver call or the cause. */
static bool rf_result(rf_state *st, um_status s, const char *call)
{
    if (s == UM_OK)
        return true;
    st->failures++;
    const char *msg = um_last_error();
    if (getenv("RF_TRACE"))
        printf("op %ld: %s failed: %s\n", st->op, call, msg);
    char detail[700];
    snprintf(detail, sizeof detail, "%s failed (%s): %s", call, um_status_name(s), msg);
    if (!st->is_armed) {
        rf_report(st, "no fault armed, yet", detail);
        return false;
    }
    bool named = strstr(msg, "CUDA_ERROR") != NULL;
    for (size_t i = 0; i < sizeof rf_calls / sizeof rf_calls[0]; i++)
        named = named || strstr(msg, rf_calls[i]) != NULL;
    if (!named)
        rf_report(st, "the message names no driver call:", detail);
    return false;
}

/* New race or unmap reports since the last look. */
static void rf_violations(rf_state *st)
{
    long v = unmaps_since(st->c) + races_since(st->c);
    if (v != st->violations) {
        char n[64];
        snprintf(n, sizeof n, "%ld new (race %ld, unmap %ld in all)", v - st->violations,
                 races_since(st->c), unmaps_since(st->c));
        rf_report(st, "driver violations:", n);
        st->violations = v;
    }
}

/* n bytes at got against rb's model from offset off. */
static void rf_compare(rf_state *st, int k, const unsigned char *got, size_t off, size_t n)
{
    rf_buffer *rb = &st->buf[k];
    if (!rb->known || memcmp(got, rb->model + off, n) == 0)
        return;
    size_t i = 0;
    while (got[i] == rb->model[off + i])
        i++;
    size_t bad = 0;
    for (size_t j = i; j < n; j++)
        bad += got[j] != rb->model[off + j];
    char detail[200];
    snprintf(detail, sizeof detail, "buffer %d, byte %zu: %u, want %u (%zu of %zu bytes wrong)", k,
             off + i, got[i], rb->model[off + i], bad, n);
    rf_report(st, "wrong bytes:", detail);
    rb->known = false; /* reported once */
}

/* New data for n bytes: words of a random key, each different. */
static void rf_pattern(rf_state *st, unsigned char *p, size_t n)
{
    uint64_t key = harness_rand(&st->rng);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((key >> (8 * (i & 7))) + (i >> 3) * 0x9Du);
}

/* A random range of rb: the whole buffer one time in four. */
static void rf_range(rf_state *st, const rf_buffer *rb, size_t *off, size_t *n)
{
    if (rf_below(st, 4) == 0) {
        *off = 0;
        *n = rb->size;
        return;
    }
    *off = rf_below(st, rb->size);
    *n = 1 + rf_below(st, rb->size - *off);
}

static void rf_create(rf_state *st, int k)
{
    rf_buffer *rb = &st->buf[k];
    rb->size = ((size_t)256 << 10) + rf_below(st, ((size_t)1792 << 10) + 1);
    rb->b = NULL;
    rb->pinned = false;
    memset(rb->model, 0, rb->size); /* a new buffer reads as zeros */
    rb->known = true;
    CHECK_OK(um_buffer_create(st->ctx, rb->size, NULL, &rb->b));
}

/* An acquisition of buffer k on dev in mode, the replica used on stream
 * s (read out, or written in with um_memcpy_async), and its release. */
static void rf_acquire(rf_state *st, int k, int dev, um_access mode, int si)
{
    rf_buffer *rb = &st->buf[k];
    um_stream s = st->streams[dev][si];
    unsigned char *p = NULL;
    rf_arm(st);
    um_status s1 = um_buffer_acquire(rb->b, dev, mode, s, (void **)&p);
    bool ok = rf_result(st, s1, "um_buffer_acquire");
    rf_disarm(st);
    if (!ok)
        return;
    size_t off = 0, n = rb->size;
    if (mode != UM_ACCESS_WRITE_DISCARD)
        rf_range(st, rb, &off, &n);
    unsigned char *host = mode == UM_ACCESS_READ ? st->out : st->stage;
    if (mode != UM_ACCESS_READ)
        rf_pattern(st, st->stage, n);
    if (dev == 0)
        memcpy(mode == UM_ACCESS_READ ? host : p + off, mode == UM_ACCESS_READ ? p + off : host, n);
    else if (mode == UM_ACCESS_READ)
        CHECK_OK(um_memcpy_async(st->ctx, host, p + off, n, s));
    else
        CHECK_OK(um_memcpy_async(st->ctx, p + off, host, n, s));
    rf_arm(st);
    um_status s2 = um_buffer_release(rb->b, dev, s);
    ok = rf_result(st, s2, "um_buffer_release");
    rf_disarm(st);
    /* A release that failed leaves the acquisition held: the next works. */
    if (!ok)
        CHECK_OK(um_buffer_release(rb->b, dev, s));
    if (dev != 0)
        CHECK_OK(um_stream_synchronize(st->ctx, s));
    if (mode == UM_ACCESS_READ) {
        rf_compare(st, k, host, off, n);
    } else {
        memcpy(rb->model + off, host, n);
        if (n == rb->size)
            rb->known = true;
    }
}

static void rf_read(rf_state *st, int k)
{
    rf_buffer *rb = &st->buf[k];
    size_t off, n;
    rf_range(st, rb, &off, &n);
    rf_arm(st);
    um_status s = um_buffer_read(rb->b, off, st->out, n);
    bool ok = rf_result(st, s, "um_buffer_read");
    rf_disarm(st);
    if (ok) {
        rf_compare(st, k, st->out, off, n);
    } else if (strstr(um_last_error(), "may still be writing there") &&
               st->nabandoned < (int)(sizeof st->abandoned / sizeof st->abandoned[0])) {
        /* As the error says, the copy may still write out: a program
         * leaves that memory alone. */
        st->abandoned[st->nabandoned++] = st->out;
        st->out = malloc(RF_MAX);
    }
}

static void rf_write(rf_state *st, int k)
{
    rf_buffer *rb = &st->buf[k];
    size_t off, n;
    rf_range(st, rb, &off, &n);
    rf_pattern(st, st->stage, n);
    rf_arm(st);
    um_status s = um_buffer_write(rb->b, off, st->stage, n);
    bool ok = rf_result(st, s, "um_buffer_write");
    /* The documented exception: the range written may be partly so. */
    bool partly = !ok && strstr(um_last_error(), "may be partly written") != NULL;
    rf_disarm(st);
    if (ok) {
        memcpy(rb->model + off, st->stage, n);
        if (n == rb->size)
            rb->known = true;
    } else if (partly) {
        rb->known = false;
    }
}

/* Every known buffer read whole and compared, with no fault armed. */
static void rf_check_all(rf_state *st)
{
    snprintf(st->what, sizeof st->what, "reading every buffer");
    for (int k = 0; k < RF_BUFFERS; k++) {
        rf_buffer *rb = &st->buf[k];
        if (!rb->b || !rb->known)
            continue;
        if (rf_result(st, um_buffer_read(rb->b, 0, st->out, rb->size), "um_buffer_read"))
            rf_compare(st, k, st->out, 0, rb->size);
    }
}

static const char *rf_mode_name(um_access m)
{
    return m == UM_ACCESS_READ         ? "READ"
           : m == UM_ACCESS_READ_WRITE ? "READ_WRITE"
                                       : "WRITE_DISCARD";
}

static void rf_step(rf_state *st)
{
    int k = (int)rf_below(st, RF_BUFFERS);
    rf_buffer *rb = &st->buf[k];
    int dev = (int)rf_below(st, 1 + RF_GPUS);
    uint64_t r = rf_below(st, 100);
    if (!rb->b) {
        snprintf(st->what, sizeof st->what, "creating buffer %d", k);
        rf_create(st, k);
    } else if (r < 50) {
        static const um_access modes[] = {UM_ACCESS_READ, UM_ACCESS_READ, UM_ACCESS_READ_WRITE,
                                          UM_ACCESS_WRITE_DISCARD};
        um_access mode = modes[rf_below(st, 4)];
        int si = dev == 0 ? 0 : (int)rf_below(st, 1 + RF_STREAMS);
        snprintf(st->what, sizeof st->what,
                 "buffer %d (%zu bytes) acquired for %s on device %d, stream %d", k, rb->size,
                 rf_mode_name(mode), dev, si);
        rf_acquire(st, k, dev, mode, si);
    } else if (r < 62) {
        snprintf(st->what, sizeof st->what, "um_buffer_read of buffer %d", k);
        rf_read(st, k);
    } else if (r < 74) {
        snprintf(st->what, sizeof st->what, "um_buffer_write of buffer %d", k);
        rf_write(st, k);
    } else if (r < 84) {
        snprintf(st->what, sizeof st->what, "um_buffer_prefetch of buffer %d to device %d", k, dev);
        rf_arm(st);
        rf_result(st, um_buffer_prefetch(rb->b, dev), "um_buffer_prefetch");
        rf_disarm(st);
    } else if (r < 91) {
        /* One pinned buffer at most: wherever its replica lies in a
         * GPU's 6 MiB, the rest has room for any other buffer. */
        um_hint h = (um_hint)(1 + rf_below(st, 4));
        for (int i = 0; h == UM_HINT_PIN && i < RF_BUFFERS; i++)
            if (i != k && st->buf[i].pinned)
                h = UM_HINT_UNPIN;
        snprintf(st->what, sizeof st->what, "hint %d for buffer %d", (int)h, k);
        rf_arm(st);
        if (rf_result(st, um_buffer_hint(rb->b, h), "um_buffer_hint"))
            rb->pinned = h == UM_HINT_PIN ? true : h == UM_HINT_UNPIN ? false : rb->pinned;
        rf_disarm(st);
    } else if (r < 96) {
        snprintf(st->what, sizeof st->what, "destroying buffer %d", k);
        rf_arm(st);
        bool ok = rf_result(st, um_buffer_destroy(rb->b), "um_buffer_destroy");
        rf_disarm(st);
        if (ok)
            rf_create(st, k);
    } else {
        snprintf(st->what, sizeof st->what, "um_trim of device %d", dev);
        rf_arm(st);
        rf_result(st, um_trim(st->ctx, dev), "um_trim");
        rf_disarm(st);
    }
}

/* Random use of buffers on two GPUs and the host, at tight memory limits
 * (eviction and write-back all along), where before some library calls
 * one of the driver calls that order GPU work, or queue copies and
 * fills, is made to fail: every failure names its cause, a failed release
 * leaves the acquisition held, no memory is handed on or written under
 * queued work that may still use it (no race or unmap report), and every
 * buffer holds its own bytes (a failed write's range unknown only where
 * its error says so). */
static void check_buffers_random_event_faults(uint64_t seed)
{
    rf_state st = {.rng = harness_mix64(seed ^ 0x6576656e74ull)};
    /* The host is short of room too: the only copy of some buffers goes
     * to the spill file. */
    char dir[] = "/tmp/unimem-order-XXXXXX", conf[200];
    if (!mkdtemp(dir)) {
        harness_report(__FILE__, __LINE__, "mkdtemp %s failed", dir);
        return;
    }
    snprintf(conf, sizeof conf, TWO_GPUS ",watermark_high=100,watermark_low=100,spill_dir=%s", dir);
    st.ctx = check_open("random buffer use with the ordering and copy calls failing", conf, &st.c);
    if (!st.ctx) {
        rmdir(dir);
        return;
    }
    CHECK_OK(um_set_memory_limit(st.ctx, 0, 6 * MIB));
    const int steps = HARNESS_SANITIZED ? 300 : 3000;
    st.stage = malloc(RF_MAX);
    st.out = malloc(RF_MAX);
    for (int d = 1; d <= RF_GPUS; d++) {
        CHECK_OK(um_set_memory_limit(st.ctx, d, 6 * MIB));
        for (int i = 1; i <= RF_STREAMS; i++)
            CHECK_OK(um_stream_create(st.ctx, d, &st.streams[d][i]));
    }
    for (int k = 0; k < RF_BUFFERS; k++) {
        st.buf[k].model = malloc(RF_MAX);
        rf_create(&st, k);
    }
    for (st.op = 0; st.op < steps; st.op++) {
        rf_step(&st);
        rf_violations(&st);
        if (st.op % 64 == 63) {
            rf_check_all(&st);
            rf_violations(&st);
        }
    }
    rf_check_all(&st);
    rf_violations(&st);
    for (int d = 0; d <= RF_GPUS; d++) {
        um_reclaim_stats rs;
        CHECK_OK(um_reclaim_stats_get(st.ctx, d, &rs));
        st.evictions += rs.evictions;
        st.spilled += rs.spilled;
    }
    for (int k = 0; k < RF_BUFFERS; k++) {
        if (st.buf[k].b)
            CHECK_OK(um_buffer_destroy(st.buf[k].b));
        free(st.buf[k].model);
    }
    for (int d = 1; d <= RF_GPUS; d++)
        for (int i = 1; i <= RF_STREAMS; i++)
            CHECK_OK(um_stream_destroy(st.ctx, st.streams[d][i]));
    um_shutdown(st.ctx);
    free(st.stage);
    free(st.out);
    lazy_drain();
    for (int i = 0; i < st.nabandoned; i++)
        free(st.abandoned[i]);
    rmdir(dir);
    printf("random event faults: %ld operations, %ld faults armed, %ld failures, %llu "
           "evictions (%llu spilled), %ld race and %ld unmap reports\n",
           st.op, st.armed, st.failures, (unsigned long long)st.evictions,
           (unsigned long long)st.spilled, races_since(st.c), unmaps_since(st.c));
    CHECK_EQ(unmaps_since(st.c), 0);
    CHECK_EQ(races_since(st.c), 0);
}

/* Device dev's active bytes. */
static size_t active_on(um_context *ctx, int dev)
{
    um_stats st;
    CHECK_OK(um_stats_get(ctx, dev, &st));
    return st.active_bytes;
}

/* A prefetch of a new buffer to GPU 2 queues a zero fill of its memory
 * there; where the fill's end can be neither recorded (cuEventRecord) nor
 * waited for (cuStreamSynchronize), the fill's stream stands for it: the
 * prefetch fails saying the fill may still be writing, and the buffer's
 * next acquisition there, on another stream, runs after the fill: no race.
 * Once destroyed, the buffer's memory goes back. (The replica first kept
 * the memory with nothing standing for the fill, and the acquisition's
 * write raced it; then the memory was leaked.) */
static void check_fill_unrecorded(void)
{
    counts c;
    um_context *ctx =
        check_open("a fill whose end can be neither fenced nor waited for", TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    cuda_fail("cuEventRecord", 0, 1, 999);
    cuda_fail("cuStreamSynchronize", 0, 1, 999);
    CHECK_STATUS(um_buffer_prefetch(b, 2), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cuEventRecord", "cuStreamSynchronize", "may still be writing");
    cuda_fail_clear();
    CHECK_OK(write_on(ctx, b, 2, n, 0x3C, NULL));
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(b, n, 0x3C), 0);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_trim(ctx, 2));
    CHECK_EQ(active_on(ctx, 2), 0);
    check_end(ctx, c);
}

/* A fill that fails before anything is queued (its copy, cuMemcpyAsync,
 * fails) after reclaim gave it memory: GPU 1 has room for one buffer, and
 * b's replica there, still read by a copy to GPU 2, is dropped as clean,
 * its memory handed on behind that copy on the stream the fill copies on.
 * The fill's memory goes back at once (the failed replica holds none), and
 * the next write there, on another stream, runs after the copy: no race,
 * and each buffer holds its own bytes. (The failed replica kept the
 * memory with nothing ordering other streams after the copy, and a
 * WRITE_DISCARD acquisition on another stream wrote it under the copy:
 * found by test_event_faults_mt, where a failed cuStreamWaitEvent left
 * the same.) */
static void check_fill_failed_memory(void)
{
    counts c;
    um_context *ctx = check_open("a fill that fails before its copy is queued",
                                 TWO_GPUS ",watermark_high=100,watermark_low=100", &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1), *other = gpu_buffer(ctx, 2, n, 0x5A);
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    void *p = NULL;
    /* The copy from GPU 1 to GPU 2, still queued: it reads b's memory. */
    CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_READ, NULL, &p));
    CHECK_OK(um_buffer_release(b, 2, NULL));
    CHECK_OK(um_set_memory_limit(ctx, 1, n));
    cuda_fail("cuMemcpyAsync", 0, 1, 999);
    CHECK_STATUS(um_buffer_acquire(other, 1, UM_ACCESS_READ, NULL, &p), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cuda0", "cuMemcpyAsync", "999");
    cuda_fail_clear();
    CHECK_EQ(active_on(ctx, 1), 0);
    CHECK_OK(write_on(ctx, other, 1, n, 0x33, writer));
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(other, n, 0x33), 0);
    CHECK_EQ(buffer_count_not(b, n, 0xA1), 0);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_buffer_destroy(other));
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
}

/* A copy of a buffer from GPU 1 to GPU 2 whose end can be neither
 * recorded nor waited for: the prefetch fails, and the copy may still be
 * reading GPU 1's replica and writing GPU 2's memory. A write into GPU 1's
 * replica on another stream, and another buffer's write into that memory
 * of GPU 2, both run after it: no race, and each buffer then holds its
 * write's bytes. two_hop: between GPUs without peer copies, through
 * staging slots, on GPU 1's copy-out stream and GPU 2's copy-in stream.
 * (The source was left with nothing standing for the copy, and the write
 * there raced it; the two-hop copy left no fence at all.) */
static void check_copy_unrecorded(bool two_hop)
{
    counts c;
    um_context *ctx =
        two_hop ? check_open("a two-hop copy whose hops can be neither fenced nor waited for",
                             TWO_GPUS ",peer_copies=0,copy_chunk=64K", &c)
                : check_open("a copy between GPUs whose end can be neither fenced nor waited for",
                             TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 1, n, 0xA1), *other = NULL;
    um_stream writer = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &writer));
    if (b) {
        /* A two-hop copy records an event a chunk, and waits for both
         * streams. */
        cuda_fail("cuEventRecord", two_hop ? 2 : 0, 1, 999);
        cuda_fail("cuStreamSynchronize", 0, two_hop ? 2 : 1, 999);
        CHECK_STATUS(um_buffer_prefetch(b, 2), UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS(two_hop ? "two-hop copy" : "may still be writing", "cuEventRecord",
                             "cuStreamSynchronize");
        cuda_fail_clear();
        /* GPU 2 has room for one buffer: the next takes b's memory there. */
        CHECK_OK(um_set_memory_limit(ctx, 2, n));
        CHECK_OK(um_buffer_create(ctx, n, NULL, &other));
        CHECK_OK(write_on(ctx, other, 2, n, 0x3C, NULL));
        CHECK_EQ(races_since(c), 0);
        check_written_after(ctx, b, n, writer, c);
        CHECK_EQ(buffer_count_not(other, n, 0x3C), 0);
        CHECK_OK(um_buffer_destroy(other));
        CHECK_OK(um_buffer_destroy(b));
    }
    CHECK_OK(um_stream_destroy(ctx, writer));
    check_end(ctx, c);
}

/* A write into a buffer's only copy, on GPU 2, whose copy's end can be
 * neither recorded nor waited for: the write fails, saying the range may
 * be partly written, and the copy's stream stands for it. The next read
 * waits for the copy (no race) and finds the write's bytes, as the
 * stand-in runs the copy once its stream is waited for; another buffer's
 * write on GPU 2 does not race it either, and the memory goes back once
 * the buffer is destroyed. (First every later write or read raced the
 * queued copy; then the buffer was marked as having lost its data, and its
 * destroy leaked the memory.) */
static void check_write_unrecorded(void)
{
    counts c;
    um_context *ctx = check_open("a write whose copy can be neither fenced nor waited for",
                                 TWO_GPUS ",copy_chunk=4M", &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = gpu_buffer(ctx, 2, n, 0xA1), *other = NULL;
    unsigned char *h = malloc(n);
    memset(h, 0x5A, n);
    cuda_fail("cuEventRecord", 0, 2, 999);
    cuda_fail("cuStreamSynchronize", 0, 1, 999);
    CHECK_STATUS(um_buffer_write(b, 0, h, n), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cuStreamSynchronize", "may be partly written",
                         "its only valid copy, may be");
    cuda_fail_clear();
    memset(h, 0, n);
    CHECK_EQ(buffer_count_not(b, n, 0x5A), 0);
    CHECK_EQ(races_since(c), 0);
    CHECK_OK(um_buffer_create(ctx, n, NULL, &other));
    CHECK_OK(write_on(ctx, other, 2, n, 0x3C, NULL));
    CHECK_EQ(races_since(c), 0);
    CHECK_EQ(buffer_count_not(other, n, 0x3C), 0);
    CHECK_OK(um_buffer_destroy(b));
    CHECK_OK(um_buffer_destroy(other));
    CHECK_OK(um_trim(ctx, 2));
    CHECK_EQ(active_on(ctx, 2), 0);
    free(h);
    check_end(ctx, c);
}

int main(void)
{
    if (!lazy_driver_open("test_cuda_order", 1))
        return SKIP;
    uint64_t seed = harness_seed("test_cuda_order");

    check_shutdown_waits(true);
    check_shutdown_waits(false);
    check_bufcache_trim();
    check_bufcache_trim_unwaited();
    check_bufcache_stream_destroy_unwaited();
    check_link_measurement_at_limit();
    check_special_handles();
    check_one_gpu_context();
    check_fill_use_unrecorded();
    check_fill_use_written();
    check_evict_unordered();
    check_held_unwaited();
    check_fill_unrecorded();
    check_fill_failed_memory();
    check_copy_unrecorded(false);
    check_copy_unrecorded(true);
    check_write_unrecorded();
    check_readers_unmerged();
    check_release_unfenced();
    check_wrapped_destroy_unwaited();
    check_read_unwaited();
    check_spill_unwaited();
    check_buffers_random_event_faults(seed);
    /* Steps per thread: about a second each (allocator=direct maps and
     * unmaps at every call, so it runs fewer); a tenth of them under a
     * sanitizer, about 16 s in all under ThreadSanitizer. */
    check_stress("stress: pool", "devices=cuda:0", 1, 100000, seed);
    check_stress("stress: allocator=direct", "devices=cuda:0,allocator=direct", 1, 20000, seed);
    check_stress("stress: allocator=bufcache", "devices=cuda:0,allocator=bufcache", 1, 100000,
                 seed);
    check_stress("stress: pinned host pool", "devices=cuda:0,host_memory=pinned", 0, 100000, seed);
    return harness_finish("test_cuda_order");
}
