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

typedef struct dbg_block {
    uintptr_t addr; /* 0: empty */
    size_t size;    /* as the caller asked */
} dbg_block;

typedef struct dbg_alloc {
    um__allocator base;
    um__allocator *inner;
    um__allocator_ops ops; /* debug_ops, named as the inner allocator */
    pthread_mutex_t lock; /* the table */
    dbg_block *blocks;    /* open addressing by address */
    size_t cap, count;
    /* ASan's shadow is poisoned only where the allocator keeps its own
     * address range (the pool), over the span of blocks handed out, and
     * unpoisoned at the end: the range is unmapped then, and whatever the
     * process maps there next must not inherit the poison. */
    bool shadow;
    uintptr_t lo, hi;
} dbg_alloc;

static dbg_alloc *D(um__allocator *a) { return (dbg_alloc *)a; }

static size_t slot_of(const dbg_alloc *d, uintptr_t addr)
{
    return (size_t)((addr >> 4) * 0x9e3779b97f4a7c15ull >> 20) & (d->cap - 1);
}

static bool table_put(dbg_alloc *d, uintptr_t addr, size_t size)
{
    if ((d->count + 1) * 2 > d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 1024;
        dbg_block *n = calloc(cap, sizeof *n), *old = d->blocks;
        if (!n)
            return false;
        size_t old_cap = d->cap;
        d->blocks = n;
        d->cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].addr) {
                size_t j = slot_of(d, old[i].addr);
                while (n[j].addr)
                    j = (j + 1) & (cap - 1);
                n[j] = old[i];
            }
        free(old);
    }
    size_t j = slot_of(d, addr);
    while (d->blocks[j].addr)
        j = (j + 1) & (d->cap - 1);
    d->blocks[j] = (dbg_block){addr, size};
    d->count++;
    return true;
}

/* The slot of addr, or SIZE_MAX. */
static size_t table_find(const dbg_alloc *d, uintptr_t addr)
{
    if (!d->cap)
        return SIZE_MAX;
    for (size_t j = slot_of(d, addr); d->blocks[j].addr; j = (j + 1) & (d->cap - 1))
        if (d->blocks[j].addr == addr)
            return j;
    return SIZE_MAX;
}

static void table_del(dbg_alloc *d, size_t j)
{
    size_t mask = d->cap - 1;
    d->blocks[j] = (dbg_block){0, 0};
    d->count--;
    for (size_t k = (j + 1) & mask; d->blocks[k].addr; k = (k + 1) & mask) {
        size_t home = slot_of(d, d->blocks[k].addr);
        if (((k - home) & mask) >= ((k - j) & mask)) {
            d->blocks[j] = d->blocks[k];
            d->blocks[k] = (dbg_block){0, 0};
            j = k;
        }
    }
}

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
    bool ok = table_put(d, (uintptr_t)p, size);
    if (!d->lo || (uintptr_t)p < d->lo)
        d->lo = (uintptr_t)p;
    if ((uintptr_t)p + size + UM_DEBUG_GUARD > d->hi)
        d->hi = (uintptr_t)p + size + UM_DEBUG_GUARD;
    pthread_mutex_unlock(&d->lock);
    if (!ok) {
        SHADOW_UNPOISON(p + size, UM_DEBUG_GUARD);
        (void)d->inner->ops->free(d->inner, p, s);
        return um__fail(UM_ERR_NOMEM, "device %d: no memory for the debug allocator's table",
                        a->dev);
    }
    return UM_OK;
}

static um_status d_free(um__allocator *a, void *ptr, const um__stream_ref *s)
{
    dbg_alloc *d = D(a);
    pthread_mutex_lock(&d->lock);
    size_t j = table_find(d, (uintptr_t)ptr);
    if (j == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        /* Not a live block of ours: the inner allocator names the misuse
         * (double free, a pointer inside a block). */
        return d->inner->ops->free(d->inner, ptr, s);
    }
    size_t size = d->blocks[j].size;
    table_del(d, j);
    pthread_mutex_unlock(&d->lock);
    uint8_t *p = ptr;
    SHADOW_UNPOISON(p, size + UM_DEBUG_GUARD);
    size_t bad = 0;
    for (size_t i = 0; i < UM_DEBUG_GUARD; i++)
        bad += p[size + i] != GUARD_BYTE;
    /* Poisoned before the inner free: once freed, another thread may have
     * the block. */
    memset(p, FREED_BYTE, size < POISON_MAX ? size : POISON_MAX);
    if (d->shadow)
        SHADOW_POISON(p, size + UM_DEBUG_GUARD);
    um_status st = d->inner->ops->free(d->inner, ptr, s);
    if (st == UM_OK && bad)
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): %zu of the %d guard bytes after the %zu-byte block at "
                        "%p were overwritten: something wrote past its end (the block is freed)",
                        a->dev, a->backend->name, bad, UM_DEBUG_GUARD, size, ptr);
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
    size_t guards = d->count * UM_DEBUG_GUARD;
    pthread_mutex_unlock(&d->lock);
    out->requested_bytes -= guards <= out->requested_bytes ? guards : out->requested_bytes;
}
static void d_reset_peak(um__allocator *a) { D(a)->inner->ops->reset_peak(D(a)->inner); }
static void d_stream_forget(um__allocator *a, const um__stream_ref *s)
{
    D(a)->inner->ops->stream_forget(D(a)->inner, s);
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
    free(d->blocks);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static const um__allocator_ops debug_ops = {
    .name = "debug",
    .alloc = d_alloc,
    .free = d_free,
    .owns = d_owns,
    .trim = d_trim,
    .set_memory_limit = d_set_memory_limit,
    .set_cache_limit = d_set_cache_limit,
    .stats = d_stats,
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
