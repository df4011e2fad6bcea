/*
 * Where `unimem demo` checks a result too large to check whole: a few
 * entries of an n x n matrix held in nt x nt tiles of tile x tile, picked
 * by a deterministic generator. Header-only, so that a test can walk the
 * same entries the command checks.
 */
#ifndef UM_DEMO_SAMPLE_H
#define UM_DEMO_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

/* Entries a sampled check looks at (at least; demo_sampler_count says how
 * many), and the seeds of gemm's and cholesky's. */
#define DEMO_SAMPLES 4096
#define DEMO_SEED_GEMM 0x76657269667921ull
#define DEMO_SEED_CHOLESKY 0x63686f6c6573ull

static inline uint64_t demo_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline uint64_t demo_rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return demo_mix64(*s);
}

/* The entries of one check, tile by tile: every tile of the matrix (of its
 * lower triangle, i >= j, when lower) gets the same number of entries at
 * random places in it, at least one, and all of them together at least
 * the number asked for. Entries drawn over the whole matrix instead left
 * most tiles unchecked once the tiles outnumbered the samples (12,740 of
 * 16,384 at 128 tiles a side), so a tile left wrong as a whole, never
 * written or missing a task's update, could pass the check. */
typedef struct demo_sampler {
    int nt, tile;
    bool lower;
    uint64_t per_tile; /* entries in each tile */
    uint64_t rng;
    int ti, tj;    /* the tile the next entry is in */
    uint64_t done; /* entries given in that tile */
} demo_sampler;

static inline void demo_sampler_init(demo_sampler *s, int nt, int tile, bool lower,
                                     uint64_t samples, uint64_t seed)
{
    uint64_t tiles = lower ? (uint64_t)nt * (uint64_t)(nt + 1) / 2 : (uint64_t)nt * (uint64_t)nt;
    s->nt = nt;
    s->tile = tile;
    s->lower = lower;
    s->per_tile = tiles ? (samples + tiles - 1) / tiles : 0;
    if (s->per_tile == 0 && tiles)
        s->per_tile = 1;
    s->rng = seed;
    s->ti = s->tj = 0;
    s->done = 0;
}

/* How many entries the check looks at. */
static inline uint64_t demo_sampler_count(const demo_sampler *s)
{
    uint64_t nt = (uint64_t)s->nt;
    return s->per_tile * (s->lower ? nt * (nt + 1) / 2 : nt * nt);
}

/* The next entry (i, j); false when every one has been given. */
static inline bool demo_sampler_next(demo_sampler *s, int *i, int *j)
{
    if (s->done == s->per_tile) {
        s->done = 0;
        if (++s->tj > (s->lower ? s->ti : s->nt - 1)) {
            s->tj = 0;
            s->ti++;
        }
    }
    if (s->ti >= s->nt || s->per_tile == 0)
        return false;
    s->done++;
    int a = (int)(demo_rng_next(&s->rng) % (uint64_t)s->tile);
    int b = (int)(demo_rng_next(&s->rng) % (uint64_t)s->tile);
    if (s->lower && s->ti == s->tj && b > a) { /* the diagonal tile's lower part */
        int tmp = a;
        a = b;
        b = tmp;
    }
    *i = s->ti * s->tile + a;
    *j = s->tj * s->tile + b;
    return true;
}

#endif
