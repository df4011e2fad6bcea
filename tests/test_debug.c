/* The debug allocator of -DUNIMEM_DEBUG=ON builds (src/pool/debug.c): a
 * write past a block's end is reported at its free, a freed block is
 * poisoned (filled, and in ASan builds marked in ASan's shadow), live
 * blocks are not, and the statistics count what callers asked. Other
 * builds skip it, saying so. */
#include "harness.h"
#include "pool/pool.h"

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
#endif

int main(void)
{
#ifndef UM_DEBUG
    printf("test_debug: skipped: not a -DUNIMEM_DEBUG=ON build\n");
    return 77;
#else
    unsetenv("UNIMEM_CONF");
    test_guard_bytes("sim:64M");
    return harness_finish("test_debug");
#endif
}
