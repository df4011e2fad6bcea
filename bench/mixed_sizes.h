/* The size mix of alloc_compare's live-10k-mixed scenario
 * (bench/gpu/alloc_compare.cpp) and of bench/live_mixed.c, its copy on the
 * public API: one generator and one mix, so both programs replace the same
 * blocks with the same sizes. 70% of the sizes are 256 B-32 KiB, 25% 32
 * KiB-4 MiB and 5% 4-64 MiB, log-uniform within each band. C, and usable
 * from C++. */
#ifndef UM_BENCH_MIXED_SIZES_H
#define UM_BENCH_MIXED_SIZES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define MIX_SEED 0x756e696d656d2025ull
/* The generator of which live block each step replaces. */
#define MIX_VICTIM_SEED (MIX_SEED ^ 0x5bd1e995ull)
#define MIX_SMALL_MIN ((size_t)256)
#define MIX_SMALL_MAX ((size_t)32 << 10)
#define MIX_MEDIUM_MAX ((size_t)4 << 20)
#define MIX_LARGE_MAX ((size_t)64 << 20)

static inline uint64_t mix_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double mix_uniform01(uint64_t *state)
{
    return (double)(mix_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* Log-uniform in [lo, hi]: every factor of two in the band is as likely. */
static inline size_t mix_log_uniform(uint64_t *state, size_t lo, size_t hi)
{
    double l = log((double)lo), h = log((double)hi);
    size_t n = (size_t)exp(l + mix_uniform01(state) * (h - l));
    return n < lo ? lo : n > hi ? hi : n;
}

static inline size_t mix_size(uint64_t *state)
{
    double band = mix_uniform01(state);
    if (band < 0.70)
        return mix_log_uniform(state, MIX_SMALL_MIN, MIX_SMALL_MAX);
    if (band < 0.95)
        return mix_log_uniform(state, MIX_SMALL_MAX, MIX_MEDIUM_MAX);
    return mix_log_uniform(state, MIX_MEDIUM_MAX, MIX_LARGE_MAX);
}

#endif
