/*
 * Internal structures of unimem's pool (pool.c), shared with its tests.
 *
 * Layout of one device's memory:
 *
 *   one reservation of address space, covered in address order by range
 *   records ("blocks") that are live, free ("ready", coalesced at once) or
 *   hold a slab: a 64 KiB-aligned range cut into equal slots of one size
 *   class (requests up to UM_SMALL_MAX bytes, and up to UM_MEDIUM_MAX while
 *   medium slabs are on: pool.c, slabs). Blocks and slabs share the
 *   range, so slabs fill gaps between large blocks. Placement is best fit
 *   with split and coalesce.
 *
 *   physical pages (the backend granularity) are mapped only under bytes
 *   that are not free: pages[p].pin counts such bytes of page p. A mapped
 *   page whose count is 0 is a hole: it sits on the hole list, and when the
 *   pool needs a page elsewhere it moves a hole there (unmap + map) before it
 *   asks the backend for new memory.
 *
 * Stream order: freeing a block on stream s stamps its pages with a fence
 * (s, s's current epoch). Another stream may use those bytes, and any page
 * move may unmap them, only once s has completed that epoch: a backend
 * event recorded on s covers every epoch up to its own. Small slots are
 * kept per stream until their epoch completes, then go back to their slab.
 */
#ifndef UM_POOL_INTERNAL_H
#define UM_POOL_INTERNAL_H

#include "../base/lock.h"
#include "freeidx.h"
#include "plan.h"
#include "pool.h"

#include <pthread.h>

#define UM_SMALL_MAX (32u * 1024u)
#define UM_MEDIUM_MAX (1024u * 1024u)
#define UM_SLAB_UNIT (64u * 1024u)
#define UM_NSMALL_CLASSES 28 /* the classes up to UM_SMALL_MAX */
#define UM_NCLASSES 48
#define UM_TC_MAX 64

enum um__block_state {
    UM_BLOCK_LIVE = 1,    /* handed out by um_malloc */
    UM_BLOCK_READY = 3,   /* free (subject to its pages' fences) */
    UM_BLOCK_SLAB = 4,    /* holds a slab of small slots */
    /* freed, its release deferred (pool.c, deferred frees): still pinned
     * and in the pointer map, in the pool's deferred index and list */
    UM_BLOCK_DEFERRED = 5
};

#define UM_NO_FENCE UINT32_MAX
#define UM_MIXED_FENCE (UINT32_MAX - 1) /* freed by several busy streams */

/* The fields that a large free and the allocation that takes the block
 * back read come first: records are 64-byte aligned (block_new), so those
 * share one cache line, and the second holds fields that these paths
 * only write, or that only some paths touch. */
typedef struct um__block {
    um__fi_node fi;               /* addr, size; links in a free index */
    /* LIVE or DEFERRED, in the pointer map: the next such block whose
     * first byte lies in the same page (pool.c, ptr_map_*). */
    struct um__block *start_next;
    union {
        size_t requested;         /* LIVE: bytes asked for */
        struct um__block *newer;  /* DEFERRED: the next newer deferred block */
    };
    union {
        struct um__slab *slab;    /* SLAB */
        struct um__block *older;  /* DEFERRED: the next older deferred block */
    };
    uint32_t stream;              /* LIVE: allocation stream */
    uint8_t state;
    bool planned;                 /* LIVE in the plan's arena: in no region list */
    /* The bounce cache (pool.c): held by a thread cache (atomic: the owner
     * thread sets it without the lock), and the cache whose `out` this
     * block is (set by that thread; cleared under the lock when another
     * thread frees the block, and read by the owner without the lock to
     * learn whether its `out` is still its own). */
    _Atomic bool tc_held;
    _Atomic(struct um__tcache *) tc_owner;
    /* LIVE: the planner's ordinal of its allocation; DEFERRED: its
     * stream's epoch at the free. */
    uint64_t seq;
    struct um__block *prev, *next;/* address-ordered neighbours in the region */
} um__block;

enum um__slot_state { UM_SLOT_FREE = 0, UM_SLOT_LIVE = 1, UM_SLOT_CACHED = 2 };

#define UM_SLOT_WORD(state, stream, requested) \
    ((uint64_t)(state) | ((uint64_t)(stream) & 0xffffffu) << 8 | (uint64_t)(requested) << 32)
#define UM_SLOT_STATE(w) ((unsigned)((w) & 0xffu))
#define UM_SLOT_STREAM(w) ((uint32_t)(((w) >> 8) & 0xffffffu))
#define UM_SLOT_REQUESTED(w) ((uint32_t)((w) >> 32))
/* The largest stream id a slot word holds; the context keeps ids below it. */
#define UM_SLOT_MAX_STREAM 0xffffffu

/* A slot's word, alone on its cache line. Neighbouring slots of a slab
 * often belong to different threads' caches; sharing a line, their frees'
 * compare-exchange took 80% of a two-thread run (measured with perf). */
typedef struct um__slot_word {
    _Alignas(64) _Atomic uint64_t w;
} um__slot_word;

typedef struct um__slab {
    uintptr_t base;
    um__block *block;
    struct um__slab *prev, *next; /* in its class's list of slabs with free slots */
    uint32_t cls;
    uint32_t nslots;
    uint32_t nfree;               /* slots in free_stack (state FREE) */
    uint32_t *free_stack;
    /* The slots' words follow the record in the same allocation (pool.c,
     * slab_words), one per slot: state (enum um__slot_state) in the low
     * byte, the allocation stream in bits 8-31 and the requested bytes in
     * the high half, so an allocation or free touches one cache line of
     * metadata. Atomic because um_free's double-free check and
     * um_stats_get read them without the pool lock. */
    bool on_list;
} um__slab;

typedef struct um__pending_obj {
    void *ptr;
    uint64_t epoch;
} um__pending_obj;

typedef struct um__pending_vec {
    um__pending_obj *items;
    size_t n, cap;
} um__pending_vec;

#define UM_FENCE_RING 8

typedef struct um__stream_state {
    bool known;
    bool open_frees;              /* frees stamped with `epoch` exist */
    bool busy;                    /* listed in the pool's busy[] */
    um__bstream *bstream;
    um__backend *backend;         /* bstream's backend; NULL: the pool's */
    um__pending_vec small[UM_NCLASSES];
    size_t small_pending;         /* objects in small[] */
    uint64_t epoch;               /* frees are stamped with it */
    uint64_t completed;           /* every epoch up to this one has completed */
    /* Fences in flight, oldest first: fence i covers the epochs up to its
     * epoch. Several, so that frees made a while ago become reusable when
     * the device reaches them, not only when it catches up with the
     * newest fence. */
    struct {
        um__bevent *event;
        uint64_t epoch;
        uint64_t recorded_ns;
    } fences[UM_FENCE_RING];
    uint32_t fence_head, fence_n;
} um__stream_state;

typedef struct um__page {
    um__phys phys;                /* 0: unmapped */
    uint64_t fence_epoch;         /* the freeing stream's epoch then (MIXED: full_syncs then) */
    uint32_t pin;                 /* bytes of the page not ready */
    uint32_t fence_stream;        /* stream that last freed bytes of the page */
    uint32_t hole_prev, hole_next;/* hole list links, UINT32_MAX = none */
} um__page;

/* A thread's cached slots of one class, with each one's slot word, so
 * that an allocation from the bin marks its slot live without looking up
 * the slab again (two dependent loads, cold once many blocks are live). */
typedef struct um__tc_bin {
    uint32_t n;
    uint32_t stream;
    void *items[UM_TC_MAX];
    um__slot_word *words[UM_TC_MAX];
} um__tc_bin;

/* Cache-line aligned, and allocated so (tcache_get): the owner's hot
 * words must not share a line with another thread's cache (false sharing
 * of in_bins with a neighbour's counters halved the throughput of four
 * threads on the H200 machine). */
typedef struct um__tcache {
    _Alignas(64) struct um__pool *pool;
    struct um__tcache *prev, *next;
    /* Every pool's caches, for an exiting thread's destructor to tell
     * whether its cache still exists (pool.c, tcache_registry), and the
     * thread that owns this one. */
    struct um__tcache *reg_prev, *reg_next;
    pthread_t owner;
    _Atomic uint64_t allocs, frees; /* written by the owner thread only */
    /* Live bytes this thread allocated minus freed that are not yet added
     * to the pool's `active` (written by the owner thread only). */
    _Atomic int64_t live_delta;
    /* Taking back the bins and the held block of a live thread (pool.c,
     * tcache_drain_others): the owner touches them without the lock only
     * between setting in_bins and clearing it, and not at all while
     * `drain` is set; another thread, holding the lock, sets `drain`,
     * makes every thread pass a full memory barrier (membarrier), waits
     * for in_bins to clear, then empties them. has_slots: the bins may
     * hold slots. */
    _Atomic uint32_t in_bins, drain;
    _Atomic bool has_slots;
    um__tc_bin bins[UM_NCLASSES];
    /* The bounce cache: the large block this thread allocated last (out),
     * and that block once the thread freed it (held), for the next
     * allocation of its size on its stream. The deltas count the live
     * large blocks and requested bytes its hits and holds moved, not yet
     * in the pool's counters (written by the owner thread only).
     * `out` is written by the owner thread only. It may name a record
     * that is no longer the thread's: another thread that frees the block
     * clears the record's tc_owner under the lock and may reuse the
     * record, so the owner trusts `out` only while its tc_owner is this
     * cache (atomic because pool_check reads it). */
    _Atomic(struct um__block *) out;
    /* The address and stream of `out`'s block, written and read by the
     * owner thread only, so a free that is not of `out` is told apart
     * without touching the record. */
    uintptr_t out_addr;
    uint32_t out_stream;
    /* Set and taken by the owner thread between tc_enter and tc_leave,
     * with plain loads and stores; another thread takes it under the lock
     * through the bins' handover (tcache_drain_others). A held block's
     * `stream` is the stream it was freed on. */
    _Atomic(struct um__block *) held;
    _Atomic int64_t large_blocks_delta, large_req_delta;
} um__tcache;

typedef struct um__region {
    uintptr_t lo, hi;
    um__freeidx ready;
    um__block *first;
} um__region;

typedef struct um__pool {
    um__allocator base;
    uint64_t generation;          /* tells a thread's cached tcache pointer apart */
    int thread_cache;
    bool bounce;                  /* the bounce cache is on (pool.c) */
    /* take_ready is mapping the pages of a ready block it has chosen:
     * fences retired meanwhile may return slots, and a slab that empties
     * then is kept rather than destroyed (pool.c, slot_return). */
    bool taking;
    /* small_alloc_locked is filling the calling thread's bin of this class
     * (UM_NCLASSES: none): take_range's last attempt, which returns the
     * caller's other bins, leaves that one alone. Under the lock, which
     * the refill holds throughout. */
    unsigned refill_cls;
    /* Requests up to this many bytes come from slabs: UM_MEDIUM_MAX while
     * medium slabs are on, else UM_SMALL_MAX (pool.c, slabs). Read without
     * the lock by the allocation's fast path. */
    _Atomic size_t slab_max;
    bool medium;                  /* the medium_slabs option */
    /* Slots a thread's bin of each class may hold (0 for the medium
     * classes once medium slabs are off); read by the free's fast path. */
    _Atomic uint32_t bin_max[UM_NCLASSES];
    /* A cache limit is set: a freed large block then takes the locked path,
     * which enforces it, instead of staying in its thread's bounce cache
     * (one block a thread, of any size). Read by that fast path. */
    _Atomic bool cache_capped;

    uintptr_t va;                 /* the whole reservation */
    size_t va_size;
    size_t page;                  /* backend granularity */
    unsigned page_shift;          /* log2(page) */
    size_t npages;
    um__region region;
    /* Deferred frees (pool.c): freed large blocks by size, and the same
     * blocks oldest first. */
    bool defer;                   /* the defer_frees option */
    um__freeidx deferred;
    um__block *deferred_oldest, *deferred_newest;

    /* One record per page, all fields together: an operation on a block
     * touches one cache line per two pages, not one per array. */
    um__page *pages;
    uint64_t *mapped;             /* bit per page: pages[pg].phys != 0 */
    /* Chunks the backend failed to take back, each of `pages` pages (one,
     * or a large page's). */
    struct um__parked {
        um__phys phys;
        uint32_t pages;
    } *parked;
    size_t nparked, parked_cap, parked_pages;
    /* Large pages (the large_page option): 1, or the pages each large page
     * spans, a power of two up to 64. A large page is one backend chunk
     * mapped over that many pages from an index that is a multiple of it,
     * so it lies in one word of `compound`, whose bit per page marks the
     * pages large pages cover. It moves, and goes back, only as a whole. */
    uint32_t big;
    uint32_t big_min_pages;       /* the shortest range large pages back (pool.c) */
    uint64_t *compound;
    uint64_t fence_wait_ns;       /* wait for fences this old before growing; 0: never */
    int recycle;                  /* um__recycle; see recycling() */
    bool plan_on;                 /* the plan option */
    um__plan plan;                /* step planner (plan.h) */
    struct um__events *events;    /* trace_file's recorder (reserved bytes), or NULL */
    struct um__block *arena;      /* the plan's arena: a LIVE region block, in no map */
    struct um__block *plan_spare; /* records kept for the arena's gaps when it dissolves */
    size_t nplan_spare;
    uint64_t full_syncs;          /* times every stream was seen idle */
    bool cross_stream_reuse;      /* the option: adopt_fenced_spot before moving pages */
    uint64_t adopted_spots;       /* spots taken in stream order from other streams (adopt_fenced_spot) */
    /* The one stream whose frees have fenced pages so far (UM_NO_FENCE:
     * none yet; UM_MIXED_FENCE: several). While it is one stream, every
     * page is usable by it, and the placement skips its per-page checks. */
    uint32_t fencer;
    uint32_t hole_head, hole_tail;
    size_t holes;

    uintptr_t slab_base;          /* va rounded down to UM_SLAB_UNIT */
    /* (addr - slab_base) / UM_SLAB_UNIT -> the unit's slab entry (pool.c), two levels */
    _Atomic uintptr_t **slab_map;
    size_t slab_map_top;
    /* A bit per 2 MiB granule of the range: some unit of it names a slab
     * (read without the lock, so that most large frees skip the map). */
    _Atomic uint64_t *slab_granules;
    size_t slab_granules_n;
    um__slab *partial[UM_NCLASSES]; /* slabs with free slots */

    um__stream_state **streams;
    uint32_t nstreams;
    /* The streams that may have frees to retire: every one with open
     * frees, pending slots or fences in flight, and maybe some idle ones
     * (poll_all takes those off). Polling visits these alone, so a program
     * that made many streams pays for the ones still busy. Room for every
     * stream state is kept (nstates), so listing one never fails. */
    um__stream_state **busy;
    uint32_t nbusy, nstates, busy_cap;
    /* Bit i: stream i is registered. Read without the lock by the free fast
     * path; streams past the bitmap always take the locked path. */
    _Atomic uint64_t known_streams[16];

    /* The pointer map of live and deferred large blocks: page_starts[pg]
     * lists those whose first byte lies in page pg (through start_next),
     * so um_free finds a block from its address through the page it
     * touches anyway, and the map's lines are as local as the blocks. */
    um__block **page_starts;
    size_t map_count;             /* blocks in the map */

    um__block *block_freelist;

    pthread_key_t tkey;
    um__tcache *tcaches;

    /* statistics. Live bytes are `active` plus every thread cache's
     * live_delta; a thread adds its delta to `active` once it passes
     * UM_DELTA_PUBLISH bytes, so the hot path writes no shared cache line.
     * Both get cache lines of their own. */
    /* On a line of its own: threads that take it on a refill must not
     * slow down the fast path's reads of the fields above. */
    _Alignas(64) um__lock lock;

    _Alignas(64) _Atomic int64_t active;
    _Alignas(64) _Atomic int64_t peak_active;
    _Alignas(64) size_t reserved, peak_reserved;
    size_t large_requested;
    uint64_t large_blocks;
    uint64_t central_allocs, central_frees, misses, ooms;
    uint64_t dead_allocs, dead_frees; /* counters of exited threads' caches */
    uint64_t calls_at_create;
    size_t capacity;
    /* Why the last wait for the frees' fences at the limit failed (empty:
     * it did not), for nomem's message; under the lock. */
    char unwaited[256];
} um__pool;

/* Size class table (bytes per slot) and the class of a request. */
extern const uint32_t um__class_size[UM_NCLASSES];
unsigned um__class_of(size_t size);

#endif
