/*
 * test_threads: four threads allocate and free mixed sizes on the same
 * simulated device (then on two devices, then without thread caches), each
 * with its own model of its blocks, writing a pattern into every block and
 * verifying it before the block is freed. Some blocks are handed to another
 * thread through a lock-protected queue and freed there (cross-thread
 * frees). A global lock-protected interval set of every live block checks,
 * on each allocation, that no block ever overlaps another live block of any
 * thread. At the end every block is freed: the statistics must show no live
 * byte, count every allocation and free, and the allocator's consistency
 * check must pass. Also meant to run under ThreadSanitizer.
 *
 * The harness counters are not thread-safe, so worker threads count their
 * own failures and print them; the main thread turns the counts into CHECKs
 * after joining them.
 */
#include "harness.h"

#include "core/core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NTHREADS 4
#define MAX_DEVS 3                       /* the host and up to two simulated devices */
#define OWN_MAX_BYTES ((size_t)48 << 20) /* a thread frees instead of growing past this */
#define OWN_MAX_BLOCKS 512
#define QUEUE_CAP 256
#define MAX_REPORTS 8 /* failures a worker prints before it only counts */

typedef struct tblock {
    uintptr_t addr;
    size_t size;
    uint64_t id;
    int dev;
} tblock;

/* Everything the threads share; `lock` guards the interval set and the
 * handoff queue. */
typedef struct shared {
    um_context *ctx;
    int ndev; /* simulated devices used: 1..ndev */
    pthread_mutex_t lock;
    tblock *live; /* every live block of every thread, sorted by address */
    size_t nlive, caplive;
    tblock queue[QUEUE_CAP]; /* handed-off blocks, FIFO */
    size_t qhead, qlen;
    _Atomic uint64_t next_id;
    _Atomic int finished; /* workers that have returned */
    uint64_t overlaps;    /* under lock */
} shared;

typedef struct worker {
    shared *sh;
    pthread_t tid;
    int index;
    uint64_t rng;
    uint64_t nops;
    tblock own[OWN_MAX_BLOCKS];
    size_t n;
    size_t own_bytes;
    um_stream streams[MAX_DEVS]; /* one stream of its own per device */
    uint64_t allocs[MAX_DEVS], frees[MAX_DEVS];
    uint64_t handed, taken, nomem;
    uint64_t errors;
} worker;

static void worker_fail(worker *w, const char *fmt, ...) UM_PRINTF(2, 3);

static void worker_fail(worker *w, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    if (++w->errors > MAX_REPORTS)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "test_threads: thread %d: %s\n", w->index, msg);
}

/* ------------------------------------------------------------ patterns */

static void pattern_fill(const tblock *b)
{
    harness_pattern_fill((void *)b->addr, b->size, b->id);
}

static bool pattern_check(worker *w, const tblock *b, const char *when)
{
    unsigned char got, want;
    size_t bad = harness_pattern_find_bad((const void *)b->addr, b->size, b->id, &got, &want);
    if (bad != SIZE_MAX) {
        worker_fail(w, "device %d block id %llu (%p, %zu bytes) corrupted at byte %zu %s: 0x%02x, "
                       "expected 0x%02x",
                    b->dev, (unsigned long long)b->id, (void *)b->addr, b->size, bad, when, got,
                    want);
        return false;
    }
    return true;
}

/* -------------------------------------------------------- interval set */

static size_t live_lower(const shared *sh, uintptr_t a)
{
    size_t lo = 0, hi = sh->nlive;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sh->live[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Inserts b into the set of every thread's live blocks, reporting any
 * overlap with a neighbour. Returns false only when out of host memory. */
static bool live_insert(worker *w, const tblock *b)
{
    shared *sh = w->sh;
    bool ok = true;
    pthread_mutex_lock(&sh->lock);
    if (sh->nlive == sh->caplive) {
        size_t ncap = sh->caplive ? sh->caplive * 2 : 1024;
        tblock *nv = realloc(sh->live, ncap * sizeof *nv);
        if (!nv) {
            ok = false;
            goto out;
        }
        sh->live = nv;
        sh->caplive = ncap;
    }
    size_t i = live_lower(sh, b->addr);
    const tblock *prev = i > 0 ? &sh->live[i - 1] : NULL;
    const tblock *next = i < sh->nlive ? &sh->live[i] : NULL;
    if (prev && prev->addr + prev->size > b->addr) {
        sh->overlaps++;
        worker_fail(w, "new block [%p,+%zu) on device %d overlaps live [%p,+%zu) on device %d",
                    (void *)b->addr, b->size, b->dev, (void *)prev->addr, prev->size, prev->dev);
    }
    if (next && b->addr + b->size > next->addr) {
        sh->overlaps++;
        worker_fail(w, "new block [%p,+%zu) on device %d overlaps live [%p,+%zu) on device %d",
                    (void *)b->addr, b->size, b->dev, (void *)next->addr, next->size, next->dev);
    }
    memmove(&sh->live[i + 1], &sh->live[i], (sh->nlive - i) * sizeof *sh->live);
    sh->live[i] = *b;
    sh->nlive++;
out:
    pthread_mutex_unlock(&sh->lock);
    return ok;
}

/* Removes b before it is freed (after the free, another thread may get the
 * same address legitimately). */
static void live_remove(worker *w, const tblock *b)
{
    shared *sh = w->sh;
    pthread_mutex_lock(&sh->lock);
    size_t i = live_lower(sh, b->addr);
    if (i < sh->nlive && sh->live[i].addr == b->addr && sh->live[i].id == b->id) {
        memmove(&sh->live[i], &sh->live[i + 1], (sh->nlive - i - 1) * sizeof *sh->live);
        sh->nlive--;
    } else {
        worker_fail(w, "block id %llu at %p is missing from the live set",
                    (unsigned long long)b->id, (void *)b->addr);
    }
    pthread_mutex_unlock(&sh->lock);
}

/* ------------------------------------------------------------- threads */

static uint64_t rnd(worker *w)
{
    return harness_rand(&w->rng);
}

static size_t draw_size(worker *w)
{
    unsigned r = (unsigned)(rnd(w) % 100);
    unsigned lo_bit, hi_bit;
    if (r < 60)
        lo_bit = 0, hi_bit = 11; /* 1 .. 4 KiB */
    else if (r < 95)
        lo_bit = 12, hi_bit = 15; /* 4 .. 64 KiB */
    else
        lo_bit = 16, hi_bit = 19; /* 64 KiB .. 1 MiB */
    unsigned bit = lo_bit + (unsigned)(rnd(w) % (hi_bit - lo_bit + 1));
    size_t band = (size_t)1 << bit;
    size_t size = band + (size_t)(rnd(w) % band);
    if (rnd(w) % 4 == 0 && size >= 512)
        size = size / 512 * 512;
    return size;
}

static void do_alloc(worker *w)
{
    shared *sh = w->sh;
    int dev = 1 + (int)(rnd(w) % (uint64_t)sh->ndev);
    size_t size = draw_size(w);
    um_stream s = rnd(w) % 2 ? w->streams[dev] : NULL;
    void *p = NULL;
    um_status st = um_malloc(sh->ctx, dev, size, s, &p);
    if (st != UM_OK) {
        if (st == UM_ERR_NOMEM)
            w->nomem++;
        worker_fail(w, "um_malloc(device %d, %zu bytes) failed: %s", dev, size, um_last_error());
        return;
    }
    tblock b = {(uintptr_t)p, size, atomic_fetch_add(&sh->next_id, 1), dev};
    if (b.addr % UM_ALIGN != 0)
        worker_fail(w, "um_malloc(device %d, %zu bytes) returned %p, not 256-aligned", dev, size,
                    p);
    int owner = um_pointer_device(sh->ctx, p);
    if (owner != dev)
        worker_fail(w, "um_pointer_device(%p) is %d, allocated on device %d", p, owner, dev);
    if (!live_insert(w, &b)) {
        worker_fail(w, "out of host memory for the interval set");
        um_free(sh->ctx, p, NULL);
        return;
    }
    pattern_fill(&b);
    w->own[w->n++] = b;
    w->own_bytes += size;
    w->allocs[dev]++;
}

/* Verifies, unlists and frees a block, counting the free for this thread. */
static void free_block(worker *w, const tblock *b, um_stream s, const char *when)
{
    pattern_check(w, b, when);
    live_remove(w, b);
    um_status st = um_free(w->sh->ctx, (void *)b->addr, s);
    if (st != UM_OK)
        worker_fail(w, "um_free(%p, device %d, %zu bytes) failed: %s", (void *)b->addr, b->dev,
                    b->size, um_last_error());
    else
        w->frees[b->dev]++;
}

static tblock take_own(worker *w, size_t i)
{
    tblock b = w->own[i];
    w->own[i] = w->own[--w->n];
    w->own_bytes -= b.size;
    return b;
}

static void do_free_own(worker *w)
{
    tblock b = take_own(w, (size_t)(rnd(w) % w->n));
    um_stream s = rnd(w) % 2 ? w->streams[b.dev] : NULL;
    free_block(w, &b, s, "before its free");
}

/* Hands one of this thread's blocks to whichever thread takes it next. */
static void do_hand_off(worker *w)
{
    shared *sh = w->sh;
    size_t i = (size_t)(rnd(w) % w->n);
    pthread_mutex_lock(&sh->lock);
    bool room = sh->qlen < QUEUE_CAP;
    if (room) {
        sh->queue[(sh->qhead + sh->qlen) % QUEUE_CAP] = take_own(w, i);
        sh->qlen++;
    }
    pthread_mutex_unlock(&sh->lock);
    if (room)
        w->handed++;
    else
        do_free_own(w);
}

/* Takes the oldest handed-off block (most likely another thread's) and
 * frees it here. Returns false when the queue is empty. */
static bool do_take(worker *w)
{
    shared *sh = w->sh;
    tblock b = {0, 0, 0, 0};
    pthread_mutex_lock(&sh->lock);
    bool have = sh->qlen > 0;
    if (have) {
        b = sh->queue[sh->qhead];
        sh->qhead = (sh->qhead + 1) % QUEUE_CAP;
        sh->qlen--;
    }
    pthread_mutex_unlock(&sh->lock);
    if (!have)
        return false;
    w->taken++;
    free_block(w, &b, NULL, "after a handoff");
    return true;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    for (int dev = 1; dev <= sh->ndev; dev++) {
        if (um_stream_create(sh->ctx, dev, &w->streams[dev]) != UM_OK) {
            worker_fail(w, "um_stream_create(device %d) failed: %s", dev, um_last_error());
            w->streams[dev] = NULL;
        }
    }
    for (uint64_t op = 0; op < w->nops; op++) {
        unsigned r = (unsigned)(rnd(w) % 100);
        bool full = w->n == OWN_MAX_BLOCKS || w->own_bytes > OWN_MAX_BYTES;
        if (r < 8 && do_take(w))
            continue;
        if (w->n == 0 || (r < 60 && !full))
            do_alloc(w);
        else if (r < 68)
            do_hand_off(w);
        else
            do_free_own(w);
    }
    while (w->n)
        do_free_own(w);
    for (int dev = 1; dev <= sh->ndev; dev++) {
        if (w->streams[dev] && um_stream_destroy(sh->ctx, w->streams[dev]) != UM_OK)
            worker_fail(w, "um_stream_destroy(device %d) failed: %s", dev, um_last_error());
    }
    atomic_fetch_add(&sh->finished, 1);
    return NULL;
}

/* --------------------------------------------------------------- passes */

static void run_pass(const char *pass, const char *conf, int ndev, uint64_t seed, uint64_t nops)
{
    shared sh;
    worker *ws = calloc(NTHREADS, sizeof *ws);
    memset(&sh, 0, sizeof sh);
    CHECK(ws != NULL);
    if (!ws)
        return;
    CHECK_OK(um_init(conf, &sh.ctx));
    if (!sh.ctx) {
        free(ws);
        return;
    }
    CHECK_EQ(um_device_count(sh.ctx), ndev + 1);
    sh.ndev = ndev;
    pthread_mutex_init(&sh.lock, NULL);
    atomic_init(&sh.next_id, 1);
    atomic_init(&sh.finished, 0);

    int started = 0;
    for (int t = 0; t < NTHREADS; t++) {
        ws[t].sh = &sh;
        ws[t].index = t;
        ws[t].rng = seed ^ (0x632be59bd9b4e019ull * (uint64_t)(t + 1));
        ws[t].nops = nops;
        int e = pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]);
        CHECK_EQ(e, 0);
        if (e != 0)
            break;
        started++;
    }
    /* Statistics read while the workers run: the values move, but the call
     * must be safe against concurrent allocation (ThreadSanitizer watches),
     * and counters and peaks never go back. */
    um_stats prev[MAX_DEVS];
    memset(prev, 0, sizeof prev);
    uint64_t polls = 0;
    while (atomic_load(&sh.finished) < started) {
        for (int dev = 1; dev <= ndev; dev++) {
            um_stats st;
            CHECK_OK(um_stats_get(sh.ctx, dev, &st));
            CHECK(st.num_allocs >= prev[dev].num_allocs);
            CHECK(st.num_frees >= prev[dev].num_frees);
            CHECK(st.peak_active_bytes >= prev[dev].peak_active_bytes);
            CHECK(st.peak_reserved_bytes >= prev[dev].peak_reserved_bytes);
            prev[dev] = st;
        }
        polls++;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    for (int t = 0; t < started; t++)
        pthread_join(ws[t].tid, NULL);

    /* Blocks still in the queue are freed by the main thread: one more
     * thread frees memory it never allocated. */
    worker mainw;
    memset(&mainw, 0, sizeof mainw);
    mainw.sh = &sh;
    mainw.index = NTHREADS;
    while (do_take(&mainw)) {
    }

    uint64_t allocs[MAX_DEVS] = {0}, frees[MAX_DEVS] = {0}, handed = 0, taken = mainw.taken;
    CHECK_EQ(mainw.errors, 0);
    for (int t = 0; t < started; t++) {
        CHECK_EQ(ws[t].errors, 0);
        CHECK_EQ(ws[t].nomem, 0);
        CHECK_EQ(ws[t].n, 0);
        handed += ws[t].handed;
        taken += ws[t].taken;
        for (int dev = 1; dev <= ndev; dev++) {
            allocs[dev] += ws[t].allocs[dev];
            frees[dev] += ws[t].frees[dev];
        }
        CHECK(ws[t].allocs[1] > 0);
    }
    for (int dev = 1; dev <= ndev; dev++)
        frees[dev] += mainw.frees[dev];
    CHECK_EQ(sh.overlaps, 0);
    CHECK_EQ(sh.nlive, 0);
    CHECK_EQ(handed, taken);
    CHECK(handed > 0);
    for (int dev = 1; dev <= ndev; dev++) {
        um_stats st;
        CHECK_OK(um_stats_get(sh.ctx, dev, &st));
        CHECK_EQ(st.active_bytes, 0);
        CHECK_EQ(st.active_blocks, 0);
        CHECK_EQ(st.requested_bytes, 0);
        CHECK_EQ(st.num_allocs, allocs[dev]);
        CHECK_EQ(st.num_frees, frees[dev]);
        CHECK_EQ(allocs[dev], frees[dev]);
        CHECK(st.peak_active_bytes > 0);
        um__allocator *a = sh.ctx->devices[dev].alloc;
        CHECK_STATUS(a->ops->check(a), UM_OK);
        CHECK_OK(um_trim(sh.ctx, dev));
        CHECK_OK(um_stats_get(sh.ctx, dev, &st));
        CHECK_EQ(st.reserved_bytes, 0);
        if (st.reserved_bytes)
            fprintf(stderr,
                    "  %s: device %d keeps %zu bytes reserved after everything was "
                    "freed and trimmed\n",
                    pass, dev, st.reserved_bytes);
        CHECK_STATUS(a->ops->check(a), UM_OK);
    }
    uint64_t total = 0;
    for (int dev = 1; dev <= ndev; dev++)
        total += allocs[dev];
    printf("%s: %d threads, %llu allocations, %llu handed to another thread, %llu stats polls\n",
           pass, started, (unsigned long long)total, (unsigned long long)handed,
           (unsigned long long)polls);
    um_shutdown(sh.ctx);
    pthread_mutex_destroy(&sh.lock);
    free(sh.live);
    free(ws);
}

/* One thread allocates, another frees it all and stays alive (its delta
 * unpublished), the first allocates again into the same memory: the peak
 * of live bytes must not go above the peak of reserved memory (the freeing
 * thread's unpublished delta must not make the estimate overshoot). */
typedef struct handoff {
    um_context *ctx;
    void *blocks[64];
    int n;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int step; /* 1: the blocks are freed; 2: the freeing thread may end */
} handoff;

static void *free_all(void *arg)
{
    handoff *h = arg;
    for (int i = 0; i < h->n; i++)
        (void)um_free(h->ctx, h->blocks[i], NULL);
    pthread_mutex_lock(&h->lock);
    h->step = 1;
    pthread_cond_broadcast(&h->cv);
    while (h->step != 2)
        pthread_cond_wait(&h->cv, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static void test_peak_with_cross_thread_frees(void)
{
    handoff h = {.n = 20};
    pthread_mutex_init(&h.lock, NULL);
    pthread_cond_init(&h.cv, NULL);
    CHECK_OK(um_init("devices=sim:256M,allocator=pool", &h.ctx));
    if (!h.ctx)
        return;
    /* 20 x 48 KiB: under the delta a thread keeps unpublished. */
    const size_t size = 48 << 10;
    for (int i = 0; i < h.n; i++)
        CHECK_OK(um_malloc(h.ctx, 1, size, NULL, &h.blocks[i]));
    um_stats st;
    CHECK_OK(um_stats_get(h.ctx, 1, &st)); /* publishes this thread's delta */
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_all, &h), 0);
    pthread_mutex_lock(&h.lock);
    while (h.step != 1)
        pthread_cond_wait(&h.cv, &h.lock);
    pthread_mutex_unlock(&h.lock);
    CHECK_OK(um_reset_peak(h.ctx, 1));
    void *again[20];
    for (int i = 0; i < h.n; i++)
        CHECK_OK(um_malloc(h.ctx, 1, size, NULL, &again[i]));
    CHECK_OK(um_stats_get(h.ctx, 1, &st));
    CHECK(st.peak_active_bytes <= st.peak_reserved_bytes);
    CHECK_EQ(st.peak_active_bytes, (size_t)h.n * size);
    printf("cross-thread frees: peak live %zu bytes, peak reserved %zu\n", st.peak_active_bytes,
           st.peak_reserved_bytes);
    pthread_mutex_lock(&h.lock);
    h.step = 2;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.lock);
    pthread_join(t, NULL);
    for (int i = 0; i < h.n; i++)
        CHECK_OK(um_free(h.ctx, again[i], NULL));
    um_shutdown(h.ctx);
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.lock);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_peak_with_cross_thread_frees();
    uint64_t seed = harness_seed("test_threads");
    uint64_t nops = HARNESS_SANITIZED ? 10000 : 40000;
    run_pass("one device", "devices=sim:2G,allocator=pool", 1, seed, nops);
    run_pass("two devices", "devices=sim:2x1G,allocator=pool", 2, seed + 1, nops);
    run_pass("no thread cache", "devices=sim:2G,allocator=pool,thread_cache=0", 1, seed + 2,
             nops / 2);
    return harness_finish("test_threads");
}
