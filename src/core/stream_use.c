/*
 * stream_use: blocks used on more streams than the one they are freed on
 * (um_record_stream, PyTorch's Tensor.record_stream). Owns, per device, the
 * marked blocks with the streams each was marked for, and the frees of
 * marked blocks that wait for those streams.
 *
 * A marked block's um_free records an event on each marked stream and
 * keeps the block out of the allocator until every event has completed;
 * then it frees the block on the free's own stream, whose order the pool
 * already keeps. The free's stream is never made to wait for the others
 * (PyTorch's allocator defers the same way): a communication stream that
 * frees a tensor the compute stream still reads must not stall behind it.
 * While a device has no marked block, um_free and um_malloc test one word
 * each and pass straight through (memory.c).
 */
#include "core.h"
#include "../base/addrmap.h"
#include "../base/vtime.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct use {
    void *ptr;
    um_stream *streams; /* the marked streams, each once */
    uint32_t n, cap;
    /* Freed: the free's stream (NULL: the allocation stream), one event
     * per marked stream (NULL where recording failed and the stream was
     * synchronized instead), and the next deferred free, oldest first.
     * giving: done, its block being given back outside the lock; it stays
     * in the map and on the `all` list until then, so that a second
     * um_free of the block is refused as one and destroying its free's
     * stream waits for it. An allocation the allocator gives the same
     * address meanwhile waits for the end (um__uses_given), so that the
     * address never means a new block while its old use is in the map.
     * A give-back that fails puts it back on the deferred list (counted in
     * failures), to be retried. */
    bool freeing, giving;
    uint32_t failures;
    um_stream free_stream;
    um__bevent **events;
    struct use *next;
    /* Every use of the device, for a stream that goes away. */
    struct use *all_prev, *all_next;
} use;

typedef struct um__stream_uses {
    pthread_mutex_t lock;
    um__addrmap by_ptr; /* block -> its use */
    use *deferred_head, *deferred_tail;
    use all; /* the list head of every use */
    /* Uses being given back (`giving`), and the signal that some were. */
    size_t giving;
    um__cond gave;
} um__stream_uses;

static um__backend *backend_of(um_context *ctx, um_stream s)
{
    return ctx->devices[s->dev].backend;
}

/* The device's uses, made on first need (set once, by a compare-exchange,
 * so two threads that mark blocks at once make one). */
static um__stream_uses *uses_of(um_context *ctx, int dev, bool make)
{
    um_device *d = &ctx->devices[dev];
    um__stream_uses *u = __atomic_load_n(&d->uses, __ATOMIC_ACQUIRE);
    if (u || !make)
        return u;
    um__stream_uses *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    if (um__cond_init(&fresh->gave) != 0) {
        free(fresh);
        return NULL;
    }
    pthread_mutex_init(&fresh->lock, NULL);
    fresh->all.all_prev = fresh->all.all_next = &fresh->all;
    if (__atomic_compare_exchange_n(&d->uses, &u, fresh, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return fresh;
    um__cond_destroy(&fresh->gave);
    pthread_mutex_destroy(&fresh->lock);
    free(fresh);
    return u;
}

/* Destroys the events of x's free that are left, and their array. */
static void drop_events(um_context *ctx, use *x)
{
    for (uint32_t i = 0; x->events && i < x->n; i++)
        if (x->events[i])
            um__be_event_destroy(backend_of(ctx, x->streams[i]), x->events[i]);
    free(x->events);
    x->events = NULL;
}

static void use_free(um_context *ctx, use *x)
{
    drop_events(ctx, x);
    free(x->streams);
    free(x);
}

/* The use of ptr in the map, or NULL. Under the lock. A use being given
 * back stays there until its block is back in the allocator, and no
 * allocation returns its address before then (um__uses_given): a call on
 * ptr that finds it `giving` is on the freed block. */
static use *use_of_locked(um__stream_uses *u, const void *ptr)
{
    uint64_t found = 0;
    if (!um__addrmap_get(&u->by_ptr, (uintptr_t)ptr, &found))
        return NULL;
    return (use *)(uintptr_t)found;
}

void um__uses_given(um_context *ctx, int dev, void *const *ptrs, size_t n)
{
    um__stream_uses *u = uses_of(ctx, dev, false);
    if (!n || !u || !atomic_load_explicit(&ctx->devices[dev].deferred, memory_order_acquire))
        return;
    um__vt_mutex_lock(&u->lock);
    for (size_t i = 0; i < n; i++)
        for (use *x; (x = use_of_locked(u, ptrs[i])) && x->giving;)
            um__cond_wait(&u->gave, &u->lock);
    um__vt_mutex_unlock(&u->lock);
}

um_status um_record_stream(um_context *ctx, void *ptr, um_stream s)
{
    const char *what = "um_record_stream";
    if (!ctx || !ptr)
        return um__fail(UM_ERR_INVALID, "%s: %s is NULL", what, ctx ? "ptr" : "ctx");
    if (s && (s->magic != UM_STREAM_MAGIC || s->ctx != ctx))
        return um__fail(UM_ERR_INVALID, "%s: %p is not a live stream of this context", what,
                        (void *)s);
    int dev = um_pointer_device(ctx, ptr);
    if (dev < 0)
        return um__fail(UM_ERR_INVALID_POINTER,
                        "%s: pointer %p is not memory of any of the %d devices of this context "
                        "(not returned by um_malloc)",
                        what, ptr, ctx->ndevices);
    um_device *d = &ctx->devices[dev];
    if (!s)
        s = d->default_stream;
    if (s->dev != dev && dev != 0)
        return um__fail(UM_ERR_WRONG_DEVICE,
                        "%s: pointer %p belongs to device %d (%s) but stream %u is on device "
                        "%d (%s)",
                        what, ptr, dev, d->backend->name, s->ref.id, s->dev,
                        backend_of(ctx, s)->name);
    /* A freed or inner pointer must be refused here: marked, its um_free
     * would be deferred and succeed, and the allocator's refusal would come
     * only later, as a log line. */
    um__allocator *a = d->alloc;
    if (!a->ops->block_live)
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: device %d's allocator (%s) cannot tell whether %p is a live block, "
                        "so it cannot be marked",
                        what, dev, a->ops->name, ptr);
    um__stream_uses *u = uses_of(ctx, dev, true);
    if (!u)
        return um__fail(UM_ERR_NOMEM, "%s: no host memory for the stream uses of device %d",
                        what, dev);
    /* The allocator is asked outside the lock, which it must never be
     * taken under. */
    um_status live = a->ops->block_live(a, ptr);
    if (live != UM_OK)
        return live;
    um__vt_mutex_lock(&u->lock);
    use *x = use_of_locked(u, ptr);
    um_status st = UM_OK;
    if (x) {
        if (x->freeing || x->giving)
            st = um__fail(UM_ERR_INVALID_POINTER,
                          "%s: %p was freed already (its free waits for the streams it was "
                          "recorded on)",
                          what, ptr);
    } else if ((x = calloc(1, sizeof *x))) {
        x->ptr = ptr;
        if (um__addrmap_put(&u->by_ptr, (uintptr_t)ptr, (uint64_t)(uintptr_t)x)) {
            x->all_next = u->all.all_next;
            x->all_prev = &u->all;
            u->all.all_next->all_prev = x;
            u->all.all_next = x;
            atomic_fetch_add_explicit(&d->marked, 1, memory_order_relaxed);
        } else {
            free(x);
            x = NULL;
        }
    }
    if (st == UM_OK && !x)
        st = um__fail(UM_ERR_NOMEM, "%s: no host memory to mark %p", what, ptr);
    bool known = false;
    for (uint32_t i = 0; st == UM_OK && i < x->n; i++)
        known |= x->streams[i] == s;
    if (st == UM_OK && !known) {
        if (x->n == x->cap) {
            uint32_t cap = x->cap ? 2 * x->cap : 2;
            um_stream *grown = realloc(x->streams, cap * sizeof *grown);
            if (grown) {
                x->streams = grown;
                x->cap = cap;
            }
        }
        if (x->n < x->cap)
            x->streams[x->n++] = s;
        else
            st = um__fail(UM_ERR_NOMEM, "%s: no host memory to mark %p", what, ptr);
    }
    um__vt_mutex_unlock(&u->lock);
    return st;
}

/* Forgets use x of device dev: out of the map (its block is no longer
 * marked) and off the list, not freed. Under the lock. */
static void forget_locked(um_context *ctx, int dev, um__stream_uses *u, use *x)
{
    (void)um__addrmap_take(&u->by_ptr, (uintptr_t)x->ptr, NULL);
    atomic_fetch_sub_explicit(&ctx->devices[dev].marked, 1, memory_order_relaxed);
    x->all_prev->all_next = x->all_next;
    x->all_next->all_prev = x->all_prev;
}

um_status um__uses_free(um_context *ctx, int dev, void *ptr, um_stream s, bool *taken)
{
    *taken = false;
    um__stream_uses *u = uses_of(ctx, dev, false);
    if (!u)
        return UM_OK;
    um__vt_mutex_lock(&u->lock);
    use *x = use_of_locked(u, ptr);
    if (x && !x->freeing && !x->giving && !x->n) {
        /* Every stream it was marked for is gone, and their work is done. */
        forget_locked(ctx, dev, u, x);
        use_free(ctx, x);
        x = NULL;
    }
    if (!x) {
        um__vt_mutex_unlock(&u->lock);
        return UM_OK;
    }
    *taken = true;
    if (x->freeing || x->giving) {
        um__vt_mutex_unlock(&u->lock);
        return um__fail(UM_ERR_DOUBLE_FREE,
                        x->giving ? "um_free: %p was freed already (its block is being given "
                                    "back to the allocator)"
                                  : "um_free: %p was freed already (its free waits for the "
                                    "streams it was recorded on)",
                        ptr);
    }
    um_status st = UM_OK;
    /* The first stream that can be neither fenced nor waited for, and
     * why: the error names both driver calls (it named the wait only). */
    char why[512] = "";
    x->events = x->n ? calloc(x->n, sizeof *x->events) : NULL;
    for (uint32_t i = 0; i < x->n; i++) {
        um_stream m = x->streams[i];
        um__backend *b = backend_of(ctx, m);
        /* Without an event the stream's work is waited for now: slower,
         * never unsafe. */
        um_status rs =
            x->events ? um__be_event_record(b, m->ref.bstream, &x->events[i]) : UM_ERR_NOMEM;
        if (rs != UM_OK) {
            char record[180];
            if (x->events) {
                x->events[i] = NULL;
                um__error_detail(rs, record, sizeof record);
            } else {
                snprintf(record, sizeof record, "no host memory for its events");
            }
            um_status w = um__be_stream_sync(b, m->ref.bstream);
            if (w != UM_OK && st == UM_OK) {
                char wait[180];
                um__error_detail(w, wait, sizeof wait);
                snprintf(why, sizeof why,
                         "stream %u of device %d, which it was recorded on, can be neither "
                         "fenced (%s) nor waited for (%s)",
                         m->ref.id, m->dev, record, wait);
                st = w;
            }
        }
    }
    if (st != UM_OK) {
        /* Neither an event nor a wait: the block stays live and marked, and
         * the program may free it again. */
        drop_events(ctx, x);
        um__vt_mutex_unlock(&u->lock);
        return um__fail(st, "um_free: %p: %s; the block stays live and marked, to be freed again",
                        ptr, why);
    }
    x->freeing = true;
    x->free_stream = s;
    x->next = NULL;
    if (u->deferred_tail)
        u->deferred_tail->next = x;
    else
        u->deferred_head = x;
    u->deferred_tail = x;
    atomic_fetch_add_explicit(&ctx->devices[dev].deferred, 1, memory_order_release);
    um__vt_mutex_unlock(&u->lock);
    return UM_OK;
}

/* Whether every event of the deferred free x has completed (waiting for
 * them when wait). */
static bool use_done(um_context *ctx, use *x, bool wait)
{
    for (uint32_t i = 0; i < x->n; i++) {
        if (!x->events || !x->events[i])
            continue;
        um__backend *b = backend_of(ctx, x->streams[i]);
        int done = 0;
        um_status st = wait ? um__be_event_sync(b, x->events[i])
                            : um__be_event_query(b, x->events[i], &done);
        if (st == UM_OK && wait)
            done = 1;
        if (st != UM_OK) {
            /* An event that cannot be asked: its stream's work is waited
             * for instead. */
            if (um__be_stream_sync(b, x->streams[i]->ref.bstream) != UM_OK)
                return false;
            done = 1;
        }
        if (!done)
            return false;
        um__be_event_destroy(b, x->events[i]);
        x->events[i] = NULL;
    }
    return true;
}

/* Frees the block of a finished deferred free on its free's stream; fails
 * only where the block is still live, so that it can be given back later
 * (um_last_error says why). */
static um_status give_back(um_context *ctx, int dev, use *x)
{
    um__allocator *a = ctx->devices[dev].alloc;
    um_stream s = x->free_stream;
    const um__stream_ref *ref = s ? &s->ref : NULL;
    if (s && s->dev != dev)
        ref = um__stream_host_ref(ctx, s); /* made when the free was checked */
    (void)um__free_took_take();
    um_status st = a->ops->free(a, x->ptr, ref);
    if (st == UM_OK)
        return UM_OK;
    /* A free that failed may have taken the block anyway (the debug
     * allocator's report of overwritten guard bytes): then it must not be
     * freed again. The free says so itself. Asking block_live here took a
     * new block that another thread's allocation had got at the same
     * address for the old one still live: the use was put back, the new
     * block's mark and free were refused, and the retry freed it under its
     * owner (found by an audit). */
    char why[512];
    snprintf(why, sizeof why, "%s", um_last_error());
    if (um__free_took_take()) {
        um__log(UM_LOG_WARN,
                "device %d: a free that waited for recorded streams failed, but the allocator "
                "took %p: %s",
                dev, x->ptr, why);
        return UM_OK;
    }
    if (!x->failures++)
        um__log(UM_LOG_WARN,
                "device %d: a free that waited for recorded streams failed; %p waits to be "
                "given back again: %s",
                dev, x->ptr, why);
    return st;
}

/* Takes the deferred frees that are done out of u, into a list: oldest
 * first up to the first not done; or, with `only`, every one whose free or
 * marks name that stream (waiting, when wait), counting in *left those
 * that are not done. Each taken one stays marked and on the `all` list,
 * `giving`, until give_back_all is done with it, and counted in the
 * device's `deferred` until its block is back: an allocation at the limit
 * that sees none deferred does not wait, and would fail while memory is
 * on its way back. Under the lock. */
static use *take_done_locked(um_context *ctx, um__stream_uses *u, bool wait, um_stream only,
                             size_t *left)
{
    use *done = NULL, **tail = &done;
    use **link = &u->deferred_head;
    use *prev = NULL;
    while (*link) {
        use *x = *link;
        bool wanted = !only || x->free_stream == only;
        for (uint32_t i = 0; !wanted && i < x->n; i++)
            wanted = x->streams[i] == only;
        if (!wanted) {
            prev = x;
            link = &x->next;
            continue;
        }
        if (!use_done(ctx, x, wait)) {
            if (!only)
                break;
            ++*left;
            prev = x;
            link = &x->next;
            continue;
        }
        *link = x->next;
        if (u->deferred_tail == x)
            u->deferred_tail = prev;
        x->giving = true;
        u->giving++;
        x->next = NULL;
        *tail = x;
        tail = &x->next;
    }
    return done;
}

/* A stream going away, for give_back_all: the frees on `drained` that fail
 * are counted (they still need it, so its destroy must fail), the first
 * one's error in `why`; those on `gone`, whose backend stream was
 * destroyed already, are retried on their block's allocation stream. */
typedef struct stream_going {
    um_stream drained, gone;
    size_t failed;
    char why[256];
} stream_going;

/* Puts use x, whose give-back failed, back as it was before
 * take_done_locked: first on the deferred list (it is the oldest), where
 * the next collect, trim or drain retries it. It never left the map, so a
 * second um_free is still refused. Under the lock. */
static void requeue_locked(um__stream_uses *u, use *x)
{
    x->giving = false;
    x->next = u->deferred_head;
    u->deferred_head = x;
    if (!u->deferred_tail)
        u->deferred_tail = x;
}

/* Frees the blocks of a list from take_done_locked (outside the lock: the
 * allocator takes its own), then, under the lock, takes the uses given
 * back off the list and puts those that failed back to wait, and tells a
 * destroy of their free's stream, which may wait for them
 * (um__uses_stream_drain), that they are done. going: NULL, or the stream
 * going away. */
static void give_back_all(um_context *ctx, int dev, um__stream_uses *u, use *done,
                          stream_going *going)
{
    /* Both lists newest first: pushed onto the deferred list's head in that
     * order, the failed ones keep their order there. */
    use *given = NULL, *failed = NULL;
    while (done) {
        use *x = done;
        done = x->next;
        x->next = NULL;
        if (give_back(ctx, dev, x) == UM_OK) {
            x->next = given;
            given = x;
            continue;
        }
        if (going && going->drained && x->free_stream == going->drained && !going->failed++)
            snprintf(going->why, sizeof going->why, "%s", um_last_error());
        x->next = failed;
        failed = x;
    }
    if (!given && !failed)
        return;
    um__vt_mutex_lock(&u->lock);
    for (use *x = given; x; x = x->next) {
        forget_locked(ctx, dev, u, x);
        u->giving--;
        atomic_fetch_sub_explicit(&ctx->devices[dev].deferred, 1, memory_order_release);
    }
    while (failed) {
        use *x = failed;
        failed = x->next;
        u->giving--;
        /* Under the lock: a drain of another stream reads free_stream. */
        if (going && going->gone && x->free_stream == going->gone)
            x->free_stream = NULL;
        requeue_locked(u, x);
    }
    um__cond_broadcast(&u->gave);
    um__vt_mutex_unlock(&u->lock);
    while (given) {
        use *next = given->next;
        use_free(ctx, given);
        given = next;
    }
}

/* Whether another thread is giving back a free on stream s. Under the
 * lock. */
static bool giving_on_locked(um__stream_uses *u, um_stream s)
{
    if (!u->giving)
        return false;
    for (use *x = u->all.all_next; x != &u->all; x = x->all_next)
        if (x->giving && x->free_stream == s)
            return true;
    return false;
}

um_status um__uses_collect(um_context *ctx, int dev, bool wait)
{
    um__stream_uses *u = uses_of(ctx, dev, false);
    if (!u || !atomic_load_explicit(&ctx->devices[dev].deferred, memory_order_acquire))
        return UM_OK;
    um__vt_mutex_lock(&u->lock);
    use *done = take_done_locked(ctx, u, wait, NULL, NULL);
    /* Waiting, a free left deferred is one whose work could be neither
     * waited for through its events nor through its streams: said, so
     * that an allocation at the limit that needed its memory names the
     * driver's failure (it said only that the device was full). */
    um_status st = UM_OK;
    if (wait && u->deferred_head) {
        char why[300]; /* copied: um__fail writes where um_last_error points */
        snprintf(why, sizeof why, "%s", um_last_error());
        st = um__fail(UM_ERR_BACKEND,
                      "device %d: freed blocks marked by um_record_stream are kept, as the work "
                      "on their streams can be waited for neither through its events nor "
                      "through the streams (%s)",
                      dev, why);
    }
    um__vt_mutex_unlock(&u->lock);
    give_back_all(ctx, dev, u, done, NULL);
    if (!wait)
        return st;
    /* Blocks other threads are giving back count as coming: waiting for
     * them is what lets an allocation at the limit have their memory. */
    um__vt_mutex_lock(&u->lock);
    while (u->giving)
        um__cond_wait(&u->gave, &u->lock);
    um__vt_mutex_unlock(&u->lock);
    return st;
}

/* The live marked blocks of u forget stream s. Under the lock. */
static void forget_stream_locked(um__stream_uses *u, um_stream s)
{
    for (use *x = u->all.all_next; x != &u->all; x = x->all_next) {
        if (x->freeing)
            continue; /* a free that needs s was finished first; others keep their events */
        for (uint32_t i = 0; i < x->n; i++) {
            if (x->streams[i] == s) {
                x->streams[i] = x->streams[--x->n];
                break;
            }
        }
    }
}

/* The error of a destroy of s that `left` deferred frees wait for. */
static um_status fail_left(um_stream s, size_t left, const char *why)
{
    return um__fail(UM_ERR_BACKEND,
                    "stream %u of device %d: %zu freed block%s marked for it wait%s for its "
                    "work, which cannot be waited for (%s)",
                    s->ref.id, s->dev, left, left == 1 ? "" : "s", left == 1 ? "s" : "", why);
}

/* On s's device and on the host (whose blocks may be marked for any
 * stream), one at a time: first waits until no other thread is giving
 * back a free on s (one taken out of the deferred list just before would
 * otherwise reach s's pool state after the stream was freed), then
 * finishes and gives back the deferred frees that need s. The marks stay:
 * the stream may yet fail to go. A free on s that the allocator refuses
 * still needs s, so the stream stays then too. */
um_status um__uses_stream_drain(um_context *ctx, um_stream s)
{
    int devs[2] = {s->dev, 0}, n = s->dev != 0 ? 2 : 1;
    size_t left = 0;
    char why[256] = "";
    stream_going going = {.drained = s};
    for (int i = 0; i < n; i++) {
        um__stream_uses *u = uses_of(ctx, devs[i], false);
        if (!u)
            continue;
        um__vt_mutex_lock(&u->lock);
        while (giving_on_locked(u, s))
            um__cond_wait(&u->gave, &u->lock);
        size_t before = left;
        use *done = take_done_locked(ctx, u, true, s, &left);
        if (left != before && !why[0])
            snprintf(why, sizeof why, "%s", um_last_error());
        um__vt_mutex_unlock(&u->lock);
        give_back_all(ctx, devs[i], u, done, &going);
    }
    if (left)
        return fail_left(s, left, why);
    if (going.failed)
        return um__fail(UM_ERR_BACKEND,
                        "stream %u of device %d: %zu freed block%s to be given back on it could "
                        "not be, and wait%s to be retried (%s)",
                        s->ref.id, s->dev, going.failed, going.failed == 1 ? "" : "s",
                        going.failed == 1 ? "s" : "", going.why);
    return UM_OK;
}

/* Both uses locked at once (the only place that holds two, the device's
 * first), so that no free records an event on s while its backend stream
 * goes, and so that a failure leaves every mark as it was: a free made
 * since the drain that needs s is waited for again, and the marks are
 * forgotten only once the backend destroyed the stream. Where the stream
 * stays (a free that cannot be waited for, or the backend's failure), its
 * marked blocks must still wait for its work. (The frees that did finish
 * go back either way.) */
um_status um__uses_stream_destroy(um_context *ctx, um_stream s)
{
    int devs[2] = {s->dev, 0}, n = s->dev != 0 ? 2 : 1;
    um__stream_uses *u[2] = {NULL, NULL};
    use *done[2] = {NULL, NULL};
    size_t left = 0;
    for (int i = 0; i < n; i++)
        if ((u[i] = uses_of(ctx, devs[i], false)))
            um__vt_mutex_lock(&u[i]->lock);
    for (int i = 0; i < n; i++)
        if (u[i])
            done[i] = take_done_locked(ctx, u[i], true, s, &left);
    char why[256] = "";
    um_status st = UM_OK;
    if (left)
        snprintf(why, sizeof why, "%s", um_last_error());
    else
        st = um__be_stream_destroy(backend_of(ctx, s), s->ref.bstream);
    for (int i = n - 1; i >= 0; i--) {
        if (!u[i])
            continue;
        if (!left && st == UM_OK)
            forget_stream_locked(u[i], s);
        um__vt_mutex_unlock(&u[i]->lock);
    }
    /* Once the backend's stream is gone, a free on it that fails is
     * retried on its block's allocation stream. */
    stream_going going = {.gone = !left && st == UM_OK ? s : NULL};
    for (int i = 0; i < n; i++)
        if (u[i])
            give_back_all(ctx, devs[i], u[i], done[i], &going);
    return left ? fail_left(s, left, why) : st;
}

void um__uses_fini(um_context *ctx)
{
    for (int dev = 0; dev < ctx->ndevices; dev++) {
        um_device *d = &ctx->devices[dev];
        um__stream_uses *u = d->uses;
        if (!u)
            continue;
        size_t stuck = 0;
        while (u->all.all_next != &u->all) {
            use *x = u->all.all_next;
            u->all.all_next = x->all_next;
            /* The program freed it and every stream's work is done: it goes
             * back now, so that the allocator (and a recorded trace) sees
             * the free; dropped, it stayed live to the end of the trace
             * (an audit). Tried once only, so that a block the allocator
             * always refuses cannot hold up the shutdown: the allocator's
             * destroy gives its memory back with the rest. */
            if (x->freeing && give_back(ctx, dev, x) != UM_OK)
                stuck++;
            use_free(ctx, x);
        }
        if (stuck)
            um__log(UM_LOG_WARN,
                    "um_shutdown: device %d: %zu freed block%s marked by um_record_stream could "
                    "not be given back to the allocator (see the earlier warnings)",
                    dev, stuck, stuck == 1 ? "" : "s");
        um__addrmap_free(&u->by_ptr);
        um__cond_destroy(&u->gave);
        pthread_mutex_destroy(&u->lock);
        free(u);
        d->uses = NULL;
        atomic_store(&d->marked, 0);
        atomic_store(&d->deferred, 0);
    }
}
