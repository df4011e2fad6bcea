/*
 * memory: the public calls on pooled memory (um_malloc, um_free,
 * um_pointer_device) and memory control (limits, trim, statistics). It owns
 * no state: it validates arguments and forwards to the allocator of the
 * device, which context.c created, or for blocks marked by
 * um_record_stream to stream_use.c. um_malloc and um_free are the hot path:
 * on success they take no lock, allocate nothing and format nothing.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

/* The message for a stream handle that is not a live stream of ctx. */
static um_status bad_stream(const char *what, um_stream s)
{
    return um__fail(UM_ERR_INVALID, "%s: %p is not a live stream of this context", what, (void *)s);
}

static const char *dev_name(um_context *ctx, int dev)
{
    return ctx->devices[dev].backend->name;
}

/* Set while this thread's allocations must not evict (um__alloc_no_reclaim). */
static _Thread_local bool no_reclaim;

/* At the memory limit: room is made (buffer replicas evicted, one per call
 * of the hook) and the allocation retried, for as long as making room
 * frees something, or until the hook has found nothing to evict a few
 * times in a row. A last call for 0 bytes tells the hook the allocation
 * is over and whether it was made, so that it counts it once, with its
 * whole wait, and as failed only if it failed. */
static um_status alloc_after_reclaim(um_context *ctx, int dev, size_t size,
                                     const um__stream_ref *ref, void **ptr)
{
    um__allocator *a = ctx->devices[dev].alloc;
    bool (*reclaim)(um_context *, int, size_t, bool) =
        atomic_load_explicit(&ctx->reclaim, memory_order_acquire);
    /* A request larger than the limit itself cannot fit however much is
     * evicted: nothing is dropped for it (found by fuzzing: four buffers
     * written back for a request of SIZE_MAX - 255 bytes). Nor can one
     * whose granules alone exceed it, since blocks span whole granules. */
    size_t limit = a->memory_limit, granule = a->backend->granularity;
    if (!reclaim || size > limit || um__align_up(size, granule) > limit)
        return UM_ERR_NOMEM;
    /* What the pool and the hook said last (copied: um__fail writes the
     * buffer um_last_error points into). */
    char pool_says[512], reclaim_says[512] = "";
    um_status st = UM_ERR_NOMEM;
    /* Calls in a row that found nothing to evict, each followed by a try
     * that failed. One is not enough to fail: other threads may fill the
     * device between the hook's look and the try, with replicas the next
     * look can evict (an audit's stress test in virtual time saw "nothing
     * left to evict" with the device empty at the look and full of
     * evictable replicas at the try). A few in a row bound the calls. */
    enum { NOTHING_TO_EVICT_TRIES = 3 };
    unsigned found_nothing = 0;
    for (;;) {
        bool made_room = reclaim(ctx, dev, size, false);
        if (!made_room)
            snprintf(reclaim_says, sizeof reclaim_says, "%s", um_last_error());
        /* Tried again even when the hook found nothing to evict: another
         * thread (the background reclaimer, a free) may have made room
         * since the last try. Without this try, an allocation failed
         * while the reclaimer had just evicted the very replica it would
         * have evicted (`unimem sim --engine runtime`, a GPU with room for
         * one task's three tiles). The failure before it was not the
         * call's last. */
        atomic_fetch_add_explicit(&ctx->devices[dev].ooms_retried, 1, memory_order_release);
        (void)um__host_nomem_take(); /* not left by the eviction's own allocations */
        st = a->ops->alloc(a, size, ref, ptr);
        if (st != UM_ERR_NOMEM || um__host_nomem_take()) {
            (void)reclaim(ctx, dev, 0, st == UM_OK);
            return st;
        }
        snprintf(pool_says, sizeof pool_says, "%s", um_last_error());
        found_nothing = made_room ? 0 : found_nothing + 1;
        if (found_nothing == NOTHING_TO_EVICT_TRIES)
            break;
    }
    (void)reclaim(ctx, dev, 0, false);
    const char *pool = strchr(pool_says, ':'), *why = strchr(reclaim_says, ':');
    return um__fail(UM_ERR_NOMEM, "%s;%s", pool ? pool + 2 : pool_says, why ? why + 1 : "");
}

/* Whether s is a live stream of ctx on device dev: what the fast paths of
 * um_malloc and um_free accept (anything else gets the checked path). */
static inline bool stream_on(um_context *ctx, um_stream s, int dev)
{
    return s->magic == UM_STREAM_MAGIC && s->ctx == ctx && s->dev == dev;
}

/* um_malloc with every check and the retry after reclaim. */
static __attribute__((noinline)) um_status malloc_checked(um_context *ctx, int dev, size_t size,
                                                          um_stream s, void **ptr)
{
    if (UM_UNLIKELY(!ctx || !ptr))
        return um__fail(UM_ERR_INVALID, "um_malloc: %s is NULL", ctx ? "ptr" : "ctx");
    *ptr = NULL;
    if (UM_UNLIKELY(dev < 0 || dev >= ctx->ndevices)) {
        um__device(ctx, dev, "um_malloc");
        return UM_ERR_NO_DEVICE;
    }
    if (UM_UNLIKELY(size == 0))
        return um__fail(UM_ERR_INVALID,
                        "um_malloc: device %d (%s): size 0 (a request needs at "
                        "least 1 byte)",
                        dev, dev_name(ctx, dev));
    um_device *d = &ctx->devices[dev];
    const um__stream_ref *ref = &d->default_stream->ref;
    if (s) {
        if (UM_UNLIKELY(s->magic != UM_STREAM_MAGIC || s->ctx != ctx))
            return bad_stream("um_malloc", s);
        ref = &s->ref;
        if (UM_UNLIKELY(s->dev != dev)) {
            /* Host memory may be ordered by any device's stream (the
             * pinned buffers of its copies); other memory only by its own
             * device's streams. */
            if (dev != 0)
                return um__fail(UM_ERR_WRONG_DEVICE,
                                "um_malloc: %zu bytes on device %d (%s) with "
                                "stream %u of device %d (%s)",
                                size, dev, dev_name(ctx, dev), s->ref.id, s->dev,
                                dev_name(ctx, s->dev));
            if (!(ref = um__stream_host_ref(ctx, s)))
                return UM_ERR_NOMEM;
        }
    }
    /* Blocks whose frees waited for other streams go back first, so that
     * their memory is reused before the pool grows. */
    um__uses_collect(ctx, dev, false);
    (void)um__host_nomem_take();
    um_status st = d->alloc->ops->alloc(d->alloc, size, ref, ptr);
    /* Why deferred frees kept their memory, for the failure's message. */
    char kept[400] = "";
    if (UM_UNLIKELY(st == UM_ERR_NOMEM) &&
        atomic_load_explicit(&d->deferred, memory_order_acquire)) {
        if (um__uses_collect(ctx, dev, true) != UM_OK)
            snprintf(kept, sizeof kept, "%s", um_last_error());
        atomic_fetch_add_explicit(&d->ooms_retried, 1, memory_order_release);
        (void)um__host_nomem_take(); /* the retry's own cause counts */
        st = d->alloc->ops->alloc(d->alloc, size, ref, ptr);
    }
    /* Out of host memory for the allocator's own records, evicting from
     * the device would only drop its replicas, every one, for nothing. */
    if (UM_UNLIKELY(st == UM_ERR_NOMEM) && !um__host_nomem_take() && !no_reclaim)
        st = alloc_after_reclaim(ctx, dev, size, ref, ptr);
    if (UM_UNLIKELY(st == UM_ERR_NOMEM && kept[0])) {
        char full[512];
        snprintf(full, sizeof full, "%s", um_last_error());
        const char *says = strchr(full, ':'), *why = strchr(kept, ':');
        return um__fail(UM_ERR_NOMEM, "%s; %s", says ? says + 2 : full, why ? why + 2 : kept);
    }
    return st;
}

bool um__alloc_no_reclaim(bool on)
{
    bool was = no_reclaim;
    no_reclaim = on;
    return was;
}

/* um_malloc's and um_free's common calls (valid arguments and, for
 * um_malloc, no buffer layer that could evict for a retry, and no free
 * waiting for other streams; for um_free, no block of the device marked by
 * um_record_stream) go straight to the allocator, each in a tail call, so
 * that they need no frame of their own. While a trace is recorded, the
 * allocator's operations record (pool/record.c), so these calls test for
 * no recorder. Every other call takes the checked path, which says what
 * is wrong. */
um_status um_malloc(um_context *ctx, int dev, size_t size, um_stream s, void **ptr)
{
    if (UM_LIKELY(ctx != NULL && ptr != NULL && size != 0) &&
        UM_LIKELY((unsigned)dev < (unsigned)ctx->ndevices) &&
        UM_LIKELY(!atomic_load_explicit(&ctx->reclaim, memory_order_relaxed))) {
        um_device *d = &ctx->devices[dev];
        if (UM_LIKELY(!s || stream_on(ctx, s, dev)) &&
            UM_LIKELY(!atomic_load_explicit(&d->deferred, memory_order_relaxed))) {
            *ptr = NULL;
            /* A marked block's free may be deferred and handed back after
             * the check above; an allocation the allocator gives its
             * address then waits inside the allocator for the hand-back's
             * end (um__allocator's reuse_wait), so this stays a tail call. */
            return d->alloc->ops->alloc(d->alloc, size, s ? &s->ref : &d->default_stream->ref,
                                        ptr);
        }
    }
    return malloc_checked(ctx, dev, size, s, ptr);
}

/* Whether allocator a manages ptr. */
static inline bool allocator_owns(um__allocator *a, const void *ptr)
{
    if (UM_LIKELY(a->range_size))
        return (uintptr_t)ptr - a->range_lo < a->range_size;
    return a->ops->owns(a, ptr);
}

/* The device whose address range (the context's table) holds ptr, or -1. */
static inline int owner_by_range(um_context *ctx, const void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < ctx->ndevices; i++)
        if (a - ctx->owner_range[i].lo < ctx->owner_range[i].size)
            return i;
    return -1;
}

/* The device whose allocator manages ptr, trying `first` before the rest
 * (the stream's device is the likely owner), or -1. */
static inline int owner_of(um_context *ctx, const void *ptr, int first)
{
    if (first >= 0 && allocator_owns(ctx->devices[first].alloc, ptr))
        return first;
    int dev = owner_by_range(ctx, ptr);
    if (dev >= 0)
        return dev;
    for (int i = 0; i < ctx->ndevices; i++)
        if (!ctx->owner_range[i].size && i != first && ctx->devices[i].alloc &&
            allocator_owns(ctx->devices[i].alloc, ptr))
            return i;
    return -1;
}

/* um_free with every check. */
static __attribute__((noinline)) um_status free_checked(um_context *ctx, void *ptr, um_stream s)
{
    if (UM_UNLIKELY(!ctx))
        return um__fail(UM_ERR_INVALID, "um_free: ctx is NULL (pointer %p)", ptr);
    if (!ptr)
        return UM_OK;
    if (s && UM_UNLIKELY(s->magic != UM_STREAM_MAGIC || s->ctx != ctx))
        return bad_stream("um_free", s);
    int dev = owner_of(ctx, ptr, s ? s->dev : -1);
    if (UM_UNLIKELY(dev < 0))
        return um__fail(UM_ERR_INVALID_POINTER,
                        "um_free: pointer %p is not memory of any of the "
                        "%d devices of this context (not returned by um_malloc)",
                        ptr, ctx->ndevices);
    const um__stream_ref *ref = s ? &s->ref : NULL;
    if (s && UM_UNLIKELY(s->dev != dev)) {
        if (dev != 0)
            return um__fail(UM_ERR_WRONG_DEVICE,
                            "um_free: pointer %p belongs to device %d (%s) but "
                            "stream %u is on device %d (%s)",
                            ptr, dev, dev_name(ctx, dev), s->ref.id, s->dev,
                            dev_name(ctx, s->dev));
        if (!(ref = um__stream_host_ref(ctx, s)))
            return UM_ERR_NOMEM;
    }
    um__allocator *a = ctx->devices[dev].alloc;
    if (atomic_load_explicit(&ctx->devices[dev].marked, memory_order_acquire)) {
        bool taken = false;
        um_status st = um__uses_free(ctx, dev, ptr, s, &taken);
        um__uses_collect(ctx, dev, false);
        if (taken)
            return st;
    }
    return a->ops->free(a, ptr, ref);
}

um_status um_free(um_context *ctx, void *ptr, um_stream s)
{
    if (UM_LIKELY(ctx != NULL && ptr != NULL)) {
        /* Only the context's table of address ranges: an allocator that
         * asks to be called for ownership takes the checked path. */
        int dev = owner_by_range(ctx, ptr);
        if (UM_LIKELY(dev >= 0) && (!s || stream_on(ctx, s, dev)) &&
            UM_LIKELY(!atomic_load_explicit(&ctx->devices[dev].marked, memory_order_relaxed))) {
            um__allocator *a = ctx->devices[dev].alloc;
            return a->ops->free(a, ptr, s ? &s->ref : NULL);
        }
    }
    return free_checked(ctx, ptr, s);
}

int um_pointer_device(um_context *ctx, const void *ptr)
{
    if (!ctx || !ptr)
        return -1;
    return owner_of(ctx, ptr, -1);
}

/* The allocator of dev for a memory-control call, in *out. */
static um_status allocator_for(um_context *ctx, int dev, const char *what, um__allocator **out)
{
    *out = NULL;
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "%s: ctx is NULL (device %d)", what, dev);
    um_device *d = um__device(ctx, dev, what);
    if (!d)
        return UM_ERR_NO_DEVICE;
    *out = d->alloc;
    return UM_OK;
}

/* Gives the memory that waits only for finished work back to dev's
 * allocator first (destroyed buffers', and marked blocks' frees), so that
 * what um_trim and a limit count is what is really held. */
static void collect_freed(um_context *ctx, int dev)
{
    void (*collect)(um_context *) = atomic_load_explicit(&ctx->collect, memory_order_acquire);
    if (collect)
        collect(ctx);
    um__uses_collect(ctx, dev, false);
}

um_status um_set_memory_limit(um_context *ctx, int dev, size_t bytes)
{
    um__allocator *a;
    um_status st = allocator_for(ctx, dev, "um_set_memory_limit", &a);
    if (st != UM_OK)
        return st;
    /* A limit above the device's memory is the device's memory. */
    if (bytes > a->backend->capacity)
        bytes = a->backend->capacity;
    collect_freed(ctx, dev);
    st = a->ops->set_memory_limit(a, bytes);
    if (st == UM_ERR_BUSY &&
        atomic_load_explicit(&ctx->devices[dev].deferred, memory_order_acquire)) {
        /* Still too much reserved: the frees of marked blocks are waited
         * for, as an allocation at the limit waits for them. */
        um__uses_collect(ctx, dev, true);
        st = a->ops->set_memory_limit(a, bytes);
    }
    void (*changed)(um_context *) =
        atomic_load_explicit(&ctx->limit_changed, memory_order_acquire);
    if (st == UM_OK && changed)
        changed(ctx);
    return st;
}

um_status um_set_cache_limit(um_context *ctx, int dev, size_t bytes)
{
    um__allocator *a;
    um_status st = allocator_for(ctx, dev, "um_set_cache_limit", &a);
    return st == UM_OK ? a->ops->set_cache_limit(a, bytes) : st;
}

um_status um_trim(um_context *ctx, int dev)
{
    um__allocator *a;
    um_status st = allocator_for(ctx, dev, "um_trim", &a);
    if (st != UM_OK)
        return st;
    collect_freed(ctx, dev);
    return a->ops->trim(a);
}

/* um_stats_get for the public call `what`, which its errors name: called
 * by um_stats_json, they named um_stats_get, a call the program never made. */
static um_status stats_get(um_context *ctx, int dev, um_stats *out, const char *what)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "%s: out is NULL (device %d)", what, dev);
    um__allocator *a;
    um_status st = allocator_for(ctx, dev, what, &a);
    if (st != UM_OK)
        return st;
    /* Read before the allocator's count, which each of them follows, so
     * that the difference never goes below the failures that were final. */
    uint64_t retried = atomic_load_explicit(&ctx->devices[dev].ooms_retried, memory_order_acquire);
    memset(out, 0, sizeof *out);
    a->ops->stats(a, out);
    out->num_ooms -= retried < out->num_ooms ? retried : out->num_ooms;
    out->version = UM_STATS_VERSION;
    return UM_OK;
}

um_status um_stats_get(um_context *ctx, int dev, um_stats *out)
{
    return stats_get(ctx, dev, out, "um_stats_get");
}

um_status um_stats_json(um_context *ctx, int dev, char *buf, size_t len, size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!buf && len)
        return um__fail(UM_ERR_INVALID, "um_stats_json: buf is NULL with len %zu", len);
    um_stats s;
    um_status st = stats_get(ctx, dev, &s, "um_stats_json");
    if (st != UM_OK)
        return st;
    const um__backend *b = ctx->devices[dev].backend;
    int n = snprintf(
        buf, len,
        "{\"device\":%d,\"name\":\"%s\",\"kind\":\"%s\",\"version\":%u,\"active_bytes\":%zu,"
        "\"requested_bytes\":%zu,\"reserved_bytes\":%zu,\"cached_bytes\":%zu,"
        "\"peak_active_bytes\":%zu,\"peak_reserved_bytes\":%zu,\"largest_free_bytes\":%zu,"
        "\"fragmentation\":%.6f,\"active_blocks\":%llu,\"num_allocs\":%llu,\"num_frees\":%llu,"
        "\"num_backend_calls\":%llu,\"num_cache_hits\":%llu,\"num_ooms\":%llu}",
        dev, b->name, um_device_kind_name(b->kind), s.version, s.active_bytes, s.requested_bytes,
        s.reserved_bytes, s.cached_bytes, s.peak_active_bytes, s.peak_reserved_bytes,
        s.largest_free_bytes, s.fragmentation, (unsigned long long)s.active_blocks,
        (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees,
        (unsigned long long)s.num_backend_calls, (unsigned long long)s.num_cache_hits,
        (unsigned long long)s.num_ooms);
    if (needed)
        *needed = (size_t)n;
    if ((size_t)n >= len) {
        if (len)
            buf[0] = '\0';
        return um__fail(UM_ERR_INVALID, "um_stats_json: device %d needs %d bytes and a NUL, "
                        "the buffer has %zu", dev, n, len);
    }
    return UM_OK;
}

void um_stats_print(um_context *ctx, void *out)
{
    FILE *f = out;
    if (!ctx || !f)
        return;
    fprintf(f, "%-4s %-10s %11s %11s %11s %11s %11s %9s %10s %10s %9s %7s %5s\n", "dev", "name",
            "live", "peak_live", "reserved", "peak_resvd", "cached", "blocks", "allocs", "frees",
            "be_calls", "hit%", "ooms");
    for (int d = 0; d < ctx->ndevices; d++) {
        um_stats s;
        if (um_stats_get(ctx, d, &s) != UM_OK)
            continue;
        char a[32], pa[32], r[32], pr[32], c[32];
        fprintf(f, "%-4d %-10s %11s %11s %11s %11s %11s %9llu %10llu %10llu %9llu %6.2f%% %5llu\n",
                d, ctx->devices[d].backend->name, um__format_bytes(a, sizeof a, s.active_bytes),
                um__format_bytes(pa, sizeof pa, s.peak_active_bytes),
                um__format_bytes(r, sizeof r, s.reserved_bytes),
                um__format_bytes(pr, sizeof pr, s.peak_reserved_bytes),
                um__format_bytes(c, sizeof c, s.cached_bytes),
                (unsigned long long)s.active_blocks, (unsigned long long)s.num_allocs,
                (unsigned long long)s.num_frees, (unsigned long long)s.num_backend_calls,
                s.num_allocs ? 100.0 * (double)s.num_cache_hits / (double)s.num_allocs : 0.0,
                (unsigned long long)s.num_ooms);
    }
}

um_status um_reset_peak(um_context *ctx, int dev)
{
    um__allocator *a;
    um_status st = allocator_for(ctx, dev, "um_reset_peak", &a);
    if (st != UM_OK)
        return st;
    a->ops->reset_peak(a);
    return UM_OK;
}

/* ------------------------------------------------------------- copies */

/* The device whose backend runs a copy: the stream's, else a CUDA device
 * that owns either side (its driver can reach both through unified
 * addressing), else whichever owns either side, else the host. */
static int copy_device(um_context *ctx, const void *dst, const void *src, um_stream s)
{
    if (s)
        return s->dev;
    int d = owner_of(ctx, dst, -1), e = owner_of(ctx, src, -1);
    if (d >= 0 && ctx->devices[d].backend->kind == UM_DEVICE_CUDA)
        return d;
    if (e >= 0 && ctx->devices[e].backend->kind == UM_DEVICE_CUDA)
        return e;
    if (ctx->devices[0].backend->pinned && ctx->ndevices > 1) {
        /* Pinned host memory on both sides still wants the GPU's copy
         * engine: take the first GPU. */
        for (int i = 1; i < ctx->ndevices; i++)
            if (ctx->devices[i].backend->kind == UM_DEVICE_CUDA)
                return i;
    }
    return d >= 0 ? d : e >= 0 ? e : 0;
}

static um_status copy_common(um_context *ctx, void *dst, const void *src, size_t n, um_stream s,
                             bool wait, const char *what)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "%s: ctx is NULL", what);
    if (s && (s->magic != UM_STREAM_MAGIC || s->ctx != ctx))
        return bad_stream(what, s);
    if (n == 0)
        return UM_OK;
    if (!dst || !src)
        return um__fail(UM_ERR_INVALID, "%s: %zu bytes: the %s pointer is NULL", what, n,
                        dst ? "source" : "destination");
    uintptr_t a = (uintptr_t)dst, b = (uintptr_t)src;
    if (a + n < a || b + n < b)
        return um__fail(UM_ERR_INVALID, "%s: %zu bytes from %p to %p wrap around the address space",
                        what, n, src, dst);
    if ((a < b + n) && (b < a + n) && a != b)
        return um__fail(UM_ERR_INVALID,
                        "%s: %zu bytes from %p to %p: the ranges overlap (a stream-ordered copy "
                        "of overlapping ranges is undefined)",
                        what, n, src, dst);
    int dev = copy_device(ctx, dst, src, s);
    um_device *d = &ctx->devices[dev];
    um__bstream *bs = s ? s->ref.bstream : NULL;
    um_status st = um__be_copy_async(d->backend, dst, src, n, bs);
    if (st == UM_OK && wait)
        st = um__be_stream_sync(d->backend, bs);
    return st;
}

um_status um_memcpy_async(um_context *ctx, void *dst, const void *src, size_t n, um_stream s)
{
    return copy_common(ctx, dst, src, n, s, false, "um_memcpy_async");
}

um_status um_memcpy(um_context *ctx, void *dst, const void *src, size_t n)
{
    return copy_common(ctx, dst, src, n, NULL, true, "um_memcpy");
}
