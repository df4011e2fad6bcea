/* The live-10k-mixed scenario of bench/gpu/alloc_compare.cpp on the public
 * API alone, for machines without a GPU: 10,000 live blocks of the same
 * fixed-seed size mix (70% 256 B-32 KiB, 25% 32 KiB-4 MiB, 5% 4-64 MiB),
 * then pairs that each free one live block and allocate the next size in
 * its place. Prints ns per pair for each round of pairs, with the device's
 * backend calls and reserved bytes, so that a change can be checked to
 * keep every placement while it is timed.
 *
 * The build makes it (build/bench/live_mixed); by hand:
 *   cc -O2 -g -Iinclude bench/live_mixed.c build/libunimem.a -lz -lpthread -ldl -lm -o live_mixed
 *   live_mixed [CONF [ROUNDS [PAIRS [SPLIT]]]]   (defaults: devices=sim:40G, 5, 200000)
 *
 * With SPLIT set to "split", the last round also times each call with the
 * TSC (x86-64 only) and prints the mean cost of a free and of an
 * allocation of blocks up to 1 MiB (the slab path while medium slabs are
 * on) and above (the large path), and how many of each; the timing adds
 * its own few nanoseconds to every call:
 *   live_mixed devices=sim:141G 12 200000 split
 *
 * Under callgrind, only the last round is counted, so the figure is the
 * steady state's, not the fill's:
 *   valgrind --tool=callgrind --instr-atstart=no live_mixed \
 *       devices=sim:40G,host_capacity=1G,va_factor=1 3 200000
 */
#include <unimem.h>

#include "mixed_sizes.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_START_INSTRUMENTATION do {} while (0)
#define CALLGRIND_STOP_INSTRUMENTATION do {} while (0)
#endif

#if defined(__x86_64__)
#include <x86intrin.h>
#define HAVE_SPLIT 1
static inline uint64_t ticks(void) { return __rdtsc(); }
#else
#define HAVE_SPLIT 0
static inline uint64_t ticks(void) { return 0; }
#endif

#define LIVE_BLOCKS 10000u
/* The split's line between small and large blocks: the largest medium
 * slab class. */
#define SPLIT_SMALL_MAX ((size_t)1 << 20)
#define STEPS (1u << 20)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *conf = argc > 1 ? argv[1] : "devices=sim:40G";
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    long pairs = argc > 3 ? atol(argv[3]) : 200000;
    bool split = argc > 4 && !strcmp(argv[4], "split");
    if (rounds < 1 || pairs < 1 || (argc > 4 && !split)) {
        fprintf(stderr, "live_mixed: ROUNDS and PAIRS must be at least 1, and SPLIT the word "
                        "'split'\n");
        return 2;
    }
    if (split && !HAVE_SPLIT) {
        fprintf(stderr, "live_mixed: 'split' reads the TSC, which only x86-64 has\n");
        return 2;
    }
    um_context *ctx = NULL;
    if (um_init(conf, &ctx) != UM_OK) {
        fprintf(stderr, "live_mixed: %s\n", um_last_error());
        return 1;
    }
    int dev = um_device_count(ctx) > 1 ? 1 : 0;
    static void *live[LIVE_BLOCKS];
    static size_t live_size[LIVE_BLOCKS];
    static size_t sizes[STEPS];
    static uint32_t victim[STEPS];
    uint64_t size_state = MIX_SEED, victim_state = MIX_VICTIM_SEED;
    for (unsigned i = 0; i < LIVE_BLOCKS; i++) {
        size_t n = mix_size(&size_state);
        live_size[i] = n;
        if (um_malloc(ctx, dev, n, NULL, &live[i]) != UM_OK) {
            fprintf(stderr, "live_mixed: filling block %u of %zu bytes: %s\n", i, n, um_last_error());
            return 1;
        }
    }
    for (unsigned i = 0; i < STEPS; i++) {
        sizes[i] = mix_size(&size_state);
        victim[i] = (uint32_t)(mix_splitmix64(&victim_state) % LIVE_BLOCKS);
    }
    unsigned step = 0;
    for (int r = 0; r < rounds; r++) {
        if (r == rounds - 1)
            CALLGRIND_START_INSTRUMENTATION;
        bool timed = split && r == rounds - 1;
        /* Ticks and calls: free small, free large, alloc small, alloc large. */
        uint64_t spent[4] = {0}, calls[4] = {0};
        uint64_t k0 = ticks();
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++, step++) {
            unsigned k = step % STEPS;
            uint32_t v = victim[k];
            uint64_t a = timed ? ticks() : 0;
            um_status st = um_free(ctx, live[v], NULL);
            uint64_t b = timed ? ticks() : 0;
            if (st == UM_OK)
                st = um_malloc(ctx, dev, sizes[k], NULL, &live[v]);
            if (timed) {
                uint64_t c = ticks();
                unsigned f = live_size[v] > SPLIT_SMALL_MAX, m = 2 + (sizes[k] > SPLIT_SMALL_MAX);
                spent[f] += b - a;
                calls[f]++;
                spent[m] += c - b;
                calls[m]++;
            }
            live_size[v] = sizes[k];
            if (st != UM_OK) {
                fprintf(stderr, "live_mixed: pair %u (%zu bytes): %s\n", step, sizes[k],
                        um_last_error());
                return 1;
            }
        }
        double round_ns = now_ns() - t0;
        double ns = round_ns / (double)pairs;
        if (timed) {
            double ns_per_tick = round_ns / (double)(ticks() - k0);
            static const char *const what[4] = {"free, up to 1 MiB", "free, above 1 MiB",
                                                "alloc, up to 1 MiB", "alloc, above 1 MiB"};
            for (int c = 0; c < 4; c++)
                printf("split: %-19s %7.1f ns a call, %llu calls\n", what[c],
                       calls[c] ? (double)spent[c] * ns_per_tick / (double)calls[c] : 0.0,
                       (unsigned long long)calls[c]);
        }
        if (r == rounds - 1)
            CALLGRIND_STOP_INSTRUMENTATION;
        um_stats st = {.version = UM_STATS_VERSION};
        um_stats_get(ctx, dev, &st);
        printf("round %d: %.1f ns a pair; backend calls %llu, reserved %.2f GiB, live %.2f GiB\n",
               r + 1, ns, (unsigned long long)st.num_backend_calls,
               (double)st.reserved_bytes / (double)(1u << 30),
               (double)st.active_bytes / (double)(1u << 30));
    }
    um_shutdown(ctx);
    return 0;
}
