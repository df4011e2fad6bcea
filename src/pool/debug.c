/*
 * The debug allocator (builds with -DUNIMEM_DEBUG=ON): wraps the allocator
 * of a device whose memory the host can read (host and sim devices) and
 * checks what a release build trusts:
 *
 *   - guard bytes: every block is asked for UM_DEBUG_GUARD bytes larger,
 *     the extra bytes are set to a pattern, and a free checks them, so a
 *     write past a block's end is reported at its free;
 *   - poisoning: a freed block's first POISON_MAX bytes are filled with
 *     0xdd before the allocator may reuse it, so a read after free sees
 *     garbage, not plausible data (only the start: filling whole blocks of
 *     a training step made every page of a sim device resident);
 *   - AddressSanitizer: in ASan builds a free block is poisoned in ASan's
 *     shadow and a live one unpoisoned (its guard bytes stay poisoned), so
 *     ASan reports a use after free or an overflow inside the pool at the
 *     faulting access.
 *
 * The statistics are the inner allocator's, with the guard bytes of live
 * blocks taken out of requested_bytes, so they count what callers asked.
 */
#include "pool.h"
#include "../base/addrmap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define UM_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UM_HAVE_ASAN 1
#endif
#endif
#ifdef UM_HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define SHADOW_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define SHADOW_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define SHADOW_POISON(p, n) ((void)(p), (void)(n))
#define SHADOW_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define GUARD_BYTE 0xab
#define FREED_BYTE 0xdd
#define POISON_MAX (64u * 1024u)

typedef struct dbg_alloc {
    um__allocator base;
    um__allocator *inner;
    um__allocator_ops ops; /* debug_ops, named as the inner allocator */
    pthread_mutex_t lock; /* the map */
    um__addrmap blocks;   /* live block -> the size its caller asked for */
    /* ASan's shadow is poisoned only where the allocator keeps its own
     * address range (the pool), over the span of blocks handed out, and
     * unpoisoned at the end: the range is unmapped then, and whatever the
     * process maps there next must not inherit the poison. */
    bool shadow;
    uintptr_t lo, hi;
    /* Allocations refused for want of host memory for the map (under
     * lock): the inner allocator never saw them fail, so its num_ooms
     * lacks them. */
    uint64_t table_ooms;
} dbg_alloc;

static dbg_alloc *D(um__allocator *a) { return (dbg_alloc *)a; }

static um_status d_alloc(um__allocator *a, size_t size, const um__stream_ref *s, void **ptr)
{
    dbg_alloc *d = D(a);
    if (size > SIZE_MAX - UM_DEBUG_GUARD)
        return d->inner->ops->alloc(d->inner, size, s, ptr); /* its own overflow error */
    um_status st = d->inner->ops->alloc(d->inner, size + UM_DEBUG_GUARD, s, ptr);
    if (st != UM_OK)
        return st;
    uint8_t *p = *ptr;
    SHADOW_UNPOISON(p, size + UM_DEBUG_GUARD);
    memset(p + size, GUARD_BYTE, UM_DEBUG_GUARD);
    if (d->shadow)
        SHADOW_POISON(p + size, UM_DEBUG_GUARD);
    pthread_mutex_lock(&d->lock);
    bool ok = um__addrmap_put(&d->blocks, (uintptr_t)p, size);
    d->table_ooms += !ok;
    if (!d->lo || (uintptr_t)p < d->lo)
        d->lo = (uintptr_t)p;
    if ((uintptr_t)p + size + UM_DEBUG_GUARD > d->hi)
        d->hi = (uintptr_t)p + size + UM_DEBUG_GUARD;
    pthread_mutex_unlock(&d->lock);
    if (!ok) {
        SHADOW_UNPOISON(p + size, UM_DEBUG_GUARD);
        (void)d->inner->ops->free(d->inner, p, s);
        um__note_host_nomem();
        return um__fail(UM_ERR_NOMEM, "device %d: no memory for the debug allocator's table",
                        a->dev);
    }
    return UM_OK;
}

static um_status d_block_live(um__allocator *a, const void *ptr)
{
    um__allocator *in = D(a)->inner;
    if (!in->ops->block_live)
        return um__fail(UM_ERR_UNSUPPORTED, "debug allocator: %s cannot tell live blocks",
                        in->ops->name);
    return in->ops->block_live(in, ptr);
}

static um_status d_free(um__allocator *a, void *ptr, const um__stream_ref *s)
{
    dbg_alloc *d = D(a);
    /* The note (below) says what this free did, never an earlier one's
     * (a program's um_free does not take it). */
    (void)um__free_took_take();
    pthread_mutex_lock(&d->lock);
    uint64_t size64 = 0;
    bool ours = um__addrmap_take(&d->blocks, (uintptr_t)ptr, &size64);
    pthread_mutex_unlock(&d->lock);
    /* Not a live block of ours: the inner allocator names the misuse
     * (double free, a pointer inside a block). */
    if (!ours)
        return d->inner->ops->free(d->inner, ptr, s);
    size_t size = (size_t)size64;
    uint8_t *p = ptr;
    SHADOW_UNPOISON(p, size + UM_DEBUG_GUARD);
    size_t bad = 0;
    for (size_t i = 0; i < UM_DEBUG_GUARD; i++)
        bad += p[size + i] != GUARD_BYTE;
    /* Poisoned before the inner free: once freed, another thread may have
     * the block. The inner free may still fail and keep the block live
     * (no host memory for its records), so what the poison covers is kept
     * to be put back then; without memory for that copy, the block is not
     * poisoned. */
    size_t n = size < POISON_MAX ? size : POISON_MAX;
    uint8_t *saved = malloc(n ? n : 1);
    if (saved) {
        memcpy(saved, p, n);
        memset(p, FREED_BYTE, n);
    }
    if (d->shadow)
        SHADOW_POISON(p, size + UM_DEBUG_GUARD);
    um_status st = d->inner->ops->free(d->inner, ptr, s);
    if (st != UM_OK) {
        /* Still live: as it was, and in the table again. */
        SHADOW_UNPOISON(p, size + UM_DEBUG_GUARD);
        if (saved)
            memcpy(p, saved, n);
        if (d->shadow)
            SHADOW_POISON(p + size, UM_DEBUG_GUARD);
        pthread_mutex_lock(&d->lock);
        (void)um__addrmap_put(&d->blocks, (uintptr_t)p, size);
        pthread_mutex_unlock(&d->lock);
    }
    free(saved);
    if (st == UM_OK && bad) {
        um__note_free_took();
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): %zu of the %d guard bytes after the %zu-byte block at "
                        "%p were overwritten: something wrote past its end (the block is freed)",
                        a->dev, a->backend->name, bad, UM_DEBUG_GUARD, size, ptr);
    }
    return st;
}

/* The inner allocator's header fields that others read, after a call that
 * may change them. */
static void mirror(dbg_alloc *d)
{
    d->base.memory_limit = d->inner->memory_limit;
    d->base.cache_limit = d->inner->cache_limit;
    d->base.range_lo = d->inner->range_lo;
    d->base.range_size = d->inner->range_size;
}

static bool d_owns(um__allocator *a, const void *ptr) { return D(a)->inner->ops->owns(D(a)->inner, ptr); }
static um_status d_trim(um__allocator *a) { return D(a)->inner->ops->trim(D(a)->inner); }
static um_status d_set_memory_limit(um__allocator *a, size_t bytes)
{
    um_status st = D(a)->inner->ops->set_memory_limit(D(a)->inner, bytes);
    mirror(D(a));
    return st;
}
static um_status d_set_cache_limit(um__allocator *a, size_t bytes)
{
    um_status st = D(a)->inner->ops->set_cache_limit(D(a)->inner, bytes);
    mirror(D(a));
    return st;
}
static void d_stats(um__allocator *a, um_stats *out)
{
    dbg_alloc *d = D(a);
    d->inner->ops->stats(d->inner, out);
    pthread_mutex_lock(&d->lock);
    size_t guards = d->blocks.count * UM_DEBUG_GUARD;
    out->num_ooms += d->table_ooms;
    pthread_mutex_unlock(&d->lock);
    out->requested_bytes -= guards <= out->requested_bytes ? guards : out->requested_bytes;
}
static size_t d_active_bytes(um__allocator *a)
{
    um__allocator *in = D(a)->inner;
    return in->ops->active_bytes(in);
}
static void d_reset_peak(um__allocator *a) { D(a)->inner->ops->reset_peak(D(a)->inner); }
static um_status d_stream_forget(um__allocator *a, const um__stream_ref *s)
{
    return D(a)->inner->ops->stream_forget(D(a)->inner, s);
}
static um_status d_check(um__allocator *a)
{
    um__allocator *in = D(a)->inner;
    return in->ops->check ? in->ops->check(in) : UM_OK;
}
static void d_destroy(um__allocator *a)
{
    dbg_alloc *d = D(a);
    if (d->shadow && d->hi)
        SHADOW_UNPOISON((void *)d->lo, d->hi - d->lo);
    d->inner->ops->destroy(d->inner);
    um__addrmap_free(&d->blocks);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static const um__allocator_ops debug_ops = {
    .name = "debug",
    .alloc = d_alloc,
    .free = d_free,
    .owns = d_owns,
    .block_live = d_block_live,
    .trim = d_trim,
    .set_memory_limit = d_set_memory_limit,
    .set_cache_limit = d_set_cache_limit,
    .stats = d_stats,
    .active_bytes = d_active_bytes,
    .reset_peak = d_reset_peak,
    .stream_forget = d_stream_forget,
    .check = d_check,
    .destroy = d_destroy,
};

um_status um__debug_allocator_wrap(um__allocator *inner, um__allocator **out)
{
    dbg_alloc *d = calloc(1, sizeof *d);
    if (!d)
        return um__fail(UM_ERR_NOMEM, "device %d: no memory for the debug allocator", inner->dev);
    d->base = *inner;
    /* Device info names the allocator the device really has. */
    d->ops = debug_ops;
    d->ops.name = inner->ops->name;
    d->base.ops = &d->ops;
    d->inner = inner;
    d->shadow = inner->range_size != 0;
    pthread_mutex_init(&d->lock, NULL);
    *out = &d->base;
    return UM_OK;
}
