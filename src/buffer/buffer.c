/*
 * buffer: unified buffers (see buffer.h and include/unimem.h). The
 * coherence protocol, per buffer and under its lock:
 *
 *   - at most one replica is OWNER, and once any replica is valid exactly
 *     one is: the newest contents, made by the last writer (or the zeros
 *     of a new buffer); SHARED replicas hold the same contents;
 *   - a read acquisition on a device with no valid replica copies from the
 *     valid replica with the cheapest route, and the copy is SHARED;
 *   - a write acquisition copies in the same way (not for WRITE_DISCARD),
 *     makes its replica the OWNER and every other one INVALID; invalid
 *     replicas keep their memory, so a later copy back needs no allocation;
 *   - so a byte moves only when a device without a valid copy needs it.
 *
 * Reads may be held on any number of devices at once; a write excludes
 * every other acquisition, and a conflict fails with UM_ERR_BUSY.
 */
#include "buffer.h"

#include "../base/vtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *um_replica_state_name(um_replica_state s)
{
    switch (s) {
    case UM_REPLICA_INVALID: return "invalid";
    case UM_REPLICA_SHARED: return "shared";
    case UM_REPLICA_OWNER: return "owner";
    }
    return "unknown";
}

/* ---------------------------------------------------------- arguments */

static um_status bad_buffer(const char *what, const um_buffer *b)
{
    return um__fail(UM_ERR_INVALID, "%s: %p is not a live buffer (destroyed, or never created)",
                    what, (const void *)b);
}

static bool live(const um_buffer *b)
{
    return b && atomic_load_explicit(&b->magic, memory_order_relaxed) == UM_BUFFER_MAGIC;
}

/* Takes b's lock for a call that found b live, and looks again under it:
 * a destroy in another thread may have ended it between the two (an
 * audit's acquire then worked on a buffer being torn down, and freed its
 * fences twice). UM_OK with the lock held, else the unlocked failure. */
static um_status lock_live(um_buffer *b, const char *what)
{
    um__vt_mutex_lock(&b->lock);
    if (UM_LIKELY(b->magic == UM_BUFFER_MAGIC))
        return UM_OK;
    um__vt_mutex_unlock(&b->lock);
    return bad_buffer(what, b);
}

static um_status check_device(const um_buffer *b, int dev, const char *what)
{
    if (dev < 0 || dev >= b->ctx->ndevices)
        return um__fail(UM_ERR_NO_DEVICE, "%s: buffer %p: device %d: the context has devices 0..%d",
                        what, (const void *)b, dev, b->ctx->ndevices - 1);
    return UM_OK;
}

static um_status check_stream(const um_buffer *b, int dev, um_stream s, const char *what)
{
    if (!s)
        return UM_OK;
    if (s->magic != UM_STREAM_MAGIC || s->ctx != b->ctx)
        return um__fail(UM_ERR_INVALID, "%s: %p is not a live stream of the buffer's context",
                        what, (void *)s);
    if (s->dev != dev)
        return um__fail(UM_ERR_WRONG_DEVICE,
                        "%s: buffer %p on device %d with a stream of device %d", what,
                        (const void *)b, dev, s->dev);
    return UM_OK;
}

static um_status check_range(const um_buffer *b, size_t offset, const void *p, size_t n,
                             const char *what)
{
    if (!p && n)
        return um__fail(UM_ERR_INVALID, "%s: buffer %p: the host pointer is NULL", what,
                        (const void *)b);
    if (offset > b->size || n > b->size - offset)
        return um__fail(UM_ERR_INVALID,
                        "%s: buffer %p: %zu bytes at offset %zu run past its %zu bytes", what,
                        (const void *)b, n, offset, b->size);
    return UM_OK;
}

static um__xfer *engine(const um_buffer *b)
{
    return atomic_load_explicit(&b->ctx->xfer, memory_order_acquire);
}

/* ------------------------------------------------------------ fences */

/* Adds f to the replica's users. A newer fence of the same stream covers
 * an older one (not one with an upstream, whose other stream it does not
 * follow); when the list is full, finished fences are dropped, and if
 * none has finished the two oldest become one (waited for on the host only
 * where they cannot be merged on a stream). On eight GPUs a tile that all
 * of them read had more users in flight than the list holds, and the host
 * waited here for a kernel while it held the buffer's lock, stalling every
 * task that used the tile. Where the oldest can be neither merged nor
 * waited for, the list stays as it was and f is not taken: fails, saying
 * why (dropping the oldest let a write, or the memory's reuse, run under
 * its reader). */
static um_status add_use(um__xfer *x, um__replica *r, um__fence f)
{
    if (!um__fence_pending(&f))
        return UM_OK;
    for (uint32_t i = 0; i < r->nused; i++) {
        if (r->used[i].stream == f.stream && r->used[i].be == f.be && !r->used[i].upstream) {
            um__fence_drop(&r->used[i]);
            r->used[i] = f;
            return UM_OK;
        }
    }
    if (r->nused == UM_REPLICA_USES) {
        uint32_t kept = 0;
        for (uint32_t i = 0; i < r->nused; i++)
            if (!um__fence_done(x, &r->used[i]))
                r->used[kept++] = r->used[i];
        r->nused = kept;
        if (kept == UM_REPLICA_USES) {
            um_status st = um__xfer_join(x, &r->used[1], &r->used[0]);
            if (st != UM_OK) {
                char join[300], wait[300];
                um__error_detail(st, join, sizeof join);
                if ((st = um__fence_wait(x, &r->used[0])) != UM_OK)
                    return um__fail(st,
                                    "the oldest of %d uses of a copy still in flight could be "
                                    "neither merged with the next (%s) nor waited for (%s)",
                                    UM_REPLICA_USES, join, um__error_detail(st, wait, sizeof wait));
            }
            memmove(&r->used[0], &r->used[1], (UM_REPLICA_USES - 1) * sizeof r->used[0]);
            r->nused--;
        }
    }
    r->used[r->nused++] = f;
    return UM_OK;
}

static void drop_uses(um__replica *r)
{
    for (uint32_t i = 0; i < r->nused; i++)
        um__fence_drop(&r->used[i]);
    r->nused = 0;
}

/* A copy out of r (done: its completion, which came after r's filler)
 * that could not be waited for: it stays one of r's uses, so that no
 * write there nor reuse of its memory runs under it. Where the list of
 * uses is full and cannot be merged, it stands for the filler instead. */
static void keep_use(um__xfer *x, um__replica *r, um__fence *done)
{
    if (add_use(x, r, *done) != UM_OK) {
        um__fence_drop(&r->ready);
        r->ready = *done;
    }
    *done = UM_FENCE_NONE;
}

/* The fences a write into r must wait for: its readers and its filler. */
static int write_hazards(const um__replica *r, um__fence *out)
{
    int n = 0;
    for (uint32_t i = 0; i < r->nused; i++)
        out[n++] = r->used[i];
    out[n++] = r->ready;
    return n;
}

/* Orders work queued on s (device dev) after f: a stream wait on a
 * device, a wait on the host for the host's own work (and for an
 * unrecorded f that still has no event). f is dropped once seen
 * complete. */
static um_status order_stream(um__xfer *x, um_context *ctx, int dev, um_stream s, um__fence *f)
{
    if (!um__fence_pending(f) || um__fence_done(x, f))
        return UM_OK;
    if ((dev == 0 && !s) || !f->ev)
        return um__fence_wait(x, f);
    um_stream us = s ? s : ctx->devices[dev].default_stream;
    return um__be_stream_wait(ctx->devices[dev].backend, us->ref.bstream, f->be, f->ev);
}

/* --------------------------------------------------------- replicas */

/* The device d for which ok(b, d, arg) holds with the cheapest copy of b
 * between d and `peer` (from d to peer, or from peer to d when
 * `from_peer`), or -1. */
typedef bool (*candidate_fn)(const um_buffer *b, int d, const void *arg);

static int cheapest(const um_buffer *b, int peer, bool from_peer, candidate_fn ok,
                    const void *arg)
{
    const um__xfer *x = engine(b);
    int best = -1;
    double cost = 0.0;
    for (int d = 0; d < b->ctx->ndevices; d++) {
        if (!ok(b, d, arg))
            continue;
        double c = from_peer ? um__xfer_cost(x, peer, d, b->size) : um__xfer_cost(x, d, peer, b->size);
        if (best < 0 || c < cost) {
            best = d;
            cost = c;
        }
    }
    return best;
}

static bool valid_source(const um_buffer *b, int d, const void *except)
{
    return d != *(const int *)except && b->rep[d].state != UM_REPLICA_INVALID;
}

/* The valid replica (not on `except`) cheapest to copy to device `to`, or
 * -1 when the buffer holds no data yet. */
static int best_source(const um_buffer *b, int to, int except)
{
    return cheapest(b, to, false, valid_source, &except);
}

static int owner_of(const um_buffer *b)
{
    for (int d = 0; d < b->ctx->ndevices; d++)
        if (b->rep[d].state == UM_REPLICA_OWNER)
            return d;
    return -1;
}

static void note_memory(um_buffer *b, int dev, bool has)
{
    uint64_t bit = (uint64_t)1 << dev;
    if (has)
        atomic_fetch_or_explicit(&b->has_memory, bit, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&b->has_memory, ~bit, memory_order_relaxed);
}

/* Memory for the replica on dev, allocated on the stream that will first
 * write it (stream-ordered reuse then needs no other wait). */
static um_status ensure_memory(um_buffer *b, int dev, um_stream first_writer)
{
    um__replica *r = &b->rep[dev];
    if (r->ptr)
        return UM_OK;
    /* Noted before the allocation: once the pool has given the memory,
     * other threads' reclaim must see it held by this call in progress,
     * and wait for it, before um_malloc returns. Noted after, that window
     * hid it: an allocation there found nothing to evict and nothing busy
     * and failed at once (an audit's eight threads at one 2 MiB page saw
     * "0 acquired replicas hold 0 B" beside 1013 KiB live). This thread's
     * own reclaim passes the buffer over (um__reclaim_allocating). */
    note_memory(b, dev, true);
    um_buffer *was = um__reclaim_allocating(b);
    um_status st = um_malloc(b->ctx, dev, b->size, first_writer, &r->ptr);
    um__reclaim_allocating(was);
    if (st == UM_OK)
        um__reclaim_account(um__xfer_reclaim(engine(b)), dev, (int64_t)b->size);
    else
        note_memory(b, dev, false);
    return st;
}

/* The stream a copy from src into dev runs on, for allocating dev's
 * replica (host memory may be ordered by a GPU's stream). */
static um_stream copy_stream(um__xfer *x, int dev, int src)
{
    um_stream s = um__xfer_stream(x, dev, true);
    if (!s && dev == 0 && src >= 0)
        s = um__xfer_stream(x, src, false);
    return s;
}

/* Checks bytes [from, from + n) of b's spill extent before they are read
 * (see spill.c). */
static um_status spill_verify(um_buffer *b, size_t from, size_t n)
{
    um__spill *sp;
    um_status st = um__xfer_spill(engine(b), &sp);
    return st == UM_OK ? um__spill_check(sp, b->spill, b->spill_off, b->size, b->spill_sums,
                                         from, n)
                       : st;
}

/* dev's replica is left without memory: its fences were handed on with
 * the memory or dropped, and it no longer counts as holding any. */
static void memory_gone(um_buffer *b, int dev)
{
    um__replica *r = &b->rep[dev];
    r->ptr = NULL;
    note_memory(b, dev, false);
    r->nused = 0;
    r->ready = UM_FENCE_NONE;
}

/* Hands the replica's memory back once its users are done. */
static void free_replica(um_buffer *b, int dev)
{
    um__replica *r = &b->rep[dev];
    if (!r->ptr)
        return;
    um__xfer *x = engine(b);
    um__fence f[UM_REPLICA_USES + 1];
    int n = write_hazards(r, f);
    if (dev == 0 && b->wrapped) {
        /* The program's memory: its copies must be done when destroy returns. */
        for (int i = 0; i < n; i++)
            if (um__fence_wait(x, &f[i]) != UM_OK)
                um__fence_drop(&f[i]);
    } else {
        um__xfer_free_later(x, dev, r->ptr, f, n);
        um__reclaim_account(um__xfer_reclaim(x), dev, -(int64_t)b->size);
    }
    memory_gone(b, dev);
    r->state = UM_REPLICA_INVALID;
}

/* Makes the replica on dev valid: a copy from the cheapest valid replica,
 * or zeros for a buffer that holds no data yet (that replica becomes the
 * owner). On failure the replica stays invalid, without the memory this
 * call took for it unless a copy still queued writes there, and the
 * others untouched. */
static um_status fill(um_buffer *b, int dev)
{
    um__xfer *x = engine(b);
    um__replica *r = &b->rep[dev];
    int src = best_source(b, dev, dev);
    /* With no valid replica the data may be in the spill file (the host's
     * side of every link: program memory to the engine). */
    bool from_spill = src < 0 && b->spill_valid;
    bool fresh = !r->ptr;
    um_status st = from_spill ? spill_verify(b, 0, b->size) : UM_OK;
    if (st == UM_OK)
        st = ensure_memory(b, dev, copy_stream(x, dev, from_spill ? 0 : src));
    if (st != UM_OK)
        return st;
    um__fence after[UM_REPLICA_USES + 2];
    int n = write_hazards(r, after);
    um__fence done;
    if (from_spill) {
        st = um__xfer_copy(x, dev, r->ptr, 0, b->spill, b->size, after, n, &done);
    } else if (src < 0) {
        st = um__xfer_zero(x, dev, r->ptr, b->size, after, n, &done);
    } else {
        after[n++] = b->rep[src].ready;
        st = um__xfer_copy(x, dev, r->ptr, src, b->rep[src].ptr, b->size, after, n, &done);
    }
    if (st != UM_OK && !done.unrecorded) {
        /* Nothing was queued. Memory taken for this fill goes back: it
         * came in stream order on the copy's stream, maybe behind work
         * that stream waits for (reclaim hands memory on that way), and
         * nothing orders other streams after that. Kept by the invalid
         * replica, it was written on another stream under that work. */
        if (fresh)
            free_replica(b, dev);
        return st;
    }
    /* The copy ran after every earlier user and filler of r. */
    drop_uses(r);
    um__fence_drop(&r->ready);
    r->ready = done;
    if (st != UM_OK) {
        /* Failed, but queued with nothing recording its end: r stays
         * invalid, and both r's memory and the source wait for it. */
        if (src >= 0)
            keep_use(x, &b->rep[src], &done);
        return st;
    }
    if (src >= 0 && done.ev) {
        /* The copy reads the source: writes there, and the reuse of its
         * memory, wait for it. Where no event can be recorded for that
         * now, the copy's stream stands for it (an event recorded there
         * later, or a wait for the stream). */
        um_stream runner = (um_stream)done.stream;
        um__fence use;
        if (um__fence_record(b->ctx, runner->dev, runner, &use) != UM_OK)
            use = um__fence_unrecorded(done.be, runner);
        keep_use(x, &b->rep[src], &use);
    }
    /* Zeros, or the spill file's copy, make the first replica: the owner
     * (a spill copy stays valid beside it until the next write). */
    r->state = src < 0 ? UM_REPLICA_OWNER : UM_REPLICA_SHARED;
    r->last_use = um__xfer_tick(x);
    if (r->evicted && (src >= 0 || from_spill) && um__xfer_reclaim(x))
        um__reclaim_refetched(um__xfer_reclaim(x), dev, b->size);
    r->evicted = false;
    return UM_OK;
}

/* Makes dev's replica the owner and every other copy invalid. */
static void take_ownership(um_buffer *b, int dev)
{
    b->spill_valid = false;
    /* Every other copy is out of date now, evicted or not: a later fill
     * of one is a copy of this write, not a re-fetch of what reclaim
     * dropped (nor is a fill of dev's own, valid again without a copy in
     * after a WRITE_DISCARD). */
    for (int d = 0; d < b->ctx->ndevices; d++) {
        if (d != dev)
            b->rep[d].state = UM_REPLICA_INVALID;
        b->rep[d].evicted = false;
    }
    b->rep[dev].state = UM_REPLICA_OWNER;
}

/* ------------------------------------------------------------- public */

static um_status buffer_new(um_context *ctx, size_t size, const char *what, um_buffer **out)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "%s: ctx is NULL", what);
    *out = NULL;
    if (size == 0)
        return um__fail(UM_ERR_INVALID, "%s: size 0 (a buffer needs at least 1 byte)", what);
    um__xfer *x;
    um_status st = um__xfer_get(ctx, &x);
    if (st != UM_OK)
        return st;
    um__xfer_poll(x);
    um_buffer *b = um__xfer_record(x);
    if (!b)
        return um__fail(UM_ERR_NOMEM, "%s: no host memory for a buffer record", what);
    b->magic = UM_BUFFER_MAGIC;
    b->ctx = ctx;
    b->size = size;
    pthread_mutex_init(&b->lock, NULL);
    for (int d = 0; d < ctx->ndevices; d++) {
        b->rep[d].ready = UM_FENCE_NONE;
        b->rep[d].state = UM_REPLICA_INVALID;
    }
    um__xfer_track(x, b, true);
    *out = b;
    return UM_OK;
}

um_status um_buffer_create(um_context *ctx, size_t size, const um_buffer_opts *o, um_buffer **out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "um_buffer_create: out is NULL");
    /* A replica is whole on one device: a buffer larger than every
     * device's memory could never be used, so it is refused now rather
     * than at its first acquire. */
    int largest = 0;
    for (int d = 1; ctx && d < ctx->ndevices; d++)
        if (ctx->devices[d].backend->capacity > ctx->devices[largest].backend->capacity)
            largest = d;
    const um__backend *lb = ctx ? ctx->devices[largest].backend : NULL;
    if (lb && lb->capacity && size > lb->capacity) {
        *out = NULL;
        char want[32], has[32];
        return um__fail(UM_ERR_NOMEM,
                        "um_buffer_create: %s is more than any device of this context holds "
                        "(the largest, device %d (%s), has %s)",
                        um__format_bytes(want, sizeof want, size), largest, lb->name,
                        um__format_bytes(has, sizeof has, lb->capacity));
    }
    um_buffer *b;
    um_status st = buffer_new(ctx, size, "um_buffer_create", &b);
    *out = st == UM_OK && (!o || o->device == -1) ? b : NULL;
    if (st != UM_OK || !o || o->device == -1)
        return st;
    st = check_device(b, o->device, "um_buffer_create");
    /* The buffer is on the engine's list already, where reclaim may pick
     * its replica while fill allocates and zeroes it: under the buffer's
     * lock, as every other change of a replica (found by the stress test:
     * an eviction mid-fill left an owner without memory). */
    if (st == UM_OK) {
        um__vt_mutex_lock(&b->lock);
        st = fill(b, o->device);
        um__vt_mutex_unlock(&b->lock);
    }
    if (st != UM_OK) {
        um__buffer_discard(b);
        return st;
    }
    *out = b;
    return UM_OK;
}

um_status um_buffer_wrap(um_context *ctx, void *host_ptr, size_t size, um_buffer **out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "um_buffer_wrap: out is NULL");
    *out = NULL;
    if (!host_ptr)
        return um__fail(UM_ERR_INVALID, "um_buffer_wrap: host_ptr is NULL (%zu bytes)", size);
    um_buffer *b;
    um_status st = buffer_new(ctx, size, "um_buffer_wrap", &b);
    if (st != UM_OK)
        return st;
    /* Under the lock, as in um_buffer_create: reclaim may already look at
     * the buffer, and must never see the program's memory as a replica
     * of the pool's (it would free it). */
    um__vt_mutex_lock(&b->lock);
    b->wrapped = true;
    b->rep[0].ptr = host_ptr;
    /* Not noted in has_memory: that memory is the program's, and no call
     * on the buffer that ends gives the host's pool any of it. Noted,
     * reclaim waited for such a call (a destroy waiting for a copy out of
     * it, say) and then failed the host allocation all the same. */
    b->rep[0].state = UM_REPLICA_OWNER;
    um__vt_mutex_unlock(&b->lock);
    *out = b;
    return UM_OK;
}

static bool writes(um_access mode)
{
    return mode != UM_ACCESS_READ;
}

/* Why an acquisition in `mode` cannot be had now, or UM_OK. */
static um_status conflict(const um_buffer *b, um_access mode, const char *what)
{
    for (int d = 0; d < b->ctx->ndevices; d++) {
        const um__replica *r = &b->rep[d];
        if (r->writer)
            return um__fail(UM_ERR_BUSY, "%s: buffer %p is acquired for writing on device %d",
                            what, (const void *)b, d);
        if (r->readers && writes(mode))
            return um__fail(UM_ERR_BUSY,
                            "%s: buffer %p is acquired for reading on device %d (%u time%s); "
                            "a write needs it alone",
                            what, (const void *)b, d, r->readers, r->readers == 1 ? "" : "s");
    }
    return UM_OK;
}

um_status um_buffer_acquire(um_buffer *b, int dev, um_access mode, um_stream s, void **ptr)
{
    static const char what[] = "um_buffer_acquire";
    /* Every failure leaves *ptr NULL, a dead handle's too, so that a caller
     * who ignores the status faults at once rather than on stale memory. */
    if (ptr)
        *ptr = NULL;
    if (!live(b))
        return bad_buffer(what, b);
    if (!ptr)
        return um__fail(UM_ERR_INVALID, "%s: buffer %p: ptr is NULL", what, (void *)b);
    um_status st = check_device(b, dev, what);
    if (st == UM_OK)
        st = check_stream(b, dev, s, what);
    if (st != UM_OK)
        return st;
    if (mode != UM_ACCESS_READ && mode != UM_ACCESS_WRITE && mode != UM_ACCESS_READ_WRITE &&
        mode != UM_ACCESS_WRITE_DISCARD)
        return um__fail(UM_ERR_INVALID,
                        "%s: buffer %p: mode %d is none of READ (1), WRITE (2), READ_WRITE (3), "
                        "WRITE_DISCARD (4)",
                        what, (void *)b, (int)mode);
    um__xfer *x = engine(b);
    if ((st = lock_live(b, what)) != UM_OK)
        return st;
    st = conflict(b, mode, what);
    um__replica *r = &b->rep[dev];
    if (st == UM_OK && r->state == UM_REPLICA_INVALID) {
        if (mode == UM_ACCESS_WRITE_DISCARD)
            st = ensure_memory(b, dev, s);
        else
            st = fill(b, dev);
    }
    if (st == UM_OK && writes(mode)) {
        /* The program's writes on s come after every earlier reader and
         * the filler; its release fence will stand for all of them. */
        st = order_stream(x, b->ctx, dev, s, &r->ready);
        for (uint32_t i = 0; st == UM_OK && i < r->nused; i++)
            st = order_stream(x, b->ctx, dev, s, &r->used[i]);
        if (st == UM_OK) {
            drop_uses(r);
            um__fence_drop(&r->ready);
            b->discarding = r->state == UM_REPLICA_INVALID && mode == UM_ACCESS_WRITE_DISCARD;
            if (!b->discarding)
                take_ownership(b, dev);
            r->writer = true;
        }
    } else if (st == UM_OK) {
        st = order_stream(x, b->ctx, dev, s, &r->ready);
        if (st == UM_OK)
            r->readers++;
    }
    if (st == UM_OK) {
        b->holders++;
        r->last_use = um__xfer_tick(x);
        if (b->last_acquire)
            b->reuse_interval = r->last_use - b->last_acquire;
        b->last_acquire = r->last_use;
        /* This use was the oldest announced one; WONT_USE no longer holds. */
        if (b->nannounced)
            memmove(b->announced, b->announced + 1, --b->nannounced * sizeof *b->announced);
        b->wont_use = false;
        *ptr = r->ptr;
    }
    um__vt_mutex_unlock(&b->lock);
    return st;
}

um_status um_buffer_release(um_buffer *b, int dev, um_stream s)
{
    return um__buffer_release(b, dev, s, true);
}

um_status um__buffer_release(um_buffer *b, int dev, um_stream s, bool used)
{
    static const char what[] = "um_buffer_release";
    if (!live(b))
        return bad_buffer(what, b);
    um_status st = check_device(b, dev, what);
    if (st == UM_OK)
        st = check_stream(b, dev, s, what);
    if (st != UM_OK)
        return st;
    um__xfer *x = engine(b);
    if ((st = lock_live(b, what)) != UM_OK)
        return st;
    um__replica *r = &b->rep[dev];
    if (!r->writer && !r->readers) {
        um__vt_mutex_unlock(&b->lock);
        return um__fail(UM_ERR_INVALID, "%s: buffer %p is not acquired on device %d", what,
                        (void *)b, dev);
    }
    um__fence f;
    st = um__fence_record(b->ctx, dev, s, &f);
    if (st != UM_OK) {
        /* No event: the stream's work is waited for here instead. Where
         * that fails too, nothing would stand for the work, and the
         * replica could be written or its memory reused under it: the
         * buffer stays acquired, to be released again. */
        char record[300], wait[300];
        um__error_detail(st, record, sizeof record);
        um_stream us = s ? s : b->ctx->devices[dev].default_stream;
        st = um__be_stream_sync(b->ctx->devices[dev].backend, us->ref.bstream);
        if (st != UM_OK) {
            um__error_detail(st, wait, sizeof wait);
            um__vt_mutex_unlock(&b->lock);
            return um__fail(st,
                            "%s: buffer %p on device %d: the work on its stream can be neither "
                            "fenced (%s) nor waited for (%s); the buffer stays acquired, to be "
                            "released again",
                            what, (void *)b, dev, record, wait);
        }
    }
    r->last_use = um__xfer_tick(x);
    if (r->writer) {
        r->writer = false;
        r->ready = f;
        if (b->discarding && used)
            take_ownership(b, dev);
        b->discarding = false;
    } else {
        um_status su = add_use(x, r, f);
        if (su != UM_OK) {
            /* No fence stands for this reader: released, the memory could
             * be written or reused under its work. */
            char why[600];
            um__error_detail(su, why, sizeof why);
            um__fence_drop(&f);
            um__vt_mutex_unlock(&b->lock);
            return um__fail(su,
                            "%s: buffer %p on device %d: this read's use cannot be noted: %s; "
                            "the buffer stays acquired, to be released again",
                            what, (void *)b, dev, why);
        }
        r->readers--;
    }
    b->holders--;
    um__vt_mutex_unlock(&b->lock);
    return st;
}

um_status um_buffer_prefetch(um_buffer *b, int dev)
{
    static const char what[] = "um_buffer_prefetch";
    if (!live(b))
        return bad_buffer(what, b);
    um_status st = check_device(b, dev, what);
    if (st != UM_OK || (st = lock_live(b, what)) != UM_OK)
        return st;
    st = conflict(b, UM_ACCESS_READ, what);
    if (st == UM_OK && b->rep[dev].state == UM_REPLICA_INVALID)
        st = fill(b, dev);
    um__vt_mutex_unlock(&b->lock);
    return st;
}

/* The argument checks of um_buffer_read and um_buffer_write. */
static um_status check_io(const um_buffer *b, size_t offset, const void *p, size_t n,
                          const char *what)
{
    return live(b) ? check_range(b, offset, p, n, what) : bad_buffer(what, b);
}

/* A read whose copy out of device src's replica cannot be waited for (b
 * locked; st the wait's failure): the copy may still read the replica, so
 * it stays a use of it (dropped, the next write or eviction raced the
 * copy). The program's dst may still be written too, which the error
 * says. */
static um_status read_unwaited(um_buffer *b, int src, um__fence *done, const void *dst, size_t n,
                               um_status st)
{
    char why[300];
    um__error_detail(st, why, sizeof why);
    keep_use(engine(b), &b->rep[src], done);
    return um__fail(st,
                    "um_buffer_read: buffer %p: the copy of %zu bytes from device %d to %p "
                    "cannot be waited for (%s): it may still be writing there, and device %d's "
                    "copy is kept until it is done",
                    (void *)b, n, src, dst, why, src);
}

um_status um_buffer_read(um_buffer *b, size_t offset, void *dst, size_t n)
{
    static const char what[] = "um_buffer_read";
    um_status st = check_io(b, offset, dst, n, what);
    if (st != UM_OK || n == 0)
        return st;
    um__xfer *x = engine(b);
    if ((st = lock_live(b, what)) != UM_OK)
        return st;
    st = conflict(b, UM_ACCESS_READ, what);
    int src = st == UM_OK ? best_source(b, 0, -1) : -1;
    if (st == UM_OK && src < 0 && b->spill_valid) {
        /* Through the engine, as every other read: it is a copy to the
         * host, which the link statistics count. */
        um__fence done;
        st = spill_verify(b, offset, n);
        if (st == UM_OK)
            st = um__xfer_copy(x, 0, dst, 0, (const char *)b->spill + offset, n, NULL, 0, &done);
        if (st == UM_OK && (st = um__fence_wait(x, &done)) != UM_OK)
            um__fence_drop(&done);
    } else if (st == UM_OK && src < 0) {
        memset(dst, 0, n); /* a new buffer reads as zeros */
    } else if (st == UM_OK) {
        um__fence done;
        st = um__xfer_copy(x, 0, dst, src, (char *)b->rep[src].ptr + offset, n,
                           &b->rep[src].ready, 1, &done);
        if (st == UM_OK)
            st = um__fence_wait(x, &done);
        if (st != UM_OK && um__fence_pending(&done))
            st = read_unwaited(b, src, &done, dst, n, st);
    }
    um__vt_mutex_unlock(&b->lock);
    return st;
}

/* A failed write into the buffer's only valid copy (no other replica and
 * no spill copy holds the range's old bytes): the copy may have stopped
 * midway (a staged one lands chunk by chunk) or ended unknown (its wait
 * failed), so the range may be partly written, as after a failed
 * cudaMemcpy; the rest of the buffer is untouched. Keeping the old bytes
 * would cost a copy of the range out before every such write, half of a
 * pageable write's bandwidth, so the error says so instead (an audit
 * found the mix reported only as the copy's failure). st's message stays
 * first. */
static um_status range_unknown(const um_buffer *b, int dev, size_t offset, size_t n, um_status st)
{
    char why[768];
    return um__fail(st,
                    "%s; bytes %zu-%zu of buffer %p on device %d, its only valid copy, may be "
                    "partly written; the rest of the buffer is unchanged",
                    um__error_detail(st, why, sizeof why), offset, offset + n - 1,
                    (const void *)b, dev);
}

um_status um_buffer_write(um_buffer *b, size_t offset, const void *src, size_t n)
{
    static const char what[] = "um_buffer_write";
    um_status st = check_io(b, offset, src, n, what);
    if (st != UM_OK || n == 0)
        return st;
    um__xfer *x = engine(b);
    if ((st = lock_live(b, what)) != UM_OK)
        return st;
    st = conflict(b, UM_ACCESS_WRITE, what);
    int dev = owner_of(b);
    if (st == UM_OK && dev < 0) {
        /* No data yet: the host gets the first replica, zeros unless this
         * write covers it all. */
        dev = 0;
        if (n == b->size)
            st = ensure_memory(b, 0, NULL);
        else
            st = fill(b, 0);
    }
    if (st == UM_OK) {
        um__replica *r = &b->rep[dev];
        um__fence after[UM_REPLICA_USES + 1], done;
        int na = write_hazards(r, after);
        st = um__xfer_copy(x, dev, (char *)r->ptr + offset, 0, src, n, after, na, &done);
        um_status waited = st == UM_OK ? um__fence_wait(x, &done) : st;
        if (st == UM_OK || done.unrecorded) {
            /* The copy was issued (failed with it queued, done is its
             * stream): r's bytes are no longer what the other replicas
             * hold, and its end (done) orders every later use. */
            drop_uses(r);
            um__fence_drop(&r->ready);
            r->ready = waited == UM_OK ? UM_FENCE_NONE : done;
            int other = best_source(b, dev, dev);
            if (waited == UM_OK || (other < 0 && !b->spill_valid)) {
                take_ownership(b, dev);
                if (waited != UM_OK)
                    waited = range_unknown(b, dev, offset, n, waited);
            } else {
                /* A failed write leaves the old data where another copy
                 * holds it, rather than r's unknown mix. */
                if (other >= 0)
                    b->rep[other].state = UM_REPLICA_OWNER;
                r->state = UM_REPLICA_INVALID;
            }
            st = waited;
        } else if (r->state != UM_REPLICA_INVALID) {
            /* A copy that failed may have stopped midway (a staged one
             * lands chunk by chunk), so r's bytes are unknown too: where
             * another copy holds the old data, that one owns it. */
            int other = best_source(b, dev, dev);
            if (other >= 0 || b->spill_valid) {
                if (other >= 0 && r->state == UM_REPLICA_OWNER)
                    b->rep[other].state = UM_REPLICA_OWNER;
                r->state = UM_REPLICA_INVALID;
            } else {
                st = range_unknown(b, dev, offset, n, st);
            }
        }
    }
    um__vt_mutex_unlock(&b->lock);
    return st;
}

/* A wrapped buffer's newest data goes back into the program's memory
 * before the buffer goes: that memory is the buffer's home. The copies
 * into and out of it are waited for: the program's once the buffer goes.
 * Where one cannot be, the buffer stays (its destroy had returned with a
 * copy still writing the program's memory). */
static um_status write_back_home(um_buffer *b)
{
    if (!b->wrapped)
        return UM_OK;
    um_status filled = b->rep[0].state == UM_REPLICA_INVALID ? fill(b, 0) : UM_OK;
    if (filled != UM_OK) {
        /* fill's message is copied out first: um__fail formats into the
         * same buffer, and quoting it there wrote the new message over
         * the cause (the driver call that failed) as it was read. */
        char why[300];
        return um__fail(UM_ERR_BACKEND,
                        "buffer %p: its newest data (on device %d) could not be "
                        "copied back to the wrapped host memory %p: %s",
                        (void *)b, owner_of(b), b->rep[0].ptr,
                        um__error_detail(filled, why, sizeof why));
    }
    um__replica *r = &b->rep[0];
    um_status st = um__fence_wait(engine(b), &r->ready);
    for (uint32_t i = 0; st == UM_OK && i < r->nused; i++)
        st = um__fence_wait(engine(b), &r->used[i]);
    if (st != UM_OK) {
        char why[300];
        return um__fail(st,
                        "buffer %p: a copy into or out of the wrapped host memory %p cannot be "
                        "waited for (%s); the buffer stays",
                        (void *)b, r->ptr, um__error_detail(st, why, sizeof why));
    }
    return UM_OK;
}

void um__buffer_discard(um_buffer *b)
{
    if (write_back_home(b) != UM_OK)
        um__log(UM_LOG_ERROR, "%s", um_last_error());
    um__xfer *x = engine(b);
    um__reclaim *rc = um__xfer_reclaim(x);
    bool had[UM_MAX_DEVICES];
    /* Under the lock: reclaim reads it under the lock until the buffer is
     * off the engine's list. From there until each replica's memory is
     * freed, reclaim finds it nowhere: the count says it is coming back
     * (without it an allocation failed with "nothing left to evict" in
     * that window, under ASan on a loaded machine). */
    um__vt_mutex_lock(&b->lock);
    b->magic = 0;
    /* The program's memory under a wrapped buffer comes back to no pool. */
    for (int d = 0; d < b->ctx->ndevices; d++)
        if ((had[d] = b->rep[d].ptr != NULL && !(d == 0 && b->wrapped)))
            um__reclaim_destroying(rc, d, 1);
    um__vt_mutex_unlock(&b->lock);
    um__xfer_track(x, b, false);
    for (int d = 0; d < b->ctx->ndevices; d++) {
        free_replica(b, d);
        if (had[d])
            um__reclaim_destroying(rc, d, -1);
    }
    um__spill *sp;
    if (b->spill && um__xfer_spill(x, &sp) == UM_OK)
        um__spill_free(sp, b->spill, b->spill_off, b->size);
    b->spill = NULL;
    b->spill_valid = false;
    free(b->spill_sums);
    b->spill_sums = NULL;
    free(b->announced);
    /* The lock stays whole while the record waits for reuse: a call that
     * found the handle live just before the destroy ended it takes the lock
     * after, finds it dead and fails (lock_live). It is made again when
     * the record is, and destroyed with the records at shutdown. */
    um__xfer_recycle(x, b);
}

/* A destroy's refusal while the buffer is acquired. */
static um_status still_acquired(const char *what, const um_buffer *b, unsigned holders)
{
    return um__fail(UM_ERR_BUSY, "%s: buffer %p is still acquired (%u acquisition%s held)", what,
                    (const void *)b, holders, holders == 1 ? "" : "s");
}

um_status um_buffer_destroy(um_buffer *b)
{
    static const char what[] = "um_buffer_destroy";
    if (!b)
        return UM_OK;
    if (!live(b))
        return bad_buffer(what, b);
    /* Every check that can refuse comes before the task layer forgets the
     * buffer's record: a refused destroy must leave its last writer (and
     * a failure to inherit) in place (found by the stress test). The
     * record is forgotten outside the buffer's lock, which the task
     * layer's lock never nests in. */
    um__vt_mutex_lock(&b->lock);
    um_status st = b->holders ? UM_ERR_BUSY : write_back_home(b);
    unsigned holders = b->holders;
    um__vt_mutex_unlock(&b->lock);
    if (holders)
        return still_acquired(what, b, holders);
    if (st != UM_OK)
        return st; /* the buffer stays, with its data */
    bool (*forget)(um_context *, const um_buffer *) =
        atomic_load_explicit(&b->ctx->forget_buffer, memory_order_acquire);
    if (forget && !forget(b->ctx, b))
        return um__fail(UM_ERR_BUSY, "%s: buffer %p is used by tasks that have not finished "
                        "(um_task_wait or um_wait_all first)", what, (void *)b);
    /* The lock was let go for the task layer: another thread may have
     * acquired the buffer (or destroyed it) meanwhile. Ended only as
     * checked under the lock that ends it; an audit's destroy freed the
     * replicas of a buffer acquired in that window (a use after free). */
    um__vt_mutex_lock(&b->lock);
    if (b->magic != UM_BUFFER_MAGIC) {
        um__vt_mutex_unlock(&b->lock);
        return bad_buffer(what, b);
    }
    holders = b->holders;
    if (!holders)
        b->magic = 0;
    um__vt_mutex_unlock(&b->lock);
    if (holders)
        return still_acquired(what, b, holders);
    um__xfer *x = engine(b);
    um__buffer_discard(b);
    um__xfer_poll(x);
    return UM_OK;
}

size_t um_buffer_size(const um_buffer *b)
{
    return live(b) ? b->size : 0;
}

um_replica_state um_buffer_replica_state(um_buffer *b, int dev)
{
    if (!live(b) || dev < 0 || dev >= b->ctx->ndevices)
        return UM_REPLICA_INVALID;
    um__vt_mutex_lock(&b->lock);
    um_replica_state s = (um_replica_state)b->rep[dev].state;
    /* During a WRITE_DISCARD acquisition the program sees what its release
     * makes: the acquired replica the owner, the copies it replaces gone. */
    if (b->discarding)
        s = b->rep[dev].writer ? UM_REPLICA_OWNER : UM_REPLICA_INVALID;
    um__vt_mutex_unlock(&b->lock);
    return s;
}

/* ------------------------------------------------------------ eviction */

typedef struct target_arg {
    int dev;          /* the device written back from */
    const bool *skip; /* targets that failed already */
} target_arg;

/* The host, or a device other than the source with room for b. */
static bool write_back_ok(const um_buffer *b, int d, const void *arg)
{
    const target_arg *t = arg;
    /* A replica a WRITE_DISCARD holds is the program's to write: a copy
     * into it would race with those writes. */
    if (d == t->dev || t->skip[d] || b->rep[d].writer)
        return false;
    if (d == 0 || b->rep[d].ptr)
        return true;
    return b->size <= um__device_room(&b->ctx->devices[d]) &&
           um__reclaim_write_back_ok(um__xfer_reclaim(engine(b)), d, b->size);
}

/* Where the only valid copy on dev goes before it is dropped: the host or
 * another device with room for it, cheapest link first; -1 if none. The
 * host's own replicas are never written elsewhere (the host is their
 * home). Tried in order by the caller; `skip` lists failed targets. */
static int write_back_target(um_buffer *b, int dev, const bool *skip)
{
    target_arg t = {dev, skip};
    return dev == 0 ? -1 : cheapest(b, dev, true, write_back_ok, &t);
}

bool um__buffer_valid_elsewhere(const um_buffer *b, int dev)
{
    return b->spill_valid || best_source(b, dev, dev) >= 0;
}

bool um__buffer_evictable(const um_buffer *b, int dev)
{
    const um__replica *r = &b->rep[dev];
    /* A pin keeps the buffer's data, which an out-of-date replica does not
     * hold: its memory may go as any other invalid replica's. */
    bool pinned = b->pinned && r->state != UM_REPLICA_INVALID;
    return r->ptr && !r->readers && !r->writer && !pinned &&
           !(dev == 0 && b->wrapped) &&
           (dev != 0 || r->state == UM_REPLICA_INVALID || um__buffer_valid_elsewhere(b, dev) ||
            b->ctx->opts.spill_dir[0]);
}

/* Writes the only valid copy, dev's replica, to b's spill extent (made on
 * first use; a kept one has its blocks allocated again, as the file may
 * have been truncated since) and waits for it. On failure nothing changes
 * but a new extent, kept for the next try. */
static um_status spill_out(um_buffer *b, int dev)
{
    um__xfer *x = engine(b);
    um__spill *sp;
    um_status st = um__xfer_spill(x, &sp);
    if (st == UM_OK)
        st = b->spill ? um__spill_prepare(sp, b->spill_off, b->size)
                      : um__spill_alloc(sp, b->size, &b->spill, &b->spill_off);
    if (st == UM_OK && !b->spill_sums &&
        !(b->spill_sums = malloc(um__spill_sums(b->size) * sizeof *b->spill_sums)))
        st = um__fail(UM_ERR_NOMEM, "spill: no memory for the checksums of %zu bytes", b->size);
    um__replica *r = &b->rep[dev];
    um__fence done = UM_FENCE_NONE;
    if (st == UM_OK)
        st = um__xfer_copy(x, 0, b->spill, dev, r->ptr, b->size, &r->ready, 1, &done);
    if (st != UM_OK && done.unrecorded) {
        /* The copy may still write the extent, which nothing frees after
         * it: it is left to it (leaked in the file), and the next spill
         * takes a new one. */
        b->spill = NULL;
        b->spill_off = 0;
    }
    if (st == UM_OK)
        st = um__fence_wait(x, &done);
    if (st != UM_OK && um__fence_pending(&done)) {
        /* The copy may still read the replica, which stays (dropped, the
         * next write there raced the copy); the extent stays invalid. */
        char why[300];
        um__error_detail(st, why, sizeof why);
        keep_use(x, r, &done);
        return um__fail(st,
                        "writing device %d's copy of buffer %p to the spill file: the copy "
                        "cannot be waited for (%s); device %d's copy is kept",
                        dev, (void *)b, why, dev);
    }
    if (st == UM_OK) {
        um__spill_seal(b->spill, b->size, b->spill_sums);
        b->spill_valid = true;
    }
    return st;
}

um_status um__buffer_evict(um_buffer *b, int dev, size_t *bytes_written, bool *spilled)
{
    *bytes_written = 0;
    *spilled = false;
    um__replica *r = &b->rep[dev];
    if (!um__buffer_evictable(b, dev))
        return UM_ERR_BUSY;
    um__xfer *x = engine(b);
    /* Data a WRITE_DISCARD acquisition is replacing is written back like
     * any other only copy: the acquisition may be given back unused (its
     * task did not run), and then that copy is the buffer's data. */
    if (r->state != UM_REPLICA_INVALID) {
        int other = best_source(b, dev, dev);
        bool skip[UM_MAX_DEVICES] = {false};
        /* The first write-back that failed other than for room, for the
         * message: without it a failed copy read as if no memory had room. */
        char failed[400] = "";
        while (other < 0 && !b->spill_valid) {
            int t = write_back_target(b, dev, skip);
            if (t < 0) {
                /* No memory has room: the file tier is the last. */
                um_status spilt = spill_out(b, dev);
                if (spilt != UM_OK) {
                    char why[300]; /* um__fail writes where um_last_error points */
                    um__error_detail(spilt, why, sizeof why);
                    return um__fail(UM_ERR_NOMEM,
                                    "buffer %p (%zu bytes): its only valid copy, on device %d, "
                                    "has nowhere to go: %s%s",
                                    (void *)b, b->size, dev, failed, why);
                }
                *bytes_written = b->size;
                *spilled = true;
                break;
            }
            /* A write-back is no re-fetch, even into a replica reclaim
             * dropped before: it is counted as written back only. */
            bool was_evicted = b->rep[t].evicted, had_memory = b->rep[t].ptr != NULL;
            b->rep[t].evicted = false;
            um_status st = fill(b, t);
            if (st == UM_OK) {
                other = t;
                *bytes_written = b->size;
            } else {
                b->rep[t].evicted = was_evicted;
                /* Memory taken for this write-back goes back at once
                 * (fill gave it back already where nothing was queued;
                 * here a copy left queued holds it until done): kept as
                 * an invalid replica, it left the next candidate's
                 * write-back no room on the same target (reclaim never
                 * makes room on a target), and the allocation failed. */
                if (!had_memory)
                    free_replica(b, t);
                skip[t] = true;
                /* A target found full after all is what "nowhere to go"
                 * says already. */
                if (!failed[0] && st != UM_ERR_NOMEM) {
                    char why[300];
                    snprintf(failed, sizeof failed, "writing it back to device %d failed (%s); ", t,
                             um__error_detail(st, why, sizeof why));
                }
            }
        }
        if (r->state == UM_REPLICA_OWNER && other >= 0)
            b->rep[other].state = UM_REPLICA_OWNER;
    }
    /* The memory goes back now, for the allocation that needs the room.
     * On a GPU it goes to the copy-in stream after that stream waits for
     * the replica's users: the copy that takes the room is queued right
     * behind them, and the host never waits (waiting here kept one copy in
     * flight at a time). Elsewhere the users are waited for. */
    um__fence f[UM_REPLICA_USES + 1];
    int n = write_hazards(r, f);
    um_stream in = um__xfer_stream(x, dev, true);
    um_status unwaited = UM_OK;
    char why[300] = "";
    for (int i = 0; i < n; i++) {
        if (in &&
            (!um__fence_pending(&f[i]) || um__fence_done(x, &f[i]) ||
             um__xfer_order_in(x, dev, &f[i]) == UM_OK))
            continue;
        /* Where the stream could not wait, the host does. */
        um_status st = um__fence_wait(x, &f[i]);
        if (st != UM_OK && unwaited == UM_OK) {
            unwaited = st;
            um__error_detail(st, why, sizeof why);
        }
    }
    if (unwaited != UM_OK) {
        /* A user, perhaps the write-back just queued, may still read the
         * memory, and nothing orders its next owner after it: the memory
         * stays with the replica, whose fences stay as they were (those
         * seen done are gone), valid beside the copy written back. */
        r->nused = 0;
        for (int i = 0; i < n - 1; i++)
            if (um__fence_pending(&f[i]))
                r->used[r->nused++] = f[i];
        r->ready = f[n - 1];
        if (r->state == UM_REPLICA_OWNER && best_source(b, dev, dev) >= 0)
            r->state = UM_REPLICA_SHARED; /* the copy written back owns the data */
        return um__fail(unwaited,
                        "buffer %p (%zu bytes): device %d's copy cannot be dropped: the work "
                        "using it could neither be ordered before its memory's reuse nor "
                        "waited for (%s); the memory is kept",
                        (void *)b, b->size, dev, why);
    }
    for (int i = 0; i < n; i++)
        um__fence_drop(&f[i]);
    /* On `in` whenever there is one: a fence it waited for stands only
     * there, even where a later one had to be waited for here. */
    (void)um_free(b->ctx, r->ptr, in);
    um__reclaim_account(um__xfer_reclaim(x), dev, -(int64_t)b->size);
    memory_gone(b, dev);
    /* Only dropped data makes a later fill a re-fetch: the memory of an
     * out-of-date copy costs no copy back (its fill is the newer write's). */
    r->evicted = r->evicted || r->state != UM_REPLICA_INVALID;
    r->state = UM_REPLICA_INVALID;
    return UM_OK;
}

bool um__buffer_fetch_cost(um_buffer *b, int dev, double *ns)
{
    *ns = 0.0;
    um__vt_mutex_lock(&b->lock);
    bool valid = b->rep[dev].state != UM_REPLICA_INVALID;
    if (!valid) {
        int src = best_source(b, dev, dev);
        if (src >= 0)
            *ns = um__xfer_cost(engine(b), src, dev, b->size);
        else if (b->spill_valid)
            *ns = um__xfer_cost(engine(b), 0, dev, b->size);
    }
    um__vt_mutex_unlock(&b->lock);
    return valid;
}

/* Appends a WILL_USE announcement to b's list (b locked); *ticket, when
 * not NULL, names it for um__buffer_withdraw. */
static um_status announce(um_buffer *b, uint64_t *ticket, const char *what)
{
    if (b->nannounced == b->announced_cap) {
        uint32_t cap = b->announced_cap ? 2 * b->announced_cap : 8;
        uint64_t *a = realloc(b->announced, cap * sizeof *a);
        if (!a)
            return um__fail(UM_ERR_NOMEM, "%s: buffer %p: no host memory for an announcement", what,
                            (void *)b);
        b->announced = a;
        b->announced_cap = cap;
    }
    uint64_t tick = um__xfer_tick(engine(b));
    b->announced[b->nannounced++] = tick;
    b->wont_use = false;
    um__reclaim_announced(um__xfer_reclaim(engine(b)));
    if (ticket)
        *ticket = tick;
    return UM_OK;
}

um_status um__buffer_announce(um_buffer *b, uint64_t *ticket)
{
    *ticket = 0;
    if (!live(b))
        return bad_buffer("um__buffer_announce", b);
    um__vt_mutex_lock(&b->lock);
    um_status st = announce(b, ticket, "um__buffer_announce");
    um__vt_mutex_unlock(&b->lock);
    return st;
}

void um__buffer_withdraw(um_buffer *b, uint64_t ticket)
{
    if (!ticket || !live(b))
        return;
    um__vt_mutex_lock(&b->lock);
    /* Acquisitions take the oldest announcement, whichever use made it:
     * when one took this ticket, the oldest left stands for this use. */
    uint32_t i = 0;
    while (i < b->nannounced && b->announced[i] != ticket)
        i++;
    if (i == b->nannounced)
        i = 0;
    if (b->nannounced) {
        b->nannounced--;
        memmove(b->announced + i, b->announced + i + 1, (b->nannounced - i) * sizeof *b->announced);
    }
    um__vt_mutex_unlock(&b->lock);
}

um_status um_buffer_hint(um_buffer *b, um_hint hint)
{
    static const char what[] = "um_buffer_hint";
    if (!live(b))
        return bad_buffer(what, b);
    if (hint != UM_HINT_WONT_USE && hint != UM_HINT_WILL_USE && hint != UM_HINT_PIN &&
        hint != UM_HINT_UNPIN)
        return um__fail(UM_ERR_INVALID,
                        "%s: buffer %p: hint %d is none of WONT_USE (1), WILL_USE (2), PIN (3), "
                        "UNPIN (4)", what, (void *)b, (int)hint);
    um_status st = lock_live(b, what);
    if (st != UM_OK)
        return st;
    switch (hint) {
    case UM_HINT_WONT_USE:
        b->wont_use = true;
        break;
    case UM_HINT_WILL_USE:
        st = announce(b, NULL, what);
        break;
    case UM_HINT_PIN:
        b->pinned = true;
        break;
    default:
        b->pinned = false;
        break;
    }
    um__vt_mutex_unlock(&b->lock);
    return st;
}
