/*
 * plan: the step planner of a pool (see pool.c and docs/DESIGN.md).
 *
 * Training loops allocate the same sequence of large blocks every step.
 * An online best fit cannot know what comes later in the step, so it
 * either moves physical pages between phases of the step (each move a
 * driver call, and impossible while the GPU still uses the page) or keeps
 * more memory than the live peak. The planner watches the sequence of
 * large allocations (size and stream, in the order the pool's locked path
 * sees them), finds its period, and from one recorded period computes an
 * offline placement (greedy by size on the circle of the period's time),
 * whose span is close to the period's peak of live bytes. The pool then
 * maps one arena of that span once and serves each planned allocation at
 * its planned offset: no page moves and no fence waits in steady state.
 *
 * Owns: the record of recent allocations, period detection, the plan and
 * the occupancy of the arena. Pure bookkeeping: it makes no backend call
 * and takes no lock; the pool calls it under its lock.
 */
#ifndef UM_PLAN_H
#define UM_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest period (in large allocations) the planner looks for. */
#define UM_PLAN_MAX_PERIOD 4096u
/* Allocations recorded: four of the longest periods. */
#define UM_PLAN_RING (4u * UM_PLAN_MAX_PERIOD)
#define UM_PLAN_SIG_SLOTS 4096u
#define UM_PLAN_CANDIDATES 8
#define UM_PLAN_SAMPLE_WINDOW 8u
#define UM_PLAN_NO_OFFSET UINT64_MAX
#define UM_PLAN_MISMATCH (UINT64_MAX - 1)

typedef enum um__plan_state {
    UM_PLAN_RECORDING = 0, /* looking for a period */
    UM_PLAN_READY,         /* a plan waits for its first allocation */
    UM_PLAN_ACTIVE         /* allocations are served from the arena */
} um__plan_state;

/* 32 bytes: the ring (UM_PLAN_RING entries, 512 KiB) is written on every
 * large allocation and on frees while a period is followed, and competes
 * for the L2 cache with the pool's own records (48-byte entries took 768
 * KiB). */
typedef struct um__plan_entry {
    uint64_t bytes;     /* block bytes (rounded) */
    uint64_t work;      /* the pool's backend calls before the allocation */
    uint64_t live;      /* large live bytes just before the allocation */
    /* Allocations made between this one and its free, at most
     * UM_PLAN_MAX_PERIOD; UM_PLAN_LONG_LIFE: live, freed later (a plan
     * never places a block that outlives its period), or allocated outside
     * `lives_from`'s stretch (no plan reads it). */
    uint32_t life;
    uint32_t stream;
} um__plan_entry;

#define UM_PLAN_LONG_LIFE UINT32_MAX

typedef struct um__plan_slot {
    uint64_t bytes;
    uint64_t offset;    /* in the arena; UM_PLAN_NO_OFFSET: placed by the pool */
    uint32_t stream;
} um__plan_slot;

typedef struct um__plan_span {
    uint64_t lo, hi;
} um__plan_span;

typedef struct um__plan_sig {
    uint64_t sig, ordinal;
} um__plan_sig;

typedef struct um__plan_cand {
    uint64_t period, run;
} um__plan_cand;

typedef struct um__plan {
    um__plan_state state;
    uint64_t next;                /* allocations seen so far (the next one's ordinal) */
    uint64_t live_bytes;          /* bytes of the noted blocks not yet freed */
    um__plan_entry *ring;         /* UM_PLAN_RING entries, by ordinal % UM_PLAN_RING */
    /* period detection */
    um__plan_sig *sigs;           /* UM_PLAN_SIG_SLOTS: where each signature was last seen */
    uint64_t recent[UM_PLAN_SAMPLE_WINDOW]; /* the last signatures, by ordinal % window */
    uint64_t sample_sig, sample_at; /* the window's smallest; UINT64_MAX: none (plan.c, sample) */
    uint64_t roll, base_pow;      /* rolling hash of the last keys; SIG_BASE^SIG_WINDOW */
    um__plan_cand cand[UM_PLAN_CANDIDATES];
    int ncand;
    uint64_t lives_from;          /* frees note lives from this ordinal on (plan.c, note_free):
                                   * where learning started, else where a candidate was proposed */
    uint64_t quiet_until;         /* no plan is made before this ordinal (after a refusal) */
    unsigned refusals;            /* plans refused or broken early since one ran well */
    unsigned short_plans;         /* plans stopped early since one ran a learning window */
    uint64_t served_at_start;     /* `served` when the running plan started */
    uint64_t learn_until;         /* the pool keeps memory tight until this ordinal */
    uint64_t learn_from;          /* where learning (re)started */
    uint64_t *seen;               /* UM_PLAN_SIG_SLOTS signatures of sizes alone */
    uint64_t repeats;             /* allocations since the last check whose sizes repeated */
    /* the plan */
    uint64_t period, base, origin;/* slot of ordinal o: (o - base) % period */
    um__plan_slot *slots;         /* period entries */
    uint64_t arena_bytes;
    uint64_t cycle_peak;          /* the period's peak of planned live bytes */
    uint32_t stream;
    /* A plan is made only if its arena exceeds the period's live peak by
     * at most span_slack/16 of it (1 by default: beyond that the pool alone
     * does about as well on memory). */
    unsigned span_slack;
    /* A period the pool served with no backend call has nothing to gain
     * from a plan and is not planned (tests turn this off). */
    bool need_work;
    /* occupancy of the arena: live planned blocks, sorted by offset */
    um__plan_span *live;
    size_t nlive;
    /* counters */
    uint64_t plans, served, misses, abandoned, rejected;
} um__plan;

bool um__plan_init(um__plan *pl);
void um__plan_fini(um__plan *pl);

/* Records the next large allocation (its ordinal is returned) and, while
 * recording, looks for a period; a found period is planned at once and
 * leaves the planner READY. work: the pool's count of backend calls so
 * far (a period that needed none has nothing to gain from a plan). */
uint64_t um__plan_note_alloc(um__plan *pl, uint64_t bytes, uint32_t stream, uint64_t work);
/* The block of ordinal `ordinal` (bytes) was freed. */
void um__plan_note_free(um__plan *pl, uint64_t ordinal, uint64_t bytes);

/* The plan's slot of allocation `ordinal` (a plan is made). */
static inline uint64_t um__plan_slot_of(const um__plan *pl, uint64_t ordinal)
{
    return (ordinal - pl->base) % pl->period;
}

/* READY or ACTIVE: whether allocation `ordinal` (bytes on stream) is the
 * one the plan holds for its slot. */
static inline bool um__plan_matches(const um__plan *pl, uint64_t ordinal, uint64_t bytes,
                                    uint32_t stream)
{
    const um__plan_slot *s = &pl->slots[um__plan_slot_of(pl, ordinal)];
    return s->bytes == bytes && s->stream == stream;
}

/* READY: whether `ordinal` is where the plan starts (the pool then makes
 * the arena and calls um__plan_activate, or um__plan_reject). */
static inline bool um__plan_starts_at(const um__plan *pl, uint64_t ordinal)
{
    return pl->state == UM_PLAN_READY && um__plan_slot_of(pl, ordinal) == pl->origin;
}
void um__plan_activate(um__plan *pl);
void um__plan_reject(um__plan *pl);
/* The pool will not start the plan because its arena would raise peak
 * reserved memory (the blocks live when it starts keep their places): a
 * reject that also ends learning, as the shortest plans do, since keeping
 * memory tight serves only a plan (a later one that serves a whole
 * learning window brings learning back); the next proposal waits longer. */
void um__plan_decline(um__plan *pl);

/* ACTIVE: the planned offset for allocation `ordinal` (bytes on stream);
 * UM_PLAN_NO_OFFSET when it is not planned or its range is still occupied
 * (a miss); UM_PLAN_MISMATCH when the program left the plan's sequence
 * (the pool then stops the plan). An offset returned is occupied until
 * um__plan_release. */
uint64_t um__plan_take(um__plan *pl, uint64_t ordinal, uint64_t bytes, uint32_t stream);
void um__plan_release(um__plan *pl, uint64_t offset);
/* Back to RECORDING, the plan forgotten (the pool has turned the arena's
 * blocks into ordinary ones first). */
void um__plan_abandon(um__plan *pl);

/* Whether the planner is looking for a period, or has a plan that has not
 * started yet (the pool then keeps memory tight: it waits for fences and
 * moves pages rather than grow, and the arena takes the pages the steps
 * it learned from used). */
static inline bool um__plan_learning(const um__plan *pl)
{
    return (pl->state == UM_PLAN_RECORDING && pl->next < pl->learn_until) ||
           pl->state == UM_PLAN_READY;
}

#endif
