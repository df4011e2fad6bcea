/*
 * pool: the allocator of one device. Three implementations share one
 * vtable so the same API, backend and statistics measure all of them:
 *
 *   pool      unimem's allocator (pool.c): one reserved address range per
 *             device, physical pages mapped only under live data and
 *             recycled out of holes, size-class slabs with per-thread caches
 *             for small requests, best fit with split/coalesce for the rest
 *             (a freed large block may first wait, whole, for a request it
 *             fits: deferred frees), stream-ordered reuse, and step plans
 *             (plan.c) for programs whose large allocations repeat.
 *   direct    no cache: every request is its own backend chunk (baseline).
 *   bufcache  MLX's BufferCache policy: whole freed buffers reused for
 *             requests of at most their size and more than
 *             max(size/2, size - 2 pages), never split or merged (baseline).
 *
 * Owns: every byte of backend memory the device's allocations use.
 */
#ifndef UM_POOL_H
#define UM_POOL_H

#include "../backend/backend.h"

/* Blocks are aligned to (and sized in multiples of) this many bytes. */
#define UM_ALIGN 256u

/* A stream as the pool sees it: a small per-device id (0 is the default
 * stream), the backend stream to record events on, and the backend that
 * stream belongs to: NULL for the allocator's own; another device's for a
 * GPU stream that orders host memory (pinned buffers of its copies). */
typedef struct um__stream_ref {
    uint32_t id;
    um__bstream *bstream;
    um__backend *backend;
} um__stream_ref;

/* When the pool moves a free page rather than create one while under the
 * memory limit (the recycle_pages option; the order of its values). */
typedef enum um__recycle {
    UM_RECYCLE_AUTO = 0,   /* while the step planner learns; else only at the limit */
    UM_RECYCLE_ALWAYS = 1,
    UM_RECYCLE_NEVER = 2   /* only at the limit */
} um__recycle;

typedef struct um__pool_config {
    int dev;               /* device index, for messages */
    size_t memory_limit;   /* 0: backend capacity */
    size_t cache_limit;    /* UM_NO_CACHE_LIMIT: no cap; 0: no cache */
    int thread_cache;      /* per-thread caches on/off */
    int va_factor;         /* address space reserved = factor x limit */
    uint64_t fence_wait_ns;/* see the fence_wait_us option; 0: never wait */
    int recycle;           /* um__recycle: the recycle_pages option */
    int no_plan;           /* the plan option, negated (0: step planning on) */
    int no_defer;          /* the defer_frees option, negated (0: deferred frees on) */
    int no_medium;         /* the medium_slabs option, negated (0: medium slabs on) */
    int no_cross_stream_reuse; /* the cross_stream_reuse option, negated */
    size_t large_page;     /* the large_page option: bytes; 0 or at most a page: none */
    const char *large_page_option; /* the option that set it, for errors; NULL: large_page */
    struct um__events *events; /* trace_file's recorder: reserved memory goes there; or NULL */
    /* The layer above's wait before an address is used again (see
     * um__allocator's reuse_wait); NULL: none. */
    void (*reuse_wait)(void *arg, int dev, void *const *ptrs, size_t n);
    void *reuse_arg;
} um__pool_config;

typedef struct um__allocator um__allocator;

typedef struct um__allocator_ops {
    const char *name;
    um_status (*alloc)(um__allocator *a, size_t size, const um__stream_ref *s, void **ptr);
    /* s NULL: the block's allocation stream. Errors: UM_ERR_DOUBLE_FREE,
     * UM_ERR_INVALID_POINTER (for a pointer owns() accepted but that is not
     * the start of a block). After an error the block is still live,
     * unless the free says that it took the block (um__note_free_took). */
    um_status (*free)(um__allocator *a, void *ptr, const um__stream_ref *s);
    /* True when ptr lies in memory this allocator manages; reads no device
     * memory. */
    bool (*owns)(um__allocator *a, const void *ptr);
    /* UM_OK when ptr (which owns() accepted) is the start of a live block;
     * else UM_ERR_INVALID_POINTER saying why. Every allocator has one;
     * um_record_stream refuses to mark where it is NULL. */
    um_status (*block_live)(um__allocator *a, const void *ptr);
    um_status (*trim)(um__allocator *a);
    um_status (*set_memory_limit)(um__allocator *a, size_t bytes);
    um_status (*set_cache_limit)(um__allocator *a, size_t bytes);
    void (*stats)(um__allocator *a, um_stats *out);
    /* um_stats' active_bytes alone, without the walks that stats makes:
     * placement asks it for every task. */
    size_t (*active_bytes)(um__allocator *a);
    void (*reset_peak)(um__allocator *a);
    /* The stream is going away: wait for its work and make its pending
     * blocks reusable everywhere. Fails where its work cannot be waited
     * for: the allocator still needs the stream (its fences), so the
     * caller must keep it and may retry. */
    um_status (*stream_forget)(um__allocator *a, const um__stream_ref *s);
    /* Recounts everything and checks every structural invariant; UM_OK when
     * consistent, else UM_ERR_INTERNAL with a message saying what differs.
     * Only meaningful while no other thread uses the allocator. */
    um_status (*check)(um__allocator *a);
    void (*destroy)(um__allocator *a);
} um__allocator_ops;

/* Every implementation starts with this header. */
struct um__allocator {
    const um__allocator_ops *ops;
    um__backend *backend;
    int dev;
    /* Effective caps on reserved bytes and on cached pages (the cache's:
     * UM_NO_CACHE_LIMIT none, 0 no cache). Atomic: set under the
     * allocator's lock, read without it by placement, reclaim and device
     * info. */
    _Atomic size_t memory_limit;
    _Atomic size_t cache_limit;
    /* Allocators whose memory is one address range say so here, so the
     * context finds a pointer's device with a compare instead of a call
     * to owns(); range_size 0: ask owns(). */
    uintptr_t range_lo;
    size_t range_size;
    /* Called by alloc, outside the allocator's locks, with the addresses
     * of blocks that may have been freed by another thread: taken from
     * memory shared between threads into the calling thread's hands (the
     * block it returns, and the slots a refill puts in its own cache). The
     * layer above waits there while the old block at such an address is
     * still being handed back (core/stream_use.c). What a thread's own
     * cache got from that thread's own free needs no call: a thread
     * handing a block back allocates nothing before the hand-back ends.
     * So um_malloc's fast path, served from the thread's cache, stays a
     * tail call. Copied from the config; NULL: none. */
    void (*reuse_wait)(void *arg, int dev, void *const *ptrs, size_t n);
    void *reuse_arg;
};

/* An allocator's call of its reuse_wait for the n blocks at ptrs. */
static inline void um__allocator_reuse_wait(const um__allocator *a, void *const *ptrs, size_t n)
{
    if (a->reuse_wait)
        a->reuse_wait(a->reuse_arg, a->dev, ptrs, n);
}

um_status um__pool_create(um__backend *b, const um__pool_config *c, um__allocator **out);
um_status um__direct_create(um__backend *b, const um__pool_config *c, um__allocator **out);
um_status um__bufcache_create(um__backend *b, const um__pool_config *c, um__allocator **out);

/* Bytes after every block that the debug allocator checks at its free. */
#define UM_DEBUG_GUARD 16
/* The debug allocator (debug.c; used in -DUNIMEM_DEBUG=ON builds for host
 * and sim devices): guard bytes, poisoning of freed blocks, and ASan's
 * shadow kept in step with the pool. Owns inner from here on. */
um_status um__debug_allocator_wrap(um__allocator *inner, um__allocator **out);

/* Gives a's operations a copy whose alloc and free also record an event
 * into events (record.c), until a is destroyed. Called once, before any
 * allocation. */
um_status um__allocator_record(um__allocator *a, struct um__events *events);

#endif /* UM_POOL_H */
