/*
 * test_random: long random sequences of the public memory calls (um_malloc,
 * um_free, um_trim, um_set_cache_limit, um_stats_get) on a context of
 * several simulated devices plus the host, checked against a reference
 * model that keeps every live block (device, address, size, pattern).
 *
 * Checked on every operation: pointers are 256-aligned; no two live blocks
 * of a device overlap; statistics (active, requested, blocks, counters)
 * equal the model's recount exactly; reserved >= active; an allocation
 * within the memory limit fails only when the limit really binds; a request
 * beyond the capacity fails with UM_ERR_NOMEM and changes nothing; bad
 * frees fail with the right status and change nothing. Every block carries
 * a pattern derived from its id and position, verified in full before it is
 * freed (simulated device memory is host-addressable). The allocator's own
 * consistency check runs periodically. Then a low memory limit is filled
 * until UM_ERR_NOMEM, and the cache limit and trim are checked on an empty
 * device. The passes cover allocator=pool (with and without thread caches),
 * direct and bufcache.
 */
#include "harness.h"

#include "core/core.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define NSTREAMS 3 /* the default stream (NULL) and two created ones */
#define MAX_DEVS 4 /* the host and three simulated devices */
#define MAX_PASS_FAILURES 50
#define PRESSURE_DEV 3
#define PRESSURE_LIMIT (24 * MIB)

typedef struct block {
    uintptr_t addr;
    size_t size;
    size_t rounded; /* what the allocation added to active_bytes */
    uint64_t id;
    int stream; /* index into the device's streams */
} block;

typedef struct devmodel {
    block *v; /* live blocks, sorted by address */
    size_t n, cap;
    size_t requested; /* sums over the live blocks */
    size_t active;
    um_stats last; /* the statistics after the last checked operation */
    um_stream streams[NSTREAMS];
    um_device_info info;
} devmodel;

typedef struct world {
    const char *pass;
    um_context *ctx;
    int ndev;
    devmodel d[MAX_DEVS];
    uint64_t rng;
    uint64_t next_id;
    uint64_t op; /* operation counter, for messages */
    uint64_t allocs, frees, ooms, over_capacity, bad_frees;
    uint64_t bytes_filled;
    int failures_at_start;
} world;

static uint64_t rnd(world *w)
{
    return harness_rand(&w->rng);
}
static uint64_t rnd_below(world *w, uint64_t n)
{
    return rnd(w) % n;
}

static bool pass_failed_too_often(const world *w)
{
    return harness_failures - w->failures_at_start > MAX_PASS_FAILURES;
}

/* ------------------------------------------------------------ patterns */

static void pattern_fill(world *w, const block *b)
{
    harness_pattern_fill((void *)b->addr, b->size, b->id);
    w->bytes_filled += b->size;
}

/* Verifies the whole block; reports the first differing byte. */
static bool pattern_check(world *w, int dev, const block *b, const char *when)
{
    unsigned char got, want;
    size_t bad = harness_pattern_find_bad((const void *)b->addr, b->size, b->id, &got, &want);
    if (bad != SIZE_MAX) {
        harness_report(__FILE__, __LINE__,
                       "%s op %llu: device %d block id %llu (%p, %zu bytes) corrupted at "
                       "byte %zu %s: 0x%02x, expected 0x%02x",
                       w->pass, (unsigned long long)w->op, dev, (unsigned long long)b->id,
                       (void *)b->addr, b->size, bad, when, got, want);
        return false;
    }
    harness_checks++;
    return true;
}

/* --------------------------------------------------------------- model */

/* Index of the first block with addr >= a. */
static size_t model_lower(const devmodel *m, uintptr_t a)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Inserts b, checking that it overlaps neither neighbour. */
static void model_insert(world *w, int dev, const block *b)
{
    devmodel *m = &w->d[dev];
    if (m->n == m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 256;
        block *nv = realloc(m->v, ncap * sizeof *nv);
        if (!nv) {
            fprintf(stderr, "test_random: out of host memory for the model\n");
            exit(2);
        }
        m->v = nv;
        m->cap = ncap;
    }
    size_t i = model_lower(m, b->addr);
    if (i > 0) {
        const block *prev = &m->v[i - 1];
        CHECK(prev->addr + prev->size <= b->addr);
        if (prev->addr + prev->size > b->addr)
            fprintf(stderr, "  %s op %llu: device %d: new block [%p,+%zu) overlaps [%p,+%zu)\n",
                    w->pass, (unsigned long long)w->op, dev, (void *)b->addr, b->size,
                    (void *)prev->addr, prev->size);
    }
    if (i < m->n) {
        const block *next = &m->v[i];
        CHECK(b->addr + b->size <= next->addr);
        if (b->addr + b->size > next->addr)
            fprintf(stderr, "  %s op %llu: device %d: new block [%p,+%zu) overlaps [%p,+%zu)\n",
                    w->pass, (unsigned long long)w->op, dev, (void *)b->addr, b->size,
                    (void *)next->addr, next->size);
    }
    memmove(&m->v[i + 1], &m->v[i], (m->n - i) * sizeof *m->v);
    m->v[i] = *b;
    m->n++;
    m->requested += b->size;
    m->active += b->rounded;
}

static void model_remove(devmodel *m, size_t i)
{
    m->requested -= m->v[i].size;
    m->active -= m->v[i].rounded;
    memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof *m->v);
    m->n--;
}

/* ----------------------------------------------------------- statistics */

static um_stats stats_now(world *w, int dev)
{
    um_stats st;
    memset(&st, 0, sizeof st);
    CHECK_OK(um_stats_get(w->ctx, dev, &st));
    return st;
}

/* The invariants that hold between any two operations, and the model's
 * recount. */
static void check_stats(world *w, int dev, const um_stats *st)
{
    devmodel *m = &w->d[dev];
    CHECK_EQ(st->active_blocks, m->n);
    CHECK_EQ(st->requested_bytes, m->requested);
    CHECK_EQ(st->active_bytes, m->active);
    CHECK(st->reserved_bytes >= st->active_bytes);
    CHECK_EQ(st->cached_bytes, st->reserved_bytes - st->active_bytes);
    CHECK(st->peak_active_bytes >= st->active_bytes);
    CHECK(st->peak_reserved_bytes >= st->reserved_bytes);
    CHECK(st->largest_free_bytes <= st->cached_bytes);
    CHECK(st->fragmentation >= 0.0 && st->fragmentation <= 1.0);
    CHECK(st->num_cache_hits <= st->num_allocs);
    CHECK(st->num_backend_calls >= m->last.num_backend_calls);
    CHECK(st->reserved_bytes <= m->info.memory_limit);
    if (st->active_blocks != m->n || st->active_bytes != m->active)
        fprintf(stderr,
                "  %s op %llu: device %d: stats active %zu bytes / %llu blocks, model "
                "%zu / %zu\n",
                w->pass, (unsigned long long)w->op, dev, st->active_bytes,
                (unsigned long long)st->active_blocks, m->active, m->n);
}

static void check_unchanged(world *w, int dev, const char *what)
{
    um_stats st = stats_now(w, dev);
    devmodel *m = &w->d[dev];
    CHECK_EQ(st.active_bytes, m->last.active_bytes);
    CHECK_EQ(st.active_blocks, m->last.active_blocks);
    CHECK_EQ(st.num_allocs, m->last.num_allocs);
    CHECK_EQ(st.num_frees, m->last.num_frees);
    if (st.active_blocks != m->last.active_blocks)
        fprintf(stderr, "  %s op %llu: device %d: %s changed the live blocks\n", w->pass,
                (unsigned long long)w->op, dev, what);
    check_stats(w, dev, &st);
    m->last = st;
}

/* ------------------------------------------------------------ operations */

/* A random size: tiny (to 4 KiB), small (to 64 KiB), medium (to 4 MiB) or
 * large (to 64 MiB). Writing and verifying the pattern (first touches of
 * fresh pages, mostly) dominates the run time, so medium and large sizes
 * are rare, except on the device under a low limit (PRESSURE_DEV), where
 * they make the limit bind and where most large requests fail at once.
 * Sometimes a multiple of 512 or of the page, as in real traces. */
static size_t draw_size(world *w, int dev)
{
    /* Upper ends (per mille) of tiny, small and medium; the rest is large. */
    static const unsigned profile[2][3] = {{600, 985, 999}, {550, 940, 990}};
    const unsigned *pr = profile[dev == PRESSURE_DEV];
    unsigned r = (unsigned)rnd_below(w, 1000);
    size_t lo, hi;
    if (r < pr[0]) {
        lo = 1, hi = 4096;
    } else if (r < pr[1]) {
        lo = 4097, hi = 64 * 1024;
    } else if (r < pr[2] || dev == 0) {
        lo = 64 * 1024 + 1, hi = 4 * MIB;
    } else {
        lo = 4 * MIB + 1, hi = 64 * MIB;
    }
    /* Log-uniform between lo and hi: a random power-of-two band, then a
     * uniform value inside it. */
    unsigned lo_bit = 0, hi_bit = 0;
    while (((size_t)1 << (lo_bit + 1)) <= lo)
        lo_bit++;
    while (((size_t)1 << (hi_bit + 1)) <= hi)
        hi_bit++;
    unsigned bit = lo_bit + (unsigned)rnd_below(w, hi_bit - lo_bit + 1);
    size_t band_lo = (size_t)1 << bit, band_hi = band_lo * 2 - 1;
    band_lo = band_lo < lo ? lo : band_lo;
    band_hi = band_hi > hi ? hi : band_hi;
    size_t size = band_lo + (size_t)rnd_below(w, band_hi - band_lo + 1);
    unsigned shape = (unsigned)rnd_below(w, 10);
    if (shape < 3 && size >= 512)
        size = size / 512 * 512;
    else if (shape == 3 && size >= 2 * MIB)
        size = size / (2 * MIB) * (2 * MIB);
    return size;
}

static int pick_stream(world *w)
{
    return (int)rnd_below(w, NSTREAMS);
}

static void do_alloc(world *w, int dev, size_t size)
{
    devmodel *m = &w->d[dev];
    int si = pick_stream(w);
    void *p = (void *)0x1;
    um_status s = um_malloc(w->ctx, dev, size, m->streams[si], &p);
    um_stats st = stats_now(w, dev);
    if (s == UM_ERR_NOMEM) {
        w->ooms++;
        CHECK(p == NULL);
        CHECK_EQ(st.num_ooms, m->last.num_ooms + 1);
        CHECK_EQ(st.num_allocs, m->last.num_allocs);
        /* Failing is right only when the limit binds: the bytes already
         * reserved plus the pages this request needs exceed it. The pool
         * maps one page per backend chunk; direct and bufcache ask the
         * backend for one chunk of all the pages, which the simulated
         * backend must find contiguous in its memory file, so for them
         * only a one-page request is held to this. */
        size_t pages = um__align_up(size, m->info.granularity);
        bool binds = st.reserved_bytes + pages > m->info.memory_limit;
        if (strcmp(m->info.allocator, "pool") != 0 && pages > m->info.granularity)
            binds = true;
        CHECK(binds);
        if (!binds)
            fprintf(stderr,
                    "  %s op %llu: device %d: %zu bytes failed with %zu reserved of a "
                    "%zu limit (%zu live blocks, %zu active): %s\n",
                    w->pass, (unsigned long long)w->op, dev, size, st.reserved_bytes,
                    m->info.memory_limit, m->n, st.active_bytes, um_last_error());
        check_stats(w, dev, &st);
        m->last = st;
        return;
    }
    CHECK_OK(s);
    if (s != UM_OK) {
        check_stats(w, dev, &st);
        m->last = st;
        return;
    }
    w->allocs++;
    block b;
    b.addr = (uintptr_t)p;
    b.size = size;
    b.id = w->next_id++;
    b.stream = si;
    b.rounded = st.active_bytes - m->last.active_bytes;
    CHECK(p != NULL);
    CHECK_EQ(b.addr % UM_ALIGN, 0);
    CHECK_EQ(b.rounded % UM_ALIGN, 0);
    CHECK(b.rounded >= um__align_up(size, UM_ALIGN));
    CHECK(b.rounded <= 2 * um__align_up(size, UM_ALIGN) + 2 * m->info.granularity);
    CHECK_EQ(st.num_allocs, m->last.num_allocs + 1);
    CHECK_EQ(st.num_ooms, m->last.num_ooms);
    CHECK_EQ(um_pointer_device(w->ctx, p), dev);
    model_insert(w, dev, &b);
    check_stats(w, dev, &st);
    m->last = st;
    pattern_fill(w, &b);
}

/* Frees block i of dev on a random choice of stream: NULL (its allocation
 * stream), its own, or another stream of the same device. Sometimes first
 * tries a free through another device's stream (an accelerator's memory
 * only: any device's stream may order host memory), an interior pointer,
 * and afterwards a second free of the same pointer. */
static void do_free(world *w, int dev, size_t i)
{
    devmodel *m = &w->d[dev];
    block b = m->v[i];
    pattern_check(w, dev, &b, "before free");
    unsigned r = (unsigned)rnd_below(w, 100);
    if (r < 3 && w->ndev > 2 && dev != 0) {
        int other = 1 + (int)rnd_below(w, (uint64_t)w->ndev - 1);
        if (other != dev) {
            CHECK_STATUS(um_free(w->ctx, (void *)b.addr, w->d[other].streams[1]),
                         UM_ERR_WRONG_DEVICE);
            check_unchanged(w, dev, "a free through another device's stream");
            w->bad_frees++;
        }
    } else if (r < 6 && b.size > UM_ALIGN) {
        /* pool.h asks for UM_ERR_INVALID_POINTER here; a slab allocator may
         * see the address as the start of a free slot and answer
         * UM_ERR_DOUBLE_FREE. Either way nothing may change. */
        um_status si = um_free(w->ctx, (void *)(b.addr + UM_ALIGN), NULL);
        CHECK(si == UM_ERR_INVALID_POINTER || si == UM_ERR_DOUBLE_FREE);
        check_unchanged(w, dev, "a free of an interior pointer");
        pattern_check(w, dev, &b, "after a free of an interior pointer");
        w->bad_frees++;
    }
    unsigned how = (unsigned)rnd_below(w, 4);
    um_stream fs = how < 2    ? NULL
                   : how == 2 ? m->streams[b.stream]
                              : m->streams[(b.stream + 1) % NSTREAMS];
    um_status s = um_free(w->ctx, (void *)b.addr, fs);
    CHECK_OK(s);
    um_stats st = stats_now(w, dev);
    if (s == UM_OK) {
        model_remove(m, i);
        w->frees++;
        CHECK_EQ(st.num_frees, m->last.num_frees + 1);
        CHECK_EQ(m->last.active_bytes - st.active_bytes, b.rounded);
    }
    check_stats(w, dev, &st);
    m->last = st;
    if (s == UM_OK && rnd_below(w, 100) < 2) {
        /* A second free of the same pointer. The pool keeps its address
         * range and must see the double free; direct (and bufcache, beyond
         * its cache limit) may have released the memory, so for them the
         * pointer may simply be unknown. */
        um_status s2 = um_free(w->ctx, (void *)b.addr, NULL);
        if (strcmp(m->info.allocator, "pool") != 0)
            CHECK(s2 == UM_ERR_DOUBLE_FREE || s2 == UM_ERR_INVALID_POINTER);
        else
            CHECK_STATUS(s2, UM_ERR_DOUBLE_FREE);
        check_unchanged(w, dev, "a double free");
        w->bad_frees++;
    }
}

/* A request beyond the device's capacity (or absurdly large) must fail with
 * UM_ERR_NOMEM and change nothing but num_ooms. */
static void do_over_capacity(world *w, int dev)
{
    devmodel *m = &w->d[dev];
    size_t size;
    unsigned r = (unsigned)rnd_below(w, 8);
    if (r == 0)
        size = SIZE_MAX - (size_t)rnd_below(w, 4096);
    else if (r == 1)
        size = SIZE_MAX / 2 + 1;
    else
        size = m->info.capacity + 1 + (size_t)rnd_below(w, 3 * m->info.capacity);
    void *p = (void *)0x1;
    CHECK_STATUS(um_malloc(w->ctx, dev, size, m->streams[pick_stream(w)], &p), UM_ERR_NOMEM);
    CHECK(p == NULL);
    um_stats st = stats_now(w, dev);
    CHECK_EQ(st.num_ooms, m->last.num_ooms + 1);
    CHECK_EQ(st.num_allocs, m->last.num_allocs);
    check_stats(w, dev, &st);
    m->last = st;
    w->over_capacity++;
}

static void do_trim(world *w, int dev)
{
    devmodel *m = &w->d[dev];
    CHECK_OK(um_trim(w->ctx, dev));
    um_stats st = stats_now(w, dev);
    CHECK(st.reserved_bytes <= m->last.reserved_bytes);
    CHECK_EQ(st.active_bytes, m->last.active_bytes);
    check_stats(w, dev, &st);
    m->last = st;
}

static void do_cache_limit(world *w, int dev)
{
    static const size_t limits[] = {0, 16 * MIB, 64 * MIB, UM_NO_CACHE_LIMIT};
    devmodel *m = &w->d[dev];
    size_t limit = limits[rnd_below(w, 4)];
    CHECK_OK(um_set_cache_limit(w->ctx, dev, limit));
    um_device_info info;
    CHECK_OK(um_device_info_get(w->ctx, dev, &info));
    CHECK_EQ(info.cache_limit, limit);
    um_stats st = stats_now(w, dev);
    CHECK_EQ(st.active_bytes, m->last.active_bytes);
    CHECK(st.reserved_bytes <= m->last.reserved_bytes);
    check_stats(w, dev, &st);
    m->last = st;
}

/* Calls that must fail and change nothing. */
static void do_bad_calls(world *w, int dev)
{
    int local = 0;
    void *p = (void *)0x1;
    CHECK_STATUS(um_malloc(w->ctx, dev, 0, NULL, &p), UM_ERR_INVALID);
    CHECK(p == NULL);
    CHECK_STATUS(um_malloc(w->ctx, w->ndev, 64, NULL, &p), UM_ERR_NO_DEVICE);
    CHECK_STATUS(um_malloc(w->ctx, -1, 64, NULL, &p), UM_ERR_NO_DEVICE);
    CHECK_STATUS(um_free(w->ctx, &local, NULL), UM_ERR_INVALID_POINTER);
    CHECK(um_pointer_device(w->ctx, &local) == -1);
    if (w->ndev > 2 && dev != 0) {
        int other = dev == 1 ? 2 : 1;
        um_status s = um_malloc(w->ctx, dev, 64, w->d[other].streams[1], &p);
        CHECK(s == UM_ERR_WRONG_DEVICE || s == UM_ERR_INVALID);
        CHECK(p == NULL);
    }
    check_unchanged(w, dev, "a failing call");
}

static void check_consistency(world *w)
{
    for (int dev = 0; dev < w->ndev; dev++) {
        um__allocator *a = w->ctx->devices[dev].alloc;
        um_status s = a->ops->check(a);
        CHECK_STATUS(s, UM_OK);
        if (s != UM_OK)
            fprintf(stderr, "  %s op %llu: device %d consistency check failed\n", w->pass,
                    (unsigned long long)w->op, dev);
    }
}

/* Frees every live block of dev (a block whose free fails stays in the
 * model, so the loop is bounded by the starting count). */
static void free_all(world *w, int dev)
{
    for (size_t k = w->d[dev].n; k > 0 && w->d[dev].n; k--)
        do_free(w, dev, (size_t)rnd_below(w, w->d[dev].n));
}

/* --------------------------------------------------------------- passes */

static bool world_open(world *w, const char *pass, const char *conf, uint64_t seed)
{
    memset(w, 0, sizeof *w);
    w->pass = pass;
    w->rng = seed;
    w->next_id = 1;
    w->failures_at_start = harness_failures;
    um_status s = um_init(conf, &w->ctx);
    CHECK_OK(s);
    if (s != UM_OK)
        return false;
    w->ndev = um_device_count(w->ctx);
    CHECK_EQ(w->ndev, MAX_DEVS);
    if (w->ndev != MAX_DEVS) {
        um_shutdown(w->ctx);
        return false;
    }
    for (int dev = 0; dev < w->ndev; dev++) {
        devmodel *m = &w->d[dev];
        CHECK_OK(um_device_info_get(w->ctx, dev, &m->info));
        CHECK_EQ(m->info.index, dev);
        CHECK_EQ(m->info.kind, dev == 0 ? UM_DEVICE_HOST : UM_DEVICE_SIM);
        if (dev > 0) {
            CHECK_EQ(m->info.capacity, 256 * MIB);
            CHECK_EQ(m->info.memory_limit, 256 * MIB);
        }
        m->streams[0] = NULL;
        for (int k = 1; k < NSTREAMS; k++) {
            CHECK_OK(um_stream_create(w->ctx, dev, &m->streams[k]));
            CHECK_EQ(um_stream_device(m->streams[k]), dev);
        }
        m->last = stats_now(w, dev);
        CHECK_EQ(m->last.active_bytes, 0);
        CHECK_EQ(m->last.active_blocks, 0);
    }
    return true;
}

static void world_close(world *w)
{
    for (int dev = 0; dev < w->ndev; dev++) {
        for (int k = 1; k < NSTREAMS; k++)
            CHECK_OK(um_stream_destroy(w->ctx, w->d[dev].streams[k]));
        free(w->d[dev].v);
    }
    um_shutdown(w->ctx);
}

static void random_ops(world *w, uint64_t nops)
{
    for (uint64_t i = 0; i < nops && !pass_failed_too_often(w); i++) {
        w->op++;
        /* Phases of growth and shrinkage, so the devices fill up (and hit
         * their limit) and empty out again. */
        unsigned p_alloc = (i / 3000) % 2 == 0 ? 640 : 380;
        int dev = (int)rnd_below(w, (uint64_t)w->ndev);
        unsigned r = (unsigned)rnd_below(w, 1000);
        if (r < 3)
            do_trim(w, dev);
        else if (r < 5)
            do_cache_limit(w, dev);
        else if (r < 7)
            do_bad_calls(w, dev);
        else if (r < 9 && dev > 0)
            do_over_capacity(w, dev);
        else if (r < 9 + p_alloc || w->d[dev].n == 0)
            do_alloc(w, dev, draw_size(w, dev));
        else
            do_free(w, dev, (size_t)rnd_below(w, w->d[dev].n));
        if (i % 128 == 0) {
            /* Spot checks of blocks that stay live for long. */
            for (int k = 0; k < 4; k++) {
                int d2 = (int)rnd_below(w, (uint64_t)w->ndev);
                if (w->d[d2].n)
                    pattern_check(w, d2, &w->d[d2].v[rnd_below(w, w->d[d2].n)], "while live");
            }
        }
        if (i % 4096 == 4095)
            check_consistency(w);
    }
}

static bool error_mentions(const char *msg, const char *word)
{
    return strcasestr(msg, word) != NULL;
}

/* Fills device dev under a low memory limit until UM_ERR_NOMEM. */
static void limit_test(world *w, int dev)
{
    const size_t limit = 32 * MIB, bsize = MIB;
    devmodel *m = &w->d[dev];
    free_all(w, dev);
    CHECK_OK(um_set_memory_limit(w->ctx, dev, limit));
    CHECK_OK(um_device_info_get(w->ctx, dev, &m->info));
    CHECK_EQ(m->info.memory_limit, limit);
    m->last = stats_now(w, dev);
    CHECK(m->last.reserved_bytes <= limit);

    size_t got = 0;
    um_status s = UM_OK;
    char msg[512] = "";
    while (got <= limit / bsize) {
        void *p = NULL;
        s = um_malloc(w->ctx, dev, bsize, NULL, &p);
        if (s != UM_OK) {
            snprintf(msg, sizeof msg, "%s", um_last_error());
            break;
        }
        um_stats st = stats_now(w, dev);
        block b = {(uintptr_t)p, bsize, st.active_bytes - m->last.active_bytes, w->next_id++, 0};
        model_insert(w, dev, &b);
        check_stats(w, dev, &st);
        m->last = st;
        pattern_fill(w, &b);
        got++;
    }
    CHECK_STATUS(s, UM_ERR_NOMEM);
    /* Pool packs 1 MiB blocks two to a page; direct and bufcache give each
     * its own 2 MiB chunk. */
    CHECK(got * bsize <= limit);
    CHECK(got >= limit / um__align_up(bsize, m->info.granularity));
    /* The message names the request (in bytes or as "1.00 MiB"), the live
     * and reserved bytes and the limit. */
    char pretty[32];
    char exact[32];
    um__format_bytes(pretty, sizeof pretty, bsize);
    snprintf(exact, sizeof exact, "%zu", bsize);
    bool names_request = error_mentions(msg, pretty) || error_mentions(msg, exact);
    CHECK(names_request);
    CHECK(error_mentions(msg, "live"));
    CHECK(error_mentions(msg, "reserved"));
    CHECK(error_mentions(msg, "limit"));
    if (!names_request || !error_mentions(msg, "live") || !error_mentions(msg, "reserved") ||
        !error_mentions(msg, "limit"))
        fprintf(stderr, "  %s: NOMEM message lacks the request, live, reserved or limit: %s\n",
                w->pass, msg);
    um_stats st = stats_now(w, dev);
    CHECK_EQ(st.num_ooms, m->last.num_ooms + 1);
    check_stats(w, dev, &st);
    m->last = st;

    /* Lowering the limit below the live data fails and keeps the old one. */
    CHECK_STATUS(um_set_memory_limit(w->ctx, dev, limit / 4), UM_ERR_BUSY);
    um_device_info info;
    CHECK_OK(um_device_info_get(w->ctx, dev, &info));
    CHECK_EQ(info.memory_limit, limit);

    free_all(w, dev);
    st = stats_now(w, dev);
    CHECK_EQ(st.active_bytes, 0);
    CHECK_EQ(st.active_blocks, 0);
    CHECK_EQ(st.requested_bytes, 0);
    m->last = st;

    CHECK_OK(um_set_memory_limit(w->ctx, dev, 0));
    CHECK_OK(um_device_info_get(w->ctx, dev, &m->info));
    CHECK_EQ(m->info.memory_limit, m->info.capacity);
    /* With the limit restored, a request far beyond the old limit works. */
    do_alloc(w, dev, 64 * MIB);
    CHECK_EQ(m->n, 1);
    free_all(w, dev);
}

/* On an empty device: the cache limit bounds what stays mapped once no
 * work is in flight (simulated streams here never have any; setting the
 * limit again gives an allocator that releases lazily its chance), and
 * trim returns everything. */
static void cache_limit_test(world *w, int dev)
{
    devmodel *m = &w->d[dev];
    const size_t cap = 8 * MIB;
    free_all(w, dev);
    CHECK_OK(um_set_cache_limit(w->ctx, dev, cap));
    for (int k = 0; k < 4; k++)
        do_alloc(w, dev, (size_t)(16 + 8 * k) * MIB + 4096);
    free_all(w, dev);
    CHECK_OK(um_set_cache_limit(w->ctx, dev, cap));
    um_stats st = stats_now(w, dev);
    CHECK_EQ(st.active_bytes, 0);
    CHECK(st.reserved_bytes <= cap);
    if (st.reserved_bytes > cap)
        fprintf(stderr,
                "  %s: device %d keeps %zu bytes mapped with no live block and a "
                "cache limit of %zu\n",
                w->pass, dev, st.reserved_bytes, cap);
    m->last = st;
    CHECK_OK(um_set_cache_limit(w->ctx, dev, UM_NO_CACHE_LIMIT));
    do_trim(w, dev);
    CHECK_EQ(m->last.reserved_bytes, 0);
}

static void run_pass(const char *pass, const char *conf, uint64_t seed, uint64_t nops)
{
    world w;
    uint64_t t0 = um__now_ns();
    if (!world_open(&w, pass, conf, seed))
        return;
    /* Device 3 runs under a low memory limit, so the random sequence keeps
     * hitting it: requests fail only when the limit binds, and the device
     * recovers as blocks are freed. */
    devmodel *pm = &w.d[PRESSURE_DEV];
    CHECK_OK(um_set_memory_limit(w.ctx, PRESSURE_DEV, PRESSURE_LIMIT));
    CHECK_OK(um_device_info_get(w.ctx, PRESSURE_DEV, &pm->info));
    CHECK_EQ(pm->info.memory_limit, PRESSURE_LIMIT);
    random_ops(&w, nops);
    check_consistency(&w);
    CHECK_OK(um_set_memory_limit(w.ctx, PRESSURE_DEV, 0));
    CHECK_OK(um_device_info_get(w.ctx, PRESSURE_DEV, &pm->info));
    CHECK_EQ(pm->info.memory_limit, pm->info.capacity);
    limit_test(&w, 2);
    cache_limit_test(&w, 1);
    for (int dev = 0; dev < w.ndev; dev++) {
        free_all(&w, dev);
        do_trim(&w, dev);
        um_stats st = stats_now(&w, dev);
        CHECK_EQ(st.active_bytes, 0);
        CHECK_EQ(st.active_blocks, 0);
        CHECK_EQ(st.requested_bytes, 0);
        CHECK_EQ(st.reserved_bytes, 0);
        CHECK_EQ(st.num_allocs - st.num_frees, 0);
        if (st.reserved_bytes)
            fprintf(stderr,
                    "  %s: device %d keeps %zu bytes reserved after everything was freed "
                    "and trimmed\n",
                    pass, dev, st.reserved_bytes);
    }
    check_consistency(&w);
    printf("%s: %llu ops: %llu allocs, %llu frees, %llu NOMEM within capacity, %llu beyond, "
           "%llu bad frees, %.1f MiB of patterns, %.2f s\n",
           pass, (unsigned long long)w.op, (unsigned long long)w.allocs,
           (unsigned long long)w.frees, (unsigned long long)w.ooms,
           (unsigned long long)w.over_capacity, (unsigned long long)w.bad_frees,
           (double)w.bytes_filled / (double)MIB, (double)(um__now_ns() - t0) / 1e9);
    CHECK(w.allocs > nops / 3);
    CHECK(w.frees > nops / 3);
    world_close(&w);
}

int main(void)
{
    /* Line-buffered, so the pass summaries and the failure reports on
     * stderr come out in order. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t seed = harness_seed("test_random");
    /* The sanitizers make every byte of pattern slower; the op counts are
     * lower there so the test stays well under 30 s on a slow machine. */
    uint64_t scale = HARNESS_SANITIZED ? 1 : 2;
    run_pass("pool", "devices=sim:3x256M,allocator=pool", seed, 30000 * scale);
    run_pass("pool-no-tcache", "devices=sim:3x256M,allocator=pool,thread_cache=0", seed + 1,
             5000 * scale);
    run_pass("direct", "devices=sim:3x256M,allocator=direct", seed + 2, 5000 * scale);
    run_pass("bufcache", "devices=sim:3x256M,allocator=bufcache", seed + 3, 6000 * scale);
    return harness_finish("test_random");
}
