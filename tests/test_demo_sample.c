/* The entries `unimem demo` checks in a result too large to check whole
 * (tools/demo_sample.h): every tile of the result is looked at, so a
 * tile left wrong as a whole (never written, a task lost) cannot pass the
 * check; every entry is inside the matrix, and in its lower triangle for
 * Cholesky, whose upper triangle holds no result. */
#include "harness.h"

#include "../tools/demo_sample.h"

#include <stdlib.h>

static void check_sampler(int nt, int tile, bool lower, uint64_t seed)
{
    demo_sampler s;
    demo_sampler_init(&s, nt, tile, lower, DEMO_SAMPLES, seed);
    int n = nt * tile;
    uint32_t *hits = calloc((size_t)nt * (size_t)nt, sizeof *hits);
    CHECK(hits != NULL);
    if (!hits)
        return;
    uint64_t walked = 0, outside = 0;
    int i, j;
    while (demo_sampler_next(&s, &i, &j)) {
        walked++;
        if (i < 0 || i >= n || j < 0 || j >= n || (lower && j > i)) {
            outside++;
            continue;
        }
        hits[(size_t)(i / tile) * (size_t)nt + (size_t)(j / tile)]++;
    }
    CHECK_EQ(outside, 0);
    CHECK_EQ(walked, demo_sampler_count(&s));
    CHECK(walked >= DEMO_SAMPLES);
    uint64_t unseen = 0, tiles = 0;
    for (int ti = 0; ti < nt; ti++)
        for (int tj = 0; tj < (lower ? ti + 1 : nt); tj++) {
            tiles++;
            unseen += hits[(size_t)ti * (size_t)nt + (size_t)tj] == 0;
        }
    harness_checks++;
    if (unseen)
        harness_report(__FILE__, __LINE__,
                       "%s, %d x %d tiles of %d: %llu of %llu tiles never checked in %llu samples",
                       lower ? "cholesky" : "gemm", nt, nt, tile, (unsigned long long)unseen,
                       (unsigned long long)tiles, (unsigned long long)walked);
    free(hits);
}

int main(void)
{
    /* The demo's largest tiling (128 tiles a side), GPU sizes (8 a side),
     * and one tile. */
    static const int sizes[][2] = {{128, 65}, {128, 8192}, {8, 4096}, {64, 129}, {1, 8193}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        check_sampler(sizes[k][0], sizes[k][1], false, DEMO_SEED_GEMM);
        check_sampler(sizes[k][0], sizes[k][1], true, DEMO_SEED_CHOLESKY);
    }
    return harness_finish("test_demo_sample");
}
