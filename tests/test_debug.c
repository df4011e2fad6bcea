/* The debug allocator of -DUNIMEM_DEBUG=ON builds (src/pool/debug.c): a
 * write past a block's end is reported at its free, a freed block is
 * poisoned (filled, and in ASan builds marked in ASan's shadow), live
 * blocks are not, and the statistics count what callers asked. Other
 * builds skip it, saying so. */
#include "core/core.h"
#include "harness.h"
#include "pool/pool.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif
#ifdef HAVE_ASAN
#include <sanitizer/asan_interface.h>
#endif

#ifdef UM_DEBUG
static void test_guard_bytes(const char *devices)
{
    char conf[96];
    snprintf(conf, sizeof conf, "devices=%s", devices);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    static const size_t sizes[] = {1, 100, 4096, 40000, 3u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int dev = 0; dev < 2; dev++) {
            size_t n = sizes[i];
            uint8_t *p = NULL;
            CHECK_OK(um_malloc(ctx, dev, n, NULL, (void **)&p));
            if (!p)
                continue;
            memset(p, 0x11, n);
            um_stats st;
            CHECK_OK(um_stats_get(ctx, dev, &st));
            CHECK_EQ(st.requested_bytes, n); /* the guard bytes are not counted */
#ifdef HAVE_ASAN
            /* ASan sees the block's end, where the guard bytes start. */
            CHECK(!__asan_address_is_poisoned(p + n - 1));
            CHECK(__asan_region_is_poisoned(p + n, UM_DEBUG_GUARD) != NULL);
#endif
            /* In bounds: a clean free. */
            CHECK_OK(um_free(ctx, p, NULL));
#ifdef HAVE_ASAN
            CHECK(__asan_region_is_poisoned(p, n) != NULL);
#endif
            /* One byte past the end: reported at the free, which still
             * frees the block. ASan would stop the write itself, so it
             * is made through an unpoisoned alias only without ASan. */
#ifndef HAVE_ASAN
            CHECK_OK(um_malloc(ctx, dev, n, NULL, (void **)&p));
            if (!p)
                continue;
            p[n] = 0x42;
            CHECK_STATUS(um_free(ctx, p, NULL), UM_ERR_INTERNAL);
            CHECK_ERROR_MENTIONS("guard bytes", "wrote past its end", NULL);
            /* The poison: what a read after the free would see. */
            for (size_t k = 0; k < n && k < 64; k++)
                CHECK_EQ(p[k], 0xdd);
            CHECK_OK(um_stats_get(ctx, dev, &st));
            CHECK_EQ(st.active_blocks, 0ull);
#endif
        }
    }
    /* Misuse still gets the release build's errors. */
    void *q = NULL;
    CHECK_OK(um_malloc(ctx, 1, 5000, NULL, &q));
    CHECK_OK(um_free(ctx, q, NULL));
    CHECK_STATUS(um_free(ctx, q, NULL), UM_ERR_DOUBLE_FREE);
    um_shutdown(ctx);
}

/* A marked block (um_record_stream) written one byte past its end,
 * freed while its stream still works and handed back later: the debug
 * free reports the write and takes the block, and says so
 * (um__note_free_took), so the give-back neither keeps the free waiting
 * to be retried (each retry a double free) nor frees the address again
 * once it is reused. Every allocator, a slab's slot and a large block. */
static void test_guard_bytes_of_a_marked_block(void)
{
    static const char *const confs[] = {"devices=sim:64M,log_level=error",
                                        "devices=sim:64M,thread_cache=0,log_level=error",
                                        "devices=sim:64M,allocator=bufcache,log_level=error",
                                        "devices=sim:64M,allocator=direct,log_level=error"};
    static const size_t sizes[] = {100, 3u << 20};
    for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++)
        for (size_t z = 0; z < 2; z++) {
            um_context *ctx = NULL;
            CHECK_OK(um_init(confs[c], &ctx));
            if (!ctx)
                continue;
            um_stream a = NULL, b = NULL;
            uint8_t *p = NULL;
            CHECK_OK(um_stream_create(ctx, 1, &a));
            CHECK_OK(um_stream_create(ctx, 1, &b));
            CHECK_OK(um_malloc(ctx, 1, sizes[z], a, (void **)&p));
            CHECK_OK(um_record_stream(ctx, p, b));
            CHECK_OK(um_sim_stream_work(ctx, 1, b, 1, 0)); /* the free waits */
#ifdef HAVE_ASAN
            __asan_unpoison_memory_region(p + sizes[z], 1);
#endif
            p[sizes[z]] = 0x42;
#ifdef HAVE_ASAN
            __asan_poison_memory_region(p + sizes[z], 1);
#endif
            CHECK_OK(um_free(ctx, p, a));
            CHECK_EQ(ctx->devices[1].deferred, 1);
            CHECK_OK(um_sim_stream_work(ctx, 1, b, 0, 1));
            CHECK_OK(um_trim(ctx, 1)); /* the hand-back: the debug free reports */
            CHECK_EQ(ctx->devices[1].deferred, 0);
            CHECK_EQ(ctx->devices[1].marked, 0);
            um_stats st;
            CHECK_OK(um_stats_get(ctx, 1, &st));
            CHECK_EQ(st.active_blocks, 0ull);
            void *q = NULL;
            CHECK_OK(um_malloc(ctx, 1, sizes[z], a, &q));
            CHECK_OK(um_record_stream(ctx, q, b));
            CHECK_OK(um_trim(ctx, 1)); /* no retry of the old free frees q */
            CHECK_OK(um_stats_get(ctx, 1, &st));
            CHECK_EQ(st.active_blocks, 1ull);
            CHECK_OK(um_free(ctx, q, a));
            CHECK_OK(um_trim(ctx, 1));
            CHECK_OK(um_stats_get(ctx, 1, &st));
            CHECK_EQ(st.active_bytes, 0ull);
            CHECK_OK(um_stream_destroy(ctx, a));
            CHECK_OK(um_stream_destroy(ctx, b));
            um_shutdown(ctx);
        }
}

/* Counts occurrences of needle in the file at path. */
static int count_in_file(const char *path, const char *needle)
{
    static char text[1 << 20];
    harness_slurp(path, text, sizeof text);
    int count = 0;
    for (const char *c = text; (c = strstr(c, needle)); c++)
        count++;
    return count;
}

/* A free that reports overwritten guard bytes has freed the block: a
 * recorded trace shows the free too (it kept the block live for good). */
static void test_guard_bytes_recorded(void)
{
    char path[] = "/tmp/unimem_test_debug_trace_XXXXXX";
    if (!harness_temp_file(path))
        return;
    char conf[128];
    snprintf(conf, sizeof conf, "devices=sim:64M,trace_file=%s", path);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    uint8_t *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, 100, NULL, (void **)&p));
#ifdef HAVE_ASAN
    __asan_unpoison_memory_region(p + 100, 1);
#endif
    p[100] = 0x42;
#ifdef HAVE_ASAN
    __asan_poison_memory_region(p + 100, 1);
#endif
    CHECK_STATUS(um_free(ctx, p, NULL), UM_ERR_INTERNAL);
    /* A later free that fails without taking its block is no free in the
     * trace, the earlier report's note notwithstanding. */
    CHECK_STATUS(um_free(ctx, p, NULL), UM_ERR_DOUBLE_FREE);
    um_shutdown(ctx);
    CHECK_EQ(count_in_file(path, "\"name\":\"alloc\""), 1);
    CHECK_EQ(count_in_file(path, "\"name\":\"free\""), 1);
    remove(path);
}

/* calloc fails at the Nth call of the thread that armed it (0: never);
 * every other call goes to the next definition (libc's or ASan's). */
static _Thread_local int calloc_fail_in;

__attribute__((no_sanitize_thread)) void *calloc(size_t n, size_t size)
{
    static void *(*_Atomic next)(size_t, size_t);
    if (calloc_fail_in > 0 && --calloc_fail_in == 0)
        return NULL;
    void *(*fn)(size_t, size_t) = atomic_load(&next);
    if (!fn) {
        *(void **)&fn = dlsym(RTLD_NEXT, "calloc");
        atomic_store(&next, fn);
    }
    return fn(n, size);
}

/* A free the pool refuses (no host memory for the new stream's records)
 * leaves the block live and whole: its bytes as they were, not poisoned,
 * still a block of the debug allocator (its guard bytes checked at the
 * next free, its size out of the statistics once). The free used to
 * poison it first and forget it. */
static void test_failed_free_keeps_block(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M", &ctx));
    if (!ctx)
        return;
    size_t n = 1u << 20;
    uint8_t *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, n, NULL, (void **)&p));
    um_stream s = NULL;
    CHECK_OK(um_stream_create(ctx, 1, &s));
    if (!p || !s) {
        um_shutdown(ctx);
        return;
    }
    memset(p, 0x11, n);
    calloc_fail_in = 1; /* the pool's state for stream s */
    um_status st = um_free(ctx, p, s);
    int left = calloc_fail_in;
    calloc_fail_in = 0;
    CHECK_EQ(left, 0);
    CHECK_STATUS(st, UM_ERR_NOMEM);
#ifdef HAVE_ASAN
    CHECK(__asan_region_is_poisoned(p, n) == NULL);
#endif
    size_t wrong = 0;
    for (size_t k = 0; k < n; k++)
        wrong += p[k] != 0x11;
    CHECK_EQ(wrong, 0);
    um_stats stats;
    CHECK_OK(um_stats_get(ctx, 1, &stats));
    CHECK_EQ(stats.requested_bytes, n);
    CHECK_OK(um_free(ctx, p, s));
    CHECK_OK(um_stats_get(ctx, 1, &stats));
    CHECK_EQ(stats.requested_bytes, 0ull);
    CHECK_OK(um_stream_destroy(ctx, s));
    um_shutdown(ctx);
}

/* An allocation the debug allocator refuses for want of host memory for
 * its table of live blocks counts once in num_ooms, as any allocation that
 * fails with UM_ERR_NOMEM does: the inner allocator served it (and took it
 * back), so only the debug allocator can count it. It was not counted. */
static void test_table_nomem_counted(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M", &ctx));
    if (!ctx)
        return;
    /* The table holds 1,024 slots up to half full: the 513th live block
     * makes it grow, with calloc. */
    enum { FULL = 512 };
    void *blocks[FULL + 1] = {0};
    for (int i = 0; i < FULL; i++)
        CHECK_OK(um_malloc(ctx, 1, 64, NULL, &blocks[i]));
    calloc_fail_in = 1;
    um_status st = um_malloc(ctx, 1, 64, NULL, &blocks[FULL]);
    int left = calloc_fail_in;
    calloc_fail_in = 0;
    CHECK_EQ(left, 0);
    CHECK_STATUS(st, UM_ERR_NOMEM);
    CHECK(strstr(um_last_error(), "no memory for the debug allocator's table") != NULL);
    um_stats stats;
    CHECK_OK(um_stats_get(ctx, 1, &stats));
    CHECK_EQ(stats.num_ooms, 1ull);
    CHECK_EQ(stats.requested_bytes, (unsigned long long)FULL * 64);
    CHECK_OK(um_malloc(ctx, 1, 64, NULL, &blocks[FULL]));
    CHECK_OK(um_stats_get(ctx, 1, &stats));
    CHECK_EQ(stats.num_ooms, 1ull);
    for (int i = 0; i <= FULL; i++)
        if (blocks[i])
            CHECK_OK(um_free(ctx, blocks[i], NULL));
    um_shutdown(ctx);
}
#endif

int main(void)
{
#ifndef UM_DEBUG
    printf("test_debug: skipped: not a -DUNIMEM_DEBUG=ON build\n");
    return 77;
#else
    unsetenv("UNIMEM_CONF");
    test_guard_bytes("sim:64M");
    test_guard_bytes_of_a_marked_block();
    test_guard_bytes_recorded();
    test_failed_free_keeps_block();
    test_table_nomem_counted();
    return harness_finish("test_debug");
#endif
}
