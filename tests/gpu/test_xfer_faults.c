/*
 * The transfer engine's staging paths (src/buffer/transfer.c) when a GPU
 * call fails, on two stand-in GPUs (fake_cuda.c). The stand-in driver does
 * its copies when they are queued, so stale DMA could never show there:
 * this test puts a layer over the two GPUs' backends that keeps every
 * queued copy pending until something waits for it, and then also runs
 * whatever other streams still have queued, after it (a legal order: those
 * streams run on their own). A copy left running against a staging slot
 * therefore lands just after the next copy has filled that slot, as it
 * could on a real GPU. The layer can also fail the next event records and
 * stream waits. Checked:
 *  - a staged copy whose event record fails waits for its stream before
 *    the slots are reused: nothing of it is left queued, and the next
 *    staged copy, from the other GPU, reads back its own bytes;
 *  - when that wait fails as well, the slots are leaked (never reused) and
 *    the error says so, for a staged copy and for a two-hop copy, and the
 *    copy's fence is left unrecorded on its stream (for a two-hop copy,
 *    the second hops' after the first hops'): waited for once the driver
 *    works, it runs what is left of the copy;
 *  - when no staging slots can be had (a failed map; a full host pool),
 *    copies go unstaged instead of failing: between a GPU and program
 *    memory, between GPUs without peer copies, and so a full GPU's only
 *    copy reaches the spill file with the host full too;
 *  - the staging allocation at the host memory limit, waiting in reclaim
 *    for a buffer another call holds, does not hold the engine's lock:
 *    other calls into the engine go on meanwhile, and the allocation
 *    succeeds once the buffer is let go;
 *  - no deadlock between two-hop copies and evictions whose write-back is
 *    staged (the staging pool's one_copy and the engine's lock, taken in
 *    opposite orders before): threads copy between the GPUs, fill the
 *    GPUs past their limits and make staged copies, and a watchdog fails
 *    the test when none of them gets on for 5 s;
 *  - a copy to a GPU ordered after another driver's fence (a sim
 *    device's modelled copy, which the host waits for) does not hold up
 *    the other copies to that GPU meanwhile.
 * Skips (77) unless UM_TEST_FAKE_CUDA is set and there are two GPUs.
 */
#include "base/vtime.h"
#include "buffer/buffer.h"
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KB ((size_t)1024)
#define CHUNK (64 * KB)

/* ------------------------------------------------- the deferring layer */

typedef struct pending {
    int kind; /* 0: copy, 1: wait for an event, 2: memset */
    um__backend *b;
    um__bstream *s;
    const void *key; /* the stream: s, or b for its default stream */
    void *dst;
    const void *src;
    size_t n;
    int value;
    const void *wkey; /* a wait: the event's stream and position */
    size_t wupto;
    bool done;
} pending;

typedef struct recorded {
    um__bevent *e;
    const void *key;
    size_t upto; /* the event completes once ops[0..upto) of key have run */
} recorded;

static struct {
    pthread_mutex_t mu;
    um__backend *be[4];
    const um__backend_ops *real[4];
    pending ops[8192];
    size_t nops;
    recorded ev[1024];
    size_t nev;
    int fail_records; /* the next this many event records fail */
    int fail_syncs;   /* the next this many stream syncs fail */
} L = {.mu = PTHREAD_MUTEX_INITIALIZER};

static um__backend_ops layer_ops;

static const um__backend_ops *real_of(um__backend *b)
{
    for (int i = 0; i < 4; i++)
        if (L.be[i] == b)
            return L.real[i];
    abort();
}

static const void *key_of(um__backend *b, um__bstream *s)
{
    return s ? (const void *)s : (const void *)b;
}

static void run_op(pending *p);

/* Runs what stream key queued before position upto (and what it waited
 * for), in order. */
static void run_upto(const void *key, size_t upto)
{
    for (size_t i = 0; i < upto && i < L.nops; i++)
        if (!L.ops[i].done && L.ops[i].key == key)
            run_op(&L.ops[i]);
}

static void run_op(pending *p)
{
    p->done = true;
    if (p->kind == 1)
        run_upto(p->wkey, p->wupto);
    else if (p->kind == 0)
        (void)real_of(p->b)->copy_async(p->b, p->dst, p->src, p->n, p->s);
    else
        (void)real_of(p->b)->memset_async(p->b, p->dst, p->value, p->n, p->s);
}

/* Everything still queued on any stream: it runs after what was waited for. */
static void run_rest(void)
{
    for (size_t i = 0; i < L.nops; i++)
        if (!L.ops[i].done)
            run_op(&L.ops[i]);
    L.nops = 0;
}

static size_t queued(void)
{
    pthread_mutex_lock(&L.mu);
    size_t n = 0;
    for (size_t i = 0; i < L.nops; i++)
        n += !L.ops[i].done;
    pthread_mutex_unlock(&L.mu);
    return n;
}

static recorded *find_event(um__bevent *e)
{
    for (size_t i = 0; i < L.nev; i++)
        if (L.ev[i].e == e)
            return &L.ev[i];
    return NULL;
}

static void push(pending p)
{
    if (L.nops == sizeof L.ops / sizeof L.ops[0])
        abort();
    L.ops[L.nops++] = p;
}

static um_status l_copy_async(um__backend *b, void *dst, const void *src, size_t n, um__bstream *s)
{
    pthread_mutex_lock(&L.mu);
    push((pending){0, b, s, key_of(b, s), dst, src, n, 0, NULL, 0, false});
    pthread_mutex_unlock(&L.mu);
    return UM_OK;
}

static um_status l_memset_async(um__backend *b, void *dst, int value, size_t n, um__bstream *s)
{
    pthread_mutex_lock(&L.mu);
    push((pending){2, b, s, key_of(b, s), dst, NULL, n, value, NULL, 0, false});
    pthread_mutex_unlock(&L.mu);
    return UM_OK;
}

static um_status l_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{
    pthread_mutex_lock(&L.mu);
    if (L.fail_records > 0) {
        L.fail_records--;
        pthread_mutex_unlock(&L.mu);
        return um__fail(UM_ERR_BACKEND, "test layer: injected event record failure");
    }
    um_status st = real_of(b)->event_record(b, s, out);
    if (st == UM_OK) {
        recorded *r = find_event(*out);
        if (!r) {
            if (L.nev == sizeof L.ev / sizeof L.ev[0])
                abort();
            r = &L.ev[L.nev++];
        }
        *r = (recorded){*out, key_of(b, s), L.nops};
    }
    pthread_mutex_unlock(&L.mu);
    return st;
}

static void l_event_destroy(um__backend *b, um__bevent *e)
{
    pthread_mutex_lock(&L.mu);
    recorded *r = find_event(e);
    if (r)
        *r = L.ev[--L.nev];
    pthread_mutex_unlock(&L.mu);
    real_of(b)->event_destroy(b, e);
}

/* An event completes: what it stands for runs, then the rest. */
static void complete(um__bevent *e)
{
    pthread_mutex_lock(&L.mu);
    recorded *r = find_event(e);
    if (r)
        run_upto(r->key, r->upto);
    run_rest();
    pthread_mutex_unlock(&L.mu);
}

static um_status l_event_sync(um__backend *b, um__bevent *e)
{
    complete(e);
    return real_of(b)->event_sync(b, e);
}

static um_status l_event_query(um__backend *b, um__bevent *e, int *done)
{
    complete(e);
    return real_of(b)->event_query(b, e, done);
}

static um_status l_stream_wait(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e)
{
    pthread_mutex_lock(&L.mu);
    recorded *r = find_event(e);
    if (r)
        push((pending){1, b, s, key_of(b, s), NULL, NULL, 0, 0, r->key, r->upto, false});
    pthread_mutex_unlock(&L.mu);
    return real_of(b)->stream_wait(b, s, eb, e);
}

static um_status l_stream_sync(um__backend *b, um__bstream *s)
{
    pthread_mutex_lock(&L.mu);
    if (L.fail_syncs > 0) {
        L.fail_syncs--;
        pthread_mutex_unlock(&L.mu);
        return um__fail(UM_ERR_BACKEND, "test layer: injected stream sync failure");
    }
    run_upto(key_of(b, s), L.nops);
    run_rest();
    pthread_mutex_unlock(&L.mu);
    return real_of(b)->stream_sync(b, s);
}

/* Puts the layer over GPUs 1 and 2. */
static void layer_install(um_context *ctx)
{
    layer_ops = *ctx->devices[1].backend->ops;
    layer_ops.copy_async = l_copy_async;
    layer_ops.memset_async = l_memset_async;
    layer_ops.event_record = l_event_record;
    layer_ops.event_destroy = l_event_destroy;
    layer_ops.event_sync = l_event_sync;
    layer_ops.event_query = l_event_query;
    layer_ops.stream_wait = l_stream_wait;
    layer_ops.stream_sync = l_stream_sync;
    for (int d = 1; d <= 2; d++) {
        L.be[d] = ctx->devices[d].backend;
        L.real[d] = L.be[d]->ops;
        L.be[d]->ops = &layer_ops;
    }
}

static void layer_remove(um_context *ctx)
{
    pthread_mutex_lock(&L.mu);
    run_rest();
    L.nev = 0;
    L.fail_records = L.fail_syncs = 0;
    pthread_mutex_unlock(&L.mu);
    for (int d = 1; d <= 2; d++) {
        ctx->devices[d].backend->ops = L.real[d];
        L.be[d] = NULL;
    }
}

static void arm(int records, int syncs)
{
    pthread_mutex_lock(&L.mu);
    L.fail_records = records;
    L.fail_syncs = syncs;
    pthread_mutex_unlock(&L.mu);
}

/* ------------------------------------------------------------- helpers */

static um_context *open_two_gpus(const char *extra)
{
    char conf[256];
    /* One staging worker (3 slots), 64 KiB chunks, the model's links (no
     * measuring), no background eviction. */
    snprintf(conf, sizeof conf,
             "devices=cuda,copy_chunk=64K,copy_threads=1,links=model,link_cache=none,"
             "watermark_high=100,watermark_low=100%s",
             extra);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (ctx && (um_device_count(ctx) < 3 || !ctx->devices[0].backend->pinned)) {
        harness_report(__FILE__, __LINE__, "needs two GPUs and pinned host memory");
        um_shutdown(ctx);
        return NULL;
    }
    return ctx;
}

/* n bytes of GPU dev's memory holding `byte` everywhere. */
static void *gpu_filled(um_context *ctx, int dev, size_t n, int byte)
{
    void *p = NULL;
    CHECK_OK(um_malloc(ctx, dev, n, NULL, &p));
    if (p)
        memset(p, byte, n); /* the stand-in's GPU memory is host memory */
    return p;
}

static size_t count_not(const unsigned char *p, size_t n, unsigned char byte)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != byte;
    return bad;
}

static size_t host_active(um_context *ctx)
{
    um_stats s;
    CHECK_OK(um_stats_get(ctx, 0, &s));
    return s.active_bytes;
}

/* --------------------------------------------------------------- tests */

/* A staged copy out of GPU 1 whose first chunk's event record fails, then
 * a staged copy out of GPU 2 through the same slots. syncs: stream syncs
 * that fail too (0: the failed copy's stream can be waited for). */
static void test_stale_chunk(int syncs)
{
    um_context *ctx = open_two_gpus("");
    if (!ctx)
        return;
    const size_t n = 6 * CHUNK;
    um__xfer *x;
    CHECK_OK(um__xfer_get(ctx, &x));
    layer_install(ctx);
    void *g1 = gpu_filled(ctx, 1, n, 0xA1), *g2 = gpu_filled(ctx, 2, n, 0xB2);
    unsigned char *h1 = malloc(n), *h2 = malloc(n);
    memset(h1, 0, n);
    memset(h2, 0, n);
    um__fence done;

    /* A first copy, successful, takes the slots. */
    size_t active_pre = host_active(ctx);
    CHECK_OK(um__xfer_copy(x, 0, h2, 2, g2, n, NULL, 0, &done));
    um__fence_drop(&done);
    CHECK_EQ(count_not(h2, n, 0xB2), 0);
    size_t active0 = host_active(ctx), slots = active0 - active_pre;
    CHECK(slots >= 3 * CHUNK);

    arm(1, syncs);
    CHECK_STATUS(um__xfer_copy(x, 0, h1, 1, g1, n, NULL, 0, &done), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("staged copy", "injected event record failure", NULL);
    if (syncs) {
        /* The wait failed: the slots the stale chunk may write are left
         * alone, and the error says so. */
        CHECK_ERROR_MENTIONS("injected stream sync failure", "leaked", NULL);
        CHECK_EQ(queued(), 1);
        /* The copy's stream stands for the chunk still queued (out of the
         * GPU's memory, which must not be reused before it): waited for
         * once the driver works, it has run. */
        CHECK(done.unrecorded);
        arm(0, 0);
        CHECK_OK(um__fence_wait(x, &done));
        CHECK_EQ(queued(), 0);
    } else {
        /* The failed copy's stream was waited for: nothing of it is left
         * running against a slot. */
        CHECK_EQ(queued(), 0);
        CHECK(!um__fence_pending(&done));
    }
    arm(0, 0);

    /* The next copy, out of the other GPU, reads its own bytes, whatever
     * the failed copy left queued. */
    memset(h2, 0, n);
    CHECK_OK(um__xfer_copy(x, 0, h2, 2, g2, n, NULL, 0, &done));
    um__fence_drop(&done);
    CHECK_EQ(count_not(h2, n, 0xB2), 0);
    /* Leaked slots stay allocated and new ones were taken; otherwise the
     * same slots serve. */
    CHECK_EQ(host_active(ctx) - active0, syncs ? slots : 0);

    layer_remove(ctx);
    CHECK_OK(um_free(ctx, g1, NULL));
    CHECK_OK(um_free(ctx, g2, NULL));
    free(h1);
    free(h2);
    um_shutdown(ctx);
}

/* A two-hop copy (GPU 1 to GPU 2 with peer_copies=0) whose first hop's
 * event record fails and whose streams cannot be waited for: its slots are
 * leaked, its fence is the second hops' stream after the first hops'
 * (both GPUs' memory stays in its use until then), which runs what is left
 * of it once waited for, and a staged copy out of GPU 2 afterwards reads
 * its own bytes. */
static void test_two_hop_leak(void)
{
    um_context *ctx = open_two_gpus(",peer_copies=0");
    if (!ctx)
        return;
    const size_t n = 6 * CHUNK;
    um__xfer *x;
    CHECK_OK(um__xfer_get(ctx, &x));
    layer_install(ctx);
    void *g1 = gpu_filled(ctx, 1, n, 0xA1), *g2 = gpu_filled(ctx, 2, n, 0xB2);
    void *g2b = gpu_filled(ctx, 2, n, 0x00);
    unsigned char *h = malloc(n);
    um__fence done;

    /* Successful first: both hops in chunks through the slots. */
    size_t active_pre = host_active(ctx);
    CHECK_OK(um__xfer_copy(x, 2, g2b, 1, g1, n, NULL, 0, &done));
    CHECK_OK(um__fence_wait(x, &done));
    CHECK_EQ(count_not(g2b, n, 0xA1), 0);
    size_t active0 = host_active(ctx), slots = active0 - active_pre;
    CHECK(slots >= 3 * CHUNK);

    arm(1, 2);
    CHECK_STATUS(um__xfer_copy(x, 2, g2b, 1, g1, n, NULL, 0, &done), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("two-hop copy", "injected event record failure", "leaked");
    CHECK(done.unrecorded && done.upstream);
    CHECK(queued() > 0);
    arm(0, 0);
    CHECK_OK(um__fence_wait(x, &done));
    CHECK_EQ(queued(), 0);

    memset(h, 0, n);
    CHECK_OK(um__xfer_copy(x, 0, h, 2, g2, n, NULL, 0, &done));
    um__fence_drop(&done);
    CHECK_EQ(count_not(h, n, 0xB2), 0);
    CHECK_EQ(host_active(ctx) - active0, slots);

    layer_remove(ctx);
    CHECK_OK(um_free(ctx, g1, NULL));
    CHECK_OK(um_free(ctx, g2, NULL));
    CHECK_OK(um_free(ctx, g2b, NULL));
    free(h);
    um_shutdown(ctx);
}

/* A staging allocation that fails (here a failed map of host memory)
 * leaves the copy unstaged, not failed: a staged copy and a two-hop one
 * arrive whole without taking slots, and the next copy maps its slots. */
static void test_alloc_fails(void)
{
    for (int two_hop = 0; two_hop < 2; two_hop++) {
        um_context *ctx =
            open_two_gpus(two_hop ? ",peer_copies=0,fault=0:map@1" : ",fault=0:map@1");
        if (!ctx)
            return;
        const size_t n = 6 * CHUNK;
        um__xfer *x;
        CHECK_OK(um__xfer_get(ctx, &x));
        void *g1 = gpu_filled(ctx, 1, n, 0xA1), *g2 = gpu_filled(ctx, 2, n, 0);
        unsigned char *h = malloc(n);
        unsigned char *dst = two_hop ? g2 : h;
        size_t active0 = host_active(ctx);
        for (int attempt = 0; attempt < 2; attempt++) {
            memset(dst, 0, n);
            um__fence done;
            CHECK_OK(two_hop ? um__xfer_copy(x, 2, g2, 1, g1, n, NULL, 0, &done)
                             : um__xfer_copy(x, 0, h, 1, g1, n, NULL, 0, &done));
            CHECK_OK(um__fence_wait(x, &done));
            CHECK_EQ(count_not(dst, n, 0xA1), 0);
            /* The first went without slots, the second took them. */
            if (attempt == 0)
                CHECK_EQ(host_active(ctx), active0);
            else
                CHECK(host_active(ctx) >= active0 + 3 * CHUNK);
        }
        CHECK_OK(um_free(ctx, g1, NULL));
        CHECK_OK(um_free(ctx, g2, NULL));
        free(h);
        um_shutdown(ctx);
    }
}

static um_buffer *gpu_buffer(um_context *ctx, int dev, size_t n, int byte)
{
    um_buffer *b = NULL;
    void *p = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &b));
    CHECK_OK(um_buffer_acquire(b, dev, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    if (p)
        memset(p, byte, n);
    CHECK_OK(um_buffer_release(b, dev, NULL));
    return b;
}

/* The host pool full (its one buffer pinned), so that no staging slots can
 * be had: copies between a GPU and program memory, and between the GPUs
 * without peer copies, go unstaged instead of failing. So a buffer's only
 * copy on a full GPU still goes to the spill file, with the host full as
 * well, and comes back from it; and buffers are read and written. */
static void test_host_full(void)
{
    char dir[] = "/tmp/test_xfer_faults-XXXXXX", extra[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(extra, sizeof extra, ",peer_copies=0,spill_dir=%s", dir);
    um_context *ctx = open_two_gpus(extra);
    if (!ctx) {
        (void)rmdir(dir);
        return;
    }
    const size_t n = 6 * CHUNK, size = 2 * 1024 * KB;
    um__xfer *x;
    CHECK_OK(um__xfer_get(ctx, &x));
    unsigned char *h = malloc(size);
    memset(h, 0x11, size);
    um_buffer *hb = NULL;
    CHECK_OK(um_buffer_create(ctx, size, NULL, &hb));
    CHECK_OK(um_buffer_write(hb, 0, h, size));
    CHECK_OK(um_buffer_hint(hb, UM_HINT_PIN));
    um_stats s;
    CHECK_OK(um_stats_get(ctx, 0, &s));
    CHECK_EQ(s.active_bytes, s.reserved_bytes);
    CHECK_OK(um_set_memory_limit(ctx, 0, s.reserved_bytes));
    size_t active0 = s.active_bytes;

    /* GPU to program memory, back, and GPU to GPU. */
    void *g1 = gpu_filled(ctx, 1, n, 0xA1), *g2 = gpu_filled(ctx, 2, n, 0);
    um__fence done;
    CHECK_OK(um__xfer_copy(x, 0, h, 1, g1, n, NULL, 0, &done));
    CHECK_OK(um__fence_wait(x, &done));
    CHECK_EQ(count_not(h, n, 0xA1), 0);
    memset(h, 0xC3, n);
    CHECK_OK(um__xfer_copy(x, 1, g1, 0, h, n, NULL, 0, &done));
    CHECK_OK(um__fence_wait(x, &done));
    CHECK_EQ(count_not(g1, n, 0xC3), 0);
    CHECK_OK(um__xfer_copy(x, 2, g2, 1, g1, n, NULL, 0, &done));
    CHECK_OK(um__fence_wait(x, &done));
    CHECK_EQ(count_not(g2, n, 0xC3), 0);
    CHECK_EQ(host_active(ctx), active0);
    CHECK_OK(um_free(ctx, g1, NULL));
    CHECK_OK(um_free(ctx, g2, NULL));

    /* GPU 1 holds two buffers' only copies and room for no third; GPU 2
     * has room for none: the third's acquisition spills one of them. */
    CHECK_OK(um_set_memory_limit(ctx, 1, 2 * size));
    CHECK_OK(um_set_memory_limit(ctx, 2, size / 2));
    um_buffer *b[3] = {gpu_buffer(ctx, 1, size, 0xB0), gpu_buffer(ctx, 1, size, 0xB1), NULL};
    void *p = NULL;
    CHECK_OK(um_buffer_create(ctx, size, NULL, &b[2]));
    CHECK_OK(um_buffer_acquire(b[2], 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    if (p)
        memset(p, 0xB2, size);
    CHECK_OK(um_buffer_release(b[2], 1, NULL));
    um_reclaim_stats rs;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_EQ(rs.spilled, 1);
    CHECK_EQ(rs.spilled_bytes, size);
    /* Each read back whole (from the GPU, unstaged, or from the file); the
     * spilled one back on GPU 1 from the file (another spilled for it). */
    for (int i = 0; i < 3; i++) {
        memset(h, 0, size);
        CHECK_OK(um_buffer_read(b[i], 0, h, size));
        CHECK_EQ(count_not(h, size, (unsigned char)(0xB0 + i)), 0);
        CHECK_OK(um_buffer_acquire(b[i], 1, UM_ACCESS_READ, NULL, &p));
        CHECK(p && count_not(p, size, (unsigned char)(0xB0 + i)) == 0);
        CHECK_OK(um_buffer_release(b[i], 1, NULL));
    }
    /* A write of the program's memory into a GPU-owned buffer. */
    memset(h, 0xD4, size);
    CHECK_OK(um_buffer_write(b[2], 0, h, size));
    memset(h, 0, size);
    CHECK_OK(um_buffer_read(b[2], 0, h, size));
    CHECK_EQ(count_not(h, size, 0xD4), 0);
    CHECK_EQ(host_active(ctx), active0);
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    CHECK_OK(um_buffer_destroy(hb));
    free(h);
    um_shutdown(ctx);
    CHECK_EQ(rmdir(dir), 0);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

typedef struct copier {
    um__xfer *x;
    void *dst, *src;
    size_t n;
    um_status st;
    char error[512];
    uint64_t done_ns; /* when the copy returned */
} copier;

static void *copy_thread(void *arg)
{
    copier *c = arg;
    um__fence done;
    c->st = um__xfer_copy(c->x, 0, c->dst, 1, c->src, c->n, NULL, 0, &done);
    c->done_ns = now_ns();
    snprintf(c->error, sizeof c->error, "%s", um_last_error());
    if (c->st == UM_OK)
        um__fence_drop(&done);
    return NULL;
}

/* The host at its memory limit, its only evictable replica's buffer held
 * by another call (here: its lock, taken by the test). The first staged
 * copy's slot allocation may not wait for it (staging slots are
 * optional: the caller of a copy may hold that very buffer), so the copy
 * goes through unstaged while the buffer is still held, and the buffer's
 * host replica stays. Meanwhile this thread asks the engine for a stream,
 * which takes the engine's lock: that must not wait for the copy. */
static void test_alloc_unlocked(void)
{
    um_context *ctx = open_two_gpus("");
    if (!ctx)
        return;
    const size_t page = 2 * 1024 * KB, n = 6 * CHUNK;
    um__xfer *x;
    CHECK_OK(um__xfer_get(ctx, &x));
    um_buffer *b = NULL;
    void *p;
    CHECK_OK(um_buffer_create(ctx, page, NULL, &b));
    if (!b) {
        um_shutdown(ctx);
        return;
    }
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_WRITE, NULL, &p));
    memset(p, 0x5C, page);
    CHECK_OK(um_buffer_release(b, 0, NULL));
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ, NULL, &p));
    CHECK_OK(um_buffer_release(b, 1, NULL));
    /* The host replica owns the data, which GPU 1 holds too: evicting it
     * drops it, with no write-back. */
    CHECK_EQ(um_buffer_replica_state(b, 0), UM_REPLICA_OWNER);
    CHECK_EQ(um_buffer_replica_state(b, 1), UM_REPLICA_SHARED);
    um_stats s;
    CHECK_OK(um_stats_get(ctx, 0, &s));
    CHECK_OK(um_set_memory_limit(ctx, 0, s.reserved_bytes));

    void *g1 = gpu_filled(ctx, 1, n, 0xA1);
    unsigned char *h = calloc(1, n);
    copier c = {x, h, g1, n, UM_OK, "", 0};
    pthread_mutex_lock(&b->lock); /* a call in progress holds b */
    pthread_t t;
    pthread_create(&t, NULL, copy_thread, &c);
    usleep(150 * 1000); /* the copy is now waiting in reclaim */
    uint64_t t0 = now_ns();
    um_stream st2 = um__xfer_stream(x, 2, true);
    double waited_ms = (double)(now_ns() - t0) / 1e6;
    uint64_t let_go = now_ns();
    pthread_mutex_unlock(&b->lock);
    pthread_join(t, NULL);
    printf("test_xfer_faults: the engine's stream came after %.1f ms; the copy: %s\n", waited_ms,
           c.st == UM_OK ? "done" : c.error);
    CHECK(st2 != NULL);
    CHECK(waited_ms < 300.0);
    CHECK_STATUS(c.st, UM_OK);
    CHECK_EQ(count_not(h, n, 0xA1), 0);
    CHECK(c.done_ns < let_go);
    CHECK_EQ(um_buffer_replica_state(b, 0), UM_REPLICA_OWNER);

    CHECK_OK(um_free(ctx, g1, NULL));
    CHECK_OK(um_buffer_destroy(b));
    free(h);
    um_shutdown(ctx);
}

/* ----------------------------------------- two-hop copies and evictions */

static struct {
    um_context *ctx;
    _Atomic unsigned long progress[3];
    _Atomic bool stop;
} lk;

/* Two-hop prefetches from GPU 1 to GPU 2 (the staging pool's one_copy,
 * then the engine's streams). */
static void *hop_main(void *arg)
{
    (void)arg;
    um_buffer *b[4] = {NULL};
    for (int i = 0; i < 4; i++)
        CHECK_OK(um_buffer_create(lk.ctx, 1 << 20, NULL, &b[i]));
    for (unsigned long k = 0; !atomic_load(&lk.stop); k++) {
        um_buffer *x = b[k % 4];
        void *p;
        if (x && um_buffer_acquire(x, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p) == UM_OK)
            CHECK_OK(um_buffer_release(x, 1, NULL));
        if (x)
            (void)um_buffer_prefetch(x, 2);
        atomic_fetch_add(&lk.progress[0], 1);
    }
    for (int i = 0; i < 4; i++)
        if (b[i])
            CHECK_OK(um_buffer_destroy(b[i]));
    return NULL;
}

/* New dirty replicas on full GPUs: their allocations evict others, whose
 * write-backs (to the full host's spill file, or to the other GPU) are
 * staged, under the engine's lock. */
static void *fill_main(void *arg)
{
    (void)arg;
    enum { N = 24 };
    um_buffer *b[N] = {NULL};
    for (unsigned long k = 0; !atomic_load(&lk.stop); k++) {
        int i = (int)(k % N), dev = 1 + (int)(k & 1);
        if (b[i])
            CHECK_OK(um_buffer_destroy(b[i]));
        b[i] = NULL;
        if (um_buffer_create(lk.ctx, 1 << 20, NULL, &b[i]) != UM_OK)
            continue;
        void *p;
        if (um_buffer_acquire(b[i], dev, UM_ACCESS_WRITE_DISCARD, NULL, &p) == UM_OK)
            CHECK_OK(um_buffer_release(b[i], dev, NULL));
        atomic_fetch_add(&lk.progress[1], 1);
    }
    for (int i = 0; i < N; i++)
        if (b[i])
            CHECK_OK(um_buffer_destroy(b[i]));
    return NULL;
}

/* Staged copies between program memory and a GPU's replica, which keep the
 * staging pool busy. */
static void *staged_main(void *arg)
{
    (void)arg;
    size_t n = 4 << 20;
    char *data = malloc(n);
    um_buffer *b = NULL;
    CHECK(data != NULL);
    CHECK_OK(um_buffer_create(lk.ctx, n, NULL, &b));
    if (!data || !b) {
        free(data);
        return NULL;
    }
    memset(data, 7, n);
    for (; !atomic_load(&lk.stop); atomic_fetch_add(&lk.progress[2], 1)) {
        void *p;
        if (um_buffer_acquire(b, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p) == UM_OK)
            CHECK_OK(um_buffer_release(b, 1, NULL));
        (void)um_buffer_write(b, 0, data, n);
        (void)um_buffer_read(b, 0, data, n);
    }
    CHECK_OK(um_buffer_destroy(b));
    free(data);
    return NULL;
}

static void test_two_hops_while_evicting(void)
{
    char dir[] = "/tmp/unimem_test_xfer_spill_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char extra[128];
    snprintf(extra, sizeof extra, ",peer_copies=0,copy_threads=2,spill_dir=%s", dir);
    lk.ctx = open_two_gpus(extra);
    if (!lk.ctx) {
        rmdir(dir);
        return;
    }
    CHECK_OK(um_set_memory_limit(lk.ctx, 0, 16 << 20));
    CHECK_OK(um_set_memory_limit(lk.ctx, 1, 12 << 20));
    CHECK_OK(um_set_memory_limit(lk.ctx, 2, 12 << 20));
    atomic_store(&lk.stop, false);
    for (int i = 0; i < 3; i++)
        atomic_store(&lk.progress[i], 0);
    void *(*mains[5])(void *) = {hop_main, hop_main, fill_main, fill_main, staged_main};
    pthread_t t[5];
    for (int i = 0; i < 5; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, mains[i], NULL), 0);
    /* 8 s of it (the deadlock came within a few), watched every 100 ms. */
    unsigned long last = 0;
    uint64_t end = um__now_ns() + 8000000000ull, moved_at = um__now_ns();
    while (um__now_ns() < end) {
        um__sleep_until_ns(um__now_ns() + 100000000ull);
        unsigned long sum = 0;
        for (int i = 0; i < 3; i++)
            sum += atomic_load(&lk.progress[i]);
        if (sum != last) {
            last = sum;
            moved_at = um__now_ns();
        } else if (um__now_ns() - moved_at > 5000000000ull) {
            printf("test_xfer_faults: no thread got on for 5 s (two-hop copies %lu, "
                   "fills %lu, staged copies %lu): a deadlock\n",
                   atomic_load(&lk.progress[0]), atomic_load(&lk.progress[1]),
                   atomic_load(&lk.progress[2]));
            fflush(stdout);
            _exit(1);
        }
    }
    atomic_store(&lk.stop, true);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    printf("test_xfer_faults: 8 s of two-hop copies (%lu), fills (%lu) and staged copies "
           "(%lu)\n",
           atomic_load(&lk.progress[0]), atomic_load(&lk.progress[1]),
           atomic_load(&lk.progress[2]));
    for (int i = 0; i < 3; i++)
        CHECK(atomic_load(&lk.progress[i]) > 0);
    um_shutdown(lk.ctx);
    CHECK_EQ(rmdir(dir), 0); /* the spill file went with the context */
}

/* Thread 1 writes 4 MiB on a sim device behind a 10 MB/s modelled link
 * (about 400 ms) and then copies it to GPU 1, ordered after that sim
 * copy: the host waits for it. Meanwhile another 64 KiB copy to GPU 1
 * goes at once; it waited for the whole sim copy behind the GPU stream's
 * order lock (306 ms found by an audit). */
static struct {
    um_buffer *x;
    int sim;
    uint64_t t0, wrote_at, copied_at;
} hw;

static void *slow_copy_main(void *arg)
{
    (void)arg;
    void *p;
    if (um_buffer_acquire(hw.x, hw.sim, UM_ACCESS_WRITE, NULL, &p) == UM_OK)
        CHECK_OK(um_buffer_release(hw.x, hw.sim, NULL));
    hw.wrote_at = um__now_ns();
    CHECK_OK(um_buffer_prefetch(hw.x, 1));
    hw.copied_at = um__now_ns();
    return NULL;
}

static void test_host_wait_outside_order_lock(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda+sim:64M,sim_link_bandwidth=10M,links=model,link_cache=none,"
                     "host_memory=pageable",
                     &ctx));
    if (!ctx)
        return;
    hw.sim = um_device_count(ctx) - 1;
    size_t n = 4 << 20, m = 64 << 10;
    char *data = calloc(1, n);
    um_buffer *y = NULL;
    CHECK_OK(um_buffer_create(ctx, n, NULL, &hw.x));
    CHECK_OK(um_buffer_create(ctx, m, NULL, &y));
    CHECK_OK(um_buffer_write(hw.x, 0, data, n));
    CHECK_OK(um_buffer_write(y, 0, data, m));
    CHECK_OK(um_buffer_prefetch(y, 1)); /* the GPU's copy-in stream exists */
    CHECK_OK(um_buffer_write(y, 0, data, m));
    pthread_t t;
    hw.t0 = um__now_ns();
    CHECK_EQ(pthread_create(&t, NULL, slow_copy_main, NULL), 0);
    um__sleep_until_ns(hw.t0 + 100000000ull); /* thread 1 waits for the sim */
    uint64_t a = um__now_ns();
    CHECK_OK(um_buffer_prefetch(y, 1));
    uint64_t took = um__now_ns() - a;
    pthread_join(t, NULL);
    printf("test_xfer_faults: a 64 KiB copy to the GPU took %.1f ms while another waited "
           "%.0f ms for a sim copy\n",
           (double)took / 1e6, (double)(hw.copied_at - hw.t0) / 1e6);
    CHECK(hw.copied_at - hw.t0 > 250000000ull); /* the sim copy was still on */
    CHECK(took < 100000000ull);
    CHECK_OK(um_buffer_destroy(hw.x));
    CHECK_OK(um_buffer_destroy(y));
    um_shutdown(ctx);
    free(data);
}

int main(void)
{
    const char *g = getenv("FAKE_CUDA_GPUS");
    if (!getenv("UM_TEST_FAKE_CUDA") || !g || atoi(g) < 2) {
        printf("test_xfer_faults: SKIPPED: needs the stand-in driver with FAKE_CUDA_GPUS=2\n");
        return 77;
    }
    test_stale_chunk(0);
    test_stale_chunk(1);
    test_two_hop_leak();
    test_alloc_fails();
    test_host_full();
    test_alloc_unlocked();
    test_two_hops_while_evicting();
    test_host_wait_outside_order_lock();
    return harness_finish("test_xfer_faults");
}
