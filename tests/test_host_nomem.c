/* The host running out of memory inside an allocation: the request fails
 * with UM_ERR_NOMEM, once in num_ooms, with a message that names what ran
 * out (the host's memory for the pool's record of a stream, not the
 * device's), and the next request, with memory back, succeeds. */
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* While set, this thread's calloc and realloc fail (the pool makes its
 * record of a stream with them); every other call goes to the next
 * definition (libc's, or a sanitizer's). Per thread, so no other thread's
 * allocations fail. */
static _Thread_local bool host_out;
/* This thread's next calloc_fails callocs and memalign_fails
 * posix_memaligns fail (a short shortage, gone by the next one), counted
 * in host_failed. */
static _Thread_local int calloc_fails, memalign_fails, host_failed;

/* Whether this call of a host allocation should fail. */
__attribute__((no_sanitize_thread)) static bool fail_now(int *countdown)
{
    if (*countdown <= 0)
        return false;
    --*countdown;
    host_failed++;
    return true;
}

/* Not instrumented by ThreadSanitizer: libc calls them while TSan sets a
 * new thread up, before that thread's TSan state exists. */
__attribute__((no_sanitize_thread)) void *calloc(size_t n, size_t size)
{
    static void *(*_Atomic next)(size_t, size_t);
    if (host_out || fail_now(&calloc_fails))
        return NULL;
    void *(*fn)(size_t, size_t) = atomic_load(&next);
    if (!fn) {
        *(void **)&fn = dlsym(RTLD_NEXT, "calloc");
        atomic_store(&next, fn);
    }
    return fn(n, size);
}

__attribute__((no_sanitize_thread)) void *realloc(void *ptr, size_t size)
{
    static void *(*_Atomic next)(void *, size_t);
    if (host_out)
        return NULL;
    void *(*fn)(void *, size_t) = atomic_load(&next);
    if (!fn) {
        *(void **)&fn = dlsym(RTLD_NEXT, "realloc");
        atomic_store(&next, fn);
    }
    return fn(ptr, size);
}

__attribute__((no_sanitize_thread)) int posix_memalign(void **out, size_t align, size_t size)
{
    static int (*_Atomic next)(void **, size_t, size_t);
    if (fail_now(&memalign_fails))
        return ENOMEM;
    int (*fn)(void **, size_t, size_t) = atomic_load(&next);
    if (!fn) {
        *(void **)&fn = dlsym(RTLD_NEXT, "posix_memalign");
        atomic_store(&next, fn);
    }
    return fn(out, align, size);
}

static uint64_t ooms(um_context *ctx, int dev)
{
    um_stats s;
    CHECK_OK(um_stats_get(ctx, dev, &s));
    return s.num_ooms;
}

/* n buffers of `size` bytes of 7s in b, each with a clean replica on
 * device 1 (written on the host, then read there). */
static void clean_replicas(um_context *ctx, um_buffer **b, int n, size_t size)
{
    unsigned char *data = malloc(size);
    CHECK(data != NULL);
    if (!data)
        return;
    memset(data, 7, size);
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        CHECK_OK(um_buffer_create(ctx, size, NULL, &b[i]));
        CHECK_OK(um_buffer_write(b[i], 0, data, size));
        CHECK_OK(um_buffer_acquire(b[i], 1, UM_ACCESS_READ, NULL, &p));
        CHECK_OK(um_buffer_release(b[i], 1, NULL));
    }
    free(data);
}

/* A first request on a new stream, small (a slab's slot) or large (pages
 * of its own), while the host has no memory for the stream's record. */
static void test_stream_record(size_t size)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M", &ctx));
    if (!ctx)
        return;
    um_stream s = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s));
    void *p = NULL;
    host_out = true;
    um_status st = um_malloc(ctx, 1, size, s, &p);
    host_out = false;
    CHECK_STATUS(st, UM_ERR_NOMEM);
    char said[512];
    snprintf(said, sizeof said, "%s", um_last_error());
    if (!strstr(said, "no host memory for the pool's record of stream"))
        harness_report(__FILE__, __LINE__, "%zu bytes: the error names no host memory: %s", size,
                       said);
    CHECK(strstr(said, "fragmented") == NULL);
    CHECK_EQ(ooms(ctx, 1), 1ull);
    /* With memory back, the same request succeeds and counts nothing. */
    CHECK_OK(um_malloc(ctx, 1, size, s, &p));
    CHECK_EQ(ooms(ctx, 1), 1ull);
    if (p) {
        memset(p, 0x5a, size);
        CHECK_OK(um_free(ctx, p, s));
    }
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
}

/* The same request with buffers' replicas on the device: none is
 * evicted for it, since no eviction gives the host memory back. The
 * reclaim loop took the UM_ERR_NOMEM for a full device and evicted every
 * replica, one per retry (found by an audit). */
static void test_stream_record_keeps_replicas(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,watermark_high=100", &ctx));
    if (!ctx)
        return;
    enum { N = 8 };
    um_buffer *b[N] = {NULL};
    clean_replicas(ctx, b, N, 1 << 20);
    um_stream s = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s));
    void *q = NULL;
    host_out = true;
    um_status st = um_malloc(ctx, 1, 4096, s, &q);
    host_out = false;
    CHECK_STATUS(st, UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("no host memory", NULL, NULL);
    um_reclaim_stats rs;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_EQ(rs.evictions, 0);
    for (int i = 0; i < N; i++) {
        CHECK(um_buffer_replica_state(b[i], 1) != UM_REPLICA_INVALID);
        CHECK_OK(um_buffer_destroy(b[i]));
    }
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
}

/* One allocation that first misses host memory for a record (and gets
 * it on its next try) and then fails for device memory, as on a GPU that
 * other processes filled (the backend's creates fail): the device's
 * shortage is what the call ends on, so reclaim runs, evicts a clean
 * replica and the request succeeds. The host's failure used to stay
 * noted, and reclaim was skipped (found by an audit): in the pool, the
 * record of a range's free rest (posix_memalign) on one try of
 * take_range; in the buffer cache, the record of a new range (calloc)
 * before it gives its cache back and tries again. conf: device 1 is
 * sim:16M (eight 2 MiB pages) with four 2 MiB replicas, and its creates
 * fail from the request's on; `cached`: a free 2 MiB block stays cached
 * before it. */
static void test_host_then_device_nomem(const char *conf, bool cached, int callocs,
                                        int memaligns)
{
    for (int host_first = 0; host_first < 2; host_first++) {
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            return;
        enum { N = 4, MB = 1 << 20 };
        um_buffer *b[N] = {NULL};
        clean_replicas(ctx, b, N, 2 * MB);
        void *q = NULL;
        if (cached) {
            CHECK_OK(um_malloc(ctx, 1, 2 * MB, NULL, &q));
            CHECK_OK(um_free(ctx, q, NULL));
        }
        calloc_fails = host_first ? callocs : 0;
        memalign_fails = host_first ? memaligns : 0;
        host_failed = 0;
        um_status st = um_malloc(ctx, 1, 4 * MB, NULL, &q);
        int failed = host_failed;
        calloc_fails = memalign_fails = 0;
        um_reclaim_stats rs;
        CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
        printf("test_host_nomem: %s, %s: %s, %llu evicted\n", cached ? "bufcache" : "pool",
               host_first ? "host memory short first" : "device memory short only",
               um_status_name(st), (unsigned long long)rs.evictions);
        CHECK_EQ(failed, host_first ? callocs + memaligns : 0); /* the shortage was met */
        CHECK_OK(st);
        CHECK(rs.evictions >= 1);
        if (st == UM_OK)
            CHECK_OK(um_free(ctx, q, NULL));
        for (int i = 0; i < N; i++) {
            unsigned char back[64];
            CHECK_OK(um_buffer_read(b[i], 0, back, sizeof back));
            CHECK_EQ(back[63], 7); /* an evicted replica's data is still there */
            CHECK_OK(um_buffer_destroy(b[i]));
        }
        um_shutdown(ctx);
    }
}

/* A thread exits while the host is out of memory: its cache's small
 * slots, freed on a stream whose list of pending slots has no room yet,
 * cannot be parked there. They must still go back (the stream's work
 * waited for), not be lost with the cache: a slab that kept them was never
 * given back, even by um_trim. */
typedef struct exiting {
    um_context *ctx;
    um_stream s;
} exiting;

static void *alloc_free_and_exit_out_of_memory(void *arg)
{
    exiting *x = arg;
    void *p[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_malloc(x->ctx, 1, 4096, x->s, &p[i]));
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_free(x->ctx, p[i], x->s)); /* into this thread's cache */
    host_out = true; /* still set while the cache is taken down */
    return NULL;
}

static void test_thread_exit_out_of_memory(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M", &ctx));
    if (!ctx)
        return;
    exiting x = {ctx, NULL};
    CHECK_OK(um_stream_create(ctx, 1, &x.s));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, alloc_free_and_exit_out_of_memory, &x) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.active_bytes, 0);
    CHECK_OK(um_trim(ctx, 1));
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, 0); /* the slab went back: no slot was lost */
    /* The slots are reusable: a new thread's allocations take them. */
    void *q = NULL;
    CHECK_OK(um_malloc(ctx, 1, 4096, x.s, &q));
    CHECK_OK(um_free(ctx, q, x.s));
    CHECK_OK(um_stream_destroy(ctx, x.s));
    um_shutdown(ctx);
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_stream_record(4096);
    test_stream_record((size_t)4 << 20);
    test_stream_record_keeps_replicas();
    test_thread_exit_out_of_memory();
    /* The pool: the replicas took creates 1-4. The buffer cache: create 5
     * is the cached block. */
    test_host_then_device_nomem("devices=sim:16M,links=model,watermark_high=100,"
                                "fault=1:create@5+1:create@6+1:create@7+1:create@8+"
                                "1:create@9+1:create@10+1:create@11+1:create@12",
                                false, 0, 1);
    test_host_then_device_nomem("devices=sim:16M,allocator=bufcache,links=model,"
                                "watermark_high=100,fault=1:create@6+1:create@7",
                                true, 1, 0);
    return harness_finish("test_host_nomem");
}
