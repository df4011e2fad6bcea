/*
 * plan: period detection and offline placement for a pool's large blocks
 * (see plan.h).
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

/* Keys hashed into a signature: a period is proposed when the last
 * SIG_WINDOW allocations were seen in the same order before. */
#define SIG_WINDOW 8u
#define SIG_BASE 0x100000001b3ull
/* A candidate period must repeat this many allocations, and at least a
 * whole period, before it is planned: a loop inside a step repeats a few
 * times and then breaks, and a plan that breaks costs page moves. The
 * period planned is the one before the repeat, whose lives must all be
 * known: while learning every life is noted, so that is one period after
 * the proposal; a period proposed after learning needs two (follow_candidates). */
#define MIN_RUN 64u
/* The planner learns (the pool keeps memory tight) for up to this many
 * allocations after it starts or abandons a plan; ... */
#define LEARN_ALLOCS (4u * UM_PLAN_MAX_PERIOD)
/* ... but stops after LEARN_QUICK of them, and at every LEARN_QUICK more,
 * when fewer than 1 in 4 of the last LEARN_QUICK saw their last SIG_WINDOW
 * sizes before: a program with no repeats (random churn) has no period to
 * find, and keeping it tight costs a page move per churned block. */
#define LEARN_QUICK 2048u
/* A plan that stops before it served LEARN_ALLOCS allocations halves the
 * next learning window, down to none after LEARN_SHRINK_MAX of them: a
 * program whose plans keep breaking (a loop with a period that the next
 * phase leaves) would otherwise spend most of its time learning, and move
 * a page for almost every block. */
#define LEARN_SHRINK_MAX 15u

static um__plan_entry *entry(const um__plan *pl, uint64_t ordinal)
{
    return &pl->ring[ordinal % UM_PLAN_RING];
}

static bool same_key(const um__plan_entry *a, const um__plan_entry *b)
{
    return a->bytes == b->bytes && a->stream == b->stream;
}

bool um__plan_init(um__plan *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->ring = calloc(UM_PLAN_RING, sizeof *pl->ring);
    pl->sigs = calloc(UM_PLAN_SIG_SLOTS, sizeof *pl->sigs);
    pl->seen = calloc(UM_PLAN_SIG_SLOTS, sizeof *pl->seen);
    if (!pl->ring || !pl->sigs || !pl->seen) {
        um__plan_fini(pl);
        return false;
    }
    pl->learn_until = LEARN_ALLOCS;
    pl->sample_at = UINT64_MAX;
    pl->lives_from = 0; /* learning: every life is noted */
    pl->span_slack = 1;
    pl->need_work = true;
    pl->base_pow = 1;
    for (unsigned i = 0; i < SIG_WINDOW; i++)
        pl->base_pow *= SIG_BASE;
    return true;
}

void um__plan_fini(um__plan *pl)
{
    free(pl->ring);
    free(pl->sigs);
    free(pl->seen);
    free(pl->slots);
    free(pl->live);
    memset(pl, 0, sizeof *pl);
}

/* No plan is made for a while: a period later after the first refusal
 * or false start, twice as long after each further one (a plan costs
 * O(period^2) to make, and a false start costs page moves). */
static void back_off(um__plan *pl, uint64_t period)
{
    pl->quiet_until = pl->next + (period << (pl->refusals < 16 ? pl->refusals : 16));
    pl->refusals++;
}

static void forget_plan(um__plan *pl)
{
    free(pl->slots);
    free(pl->live);
    pl->slots = NULL;
    pl->live = NULL;
    pl->nlive = 0;
    pl->period = pl->arena_bytes = pl->cycle_peak = 0;
    pl->ncand = 0;
    pl->learn_until = pl->next + (LEARN_ALLOCS >> pl->short_plans);
    /* Learning again notes every life; with no learning left, none. */
    pl->lives_from = pl->learn_until > pl->next ? pl->next : UINT64_MAX;
    pl->learn_from = pl->next;
    pl->repeats = 0;
}

/* ------------------------------------------------------------ placement */

typedef struct item {
    uint64_t start, end; /* on the period's circle: start < period, end <= start + period */
    uint64_t bytes, offset;
    uint32_t slot;
} item;

static bool meet(const item *a, const item *b, uint64_t period)
{
    return (a->start < b->end && b->start < a->end) ||
           (a->start + period < b->end && b->start < a->end + period) ||
           (a->start < b->end + period && b->start + period < a->end);
}

/* Orders tried for the greedy placement; the smallest span wins. Largest
 * first is the classic rule; allocation order keeps nested (stack-like)
 * lifetimes as tight as a stack; longest-lived and largest-area first
 * help where lifetimes cross. */
static int by_bytes_desc(const void *x, const void *y)
{
    const item *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    return a->start < b->start ? -1 : a->start > b->start;
}

static int by_start(const void *x, const void *y)
{
    const item *a = x, *b = y;
    return a->start < b->start ? -1 : a->start > b->start;
}

static int by_life_desc(const void *x, const void *y)
{
    const item *a = x, *b = y;
    uint64_t la = a->end - a->start, lb = b->end - b->start;
    if (la != lb)
        return la < lb ? 1 : -1;
    return by_bytes_desc(x, y);
}

static int by_area_desc(const void *x, const void *y)
{
    const item *a = x, *b = y;
    double aa = (double)a->bytes * (double)(a->end - a->start);
    double ab = (double)b->bytes * (double)(b->end - b->start);
    if (aa != ab)
        return aa < ab ? 1 : -1;
    return by_bytes_desc(x, y);
}

/* Greedy placement in the order of `it`: each block goes to the lowest
 * offset (or, best_fit, the tightest gap) where it meets no placed block
 * that is live at the same time. Returns the span. The placed blocks are
 * kept in offset order (`placed`, indices into it), so that each block
 * walks them once: sorting the ones it meets for every block made a plan
 * of 4,096 allocations take 0.7 s inside one um_malloc. */
static uint64_t place_in_order(item *it, size_t n, uint64_t period, bool best_fit,
                               uint32_t *placed)
{
    uint64_t span = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t end = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
        for (size_t j = 0; j <= i; j++) {
            const item *b = j < i ? &it[placed[j]] : NULL;
            if (b && !meet(&it[i], b, period))
                continue;
            uint64_t lo = b ? b->offset : UINT64_MAX;
            if (lo > end && lo - end >= it[i].bytes) {
                if (!best_fit) {
                    best = end;
                    break;
                }
                /* The open end counts as the loosest gap. */
                if (best == UINT64_MAX || lo - end < best_gap) {
                    best_gap = lo - end;
                    best = end;
                }
            }
            if (b && b->offset + b->bytes > end)
                end = b->offset + b->bytes;
        }
        it[i].offset = best;
        if (best + it[i].bytes > span)
            span = best + it[i].bytes;
        /* Into the offset order, after the blocks at the same offset. */
        size_t lo = 0, hi = i;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (it[placed[mid]].offset <= best)
                lo = mid + 1;
            else
                hi = mid;
        }
        memmove(&placed[lo + 1], &placed[lo], (i - lo) * sizeof *placed);
        placed[lo] = (uint32_t)i;
    }
    return span;
}

/* The best of the greedy orders and gap rules; `it` keeps that placement.
 * Returns the span, or 0 when out of memory. No placement spans less than
 * the peak of live bytes, so one that reaches it ends the search. */
static uint64_t place(item *it, size_t n, uint64_t period, uint64_t peak)
{
    int (*const orders[])(const void *, const void *) = {by_bytes_desc, by_start, by_life_desc,
                                                         by_area_desc};
    uint32_t *placed = malloc(n * sizeof *placed);
    item *best = malloc(n * sizeof *best);
    uint64_t best_span = 0;
    for (size_t k = 0; placed && best && k < 2 * sizeof orders / sizeof orders[0]; k++) {
        qsort(it, n, sizeof *it, orders[k / 2]);
        uint64_t span = place_in_order(it, n, period, k % 2, placed);
        if (!best_span || span < best_span) {
            best_span = span;
            memcpy(best, it, n * sizeof *it);
        }
        if (best_span <= peak)
            break;
    }
    if (best_span)
        memcpy(it, best, n * sizeof *it);
    free(placed);
    free(best);
    return best_span;
}

/* Adds bytes to d over the circular interval [start, end) of the period:
 * d is a difference array of period + 1 entries. */
static void add_circular(int64_t *d, uint64_t period, uint64_t start, uint64_t end, int64_t bytes)
{
    if (end <= period) {
        d[start] += bytes;
        d[end] -= bytes;
    } else {
        d[start] += bytes;
        d[period] -= bytes;
        d[0] += bytes;
        d[end - period] -= bytes;
    }
}

/* Plans the period that ended `period` allocations before `last` (the
 * newest ordinal): all its blocks that lived at most a period are known.
 * Returns false (nothing changed) when the plan is not worth making. */
static bool build(um__plan *pl, uint64_t period, uint64_t last)
{
    uint64_t base = last + 1 - 2 * period;
    uint32_t stream = entry(pl, base)->stream;
    um__plan_slot *slots = calloc(period, sizeof *slots);
    item *it = malloc(period * sizeof *it);
    int64_t *d = calloc(period + 1, sizeof *d);
    int64_t *across = calloc(period + 1, sizeof *across);
    size_t n = 0;
    bool ok = false;
    if (!slots || !it || !d || !across)
        goto out;
    for (uint64_t k = 0; k < period; k++) {
        const um__plan_entry *e = entry(pl, base + k);
        slots[k] = (um__plan_slot){e->bytes, UM_PLAN_NO_OFFSET, e->stream};
        if (e->stream != stream || e->life > period)
            continue;
        uint64_t life = e->life;
        it[n++] = (item){k, k + life, e->bytes, 0, (uint32_t)k};
        add_circular(d, period, k, k + life, (int64_t)e->bytes);
        /* Live across the boundary before allocation t: k < t < k + life. */
        if (life > 1)
            add_circular(across, period, k + 1, k + life, (int64_t)e->bytes);
    }
    if (n < 2)
        goto out;
    uint64_t peak = 0;
    int64_t live = 0, cross = 0, best_cross = INT64_MAX;
    uint64_t origin = 0;
    for (uint64_t t = 0; t < period; t++) {
        live += d[t];
        cross += across[t];
        if ((uint64_t)live > peak)
            peak = (uint64_t)live;
        if (cross < best_cross) {
            best_cross = cross;
            origin = t;
        }
    }
    uint64_t span = place(it, n, period, peak);
    if (!span || span > peak + peak / 16 * pl->span_slack)
        goto out;
    for (size_t i = 0; i < n; i++)
        slots[it[i].slot].offset = it[i].offset;
    um__plan_span *livev = malloc(n * sizeof *livev);
    if (!livev)
        goto out;
    free(pl->slots);
    free(pl->live);
    pl->slots = slots;
    slots = NULL;
    pl->live = livev;
    pl->nlive = 0;
    pl->period = period;
    pl->base = base;
    pl->origin = origin;
    pl->arena_bytes = span;
    pl->cycle_peak = peak;
    pl->stream = stream;
    pl->state = UM_PLAN_READY;
    pl->plans++;
    ok = true;
out:
    free(slots);
    free(it);
    free(d);
    free(across);
    return ok;
}

/* ------------------------------------------------------------ recording */

/* A finalizer that spreads every input bit over the whole word (MurmurHash3's
 * fmix64), so any bits of a signature may index the table. */
static uint64_t fmix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(um__plan_entry) == 32, "um__plan_entry grew past half a cache line");
#endif

/* A key needs no finalizer of its own: keys differ exactly when their
 * (bytes, stream) do, and the signature built from their rolling sum goes
 * through fmix. (A run of keys colliding only proposes a period that
 * detect then checks entry by entry.) Two finalizers an allocation were
 * about a tenth of the planner's instructions. */
static uint64_t key_of(uint64_t bytes, uint32_t stream)
{
    return bytes ^ (uint64_t)stream << 56;
}

/* Once the learning window is over, the signature table is read and
 * written only at sampled positions: the position of the smallest of the
 * last UM_PLAN_SAMPLE_WINDOW signatures (the rightmost, if equal), taken
 * when it changes ("winnowing"). The choice depends on the content alone,
 * so a repeated sequence samples the same positions in every period, and
 * no stretch of the window's length goes unsampled, so every period is
 * still found, however short (sampling signatures by their top bits
 * missed periods that had no such signature: test_plan's short plans).
 * About 2 in 9 positions are sampled, and most of the table's cache
 * misses (two for each allocation of a program with no period, a tenth of
 * its large allocations' cost) go. Returns whether a position is due, in
 * *sig and *at. */
static bool sample(um__plan *pl, uint64_t o, uint64_t *sig, uint64_t *at)
{
    if (pl->sample_at != UINT64_MAX && o - pl->sample_at < UM_PLAN_SAMPLE_WINDOW) {
        /* The smallest is still in the window: only a new one as small
         * takes its place. */
        if (*sig > pl->sample_sig)
            return false;
        pl->sample_sig = *sig;
        pl->sample_at = o;
    } else {
        /* It left the window (or none was taken since learning): look
         * again, newest first, so the rightmost of equals wins. */
        pl->sample_sig = *sig;
        pl->sample_at = o;
        for (uint64_t k = 1; k < UM_PLAN_SAMPLE_WINDOW && k <= o; k++) {
            uint64_t v = pl->recent[(o - k) % UM_PLAN_SAMPLE_WINDOW];
            if (v < pl->sample_sig) {
                pl->sample_sig = v;
                pl->sample_at = o - k;
            }
        }
    }
    *sig = pl->sample_sig;
    *at = pl->sample_at;
    return true;
}

/* Follows the candidate periods with allocation o (entry e) and plans the
 * first one that repeated a whole period and came back to the same live
 * bytes. Out of line, as are the learning window's repeats below: a
 * program with no period has no candidates and is past learning, and
 * inlined, these made every allocation save and restore six registers and
 * a planning frame. */
static __attribute__((noinline)) void follow_candidates(um__plan *pl, uint64_t o,
                                                        const um__plan_entry *e)
{
    for (int i = 0; i < pl->ncand;) {
        uint64_t period = pl->cand[i].period;
        if (!same_key(e, entry(pl, o - period))) {
            pl->cand[i] = pl->cand[--pl->ncand];
            continue;
        }
        uint64_t run = ++pl->cand[i].run;
        /* build plans the period before the last, from its lives: they
         * are noted from lives_from on (every life while learning; after
         * it, from the proposal on, which makes this two whole periods). */
        if (run >= period && run >= MIN_RUN && o + 1 >= 2 * period &&
            o + 1 - 2 * period >= pl->lives_from && e->live == entry(pl, o - period)->live &&
            o >= pl->quiet_until) {
            /* The pool served the last period without a backend call:
             * nothing to gain. */
            if (pl->need_work && e->work == entry(pl, o - period)->work) {
                pl->cand[i] = pl->cand[--pl->ncand];
                continue;
            }
            if (build(pl, period, o)) {
                pl->ncand = 0;
                pl->lives_from = UINT64_MAX;
                return;
            }
            /* Not worth planning. */
            pl->rejected++;
            back_off(pl, period);
            pl->cand[i] = pl->cand[--pl->ncand];
            continue;
        }
        i++;
    }
    if (!pl->ncand && o >= pl->learn_until)
        pl->lives_from = UINT64_MAX;
}

/* Repeats of the sizes alone (whatever the live bytes), while learning,
 * tell a program with structure from random churn. */
static __attribute__((noinline)) void count_repeats(um__plan *pl, uint64_t o)
{
    uint64_t ks = fmix(pl->roll ^ 0x5851f42d4c957f2dull) | 1;
    pl->repeats += pl->seen[ks % UM_PLAN_SIG_SLOTS] == ks;
    pl->seen[ks % UM_PLAN_SIG_SLOTS] = ks;
    if (o + 1 - pl->learn_from >= LEARN_QUICK && (o + 1 - pl->learn_from) % LEARN_QUICK == 0) {
        if (pl->repeats < LEARN_QUICK / 4)
            pl->learn_until = o + 1;
        pl->repeats = 0;
    }
}

/* Follows the candidates with allocation o and proposes a new one where
 * the last SIG_WINDOW allocations and the live bytes were seen before. */
static inline void detect(um__plan *pl, uint64_t o)
{
    const um__plan_entry *e = entry(pl, o);
    if (pl->ncand) {
        follow_candidates(pl, o, e);
        /* A plan was made: no candidate until it stops. This allocation's
         * signature would propose the planned period again, and with it
         * note lives (cold ring lines) on every free while the plan runs. */
        if (pl->state != UM_PLAN_RECORDING)
            return;
    }
    if (o + 1 < SIG_WINDOW)
        return;
    bool learning = o < pl->learn_until;
    if (learning) {
        count_repeats(pl, o);
        /* Learning ends here: lives are noted only for candidates now. */
        if (o + 1 >= pl->learn_until && !pl->ncand)
            pl->lives_from = UINT64_MAX;
    }
    /* The live bytes go into the signature: a layer repeated inside a step
     * has the same sizes but more live bytes each time (the step keeps its
     * activations), so only whole steps propose themselves. An odd
     * multiplier spreads them well enough, as the finalizer mixes the
     * rest. */
    uint64_t sig = fmix(pl->roll ^ (e->live + 1) * 0x9e3779b97f4a7c15ull) | 1; /* 0: empty slot */
    pl->recent[o % UM_PLAN_SAMPLE_WINDOW] = sig;
    uint64_t at = o;
    if (!learning && !sample(pl, o, &sig, &at))
        return;
    um__plan_sig *s = &pl->sigs[sig % UM_PLAN_SIG_SLOTS];
    if (s->sig == sig && s->ordinal < at) {
        uint64_t period = at - s->ordinal;
        bool known = false;
        for (int i = 0; i < pl->ncand; i++)
            known |= pl->cand[i].period == period;
        if (!known && period <= UM_PLAN_MAX_PERIOD && pl->ncand < UM_PLAN_CANDIDATES) {
            if (pl->lives_from > o + 1)
                pl->lives_from = o + 1;
            pl->cand[pl->ncand++] = (um__plan_cand){period, 0};
        }
    }
    s->sig = sig;
    s->ordinal = at;
}

uint64_t um__plan_note_alloc(um__plan *pl, uint64_t bytes, uint32_t stream, uint64_t work)
{
    uint64_t o = pl->next++;
    uint64_t key = key_of(bytes, stream);
    *entry(pl, o) = (um__plan_entry){bytes, work, pl->live_bytes, UM_PLAN_LONG_LIFE, stream};
    pl->live_bytes += bytes;
    /* A rolling hash of the last SIG_WINDOW keys: one multiply-add in,
     * one out. */
    pl->roll = pl->roll * SIG_BASE + key;
    if (o >= SIG_WINDOW) {
        const um__plan_entry *out = entry(pl, o - SIG_WINDOW);
        pl->roll -= pl->base_pow * key_of(out->bytes, out->stream);
    }
    if (pl->state == UM_PLAN_RECORDING)
        detect(pl, o);
    return o;
}

void um__plan_note_free(um__plan *pl, uint64_t ordinal, uint64_t bytes)
{
    pl->live_bytes -= bytes;
    /* Only build reads lives, and only of allocations made from
     * lives_from on: while learning, or after a candidate was proposed. A
     * free of an allocation made outside both leaves its entry alone, as
     * does a longer life, which is never planned. Either way a cold line
     * of the ring is spared, on most frees of a program with no period
     * once learning is over. */
    if (ordinal >= pl->lives_from && ordinal < pl->next && pl->next - ordinal <= UM_PLAN_MAX_PERIOD)
        entry(pl, ordinal)->life = (uint32_t)(pl->next - ordinal);
}

/* ---------------------------------------------------------------- serving */

void um__plan_activate(um__plan *pl)
{
    pl->state = UM_PLAN_ACTIVE;
    pl->served_at_start = pl->served;
}

void um__plan_reject(um__plan *pl)
{
    uint64_t period = pl->period;
    pl->rejected++;
    pl->state = UM_PLAN_RECORDING;
    forget_plan(pl);
    back_off(pl, period);
}

void um__plan_decline(um__plan *pl)
{
    /* Before forget_plan, which sizes the next learning window from it:
     * none. */
    pl->short_plans = LEARN_SHRINK_MAX;
    um__plan_reject(pl);
}

/* The first live span that ends after lo (spans do not overlap). */
static size_t first_after(const um__plan *pl, uint64_t lo)
{
    size_t a = 0, b = pl->nlive;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (pl->live[m].hi <= lo)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

uint64_t um__plan_take(um__plan *pl, uint64_t ordinal, uint64_t bytes, uint32_t stream)
{
    if (pl->state != UM_PLAN_ACTIVE)
        return UM_PLAN_NO_OFFSET;
    const um__plan_slot *s = &pl->slots[um__plan_slot_of(pl, ordinal)];
    if (s->bytes != bytes || s->stream != stream)
        return UM_PLAN_MISMATCH;
    if (s->offset == UM_PLAN_NO_OFFSET)
        return UM_PLAN_NO_OFFSET;
    size_t i = first_after(pl, s->offset);
    if (i < pl->nlive && pl->live[i].lo < s->offset + bytes) {
        pl->misses++; /* a block of the last period still lives there */
        return UM_PLAN_NO_OFFSET;
    }
    memmove(&pl->live[i + 1], &pl->live[i], (pl->nlive - i) * sizeof *pl->live);
    pl->live[i] = (um__plan_span){s->offset, s->offset + bytes};
    pl->nlive++;
    pl->served++;
    return s->offset;
}

void um__plan_release(um__plan *pl, uint64_t offset)
{
    size_t i = first_after(pl, offset);
    if (i < pl->nlive && pl->live[i].lo == offset) {
        memmove(&pl->live[i], &pl->live[i + 1], (pl->nlive - i - 1) * sizeof *pl->live);
        pl->nlive--;
    }
}

void um__plan_abandon(um__plan *pl)
{
    if (pl->state == UM_PLAN_RECORDING)
        return;
    /* A plan that broke within two periods was a false start: the next
     * one waits longer. One that ran longer was worth it. */
    uint64_t ran = pl->state == UM_PLAN_ACTIVE ? pl->served - pl->served_at_start : 0;
    if (ran >= 2 * pl->period)
        pl->refusals = 0;
    else
        back_off(pl, pl->period);
    if (ran >= LEARN_ALLOCS)
        pl->short_plans = 0;
    else if (pl->short_plans < LEARN_SHRINK_MAX)
        pl->short_plans++;
    pl->abandoned += pl->state == UM_PLAN_ACTIVE;
    pl->state = UM_PLAN_RECORDING;
    forget_plan(pl);
}
