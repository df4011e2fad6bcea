/* Tests of the baseline allocators (src/pool/baseline.c) on a sim backend:
 * direct's one-chunk-per-request accounting, the MLX reuse rule on chosen
 * sizes, limits, trim, stream-ordered reuse, which pointers are live block
 * starts, backend failures at every call, and a randomized run against a
 * reference model of both allocators. */
#include "flaky.h"
#include "harness.h"
#include "pool/pool.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024u * 1024u)
#define GRAN (2u * MiB)

static um__backend *sim_backend(size_t capacity)
{
    um__backend *b = NULL;
    CHECK_OK(um__sim_backend_create("sim1", capacity, GRAN, 0, &b));
    return b;
}

static um__allocator *make(um_status (*create)(um__backend *, const um__pool_config *,
                                               um__allocator **),
                           um__backend *b, size_t memory_limit, size_t cache_limit)
{
    um__pool_config c = {.dev = 1, .memory_limit = memory_limit, .cache_limit = cache_limit};
    um__allocator *a = NULL;
    CHECK_OK(create(b, &c, &a));
    return a;
}

static um_stats stats_of(um__allocator *a)
{
    um_stats s;
    a->ops->stats(a, &s);
    return s;
}

static void *alloc_on(um__allocator *a, size_t size, const um__stream_ref *s)
{
    void *p = NULL;
    CHECK_OK(a->ops->alloc(a, size, s, &p));
    return p;
}

static void test_direct(void)
{
    um__backend *b = sim_backend(64 * MiB);
    um__allocator *a = make(um__direct_create, b, 0, UM_NO_CACHE_LIMIT);
    CHECK(!strcmp(a->ops->name, "direct"));
    CHECK_EQ(a->memory_limit, 64 * MiB);

    void *p = alloc_on(a, 1, NULL);
    um_stats s = stats_of(a);
    CHECK_EQ((uintptr_t)p % UM_ALIGN, 0);
    CHECK_EQ(s.active_bytes, UM_ALIGN);
    CHECK_EQ(s.requested_bytes, 1);
    CHECK_EQ(s.reserved_bytes, GRAN);
    CHECK_EQ(s.cached_bytes, GRAN - UM_ALIGN);
    CHECK_EQ(s.num_backend_calls, 3); /* reserve, create, map */
    CHECK_EQ(s.largest_free_bytes, 0);
    CHECK_EQ(s.num_cache_hits, 0);
    CHECK(a->ops->owns(a, p));
    CHECK(a->ops->owns(a, (char *)p + GRAN - 1));
    CHECK(!a->ops->owns(a, (char *)p + GRAN));
    memset(p, 0xab, 4096); /* the memory is really there */

    void *q = alloc_on(a, 3 * MiB, NULL);
    s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 3 * GRAN);
    CHECK_EQ(s.active_bytes, UM_ALIGN + 3 * MiB);
    CHECK_EQ(s.active_blocks, 2);
    CHECK_OK(a->ops->check(a));

    CHECK_STATUS(a->ops->free(a, (char *)q + 256, NULL), UM_ERR_INVALID_POINTER);
    CHECK_OK(a->ops->free(a, q, NULL));
    s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, GRAN);
    CHECK_EQ(s.peak_reserved_bytes, 3 * GRAN);
    CHECK_EQ(s.peak_active_bytes, UM_ALIGN + 3 * MiB);
    CHECK_EQ(s.num_backend_calls, 10); /* 2 x 3 to map; the stream's wait and 3 to unmap */
    /* direct forgets a freed block: it is an unknown pointer now. */
    CHECK(!a->ops->owns(a, q));
    CHECK_STATUS(a->ops->free(a, q, NULL), UM_ERR_INVALID_POINTER);

    void *r = NULL;
    CHECK_STATUS(a->ops->alloc(a, 0, NULL, &r), UM_ERR_INVALID);
    CHECK(r == NULL);
    CHECK_STATUS(a->ops->alloc(a, SIZE_MAX - 10, NULL, &r), UM_ERR_NOMEM);

    /* Limit: 2 MiB in use, 6 MiB allowed. */
    CHECK_OK(a->ops->set_memory_limit(a, 6 * MiB));
    q = alloc_on(a, 4 * MiB, NULL);
    um__clear_error();
    CHECK_STATUS(a->ops->alloc(a, 1, NULL, &r), UM_ERR_NOMEM);
    CHECK(strstr(um_last_error(), "cannot allocate 1 bytes") != NULL);
    CHECK(strstr(um_last_error(), "6291456") != NULL); /* reserved and limit */
    CHECK(strstr(um_last_error(), "device 1") != NULL);
    CHECK_EQ(stats_of(a).num_ooms, 2);
    CHECK_STATUS(a->ops->set_memory_limit(a, 4 * MiB), UM_ERR_BUSY);
    CHECK_EQ(a->memory_limit, 6 * MiB);
    CHECK_OK(a->ops->free(a, q, NULL));
    CHECK_OK(a->ops->set_memory_limit(a, 0));
    CHECK_EQ(a->memory_limit, 64 * MiB);

    a->ops->reset_peak(a);
    s = stats_of(a);
    CHECK_EQ(s.peak_reserved_bytes, GRAN);
    CHECK_EQ(s.peak_active_bytes, UM_ALIGN);
    CHECK_EQ(s.num_allocs, 3);
    CHECK_EQ(s.num_frees, 2);
    CHECK_OK(a->ops->trim(a)); /* nothing cached: no change */
    CHECK_EQ(stats_of(a).reserved_bytes, GRAN);
    CHECK_OK(a->ops->check(a));
    /* A live block at destroy is given back too. */
    a->ops->destroy(a);
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
}

/* Frees p and checks that a request of `request` bytes gets it back (or
 * not), then frees what it got. The cache holds only p each time. */
static void reuse_case(um__allocator *a, size_t nominal, size_t request, bool reused)
{
    void *p = alloc_on(a, nominal, NULL);
    CHECK_OK(a->ops->free(a, p, NULL));
    uint64_t hits = stats_of(a).num_cache_hits;
    void *q = alloc_on(a, request, NULL);
    if ((q == p) != reused)
        fprintf(stderr, "reuse of a %zu-byte buffer for %zu bytes: expected %s\n", nominal, request,
                reused ? "reuse" : "a new buffer");
    CHECK_EQ(q == p, reused);
    CHECK_EQ(stats_of(a).num_cache_hits, hits + (reused ? 1 : 0));
    CHECK_OK(a->ops->free(a, q, NULL));
    CHECK_OK(a->ops->trim(a));
    CHECK_EQ(stats_of(a).reserved_bytes, 0);
}

static void test_bufcache_rule(void)
{
    um__backend *b = sim_backend(1024 * MiB);
    um__allocator *a = make(um__bufcache_create, b, 0, UM_NO_CACHE_LIMIT);
    CHECK(!strcmp(a->ops->name, "bufcache"));
    /* s <= b < min(2s, s + 2 pages) */
    reuse_case(a, 8 * MiB, 7 * MiB, true);
    reuse_case(a, 8 * MiB, 8 * MiB, true);
    reuse_case(a, 8 * MiB, 3 * MiB, false);     /* 8 >= 2 x 3 */
    reuse_case(a, 8 * MiB, 4 * MiB, false);     /* 8 >= 2 x 4 */
    reuse_case(a, 8 * MiB, 4 * MiB + 1, true);  /* aligned s = 4 MiB + 256 */
    reuse_case(a, 8 * MiB, 8 * MiB + 1, false); /* too small */
    reuse_case(a, 2 * MiB, 1 * MiB, false);     /* 2 >= 2 x 1 */
    reuse_case(a, 2 * MiB, 1 * MiB + 1, true);
    reuse_case(a, 100 * MiB, 96 * MiB, false);    /* 100 >= 96 + 2 pages */
    reuse_case(a, 100 * MiB, 96 * MiB + 1, true); /* 100 < 96 MiB + 256 + 4 MiB */
    reuse_case(a, 1000, 600, true);               /* nominal 1024, s 768 */
    reuse_case(a, 1000, 512, false);              /* 1024 >= 2 x 512 */
    reuse_case(a, 1000, 1024, true);              /* same nominal size */

    /* The smallest fitting buffer wins; among equal sizes the oldest. */
    void *p10 = alloc_on(a, 10 * MiB, NULL);
    void *p9 = alloc_on(a, 9 * MiB, NULL);
    void *p4a = alloc_on(a, 4 * MiB, NULL);
    void *p4b = alloc_on(a, 4 * MiB, NULL);
    CHECK_OK(a->ops->free(a, p10, NULL));
    CHECK_OK(a->ops->free(a, p9, NULL));
    CHECK_OK(a->ops->free(a, p4b, NULL));
    CHECK_OK(a->ops->free(a, p4a, NULL));
    um_stats s = stats_of(a);
    CHECK_EQ(s.active_bytes, 0);
    CHECK_EQ(s.reserved_bytes, 28 * MiB);
    CHECK_EQ(s.cached_bytes, 28 * MiB);
    CHECK_EQ(s.largest_free_bytes, 10 * MiB);
    CHECK(s.fragmentation > 0.642 && s.fragmentation < 0.643); /* 18 / 28 */
    CHECK(a->ops->owns(a, p9));
    CHECK_STATUS(a->ops->free(a, p9, NULL), UM_ERR_DOUBLE_FREE);
    CHECK_STATUS(a->ops->free(a, (char *)p9 + 512, NULL), UM_ERR_INVALID_POINTER);
    uint64_t calls = s.num_backend_calls;
    CHECK(alloc_on(a, 8 * MiB + 512, NULL) == p9);
    CHECK(alloc_on(a, 4 * MiB, NULL) == p4b); /* freed before p4a */
    CHECK(alloc_on(a, 3 * MiB, NULL) == p4a);
    void *x = NULL;
    CHECK_OK(a->ops->alloc(a, 6 * MiB, NULL, &x)); /* 10 >= min(12, 6 + 4) MiB: a new buffer */
    CHECK(x != p10);
    CHECK_OK(a->ops->free(a, x, NULL));
    CHECK(alloc_on(a, 7 * MiB, NULL) == p10); /* 10 < min(14, 7 + 4) MiB */
    s = stats_of(a);
    CHECK_EQ(s.num_backend_calls, calls + 3); /* hits make no backend call */
    CHECK_EQ(s.num_cache_hits, 7 + 4);        /* 7 reuse_case hits, then 4 */
    CHECK_EQ(s.active_bytes, 8 * MiB + 512 + 4 * MiB + 3 * MiB + 7 * MiB);
    CHECK_EQ(s.requested_bytes, 8 * MiB + 512 + 4 * MiB + 3 * MiB + 7 * MiB);
    CHECK_EQ(s.reserved_bytes, 28 * MiB + 6 * MiB);
    CHECK_EQ(s.largest_free_bytes, 6 * MiB); /* x's buffer */
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
}

static void test_bufcache_limits(void)
{
    um__backend *b = sim_backend(1024 * MiB);
    um__allocator *a = make(um__bufcache_create, b, 10 * MiB, UM_NO_CACHE_LIMIT);
    CHECK_EQ(a->memory_limit, 10 * MiB);
    CHECK_EQ(a->cache_limit, SIZE_MAX);
    void *p = alloc_on(a, 4 * MiB, NULL);
    void *q = alloc_on(a, 4 * MiB, NULL);
    CHECK_OK(a->ops->free(a, p, NULL));
    /* 8 MiB reserved + 6 MiB > 10 MiB: the cached 4 MiB buffer goes. */
    void *r = alloc_on(a, 6 * MiB, NULL);
    um_stats s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 10 * MiB);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.cached_bytes, 0);
    CHECK_EQ(s.active_blocks, 2);
    void *x = NULL;
    um__clear_error();
    CHECK_STATUS(a->ops->alloc(a, 2 * MiB, NULL, &x), UM_ERR_NOMEM);
    CHECK(strstr(um_last_error(), "2097152 bytes") != NULL);
    CHECK(strstr(um_last_error(), "10485760 bytes live") != NULL);
    CHECK(strstr(um_last_error(), "10485760 reserved") != NULL);
    CHECK(strstr(um_last_error(), "limit 10485760") != NULL);
    CHECK_EQ(stats_of(a).num_ooms, 1);
    CHECK_STATUS(a->ops->alloc(a, 11 * MiB, NULL, &x), UM_ERR_NOMEM);
    CHECK_EQ(stats_of(a).num_ooms, 2);

    /* Lowering the limit trims the cache, then refuses if live data is over. */
    CHECK_OK(a->ops->free(a, q, NULL));
    CHECK_STATUS(a->ops->set_memory_limit(a, 4 * MiB), UM_ERR_BUSY);
    CHECK_EQ(a->memory_limit, 10 * MiB);
    CHECK_EQ(stats_of(a).reserved_bytes, 6 * MiB); /* q's buffer was released */
    CHECK_OK(a->ops->set_memory_limit(a, 6 * MiB));
    CHECK_OK(a->ops->free(a, r, NULL));
    CHECK_OK(a->ops->set_memory_limit(a, 0));
    CHECK_EQ(a->memory_limit, 1024 * MiB);

    /* Cache limit: the oldest buffers go first. */
    void *m[4];
    for (int i = 0; i < 4; i++)
        m[i] = alloc_on(a, 2 * MiB, NULL);
    CHECK_EQ(stats_of(a).reserved_bytes, 6 * MiB + 4 * GRAN); /* r's 6 MiB is cached */
    CHECK_OK(a->ops->set_cache_limit(a, 4 * MiB));
    CHECK_EQ(stats_of(a).reserved_bytes, 4 * GRAN); /* 6 MiB > 4 MiB: r's buffer went */
    for (int i = 0; i < 4; i++)
        CHECK_OK(a->ops->free(a, m[i], NULL));
    s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 4 * MiB);
    CHECK(!a->ops->owns(a, m[0]) && !a->ops->owns(a, m[1]));
    CHECK(a->ops->owns(a, m[2]) && a->ops->owns(a, m[3]));
    CHECK_OK(a->ops->check(a));
    CHECK_OK(a->ops->set_cache_limit(a, UM_NO_CACHE_LIMIT));
    CHECK_EQ(a->cache_limit, SIZE_MAX);

    /* Trim empties the cache. */
    void *live = alloc_on(a, 1000, NULL);
    CHECK(live != m[2] && live != m[3]); /* a 2 MiB buffer is not reused: 2 MiB >= 2 x 1 KiB */
    CHECK_OK(a->ops->free(a, live, NULL));
    live = alloc_on(a, 5 * MiB, NULL);
    CHECK_OK(a->ops->trim(a));
    s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 6 * MiB);
    CHECK_EQ(s.cached_bytes, 1 * MiB);
    CHECK_EQ(s.largest_free_bytes, 0);
    CHECK(s.fragmentation == 1.0); /* all of the cached bytes are page rounding */
    CHECK_OK(a->ops->check(a));

    /* A cache limit of 0 keeps no cache: a freed buffer goes back at once. */
    CHECK_OK(a->ops->set_cache_limit(a, 0));
    CHECK_EQ(a->cache_limit, 0);
    CHECK_OK(a->ops->free(a, live, NULL));
    s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 0);
    CHECK_EQ(s.cached_bytes, 0);
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
}

static uint64_t calls_of(um__allocator *a)
{
    return stats_of(a).num_backend_calls;
}

/* A freed block is reusable at once on its stream, and on another stream
 * only once the work queued on its stream before the free has completed. */
static void test_streams(void)
{
    um__backend *b = sim_backend(1024 * MiB);
    um__bstream *b1 = NULL, *b2 = NULL;
    CHECK_OK(um__be_stream_create(b, &b1));
    CHECK_OK(um__be_stream_create(b, &b2));
    const um__stream_ref s0 = {0, NULL, NULL}, s1 = {1, b1, NULL}, s2 = {2, b2, NULL};

    /* Several streams in use: the event is recorded at free time. */
    um__allocator *a = make(um__bufcache_create, b, 0, UM_NO_CACHE_LIMIT);
    void *x = alloc_on(a, 4 * MiB, &s1);
    void *y = alloc_on(a, 1 * MiB, &s2);
    CHECK_OK(um__sim_stream_launch(b, b1, 1));
    uint64_t calls = calls_of(a);
    CHECK_OK(a->ops->free(a, x, NULL)); /* on its allocation stream, s1 */
    CHECK_EQ(calls_of(a), calls + 1);   /* event_record */
    void *z = alloc_on(a, 4 * MiB, &s2);
    CHECK(z != x); /* s1's work is still queued */
    void *w = alloc_on(a, 4 * MiB, &s1);
    CHECK(w == x); /* at once on its own stream */
    CHECK_OK(a->ops->free(a, w, &s1));
    void *v = alloc_on(a, 4 * MiB, &s2);
    CHECK(v != x && v != z);
    CHECK_OK(um__sim_stream_complete(b, b1, 1));
    void *u = alloc_on(a, 4 * MiB, &s2);
    CHECK(u == x);
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);

    /* One stream so far: no event at free; another stream records one when
     * it first looks at the block. */
    a = make(um__bufcache_create, b, 0, UM_NO_CACHE_LIMIT);
    void *p = alloc_on(a, 4 * MiB, &s0);
    CHECK_OK(um__sim_stream_launch(b, NULL, 1));
    CHECK_OK(a->ops->free(a, p, NULL));
    CHECK_EQ(calls_of(a), 3);
    CHECK(alloc_on(a, 4 * MiB, &s0) == p); /* same stream: a hit */
    CHECK_EQ(calls_of(a), 3);
    CHECK_EQ(stats_of(a).num_cache_hits, 1);
    CHECK_OK(a->ops->free(a, p, &s0));
    void *r = alloc_on(a, 4 * MiB, &s1);
    CHECK(r != p);
    CHECK_EQ(calls_of(a), 3 + 2 + 3); /* event record + query, then a new buffer */
    CHECK_OK(um__sim_stream_complete(b, NULL, 1));
    CHECK_OK(a->ops->free(a, r, &s1)); /* two streams now: event at free */
    CHECK_EQ(calls_of(a), 9);
    void *t = alloc_on(a, 4 * MiB, &s1);
    CHECK(t == p);                /* the older buffer, its event done */
    CHECK_EQ(calls_of(a), 9 + 2); /* query + destroy */
    CHECK_EQ(stats_of(a).num_cache_hits, 1);
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);

    /* Freed on another stream than its allocation's; then that stream goes. */
    a = make(um__bufcache_create, b, 0, UM_NO_CACHE_LIMIT);
    p = alloc_on(a, 4 * MiB, &s1);
    void *q = alloc_on(a, 8 * MiB, &s2);
    CHECK_OK(um__sim_stream_launch(b, b2, 1));
    CHECK_OK(a->ops->free(a, p, &s2));
    r = alloc_on(a, 4 * MiB, &s1);
    CHECK(r != p);
    a->ops->stream_forget(a, &s2);      /* waits for s2: p is reusable everywhere */
    CHECK_OK(a->ops->free(a, q, NULL)); /* allocated on the forgotten stream */
    calls = calls_of(a);
    CHECK(alloc_on(a, 4 * MiB, &s1) == p);
    CHECK(alloc_on(a, 8 * MiB, &s1) == q);
    CHECK_EQ(calls_of(a), calls); /* no event left to ask */
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);

    CHECK_OK(um__be_stream_destroy(b, b1));
    CHECK_OK(um__be_stream_destroy(b, b2));
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
    UM_UNUSED(y);
}

/* block_live, which um_record_stream asks before it marks a pointer:
 * UM_OK only for a live block's start; an inner or freed pointer gets
 * UM_ERR_INVALID_POINTER saying which (before, the baselines had no
 * block_live, so um_record_stream marked such pointers and their um_free
 * then succeeded). */
static void test_block_live(void)
{
    um__backend *b = sim_backend(64 * MiB);
    for (int caching = 0; caching < 2; caching++) {
        um__allocator *a =
            make(caching ? um__bufcache_create : um__direct_create, b, 0, UM_NO_CACHE_LIMIT);
        CHECK(a->ops->block_live != NULL);
        if (!a->ops->block_live) {
            a->ops->destroy(a);
            continue;
        }
        void *p = alloc_on(a, 3 * MiB, NULL), *q = alloc_on(a, 1000, NULL);
        CHECK_OK(a->ops->block_live(a, p));
        CHECK_OK(a->ops->block_live(a, q));
        CHECK_STATUS(a->ops->block_live(a, (char *)p + 4096), UM_ERR_INVALID_POINTER);
        CHECK_ERROR_MENTIONS("inside a block", NULL, NULL);
        CHECK_STATUS(a->ops->block_live(a, (char *)q + 256), UM_ERR_INVALID_POINTER);
        CHECK_ERROR_MENTIONS("inside a block", NULL, NULL);
        CHECK_OK(a->ops->free(a, p, NULL));
        /* bufcache keeps the freed buffer; direct forgets it at once. */
        CHECK_STATUS(a->ops->block_live(a, p), UM_ERR_INVALID_POINTER);
        CHECK_ERROR_MENTIONS(caching ? "already freed" : "not allocated here", NULL, NULL);
        CHECK_OK(a->ops->block_live(a, q)); /* unchanged */
        CHECK_OK(a->ops->free(a, q, NULL));
        CHECK_OK(a->ops->check(a));
        a->ops->destroy(a);
    }
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
}

/* ------------------------------------------------- injected failures */

/* Frees p if it is still live; a failed free may have taken it anyway. */
static void try_free(um__allocator *a, void **p)
{
    if (*p && (a->ops->free(a, *p, NULL) == UM_OK || !a->ops->owns(a, *p)))
        *p = NULL;
}

/* Runs a script of allocations, frees, limits and trims with the k-th
 * backend call failing; returns the calls made when nothing failed. */
static long script_with_failure(um_status (*create)(um__backend *, const um__pool_config *,
                                                    um__allocator **),
                                flaky *f, long k)
{
    um__allocator *a = make(create, &f->base, 0, UM_NO_CACHE_LIMIT);
    uint64_t calls0 = atomic_load(&f->base.calls);
    f->countdown = k;
    void *p[5] = {NULL};
    size_t sizes[5] = {3 * MiB, 1 * MiB, 3 * MiB, 5 * MiB, 1000};
    for (int i = 0; i < 2; i++)
        a->ops->alloc(a, sizes[i], NULL, &p[i]);
    try_free(a, &p[0]);
    a->ops->alloc(a, sizes[2], NULL, &p[2]);
    try_free(a, &p[1]);
    CHECK_OK(a->ops->check(a));
    a->ops->set_memory_limit(a, 8 * MiB);
    a->ops->alloc(a, sizes[3], NULL, &p[3]);
    a->ops->alloc(a, sizes[4], NULL, &p[4]);
    try_free(a, &p[4]);
    a->ops->trim(a);
    try_free(a, &p[2]);
    CHECK_OK(a->ops->check(a));
    long used = (long)(atomic_load(&f->base.calls) - calls0);

    /* Everything works again: nothing may be lost or leaked. */
    f->countdown = 0;
    for (int i = 0; i < 5; i++) {
        if (p[i]) {
            CHECK(a->ops->owns(a, p[i]));
            CHECK_OK(a->ops->free(a, p[i], NULL));
        }
    }
    CHECK_OK(a->ops->trim(a));
    CHECK_OK(a->ops->check(a));
    um_stats s = stats_of(a);
    CHECK_EQ(s.reserved_bytes, 0);
    CHECK_EQ(s.active_blocks, 0);
    a->ops->destroy(a);
    CHECK_EQ(f->reservations, 0);
    CHECK_EQ(f->chunks, 0);
    CHECK_EQ(f->mapped_bytes, 0);
    return used;
}

static void test_backend_failures(void)
{
    /* The allocators warn about every memory they must park; expected here. */
    um__log_set_level(UM_LOG_ERROR);
    flaky f;
    flaky_init(&f, sim_backend(64 * MiB));
    for (int which = 0; which < 2; which++) {
        um_status (*create)(um__backend *, const um__pool_config *, um__allocator **) =
            which ? um__bufcache_create : um__direct_create;
        long total = script_with_failure(create, &f, 0);
        CHECK_EQ(total, which ? 17 : 28); /* see the script (a wait per free or eviction) */
        for (long k = 1; k <= total; k++)
            script_with_failure(create, &f, k);
    }
    CHECK_EQ(atomic_load(&f.inner->physical_bytes), 0);
    um__backend_destroy(f.inner);
    um__log_set_level(UM_LOG_WARN);
}

/* ------------------------------------------------- randomized model */

typedef struct ref_block {
    uintptr_t va;
    size_t nominal, phys, size;
    uint64_t seq; /* cached: order of the free */
    bool live, cached;
} ref_block;

typedef struct ref_model {
    bool caching;
    size_t limit, cache_limit;
    ref_block *blocks; /* live and cached */
    size_t n, cap;
    uint64_t seq;
    size_t active, requested, reserved, cached, peak_reserved, peak_active;
    uint64_t calls, hits, ooms, live;
} ref_model;

static void ref_remove(ref_model *m, size_t i)
{
    m->blocks[i] = m->blocks[--m->n];
}

static size_t ref_oldest(const ref_model *m)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < m->n; i++)
        if (m->blocks[i].cached && (best == SIZE_MAX || m->blocks[i].seq < m->blocks[best].seq))
            best = i;
    return best;
}

static void ref_evict_oldest(ref_model *m)
{
    size_t i = ref_oldest(m);
    m->reserved -= m->blocks[i].phys;
    m->cached -= m->blocks[i].phys;
    m->calls += 4; /* the wait for its stream's work, then unmap, release, unreserve */
    ref_remove(m, i);
}

static void ref_peaks(ref_model *m)
{
    if (m->reserved > m->peak_reserved)
        m->peak_reserved = m->reserved;
    if (m->active > m->peak_active)
        m->peak_active = m->active;
}

static void compare(um__allocator *a, const ref_model *m, long step)
{
    um_stats s = stats_of(a);
    size_t largest = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->blocks[i].cached && m->blocks[i].nominal > largest)
            largest = m->blocks[i].nominal;
    bool ok = s.active_bytes == m->active && s.requested_bytes == m->requested &&
              s.reserved_bytes == m->reserved && s.cached_bytes == m->reserved - m->active &&
              s.peak_reserved_bytes == m->peak_reserved && s.peak_active_bytes == m->peak_active &&
              s.num_backend_calls == m->calls && s.num_cache_hits == m->hits &&
              s.num_ooms == m->ooms && s.active_blocks == m->live &&
              s.largest_free_bytes == largest;
    CHECK(ok);
    if (!ok)
        fprintf(stderr,
                "%s step %ld: active %zu/%zu requested %zu/%zu reserved %zu/%zu peak %zu/%zu "
                "calls %llu/%llu hits %llu/%llu ooms %llu/%llu live %llu/%llu largest %zu/%zu\n",
                a->ops->name, step, s.active_bytes, m->active, s.requested_bytes, m->requested,
                s.reserved_bytes, m->reserved, s.peak_reserved_bytes, m->peak_reserved,
                (unsigned long long)s.num_backend_calls, (unsigned long long)m->calls,
                (unsigned long long)s.num_cache_hits, (unsigned long long)m->hits,
                (unsigned long long)s.num_ooms, (unsigned long long)m->ooms,
                (unsigned long long)s.active_blocks, (unsigned long long)m->live,
                s.largest_free_bytes, largest);
}

static size_t random_size(uint64_t *rng)
{
    uint64_t r = harness_rand(rng);
    switch (r % 5) {
    case 0:
    case 1:
        return 1 + (size_t)(harness_rand(rng) % (64 * 1024));
    case 2:
    case 3:
        return 64 * 1024 + (size_t)(harness_rand(rng) % (4 * MiB));
    default:
        return 4 * MiB + (size_t)(harness_rand(rng) % (20 * MiB));
    }
}

/* Each live block holds a tag at both ends (blocks under 16 bytes at the
 * start only; every block has at least UM_ALIGN bytes), so overlapping
 * blocks or lost mappings show at the free. */
static void stamp(const ref_block *b)
{
    uintptr_t tag = b->va ^ b->size;
    memcpy((void *)b->va, &tag, sizeof tag);
    if (b->size >= 16)
        memcpy((void *)(b->va + b->size - sizeof tag), &tag, sizeof tag);
}

static bool stamp_intact(const ref_block *b)
{
    uintptr_t tag = b->va ^ b->size, head = 0, tail = tag;
    memcpy(&head, (void *)b->va, sizeof head);
    if (b->size >= 16)
        memcpy(&tail, (void *)(b->va + b->size - sizeof tail), sizeof tail);
    return head == tag && tail == tag;
}

static void random_run(bool caching, uint64_t seed, long steps)
{
    uint64_t rng = seed;
    /* The limits stay far below the capacity, so the device never runs out
     * of contiguous physical pages and every failure is the limit's. */
    um__backend *b = sim_backend(4096ull * MiB);
    um__allocator *a = make(caching ? um__bufcache_create : um__direct_create, b, 128 * MiB,
                            UM_NO_CACHE_LIMIT);
    ref_model m = {.caching = caching, .limit = 128 * MiB, .cache_limit = SIZE_MAX};
    m.cap = 1024;
    m.blocks = calloc(m.cap, sizeof *m.blocks);
    for (long step = 0; step < steps; step++) {
        uint64_t r = harness_rand(&rng) % 100;
        size_t nlive = (size_t)m.live;
        if (r < 50 && m.n < m.cap) {
            size_t size = random_size(&rng);
            size_t nominal = (size + UM_ALIGN - 1) / UM_ALIGN * UM_ALIGN;
            size_t phys = (nominal + GRAN - 1) / GRAN * GRAN;
            size_t bound = 2 * nominal < nominal + 2 * GRAN ? 2 * nominal : nominal + 2 * GRAN;
            size_t pick = SIZE_MAX;
            for (size_t i = 0; caching && i < m.n; i++) {
                const ref_block *c = &m.blocks[i];
                if (c->cached && c->nominal >= nominal && c->nominal < bound &&
                    (pick == SIZE_MAX || c->nominal < m.blocks[pick].nominal ||
                     (c->nominal == m.blocks[pick].nominal && c->seq < m.blocks[pick].seq)))
                    pick = i;
            }
            bool expect_ok = true;
            if (pick == SIZE_MAX) {
                if (phys > m.limit) {
                    expect_ok = false;
                } else {
                    while (m.reserved + phys > m.limit && ref_oldest(&m) != SIZE_MAX)
                        ref_evict_oldest(&m);
                    expect_ok = m.reserved + phys <= m.limit;
                }
            }
            void *p = NULL;
            um_status st = a->ops->alloc(a, size, NULL, &p);
            CHECK_EQ(st, expect_ok ? UM_OK : UM_ERR_NOMEM);
            if (st != UM_OK) {
                m.ooms += !expect_ok;
            } else if (pick != SIZE_MAX) {
                ref_block *c = &m.blocks[pick];
                CHECK_EQ((uintptr_t)p, c->va);
                c->cached = false;
                c->live = true;
                c->size = size;
                m.cached -= c->phys;
                m.hits++;
                m.active += nominal;
                m.requested += size;
                m.live++;
                stamp(c);
            } else {
                CHECK_EQ((uintptr_t)p % GRAN, 0);
                for (size_t i = 0; i < m.n; i++)
                    CHECK((uintptr_t)p + phys <= m.blocks[i].va ||
                          m.blocks[i].va + m.blocks[i].phys <= (uintptr_t)p);
                m.blocks[m.n++] = (ref_block){(uintptr_t)p, nominal, phys, size, 0, true, false};
                m.calls += 3;
                m.reserved += phys;
                m.active += nominal;
                m.requested += size;
                m.live++;
                stamp(&m.blocks[m.n - 1]);
            }
        } else if (r < 95 && nlive > 0) {
            size_t k = (size_t)(harness_rand(&rng) % nlive), i = 0;
            for (;; i++)
                if (m.blocks[i].live && k-- == 0)
                    break;
            ref_block *c = &m.blocks[i];
            CHECK(stamp_intact(c));
            CHECK_OK(a->ops->free(a, (void *)c->va, NULL));
            m.active -= (c->size + UM_ALIGN - 1) / UM_ALIGN * UM_ALIGN;
            m.requested -= c->size;
            m.live--;
            if (!caching) {
                m.reserved -= c->phys;
                m.calls += 4; /* the stream's wait, then unmap, release, unreserve */
                ref_remove(&m, i);
            } else {
                c->live = false;
                c->cached = true;
                c->seq = m.seq++;
                m.cached += c->phys;
                while (m.cached > m.cache_limit)
                    ref_evict_oldest(&m);
            }
        } else if (r < 97) {
            CHECK_OK(a->ops->trim(a));
            while (ref_oldest(&m) != SIZE_MAX)
                ref_evict_oldest(&m);
        } else if (r < 99) {
            static const size_t cache_limits[] = {0, 8 * MiB, 32 * MiB, UM_NO_CACHE_LIMIT};
            size_t lim = cache_limits[harness_rand(&rng) % 4];
            CHECK_OK(a->ops->set_cache_limit(a, lim));
            m.cache_limit = lim;
            while (m.cached > m.cache_limit)
                ref_evict_oldest(&m);
        } else {
            static const size_t limits[] = {64 * MiB, 96 * MiB, 128 * MiB, 256 * MiB};
            size_t lim = limits[harness_rand(&rng) % 4];
            size_t eff = lim;
            while (m.reserved > eff && ref_oldest(&m) != SIZE_MAX)
                ref_evict_oldest(&m);
            um_status expect = m.reserved > eff ? UM_ERR_BUSY : UM_OK;
            CHECK_STATUS(a->ops->set_memory_limit(a, lim), expect);
            if (expect == UM_OK)
                m.limit = eff;
        }
        ref_peaks(&m);
        compare(a, &m, step);
        if (step % 64 == 0)
            CHECK_OK(a->ops->check(a));
        if (harness_failures > 20)
            break;
    }
    CHECK_OK(a->ops->check(a));
    a->ops->destroy(a);
    CHECK_EQ(atomic_load(&b->physical_bytes), 0);
    um__backend_destroy(b);
    free(m.blocks);
}

int main(void)
{
    uint64_t seed = harness_seed("test_baseline");
    test_direct();
    test_bufcache_rule();
    test_bufcache_limits();
    test_streams();
    test_block_live();
    test_backend_failures();
    random_run(false, seed, 6000);
    random_run(true, seed ^ 0x5eed, 6000);
    return harness_finish("test_baseline");
}
