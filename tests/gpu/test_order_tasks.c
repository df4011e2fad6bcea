/*
 * Stream order where the driver calls that order GPU work fail, in the
 * parts test_cuda_order does not cover: the task runtime (src/run), blocks
 * used on other streams (um_record_stream, src/core/stream_use.c) and the
 * pool's stream-ordered reuse (src/pool). It runs on the stand-in driver's
 * lazy mode (tests/gpu/fake_cuda.c, FAKE_CUDA_LAZY_QUERIES), where queued
 * work stays pending until something waits for it and the driver reports
 * memory unmapped under pending work ("unmap") and bytes two streams touch
 * unordered ("race"); fake_cuda_fail forces the failures. Checks:
 *   - a GPU task whose end can be neither fenced (cuEventRecord) nor
 *     waited for (cuStreamSynchronize) when launched, or whose end's event
 *     cannot be asked (cuEventQuery), ends only after its work: memory its
 *     kernel used, freed once um_task_wait returns, is not reused under
 *     the kernel;
 *   - a task's buffer whose release can be neither fenced nor waited for
 *     is released once the driver works again: the task succeeds, and the
 *     buffer can be used and destroyed;
 *   - a marked block's um_free whose marked stream can be neither fenced
 *     nor waited for fails, naming the calls, and the block stays live and
 *     marked; a deferred free whose event cannot be asked stays deferred;
 *   - a marked block's stream destroyed with its work pending: the block's
 *     free still waits for that work;
 *   - the pool reuses no block freed on another stream while its fence can
 *     be neither recorded, asked, nor waited for, and an allocation at the
 *     limit that needs it fails, naming the calls, and works once the
 *     driver does.
 * The test sets FAKE_CUDA_LAZY_QUERIES=3 and FAKE_CUDA_GPUS=4 unless they
 * are set. Exits 77 (skipped), saying why, without the stand-in driver.
 */
#include "harness.h"
#include "lazy_driver.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define SKIP 77
#define BLOCK (4 * MIB)
#define ONE_GPU "devices=cuda:0"

/* Writes n bytes `byte` at p (memory of a GPU) on stream s. */
static void write_block(um_context *ctx, void *p, size_t n, int byte, um_stream s)
{
    unsigned char *h = malloc(n);
    memset(h, byte, n);
    CHECK_OK(um_memcpy_async(ctx, p, h, n, s));
    CHECK_OK(um_stream_synchronize(ctx, s));
    free(h);
}

/* ------------------------------------------------------------- tasks */

/* What a task's GPU implementation does: its "kernel" writes its first
 * buffer (filled with `byte` by the host, as the stand-in's kernels move
 * no bytes) and `scratch` (scratch_n bytes, if any), then it arms the
 * failures listed, so that they hit the calls the worker makes after the
 * launch: the releases of the buffers, the fence of the task's end, the
 * polls of that fence. */
typedef struct task_plan {
    void *scratch;
    size_t scratch_n;
    int byte;
    int rc; /* what the implementation returns */
    struct {
        const char *call;
        unsigned skip, times;
    } fail[3];
} task_plan;

static int gpu_task(const um_task_exec *e)
{
    const task_plan *tp = e->user;
    if (e->nbuffers > 0) {
        CHECK_EQ(lazy_launch(e->stream, e->ptrs[0], e->sizes[0]), 0);
        /* The kernel's bytes: the stand-in's GPU memory is the host's. */
        memset(e->ptrs[0], tp->byte, e->sizes[0]);
    }
    if (tp->scratch)
        CHECK_EQ(lazy_launch(e->stream, tp->scratch, tp->scratch_n), 0);
    for (int i = 0; i < 3 && tp->fail[i].call; i++)
        cuda_fail(tp->fail[i].call, tp->fail[i].skip, tp->fail[i].times, 999);
    return tp->rc;
}

static int cpu_never(const um_task_exec *e)
{
    (void)e;
    harness_report(__FILE__, __LINE__, "the task ran on the host");
    return 1;
}

/* Submits a task of plan tp on GPU 1 that writes b (WRITE_DISCARD), or
 * none (b NULL); its id. */
static um_task_id submit_gpu(um_context *ctx, um_buffer *b, task_plan *tp)
{
    um_task t = {0};
    t.name = "order";
    t.cpu = cpu_never;
    t.cuda = gpu_task;
    t.device = 1;
    t.user = tp;
    if (b) {
        t.nbuffers = 1;
        t.buffers[0] = b;
        t.modes[0] = UM_ACCESS_WRITE_DISCARD;
    }
    um_task_id id = 0;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    return id;
}

/* A GPU task (on GPU 1, writing a buffer of 2 MiB and a scratch block of
 * the program's) that arms the failures of `fail` once its kernel is
 * queued; um_task_wait's status should be `want`, its message mentioning
 * m1 and m2 (when not NULL). With `reuse`, the task's work is done when
 * the wait returns: the scratch block, freed then and taken again on the
 * default stream, is written there with no race (and the buffer holds
 * the task's bytes when it succeeded). (The worker took a task whose end
 * it could not fence, whose event it could not ask, or whose
 * implementation failed after it queued work, for ended with its kernel
 * queued: the wait returned, and memory the kernel used was reused under
 * it.) */
static void check_task_end(const char *name, const task_plan *plan, um_status want, const char *m1,
                           const char *m2, bool reuse)
{
    counts c;
    um_context *ctx = check_open(name, ONE_GPU, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    void *scratch = NULL;
    CHECK_OK(um_malloc(ctx, 1, BLOCK, NULL, &scratch));
    if (b && scratch) {
        task_plan tp = *plan;
        tp.scratch = scratch;
        tp.scratch_n = BLOCK;
        tp.byte = 0x5A;
        um_task_id id = submit_gpu(ctx, b, &tp);
        um_status st = um_task_wait(ctx, id);
        CHECK_STATUS(st, want);
        if (st != UM_OK && m1)
            CHECK_ERROR_MENTIONS(m1, m2 ? m2 : m1, m1);
        if (st != UM_OK)
            printf("   %s\n", um_last_error());
        cuda_fail_clear();
        if (reuse) {
            CHECK_OK(um_free(ctx, scratch, NULL));
            void *again = NULL;
            CHECK_OK(um_malloc(ctx, 1, BLOCK, NULL, &again));
            CHECK(again == scratch);
            scratch = again;
            if (again)
                write_block(ctx, again, BLOCK, 0x11, NULL);
            CHECK_EQ(races_since(c), 0);
            if (want == UM_OK)
                CHECK_EQ(buffer_count_not(b, n, 0x5A), 0);
        }
    }
    (void)um_wait_all(ctx);
    if (b)
        CHECK_OK(um_buffer_destroy(b));
    /* Once the GPU's work is done (a failed task's may still run). */
    CHECK_OK(um_stream_synchronize(ctx, NULL));
    lazy_drain();
    if (scratch)
        CHECK_OK(um_free(ctx, scratch, NULL));
    check_end(ctx, c);
}

static void check_task_ends(void)
{
    /* The release's fence is recorded; the task's end is neither recorded
     * nor waited for, once. */
    task_plan unfenced = {.fail = {{"cuEventRecord", 1, 1}, {"cuStreamSynchronize", 0, 1}}};
    check_task_end("a GPU task whose end can be neither fenced nor waited for, once", &unfenced,
                   UM_OK, NULL, NULL, true);
    /* The first poll of the task's end fails. */
    task_plan unasked = {.fail = {{"cuEventQuery", 0, 1}}};
    check_task_end("a GPU task whose end's event cannot be asked, once", &unasked, UM_OK, NULL,
                   NULL, true);
    /* The driver neither records nor waits for streams any more: the task
     * fails, saying why and that its work may still run. */
    task_plan broken = {.fail = {{"cuEventRecord", 1, 1000}, {"cuStreamSynchronize", 0, 1000}}};
    check_task_end("a GPU task whose end can never be fenced nor waited for", &broken, UM_ERR_TASK,
                   "cuEventRecord", "cuStreamSynchronize", false);
    /* No driver failure: the implementation fails after queuing its
     * kernel, which still runs when the task ends. */
    task_plan failing = {.rc = 1};
    check_task_end("a GPU task that fails after queuing work", &failing, UM_ERR_TASK, "returned 1",
                   NULL, true);
}

/* A GPU task whose buffer's release can be neither fenced (cuEventRecord)
 * nor waited for (cuStreamSynchronize), once: the worker releases it again
 * once the driver works, the task succeeds, and the buffer holds its bytes,
 * can be written by the next task and destroyed. (The task failed, and the
 * buffer stayed acquired for good: the next task waited ten seconds for it
 * and failed, and um_buffer_destroy failed.) */
static void check_task_release_unfenced(void)
{
    counts c;
    um_context *ctx =
        check_open("a task's release that can be neither fenced nor waited for, once", ONE_GPU, &c);
    if (!ctx)
        return;
    const size_t n = 2 * MIB;
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    if (b) {
        task_plan tp = {.byte = 0x5A,
                        .fail = {{"cuEventRecord", 0, 1}, {"cuStreamSynchronize", 0, 1}}};
        um_status st = um_task_wait(ctx, submit_gpu(ctx, b, &tp));
        CHECK_OK(st);
        cuda_fail_clear();
        CHECK_EQ(buffer_count_not(b, n, 0x5A), 0);
        task_plan next = {.byte = 0x6B};
        CHECK_OK(um_task_wait(ctx, submit_gpu(ctx, b, &next)));
        CHECK_EQ(buffer_count_not(b, n, 0x6B), 0);
        CHECK_EQ(races_since(c), 0);
        CHECK_OK(um_buffer_destroy(b));
    }
    check_end(ctx, c);
}

/* ------------------------------------------------------- stream use */

/* A block of GPU 1 taken on stream s1 and written by a kernel on s2,
 * marked for s2 (um_record_stream). */
static void *marked_block(um_context *ctx, um_stream s1, um_stream s2)
{
    void *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &p));
    if (p) {
        CHECK_EQ(lazy_launch(native_of(s2), p, BLOCK), 0);
        CHECK_OK(um_record_stream(ctx, p, s2));
    }
    return p;
}

/* The free on s1 of a block marked for s2, whose kernel there is queued,
 * where s2 can be neither fenced (cuEventRecord) nor waited for
 * (cuStreamSynchronize): the free fails, naming both, and the block stays
 * live and marked; freed again, its memory is taken on s1 only after the
 * kernel: no race. */
static void check_marked_free_unfenced(void)
{
    counts c;
    um_context *ctx = check_open("a marked block's free whose stream can be neither fenced nor "
                                 "waited for",
                                 ONE_GPU, &c);
    if (!ctx)
        return;
    um_stream s1 = NULL, s2 = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s1));
    CHECK_OK(um_stream_create(ctx, 1, &s2));
    void *p = marked_block(ctx, s1, s2);
    if (p) {
        cuda_fail("cuEventRecord", 0, 1, 999);
        cuda_fail("cuStreamSynchronize", 0, 1, 999);
        um_status st = um_free(ctx, p, s1);
        CHECK_STATUS(st, UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("cuEventRecord", "cuStreamSynchronize", "stays live and marked");
        printf("   %s\n", um_last_error());
        cuda_fail_clear();
        CHECK_OK(um_free(ctx, p, s1));
        void *q = NULL;
        CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &q));
        if (q) {
            write_block(ctx, q, BLOCK, 0x11, s1);
            CHECK_OK(um_free(ctx, q, s1));
        }
        CHECK_EQ(races_since(c), 0);
    }
    CHECK_OK(um_stream_synchronize(ctx, s2));
    CHECK_OK(um_stream_destroy(ctx, s1));
    CHECK_OK(um_stream_destroy(ctx, s2));
    check_end(ctx, c);
}

/* A deferred free (a block marked for s2, freed on s1) whose event on s2
 * cannot be asked (cuEventQuery) nor waited for (cuEventSynchronize), nor
 * s2 itself (cuStreamSynchronize): the block stays deferred, so an
 * allocation on s1 takes other memory, and one at the limit that needs the
 * block's fails, naming the calls; once the driver works it has it: no
 * race. */
static void check_deferred_unasked(void)
{
    counts c;
    um_context *ctx = check_open("a deferred free whose event can be neither asked nor waited for",
                                 ONE_GPU ",memory_limit=8M", &c);
    if (!ctx)
        return;
    um_stream s1 = NULL, s2 = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s1));
    CHECK_OK(um_stream_create(ctx, 1, &s2));
    void *p = marked_block(ctx, s1, s2), *q = NULL, *r = NULL;
    if (p) {
        CHECK_OK(um_free(ctx, p, s1));
        cuda_fail("cuEventQuery", 0, 1000, 999);
        cuda_fail("cuEventSynchronize", 0, 1000, 999);
        cuda_fail("cuStreamSynchronize", 0, 1000, 999);
        CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &q));
        CHECK(q != p);
        um_status st = um_malloc(ctx, 1, BLOCK, s1, &r);
        CHECK_STATUS(st, UM_ERR_NOMEM);
        CHECK_ERROR_MENTIONS("cannot allocate", "um_record_stream", "cuStreamSynchronize");
        printf("   %s\n", um_last_error());
        cuda_fail_clear();
        if (st != UM_OK)
            CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &r));
        if (r)
            write_block(ctx, r, BLOCK, 0x11, s1);
        CHECK_EQ(races_since(c), 0);
    }
    if (q)
        CHECK_OK(um_free(ctx, q, s1));
    if (r)
        CHECK_OK(um_free(ctx, r, s1));
    CHECK_OK(um_stream_synchronize(ctx, s2));
    CHECK_OK(um_stream_destroy(ctx, s1));
    CHECK_OK(um_stream_destroy(ctx, s2));
    check_end(ctx, c);
}

/* A block marked for s2, whose kernel there is still queued, when s2 is
 * destroyed (legal: the stream's work still runs): the block's free on s1
 * must wait for that work, so the memory taken again on s1 is written
 * after the kernel: no race. The backend's destroy waits for the stream
 * first; where that wait fails (cuStreamSynchronize), the destroy fails,
 * saying why, and s2 stays with its marks. (Correct when written: a guard
 * for the marks a destroy drops.) */
static void check_marked_stream_destroyed(void)
{
    counts c;
    um_context *ctx =
        check_open("a marked block's stream destroyed with its work queued", ONE_GPU, &c);
    if (!ctx)
        return;
    um_stream s1 = NULL, s2 = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s1));
    CHECK_OK(um_stream_create(ctx, 1, &s2));
    void *p = marked_block(ctx, s1, s2);
    if (p) {
        cuda_fail("cuStreamSynchronize", 0, 1, 999);
        cuda_fail("cuEventSynchronize", 0, 1, 999);
        um_status st = um_stream_destroy(ctx, s2);
        cuda_fail_clear();
        if (st != UM_OK) {
            CHECK_ERROR_MENTIONS("cuStreamSynchronize", "destroying", "destroying");
            CHECK_OK(um_stream_destroy(ctx, s2));
        }
        s2 = NULL;
        CHECK_OK(um_free(ctx, p, s1));
        void *q = NULL;
        CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &q));
        CHECK(q == p);
        if (q) {
            write_block(ctx, q, BLOCK, 0x11, s1);
            CHECK_OK(um_free(ctx, q, s1));
        }
        CHECK_EQ(races_since(c), 0);
    }
    if (s2)
        CHECK_OK(um_stream_destroy(ctx, s2));
    CHECK_OK(um_stream_destroy(ctx, s1));
    check_end(ctx, c);
}

/* ------------------------------------------------------------- pool */

/* A block freed on s1 behind a kernel there, at a limit of one block,
 * where s1's fence can be neither recorded (cuEventRecord), asked
 * (cuEventQuery) nor waited for (cuEventSynchronize), nor s1 itself
 * (cuStreamSynchronize): an allocation on s2 (which needs that memory)
 * fails, naming the calls; once the driver works it has the memory, after
 * the kernel: no race. Then the same with only cuStreamWaitEvent failing
 * (the pool orders s2 after s1 on the device, else waits on the host). */
static void check_pool_reuse_unordered(void)
{
    counts c;
    um_context *ctx = check_open("the pool's reuse of a block freed on another stream, unordered",
                                 ONE_GPU ",memory_limit=4M", &c);
    if (!ctx)
        return;
    um_stream s1 = NULL, s2 = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s1));
    CHECK_OK(um_stream_create(ctx, 1, &s2));
    static const char *const calls[] = {"cuEventRecord", "cuEventQuery", "cuEventSynchronize",
                                        "cuStreamSynchronize"};
    for (int round = 0; round < 2; round++) {
        void *p = NULL, *q = NULL;
        CHECK_OK(um_malloc(ctx, 1, BLOCK, s1, &p));
        if (!p)
            break;
        CHECK_EQ(lazy_launch(native_of(s1), p, BLOCK), 0);
        if (round == 0) {
            for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
                cuda_fail(calls[i], 0, 1000, 999);
            CHECK_OK(um_free(ctx, p, s1));
            um_status st = um_malloc(ctx, 1, BLOCK, s2, &q);
            CHECK_STATUS(st, UM_ERR_NOMEM);
            CHECK_ERROR_MENTIONS("cannot allocate", "cannot be waited for", "cuStreamSynchronize");
            printf("   %s\n", um_last_error());
            cuda_fail_clear();
            if (st != UM_OK)
                CHECK_OK(um_malloc(ctx, 1, BLOCK, s2, &q));
        } else {
            cuda_fail("cuStreamWaitEvent", 0, 1000, 999);
            CHECK_OK(um_free(ctx, p, s1));
            CHECK_OK(um_malloc(ctx, 1, BLOCK, s2, &q));
            cuda_fail_clear();
        }
        if (q) {
            write_block(ctx, q, BLOCK, 0x11, s2);
            CHECK_OK(um_free(ctx, q, s2));
        }
        CHECK_EQ(races_since(c), 0);
        CHECK_OK(um_stream_synchronize(ctx, s2));
    }
    CHECK_OK(um_stream_destroy(ctx, s1));
    CHECK_OK(um_stream_destroy(ctx, s2));
    check_end(ctx, c);
}

int main(void)
{
    if (!lazy_driver_open("test_order_tasks", 1))
        return SKIP;
    check_task_ends();
    check_task_release_unfenced();
    check_marked_free_unfenced();
    check_deferred_unasked();
    check_marked_stream_destroyed();
    check_pool_reuse_unordered();
    return harness_finish("test_order_tasks");
}
