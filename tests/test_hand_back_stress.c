/* Hand-backs under load: six threads allocate (host and a sim device,
 * slab slots, medium and large blocks), mark most blocks for a random
 * stream with um_record_stream, free them (their frees deferred while the
 * streams work), queue stream work, trim and create and destroy streams,
 * all at once. Every allocator free is followed, one time in three, by a
 * sleep of 20-220 us, which widens each hand-back's window between the
 * allocator's free and its end. The reference model is each thread's own
 * table of the blocks it holds: a block it was just given is its own, so
 * a refused mark or free of it (UM_ERR_INVALID_POINTER or
 * UM_ERR_DOUBLE_FREE) means an allocation returned an address whose old
 * block was still being handed back. With the allocators' reuse_wait
 * taken away, each of these runs counts dozens to hundreds of refusals.
 * At the end nothing is live, deferred or marked. Seeded; the seed is
 * printed. */
#include "core/core.h"
#include "harness.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MB ((size_t)1 << 20)
enum { THREADS = 6, SLOTS = 24, STEPS = 4000 };

static const um__allocator_ops *real_ops[2];
static um__allocator_ops slowed_ops[2];
static _Thread_local uint64_t sleep_rng = 0x9e3779b97f4a7c15ull;
static _Atomic long refused_marks, refused_frees, other_errors;

static void sometimes_sleep(void)
{
    if (harness_rand(&sleep_rng) % 3 == 0)
        usleep(20 + harness_rand(&sleep_rng) % 200);
}

static um_status slowed_free(int dev, um__allocator *a, void *p, const um__stream_ref *s)
{
    um_status st = real_ops[dev]->free(a, p, s);
    sometimes_sleep();
    return st;
}

static um_status slowed_free0(um__allocator *a, void *p, const um__stream_ref *s)
{
    return slowed_free(0, a, p, s);
}

static um_status slowed_free1(um__allocator *a, void *p, const um__stream_ref *s)
{
    return slowed_free(1, a, p, s);
}

typedef struct {
    um_context *ctx;
    um_stream streams[THREADS];
    uint64_t seed;
} shared;

/* Counts st against the model: refused means the call was on a block the
 * thread owns; UM_ERR_NOMEM is allowed (the limited run). */
static void count(um_status st, _Atomic long *refused, const char *what, void *p)
{
    if (st == UM_ERR_INVALID_POINTER || st == UM_ERR_DOUBLE_FREE) {
        if (atomic_fetch_add(refused, 1) < 3)
            printf("test_hand_back_stress: %s of the thread's own block %p refused: %s\n", what,
                   p, um_last_error());
    } else if (st != UM_OK && st != UM_ERR_NOMEM) {
        atomic_fetch_add(&other_errors, 1);
    }
}

static void *worker(void *arg)
{
    harness_thread *t = arg;
    shared *sh = t->shared;
    uint64_t rng = sh->seed * 31 + (uint64_t)t->id;
    sleep_rng ^= rng;
    um_stream own = sh->streams[t->id];
    void *held[SLOTS] = {0};
    for (int i = 0; i < STEPS; i++) {
        uint64_t r = harness_rand(&rng);
        int j = (int)(r % SLOTS);
        if (held[j]) {
            count(um_free(sh->ctx, held[j], (r >> 50) % 2 ? own : NULL), &refused_frees, "free",
                  held[j]);
            held[j] = NULL;
        } else {
            unsigned k = (r >> 8) % 8;
            size_t n = k < 4   ? 64 + (r >> 12) % 8000
                       : k < 6 ? 16384 + (r >> 12) % (256 << 10)
                               : MB + (r >> 12) % MB;
            int dev = (r >> 60) % 4 == 0 ? 0 : 1;
            um_status st = um_malloc(sh->ctx, dev, n, dev == 1 ? own : NULL, &held[j]);
            if (st != UM_OK) {
                count(st, &refused_marks, "allocation", NULL);
                held[j] = NULL;
                continue;
            }
            if ((r >> 40) % 4 != 0)
                count(um_record_stream(sh->ctx, held[j], sh->streams[(r >> 44) % THREADS]),
                      &refused_marks, "mark", held[j]);
        }
        if (i % 7 == 0)
            (void)um_sim_stream_work(sh->ctx, 1, own, 1, 2);
        if (i % 500 == 250)
            (void)um_trim(sh->ctx, 1 - (i / 500) % 2);
        if (i % 300 == 150) {
            um_stream fresh = NULL;
            if (um_stream_create(sh->ctx, 1, &fresh) == UM_OK) {
                void *q = NULL;
                if (um_malloc(sh->ctx, 1, 4096, fresh, &q) == UM_OK)
                    count(um_free(sh->ctx, q, fresh), &refused_frees, "free", q);
                CHECK_OK(um_stream_destroy(sh->ctx, fresh));
            }
        }
    }
    for (int j = 0; j < SLOTS; j++)
        if (held[j])
            count(um_free(sh->ctx, held[j], NULL), &refused_frees, "free", held[j]);
    return NULL;
}

static void run(const char *conf, uint64_t seed)
{
    shared sh = {.seed = seed};
    CHECK_OK(um_init(conf, &sh.ctx));
    if (!sh.ctx)
        return;
    for (int d = 0; d < 2; d++) {
        um__allocator *a = sh.ctx->devices[d].alloc;
        real_ops[d] = a->ops;
        slowed_ops[d] = *a->ops;
        slowed_ops[d].free = d ? slowed_free1 : slowed_free0;
        a->ops = &slowed_ops[d];
    }
    for (int i = 0; i < THREADS; i++)
        CHECK_OK(um_stream_create(sh.ctx, 1, &sh.streams[i]));
    refused_marks = refused_frees = other_errors = 0;
    harness_run_threads(THREADS, worker, &sh);
    for (int i = 0; i < THREADS; i++)
        CHECK_OK(um_sim_stream_work(sh.ctx, 1, sh.streams[i], 0, 1u << 30));
    CHECK_OK(um_trim(sh.ctx, 1));
    CHECK_OK(um_trim(sh.ctx, 0));
    printf("test_hand_back_stress: %s: %ld marks and %ld frees refused, %ld other errors\n",
           conf, (long)refused_marks, (long)refused_frees, (long)other_errors);
    CHECK_EQ(refused_marks, 0);
    CHECK_EQ(refused_frees, 0);
    CHECK_EQ(other_errors, 0);
    for (int i = 0; i < THREADS; i++)
        CHECK_OK(um_stream_destroy(sh.ctx, sh.streams[i]));
    for (int d = 0; d < 2; d++) {
        CHECK_EQ(sh.ctx->devices[d].deferred, 0);
        CHECK_EQ(sh.ctx->devices[d].marked, 0);
        um_stats st;
        CHECK_OK(um_stats_get(sh.ctx, d, &st));
        CHECK_EQ(st.active_blocks, 0ull);
        sh.ctx->devices[d].alloc->ops = real_ops[d];
    }
    um_shutdown(sh.ctx);
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    uint64_t seed = harness_seed("test_hand_back_stress");
    static const char *const confs[] = {
        "devices=sim:1G,log_level=error",
        "devices=sim:1G,cache_limit=0,log_level=error",
        "devices=sim:1G,thread_cache=0,log_level=error",
        "devices=sim:1G,allocator=bufcache,log_level=error",
        "devices=sim:1G,allocator=direct,log_level=error",
        "devices=sim:256M,memory_limit=64M,log_level=error",
    };
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++)
        run(confs[i], seed + i);
    return harness_finish("test_hand_back_stress");
}
