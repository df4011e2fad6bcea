/*
 * reclaim: making room on a device by evicting buffer replicas (see
 * buffer.h and include/unimem.h). Owns the eviction policy, the watermarks,
 * the background reclaimer thread and the reclaim statistics; the eviction
 * of one replica is buffer.c's (um__buffer_evict).
 *
 * Host memory is reclaimed the same way once a file tier exists (option
 * spill_dir): the host's replicas that are the only copy go to the spill
 * file (buffer.c), so data larger than RAM keeps running.
 *
 * Two ways in. An allocation that fails at the memory limit calls the
 * context's reclaim hook, which evicts one replica and lets it retry, until
 * it fits or nothing is left to evict (then the allocation fails, saying
 * what holds the memory); then it tells the hook it is over, so that it
 * counts as one wait however many evictions it took. The background
 * thread wakes when the bytes of replicas on a device pass its high
 * watermark and evicts until they are below the low one, so that
 * allocations find room without waiting.
 *
 * A victim is chosen by scanning the buffers under the engine's lock and
 * only trying (never waiting for) their locks: a thread that holds one
 * buffer's lock and needs room can never wait for another that does the
 * same. Acquired and pinned replicas are never candidates, so the buffers
 * one operation holds cannot evict each other; an operation that cannot
 * fit even then gets UM_ERR_NOMEM naming the acquired bytes.
 */
#include "buffer.h"

#include "../base/vtime.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEY_LEN 5

typedef struct device_counters {
    _Atomic uint64_t evictions, written_back, written_back_bytes, refetched_bytes, runs, sync,
        wait_ns, failed, spilled, spilled_bytes;
    /* Watermarks in bytes (0, 0: from the options), set by
     * um_set_watermarks as a pair: `marks_seq` is odd while a pair is
     * being written, and a reader retries until it reads the same even
     * value around both, so it never sees one old mark and one new. */
    _Atomic size_t low, high;
    _Atomic unsigned marks_seq;
    _Atomic int64_t replica_bytes; /* memory held by buffer replicas */
    _Atomic int32_t destroying;    /* um__reclaim_destroying's count */
} device_counters;

struct um__reclaim {
    um__xfer *x;
    um_context *ctx;
    pthread_mutex_t one;     /* one eviction at a time */
    pthread_mutex_t lock;    /* the thread's wake-up */
    pthread_mutex_t marks_lock; /* um_set_watermarks' writers */
    um__cond wake;
    bool quit, nudged, thread_started;
    pthread_t tid;
    _Atomic bool announcing;  /* some buffer got UM_HINT_WILL_USE */
    device_counters dev[UM_MAX_DEVICES];
};

/* Set while this thread evicts: an allocation inside an eviction (a
 * write-back's target) must not start another. */
static _Thread_local bool in_reclaim;

/* Set on the background reclaimer's thread: its evictions are ahead of
 * need, so a write-back of its must not push another device above that
 * device's high mark (see um__reclaim_write_back_ok). */
static _Thread_local bool in_background;

/* How long an allocation at the limit waits for candidates that calls in
 * progress hold locked, before it fails. */
#define RECLAIM_BUSY_WAIT_NS 1000000000ull

/* Set while this thread makes an allocation it can do without (see
 * um__reclaim_optional): candidates held locked are not waited for. */
static _Thread_local bool optional_allocation;

/* The buffer whose replica this thread is allocating (see
 * um__reclaim_allocating): locked by this thread, so never a candidate,
 * and not a call in progress that this thread could wait for. */
static _Thread_local um_buffer *allocating_for;

/* -------------------------------------------------------------- policy */

/* The buffers whose eviction failed (a write-back with nowhere to go)
 * during one reclaim: an allocation's calls of the hook, or a background
 * pass over a device. The policy is deterministic, so without this it
 * would choose the same one again and never try the next. A record
 * recycled meanwhile for a new buffer is passed over too, until the
 * reclaim ends. */
typedef struct failed_set {
    um_buffer **b;
    size_t n, cap;
    char why[320]; /* why the last one failed ("" none) */
} failed_set;

static bool failed_has(const failed_set *f, const um_buffer *b)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->b[i] == b)
            return true;
    return false;
}

/* Adds b, with the error its eviction failed with; false when there is no
 * memory to remember it (the reclaim then stops). */
static bool failed_add(failed_set *f, um_buffer *b, um_status st)
{
    um__error_detail(st, f->why, sizeof f->why);
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        um_buffer **v = realloc(f->b, cap * sizeof *v);
        if (!v)
            return false;
        f->b = v;
        f->cap = cap;
    }
    f->b[f->n++] = b;
    return true;
}

typedef struct victim_scan {
    um__reclaim *rc;
    int dev;
    int policy;
    bool announcing;    /* the program announces uses (WILL_USE seen) */
    const failed_set *failed; /* not candidates any more */
    um_buffer *best;
    uint64_t key[KEY_LEN];
    /* Why nothing may be evicted, for the error message; `busy`: buffers
     * with memory there whose lock another call held; `homeless`: host
     * replicas that are their buffers' only copies, with no file tier to
     * take them. */
    uint32_t acquired, pinned, busy, homeless;
    uint64_t acquired_bytes, homeless_bytes;
} victim_scan;

/* The eviction order of b's replica on scan->dev, smallest first (b locked
 * and evictable). cost: free memory of invalid replicas (and of data a
 * WRITE_DISCARD acquisition is replacing, where it is valid elsewhere)
 * first; then
 * buffers no announced use needs (WONT_USE first, clean before dirty,
 * larger first, then by recency); then announced buffers, the farthest
 * next use first (what Belady's MIN does). Recency is least recently used
 * first, unless the program announces its uses: then an unannounced
 * buffer is not needed within its look-ahead, and the one whose next use
 * is guessed farthest (last acquire + its last reuse interval) goes first.
 * In a loop that is the one used last (MIN's choice; LRU's is the worst);
 * at random it beats either fixed order. lru: invalid memory first, then
 * least recently used. */
static void key_of(const um_buffer *b, const um__replica *r, int policy, bool announcing,
                   uint64_t *k)
{
    memset(k, 0, KEY_LEN * sizeof *k);
    /* A copy a WRITE_DISCARD is replacing costs nothing to drop only where
     * another copy is valid; otherwise it is the buffer's data until the
     * acquisition is released used. */
    bool invalid = r->state == UM_REPLICA_INVALID ||
                   (b->discarding && um__buffer_valid_elsewhere(b, (int)(r - b->rep)));
    if (policy == UM_EVICT_LRU) {
        k[0] = !invalid;
        k[1] = r->last_use;
        return;
    }
    uint64_t dirty = !invalid && !um__buffer_valid_elsewhere(b, (int)(r - b->rep));
    k[0] = invalid ? 0 : b->nannounced ? 2 : 1;
    if (b->nannounced) {
        k[1] = UINT64_MAX - b->announced[0]; /* the farthest next use first */
        k[2] = dirty;
        return;
    }
    k[1] = !b->wont_use;
    k[2] = dirty;
    k[3] = UINT64_MAX - b->size;
    if (!announcing) {
        k[4] = r->last_use;
        return;
    }
    /* The farthest guessed next use first: the last acquire plus the time
     * between the last two (never reused: first of all). */
    k[4] = b->reuse_interval ? UINT64_MAX - (b->last_acquire + b->reuse_interval) : 0;
}

static bool key_less(const uint64_t *a, const uint64_t *b)
{
    for (int i = 0; i < KEY_LEN; i++)
        if (a[i] != b[i])
            return a[i] < b[i];
    return false;
}

static bool consider(um_buffer *b, void *arg)
{
    victim_scan *s = arg;
    if (!um__vt_mutex_trylock(&b->lock)) {
        /* In use right now: not a victim, but perhaps once the call ends,
         * if it has memory here (or is being given it). Not the buffer
         * this thread allocates for: that call is this one. */
        if ((atomic_load_explicit(&b->has_memory, memory_order_relaxed) >> s->dev & 1) &&
            b != allocating_for)
            s->busy++;
        return true;
    }
    if (b->magic != UM_BUFFER_MAGIC) {
        /* Being destroyed (its handle dead, its memory not yet given
         * back, the destroy waiting for the engine's lock this scan
         * holds): its memory comes back as soon as the destroy goes on,
         * so it counts as held by a call in progress. Skipped, it let an
         * allocation report nothing left to evict (an audit's stress
         * program found such a buffer at 3 of 15 looks that found none).
         * Not a wrapped buffer's host memory: that is the program's. */
        if (b->rep[s->dev].ptr && !(s->dev == 0 && b->wrapped))
            s->busy++;
    } else if (!failed_has(s->failed, b)) {
        const um__replica *r = &b->rep[s->dev];
        if (um__buffer_evictable(b, s->dev)) {
            uint64_t k[KEY_LEN];
            key_of(b, r, s->policy, s->announcing, k);
            if (!s->best || key_less(k, s->key)) {
                s->best = b;
                memcpy(s->key, k, sizeof k);
            }
        } else if (r->ptr && (r->readers || r->writer)) {
            s->acquired++;
            s->acquired_bytes += b->size;
        } else if (r->ptr && b->pinned) {
            s->pinned++;
        } else if (r->ptr && s->dev == 0 && !b->wrapped) {
            s->homeless++;
            s->homeless_bytes += b->size;
        }
    }
    um__vt_mutex_unlock(&b->lock);
    return true;
}

typedef struct evict_job {
    victim_scan *scan;
    bool done, spilled;
    um_status st;
    size_t written, size;
} evict_job;

/* The second pass: the chosen buffer is still listed (so alive), is locked
 * if free, checked again and evicted. */
static bool evict_chosen(um_buffer *b, void *arg)
{
    evict_job *j = arg;
    if (b != j->scan->best)
        return true;
    if (!um__vt_mutex_trylock(&b->lock))
        return false;
    if (b->magic == UM_BUFFER_MAGIC && um__buffer_evictable(b, j->scan->dev)) {
        j->st = um__buffer_evict(b, j->scan->dev, &j->written, &j->spilled);
        j->done = j->st == UM_OK;
        j->size = b->size;
    }
    um__vt_mutex_unlock(&b->lock);
    return false;
}

/* Evicts one replica from dev, the best candidate not in `failed`; false
 * when there was none to evict (scan and failed hold why). A candidate
 * whose eviction fails joins `failed` and the next is tried. Under
 * rc->one. */
static bool evict_one(um__reclaim *rc, int dev, victim_scan *scan, failed_set *failed)
{
    for (int raced = 0; raced < 8;) {
        *scan = (victim_scan){rc, dev, rc->ctx->opts.evict_policy, atomic_load(&rc->announcing),
                              failed, NULL, {0}, 0, 0, 0, 0, 0, 0};
        um__xfer_each_buffer(rc->x, consider, scan);
        if (!scan->best) {
            /* Memory a destroy is giving back is on no list for a moment:
             * held by a call in progress, not gone. */
            int32_t destroying = atomic_load(&rc->dev[dev].destroying);
            if (destroying > 0)
                scan->busy += (uint32_t)destroying;
            return false;
        }
        evict_job j = {scan, false, false, UM_OK, 0, 0};
        uint64_t t0 = um__now_ns();
        um__xfer_each_buffer(rc->x, evict_chosen, &j);
        /* A write-back counts where the eviction failed after it too: its
         * bytes moved, and the copy written back stays valid. */
        device_counters *c = &rc->dev[dev];
        if (j.written) {
            atomic_fetch_add(&c->written_back, 1);
            atomic_fetch_add(&c->written_back_bytes, j.written);
        }
        if (j.spilled) {
            atomic_fetch_add(&c->spilled, 1);
            atomic_fetch_add(&c->spilled_bytes, j.written);
        }
        if (j.done) {
            if (rc->ctx->events)
                um__event_add(rc->ctx->events, UM_EVENT_EVICT, dev, j.spilled, t0,
                              um__now_ns() - t0, j.size, j.written);
            atomic_fetch_add(&c->evictions, 1); /* last: readers see the rest first */
            return true;
        }
        /* Its write-back found no room: another candidate may need none (a
         * clean copy). Taken meanwhile: look again, a few times. */
        if (j.st != UM_OK) {
            if (!failed_add(failed, scan->best, j.st))
                return false;
        } else {
            raced++;
        }
    }
    /* Taken by other calls each time it was chosen: those calls are using
     * it, so it counts as busy, and the caller waits for them and looks
     * again instead of reporting nothing left to evict. */
    scan->busy++;
    return false;
}

/* ---------------------------------------------------------------- hook */

/* The allocation this thread is making room for (memory.c calls the hook
 * once per eviction, then with 0 bytes once the allocation is over): it
 * is counted once, with its whole wait and one trace event. rc NULL: none. */
typedef struct alloc_wait {
    um__reclaim *rc;
    int dev;
    size_t bytes;
    uint64_t t0;
    bool freed;        /* the last call made room */
    uint64_t pause_ns; /* the next wait for candidates held by other calls */
    /* When the calls began to find only candidates held by other calls (0:
     * none has since the last one that made room): the wait for them is
     * timed from there, not from the allocation's start, which may have
     * spent its second on write-backs already. */
    uint64_t busy_since;
    failed_set failed; /* candidates whose eviction failed, for this allocation */
} alloc_wait;

static _Thread_local alloc_wait making_room;

/* `made`: whether the allocation got its memory. It failed for lack of
 * room only when the last call found none to make: the try after such a
 * call may still succeed (another thread freed memory meanwhile), and
 * counting the call then made a successful allocation a failed one. */
static void allocation_over(um__reclaim *rc, int dev, bool made)
{
    if (making_room.rc != rc || making_room.dev != dev)
        return;
    device_counters *c = &rc->dev[dev];
    uint64_t waited = um__now_ns() - making_room.t0;
    bool room = made || making_room.freed;
    atomic_fetch_add(&c->sync, 1);
    atomic_fetch_add(&c->wait_ns, waited);
    if (!room)
        atomic_fetch_add(&c->failed, 1);
    if (rc->ctx->events)
        um__event_add(rc->ctx->events, UM_EVENT_RECLAIM_WAIT, dev, -1, making_room.t0, waited,
                      making_room.bytes, room);
    free(making_room.failed.b);
    making_room = (alloc_wait){0};
}

static bool make_room(um__reclaim *rc, um__xfer *x, int dev, size_t bytes);

/* The context's reclaim hook: one eviction on dev for a failed allocation
 * of `bytes`; 0 bytes: that allocation is over, made or not (`made`). */
static bool reclaim_hook(um_context *ctx, int dev, size_t bytes, bool made)
{
    um__xfer *x = atomic_load_explicit(&ctx->xfer, memory_order_acquire);
    um__reclaim *rc = x ? um__xfer_reclaim(x) : NULL;
    if (!rc || in_reclaim)
        return false;
    if (!bytes) {
        allocation_over(rc, dev, made);
        return false;
    }
    /* While this thread looks for room, the replica it allocates for has
     * no memory here: other threads need not wait for it. Counted, two
     * allocations stuck at a full device waited for each other, and every
     * such failure took up to the second (a first version of this took an
     * audit's program from 0.2 s to 50 s). Between looks the allocation
     * is tried, and may get the memory: noted again for that. This thread
     * holds the buffer's lock, so its replica can be read. */
    um_buffer *mine = allocating_for;
    if (mine && mine->rep[dev].ptr)
        mine = NULL;
    uint64_t bit = (uint64_t)1 << dev;
    if (mine)
        atomic_fetch_and_explicit(&mine->has_memory, ~bit, memory_order_relaxed);
    bool room = make_room(rc, x, dev, bytes);
    if (mine)
        atomic_fetch_or_explicit(&mine->has_memory, bit, memory_order_relaxed);
    return room;
}

/* One look of reclaim_hook's for an allocation of `bytes` on dev. */
static bool make_room(um__reclaim *rc, um__xfer *x, int dev, size_t bytes)
{
    if (making_room.rc != rc || making_room.dev != dev) {
        free(making_room.failed.b);
        making_room = (alloc_wait){rc, dev, bytes, um__now_ns(), false, 20000, 0,
                                   {NULL, 0, 0, ""}};
    }
    /* The memory of destroyed buffers whose last copies have completed
     * goes back first: it costs no eviction, and nothing else on this path
     * looks for it (an allocation failed with their copies long done). */
    if ((um__xfer_poll(x) >> dev) & 1) {
        making_room.freed = true;
        making_room.busy_since = 0;
        return true;
    }
    in_reclaim = true;
    victim_scan scan;
    failed_set *failed = &making_room.failed;
    um__vt_mutex_lock(&rc->one);
    bool freed = evict_one(rc, dev, &scan, failed);
    int64_t in_replicas = atomic_load(&rc->dev[dev].replica_bytes); /* at this look */
    um__vt_mutex_unlock(&rc->one);
    /* Candidates locked by calls in progress (a copy, a read, another
     * allocation) may be evictable once those end: wait for them a while,
     * letting go of rc->one, rather than fail with evictable data there
     * (found by the stress test). After each pause the allocation tries
     * again, so that memory freed meanwhile (a free in another thread, a
     * buffer destroyed) serves it without an eviction or the rest of the
     * wait. Two allocations that each hold the other's only candidate
     * both fail when the wait runs out; reclaim itself only ever
     * try-locks, so nothing deadlocks. Candidates whose eviction failed
     * are not tried again during the allocation. */
    /* Only an eviction restarts the wait: a look that finds nothing held
     * between two that do must not, or calls that keep taking the
     * candidates' locks in turns held the allocation far past its bound
     * (an audit measured 4 s against the 1 s bound). */
    uint64_t now = um__now_ns();
    if (freed)
        making_room.busy_since = 0;
    else if (scan.busy && !making_room.busy_since)
        making_room.busy_since = now;
    if (!freed && scan.busy && !optional_allocation &&
        now - making_room.busy_since <= RECLAIM_BUSY_WAIT_NS) {
        um__sleep_until_ns(now + making_room.pause_ns);
        if (making_room.pause_ns < 1000000)
            making_room.pause_ns *= 2;
        in_reclaim = false;
        making_room.freed = false;
        return true;
    }
    /* Nothing to evict, but memory dropped earlier (a destroyed buffer's)
     * whose last users are still running is held here: wait for the
     * oldest of it, unless the allocation is optional. Without this an
     * allocation failed while a destroyed buffer's copy out was still on
     * the link, "nothing left to evict" with nothing live. Candidates
     * whose eviction failed (a write-back with nowhere to go) do not
     * change that: it failed the same way with such a one there. */
    char held_why[320] = "";
    if (!freed && !optional_allocation) {
        int held = um__xfer_wait_held(x, dev);
        freed = held > 0;
        if (held < 0)
            snprintf(held_why, sizeof held_why, "%s", um_last_error());
    }
    in_reclaim = false;
    making_room.freed = freed;
    uint64_t waited = making_room.busy_since ? um__now_ns() - making_room.busy_since : 0;
    if (!freed && held_why[0]) {
        um__fail(UM_ERR_NOMEM, "device %d: no room for %zu bytes: %s", dev, bytes, held_why);
    } else if (!freed && failed->why[0]) {
        um__fail(UM_ERR_NOMEM, "device %d: no room for %zu bytes: evicting failed: %s", dev, bytes,
                 failed->why);
    } else if (!freed) {
        char held[32], homeless_held[32], replicas[32];
        char busy[96] = "", homeless[160] = "";
        if (scan.busy)
            snprintf(busy, sizeof busy, ", %u in use by other calls for %.0f ms", scan.busy,
                     (double)waited / 1e6);
        /* Without this the message named nothing that held the host's
         * memory when its replicas were the only copies of their data. */
        if (scan.homeless)
            snprintf(homeless, sizeof homeless,
                     ", %u only cop%s of buffer data (%s) with nowhere to go (no file tier: "
                     "the option spill_dir is not set)",
                     scan.homeless, scan.homeless == 1 ? "y" : "ies",
                     um__format_bytes(homeless_held, sizeof homeless_held, scan.homeless_bytes));
        /* These figures are this look's, taken before the allocation's
         * last try, whose pool figures the caller puts first: other
         * threads may have changed the device in between, so the message
         * says when each was seen (it read as if the pool had 1013 KiB
         * live while "0 acquired replicas hold 0 B" there). */
        um__fail(UM_ERR_NOMEM,
                 "device %d: no room for %zu bytes; reclaim's last look, before that try, "
                 "found %s of replicas there and nothing left to evict: %u acquired "
                 "replica%s hold%s %s, %u pinned%s%s",
                 dev, bytes,
                 um__format_bytes(replicas, sizeof replicas,
                                  in_replicas > 0 ? (size_t)in_replicas : 0),
                 scan.acquired, scan.acquired == 1 ? "" : "s", scan.acquired == 1 ? "s" : "",
                 um__format_bytes(held, sizeof held, scan.acquired_bytes), scan.pinned, homeless,
                 busy);
    }
    return freed;
}

/* ---------------------------------------------------- background thread */

static void marks(um__reclaim *rc, int dev, size_t *low, size_t *high)
{
    device_counters *c = &rc->dev[dev];
    for (;;) {
        unsigned seq = atomic_load(&c->marks_seq);
        *low = atomic_load(&c->low);
        *high = atomic_load(&c->high);
        if (!(seq & 1u) && atomic_load(&c->marks_seq) == seq)
            break;
        sched_yield();
    }
    if (*high)
        return;
    size_t limit = rc->ctx->devices[dev].alloc->memory_limit;
    *low = (size_t)((double)limit * rc->ctx->opts.watermark_low / 100.0);
    *high = (size_t)((double)limit * rc->ctx->opts.watermark_high / 100.0);
}

static size_t usage(um__reclaim *rc, int dev)
{
    int64_t v = atomic_load(&rc->dev[dev].replica_bytes);
    return v > 0 ? (size_t)v : 0;
}

static void *reclaimer(void *arg)
{
    um__reclaim *rc = arg;
    in_reclaim = true;
    in_background = true;
    um__vt_mutex_lock(&rc->lock);
    while (!rc->quit) {
        /* Usage changes only through um__reclaim_account, which nudges
         * when it crosses a high mark: no polling. */
        while (!rc->nudged && !rc->quit)
            um__cond_wait(&rc->wake, &rc->lock);
        rc->nudged = false;
        if (rc->quit)
            break;
        um__vt_mutex_unlock(&rc->lock);
        for (int d = 0; d < rc->ctx->ndevices; d++) {
            size_t low, high;
            marks(rc, d, &low, &high);
            if (usage(rc, d) <= high)
                continue;
            atomic_fetch_add(&rc->dev[d].runs, 1);
            victim_scan scan;
            /* One set for the pass: a victim that cannot go is passed
             * over, not tried before every other eviction. */
            failed_set failed = {NULL, 0, 0, ""};
            bool more = true;
            uint64_t t0 = um__now_ns();
            size_t before = usage(rc, d);
            while (more && usage(rc, d) > low) {
                um__vt_mutex_lock(&rc->one);
                more = evict_one(rc, d, &scan, &failed);
                um__vt_mutex_unlock(&rc->one);
            }
            free(failed.b);
            if (rc->ctx->events)
                um__event_add(rc->ctx->events, UM_EVENT_RECLAIM_RUN, d, -1, t0,
                              um__now_ns() - t0, before, usage(rc, d));
        }
        um__vt_mutex_lock(&rc->lock);
    }
    um__vt_mutex_unlock(&rc->lock);
    um__vt_exit();
    return NULL;
}

static void nudge(um__reclaim *rc)
{
    if (!rc)
        return;
    um__vt_mutex_lock(&rc->lock);
    rc->nudged = true;
    um__cond_signal(&rc->wake);
    um__vt_mutex_unlock(&rc->lock);
}

/* ------------------------------------------------------------ lifetime */

um__reclaim *um__reclaim_create(um__xfer *x)
{
    um__reclaim *rc = calloc(1, sizeof *rc);
    if (!rc)
        return NULL;
    rc->x = x;
    rc->ctx = NULL;
    pthread_mutex_init(&rc->one, NULL);
    pthread_mutex_init(&rc->lock, NULL);
    pthread_mutex_init(&rc->marks_lock, NULL);
    um__cond_init(&rc->wake);
    return rc;
}

/* Starts what needs the context: the hook and the thread. */
void um__reclaim_start(um__reclaim *rc, um_context *ctx)
{
    rc->ctx = ctx;
    atomic_store_explicit(&ctx->reclaim, reclaim_hook, memory_order_release);
    um__vt_spawn();
    rc->thread_started = pthread_create(&rc->tid, NULL, reclaimer, rc) == 0;
    if (!rc->thread_started)
        um__vt_unspawn();
}

void um__reclaim_destroy(um__reclaim *rc)
{
    if (!rc)
        return;
    if (rc->thread_started) {
        um__vt_mutex_lock(&rc->lock);
        rc->quit = true;
        um__cond_signal(&rc->wake);
        um__vt_mutex_unlock(&rc->lock);
        um__vt_join(rc->tid, NULL);
    }
    um__cond_destroy(&rc->wake);
    pthread_mutex_destroy(&rc->lock);
    pthread_mutex_destroy(&rc->marks_lock);
    pthread_mutex_destroy(&rc->one);
    free(rc);
}

/* ----------------------------------------------------------- accounting */

void um__reclaim_destroying(um__reclaim *rc, int dev, int delta)
{
    if (rc)
        atomic_fetch_add(&rc->dev[dev].destroying, delta);
}

void um__reclaim_announced(um__reclaim *rc)
{
    if (rc && !atomic_load_explicit(&rc->announcing, memory_order_relaxed))
        atomic_store(&rc->announcing, true);
}

bool um__reclaim_write_back_ok(um__reclaim *rc, int dev, size_t bytes)
{
    if (!rc || !rc->ctx || !in_background)
        return true;
    size_t low, high;
    marks(rc, dev, &low, &high);
    size_t now = usage(rc, dev);
    return now <= high && bytes <= high - now;
}

bool um__reclaim_optional(bool on)
{
    bool was = optional_allocation;
    optional_allocation = on;
    return was;
}

um_buffer *um__reclaim_allocating(um_buffer *b)
{
    um_buffer *was = allocating_for;
    allocating_for = b;
    return was;
}

void um__reclaim_refetched(um__reclaim *rc, int dev, size_t bytes)
{
    atomic_fetch_add(&rc->dev[dev].refetched_bytes, bytes);
}

void um__reclaim_account(um__reclaim *rc, int dev, int64_t bytes)
{
    if (!rc)
        return;
    int64_t now = atomic_fetch_add(&rc->dev[dev].replica_bytes, bytes) + bytes;
    if (bytes > 0 && rc->ctx) {
        size_t low, high;
        marks(rc, dev, &low, &high);
        if ((size_t)now > high)
            nudge(rc);
    }
}

/* ---------------------------------------------------------------- public */

static um_status reclaim_of(um_context *ctx, int dev, const char *what, um__reclaim **out)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "%s: ctx is NULL", what);
    if (dev < 0 || dev >= ctx->ndevices)
        return um__fail(UM_ERR_NO_DEVICE, "%s: device %d: the context has devices 0..%d", what,
                        dev, ctx->ndevices - 1);
    um__xfer *x;
    um_status st = um__xfer_get(ctx, &x);
    if (st != UM_OK)
        return st;
    *out = um__xfer_reclaim(x);
    if (!*out)
        return um__fail(UM_ERR_NOMEM, "%s: the reclaimer could not be made", what);
    return UM_OK;
}

um_status um_set_watermarks(um_context *ctx, int dev, size_t low_bytes, size_t high_bytes)
{
    um__reclaim *rc;
    um_status st = reclaim_of(ctx, dev, "um_set_watermarks", &rc);
    if (st != UM_OK)
        return st;
    if (low_bytes > high_bytes)
        return um__fail(UM_ERR_INVALID,
                        "um_set_watermarks: device %d: the low mark (%zu bytes) is above the "
                        "high mark (%zu bytes)", dev, low_bytes, high_bytes);
    device_counters *c = &rc->dev[dev];
    pthread_mutex_lock(&rc->marks_lock); /* writers one at a time */
    atomic_fetch_add(&c->marks_seq, 1);
    atomic_store(&c->low, low_bytes);
    atomic_store(&c->high, high_bytes);
    atomic_fetch_add(&c->marks_seq, 1);
    pthread_mutex_unlock(&rc->marks_lock);
    nudge(rc);
    return UM_OK;
}

um_status um_get_watermarks(um_context *ctx, int dev, size_t *low_bytes, size_t *high_bytes)
{
    if (!low_bytes || !high_bytes)
        return um__fail(UM_ERR_INVALID, "um_get_watermarks: %s is NULL",
                        !low_bytes ? "low_bytes" : "high_bytes");
    um__reclaim *rc;
    um_status st = reclaim_of(ctx, dev, "um_get_watermarks", &rc);
    if (st == UM_OK)
        marks(rc, dev, low_bytes, high_bytes);
    return st;
}

um_status um_reclaim_stats_get(um_context *ctx, int dev, um_reclaim_stats *out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "um_reclaim_stats_get: out is NULL");
    um__reclaim *rc;
    um_status st = reclaim_of(ctx, dev, "um_reclaim_stats_get", &rc);
    if (st != UM_OK)
        return st;
    device_counters *c = &rc->dev[dev];
    *out = (um_reclaim_stats){atomic_load(&c->evictions), atomic_load(&c->written_back),
                              atomic_load(&c->written_back_bytes),
                              atomic_load(&c->refetched_bytes), atomic_load(&c->runs),
                              atomic_load(&c->sync), atomic_load(&c->wait_ns),
                              atomic_load(&c->failed), atomic_load(&c->spilled),
                              atomic_load(&c->spilled_bytes),
                              um__xfer_spilled(rc->x)};
    return UM_OK;
}
