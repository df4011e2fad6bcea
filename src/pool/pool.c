/*
 * unimem's pool: the allocator of one device (see pool_internal.h for the
 * layout). Owns the device's address reservation, every physical page mapped
 * into it, the range records, slabs, per-stream fences and pending slots,
 * and the per-thread caches.
 *
 * Locking: one mutex per pool guards everything but the per-thread caches
 * and the active-bytes counter. A small alloc/free pair that its thread's
 * cache can serve takes no lock and makes no backend call.
 */
#include "pool_internal.h"
#include "../trace/events.h"

#include <inttypes.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NO_PAGE UINT32_MAX
#define KNOWN_STREAM_BITS 1024 /* 16 words of known_streams */
#define SLAB_MAP_LEAF 4096
/* The slab map's units per bit of the slab summary (2 MiB; a divisor of
 * SLAB_MAP_LEAF, so a granule's units share one leaf). */
#define SLAB_GRANULE_UNITS 32

/* ------------------------------------------------------------ size classes */

const uint32_t um__class_size[UM_NCLASSES] = {
    256,  512,   768,   1024,  1280,  1536,  1792,  2048,  2304,  2560,
    2816, 3072,  3328,  3584,  3840,  4096,  5120,  6144,  7168,  8192,
    10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768,
    /* medium classes (pool.c, slabs) */
    40960, 49152, 57344, 65536, 81920, 98304, 114688, 131072,
    163840, 196608, 229376, 262144, 327680, 393216, 458752, 524288,
    655360, 786432, 917504, 1048576};

static uint8_t class_lut[UM_MEDIUM_MAX / 256 + 1];
static uint64_t class_recip[UM_NCLASSES]; /* ceil(2^40 / size): slot = off * r >> 40 */
static uint32_t class_nslots[UM_NCLASSES]; /* slots of one slab of the class */
/* Slots a thread's bin of the class holds: up to 2 MiB, 4-UM_TC_MAX. */
static uint32_t class_bin_max[UM_NCLASSES];
static pthread_once_t class_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t pool_generations = 1;

/* A slab has 16 slots, or 4 for the classes above 256 KiB, so that no
 * slab spans more than the 64 units a map entry can name (below). */
#define SLAB_SLOTS 16u
#define WIDE_SLAB_SLOTS 4u
#define WIDE_CLASS_MIN (256u * 1024u)

static size_t slab_bytes(unsigned cls)
{
    size_t want = (um__class_size[cls] > WIDE_CLASS_MIN ? WIDE_SLAB_SLOTS : SLAB_SLOTS) *
                  (size_t)um__class_size[cls];
    return um__align_up(want < UM_SLAB_UNIT ? UM_SLAB_UNIT : want, UM_SLAB_UNIT);
}

static void class_init(void)
{
    unsigned c = 0;
    for (unsigned i = 0; i <= UM_MEDIUM_MAX / 256; i++) {
        while (um__class_size[c] < i * 256u)
            c++;
        class_lut[i] = (uint8_t)c;
    }
    for (unsigned k = 0; k < UM_NCLASSES; k++)
        class_recip[k] = ((1ull << 40) + um__class_size[k] - 1) / um__class_size[k];
    for (unsigned k = 0; k < UM_NCLASSES; k++) {
        class_nslots[k] = (uint32_t)(slab_bytes(k) / um__class_size[k]);
        uint32_t n = (uint32_t)((2u << 20) / um__class_size[k]);
        class_bin_max[k] = n < 4 ? 4 : n > UM_TC_MAX ? UM_TC_MAX : n;
    }
}

unsigned um__class_of(size_t size) { return class_lut[(size + 255) / 256]; }

/* ---------------------------------------------------------------- helpers */

static inline um__pool *P(um__allocator *a) { return (um__pool *)a; }

static const char *dev_name(um__pool *p) { return p->base.backend->name; }

/* block_new sets each field of a record; a new field must be set there too
 * (this size is on 64-bit targets). */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(um__block) == 96, "um__block changed: update block_new");
#endif

/* A fresh record, on a cache line of its own (see um__block), or NULL. */
static um__block *block_alloc(void)
{
    void *b = NULL;
    return posix_memalign(&b, 64, sizeof(um__block)) == 0 ? b : NULL;
}

static um__block *block_new(um__pool *p)
{
    um__block *b = p->block_freelist;
    if (b)
        p->block_freelist = b->next;
    else
        b = block_alloc();
    /* Field by field: a memset of the record became a `rep stos`, a
     * quarter of take_range's own time on the large path. */
    if (b) {
        b->fi = (um__fi_node){NULL, NULL, 0, 0};
        b->prev = b->next = NULL;
        b->slab = NULL;
        b->start_next = NULL;
        b->requested = 0;
        b->stream = 0;
        b->seq = 0;
        b->state = 0;
        b->planned = false;
        atomic_store_explicit(&b->tc_held, false, memory_order_relaxed);
        atomic_store_explicit(&b->tc_owner, NULL, memory_order_relaxed);
    }
    return b;
}

static void block_put(um__pool *p, um__block *b)
{
    b->next = p->block_freelist;
    p->block_freelist = b;
}

/* A thread publishes its live-bytes delta to the pool past this size (plus
 * the size of the large block it allocated last, see account_slack), and
 * at once when it goes below zero (a thread freeing what others made),
 * keeping half of this size private in both cases. The
 * peak is taken from the pool's published bytes plus the calling thread's
 * own delta, which is exact while one thread uses a device; with several,
 * it can miss that much per other thread (two threads each holding a
 * 64 MiB block made a peak of 64 MiB), and never exceeds the
 * true peak: other threads' unpublished deltas are never negative (when
 * they could be, the estimate overshot, and the peak of live bytes came
 * out above the peak of reserved memory). */
#define UM_DELTA_PUBLISH ((int64_t)1 << 20)

/* Counts delta live bytes for the calling thread (tc: its cache, or NULL);
 * the delta stays unpublished up to UM_DELTA_PUBLISH + slack bytes. */
static inline void account_slack(um__pool *p, um__tcache *tc, int64_t delta, int64_t slack)
{
    int64_t own = 0;
    if (tc) {
        own = atomic_load_explicit(&tc->live_delta, memory_order_relaxed) + delta;
        if (UM_UNLIKELY(own > UM_DELTA_PUBLISH + slack || own < 0)) {
            /* Half the window stays private, so that the next operations,
             * of either sign, need no locked instruction: publishing down
             * to zero made every free after a publish publish again. */
            atomic_fetch_add_explicit(&p->active, own - UM_DELTA_PUBLISH / 2,
                                      memory_order_relaxed);
            own = UM_DELTA_PUBLISH / 2;
        }
        atomic_store_explicit(&tc->live_delta, own, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&p->active, delta, memory_order_relaxed);
    }
    if (delta > 0) {
        int64_t now = atomic_load_explicit(&p->active, memory_order_relaxed) + own;
        int64_t peak = atomic_load_explicit(&p->peak_active, memory_order_relaxed);
        while (UM_UNLIKELY(now > peak) &&
               !atomic_compare_exchange_weak_explicit(&p->peak_active, &peak, now,
                                                      memory_order_relaxed, memory_order_relaxed))
            ;
    }
}

static inline void account(um__pool *p, um__tcache *tc, int64_t delta)
{
    account_slack(p, tc, delta, 0);
}

/* Live bytes: published plus every thread's delta. Under the pool lock. */
static size_t active_total(um__pool *p)
{
    int64_t n = atomic_load_explicit(&p->active, memory_order_relaxed);
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next)
        n += atomic_load_explicit(&tc->live_delta, memory_order_relaxed);
    return n > 0 ? (size_t)n : 0;
}

static inline void counter_inc(_Atomic uint64_t *c)
{
    /* Only the owning thread writes, so a load and a store (no locked RMW)
     * suffice; stats readers see a value that is at most one op behind. */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* Adds d to a counter only the owning thread writes. */
static inline void delta_add(_Atomic int64_t *c, int64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

/* ------------------------------------------------------------ page holes */

static inline size_t page_of(um__pool *p, uintptr_t a) { return (a - p->va) >> p->page_shift; }
static inline uintptr_t page_addr(um__pool *p, size_t pg) { return p->va + pg * p->page; }

/* ------------------------------------------------------------ pointer map */

/* The live and deferred large blocks by address. A page's list is short:
 * blocks above UM_SMALL_MAX bytes, so at most page / 32 KiB of them start
 * in one page, and usually one. A deferred block stays in the map, so that
 * taking it back costs no map update (the map's line of its page is cold
 * by then). Under the lock. */

/* Where the link to the block at addr is (*link is NULL: none there). */
static inline um__block **ptr_map_link(um__pool *p, uintptr_t addr)
{
    um__block **link = &p->page_starts[page_of(p, addr)];
    while (*link && (*link)->fi.addr != addr)
        link = &(*link)->start_next;
    return link;
}

static inline um__block *ptr_map_find(um__pool *p, uintptr_t addr)
{
    return *ptr_map_link(p, addr);
}

static inline void ptr_map_put(um__pool *p, um__block *b)
{
    um__block **head = &p->page_starts[page_of(p, b->fi.addr)];
    b->start_next = *head;
    *head = b;
    p->map_count++;
}

static inline void ptr_map_del(um__pool *p, um__block *b)
{
    um__block **link = ptr_map_link(p, b->fi.addr);
    *link = b->start_next;
    b->start_next = NULL;
    p->map_count--;
}

/* Sets page pg's physical page (0: unmapped), keeping the bitmap of mapped
 * pages that the placement's range queries read. */
static inline void page_set_phys(um__pool *p, size_t pg, um__phys ph)
{
    p->pages[pg].phys = ph;
    if (ph)
        p->mapped[pg / 64] |= 1ull << (pg % 64);
    else
        p->mapped[pg / 64] &= ~(1ull << (pg % 64));
}

/* Whether page pg lies under a large page (the large_page option). */
static inline bool page_compound(const um__pool *p, size_t pg)
{
    return p->big > 1 && ((p->compound[pg / 64] >> (pg % 64)) & 1);
}

/* The first page of the large page over page pg. */
static inline size_t compound_head(const um__pool *p, size_t pg)
{
    return pg & ~((size_t)p->big - 1);
}

/* Marks (or clears) pages head..head+big-1 as one large page's. */
static void compound_mark(um__pool *p, size_t head, bool on)
{
    uint64_t mask = (p->big == 64 ? ~0ull : (1ull << p->big) - 1) << (head % 64);
    if (on)
        p->compound[head / 64] |= mask;
    else
        p->compound[head / 64] &= ~mask;
}

/* Unmapped pages among pages [first, last], a word of the bitmap at a time
 * (a block's page records would be a cache line per two pages). A fully
 * mapped word, the common case, costs no bit count. */
static inline size_t unmapped_count(const um__pool *p, size_t first, size_t last)
{
    /* Most ranges lie within one word: one mask, no loop. */
    if (UM_LIKELY(first / 64 == last / 64)) {
        uint64_t want = (~0ull << (first % 64)) & (~0ull >> (63 - last % 64));
        uint64_t missing = want & ~p->mapped[first / 64];
        return UM_LIKELY(missing == 0) ? 0 : (size_t)__builtin_popcountll(missing);
    }
    size_t n = 0;
    for (size_t w = first / 64; w <= last / 64; w++) {
        uint64_t want = ~0ull;
        if (w == first / 64)
            want &= ~0ull << (first % 64);
        if (w == last / 64 && last % 64 != 63)
            want &= (1ull << (last % 64 + 1)) - 1;
        uint64_t missing = want & ~p->mapped[w];
        if (UM_UNLIKELY(missing != 0))
            n += (size_t)__builtin_popcountll(missing);
    }
    return n;
}

/* Links page pg after tail, the hole list's last page (NO_PAGE: the list
 * is empty); pg's own links are the caller's. */
static inline void hole_link_after(um__pool *p, uint32_t tail, uint32_t pg)
{
    if (tail != NO_PAGE)
        p->pages[tail].hole_next = pg;
    else
        p->hole_head = pg;
}

static void hole_push(um__pool *p, uint32_t pg)
{
    p->pages[pg].hole_prev = p->hole_tail;
    p->pages[pg].hole_next = NO_PAGE;
    hole_link_after(p, p->hole_tail, pg);
    p->hole_tail = pg;
    p->holes++;
}

/* Takes the n holes between pv and nx (list neighbours, NO_PAGE at an
 * end) off the list by linking pv and nx; their own links are the
 * caller's to clear. */
static void hole_unlink(um__pool *p, uint32_t pv, uint32_t nx, size_t n)
{
    if (pv != NO_PAGE)
        p->pages[pv].hole_next = nx;
    else
        p->hole_head = nx;
    if (nx != NO_PAGE)
        p->pages[nx].hole_prev = pv;
    else
        p->hole_tail = pv;
    p->holes -= n;
}

static void hole_remove(um__pool *p, uint32_t pg)
{
    hole_unlink(p, p->pages[pg].hole_prev, p->pages[pg].hole_next, 1);
    p->pages[pg].hole_prev = p->pages[pg].hole_next = NO_PAGE;
}

/* The bytes of [addr, addr+len) (pages first..last) on page pg: a whole
 * page but at the two ends. */
static inline uint32_t page_share(um__pool *p, size_t pg, size_t first, size_t last,
                                  uintptr_t addr, size_t len)
{
    if (pg != first && pg != last)
        return (uint32_t)p->page;
    uintptr_t ps = page_addr(p, pg), pe = ps + p->page;
    uintptr_t s = addr > ps ? addr : ps, e = addr + len < pe ? addr + len : pe;
    return (uint32_t)(e - s);
}

/* Adds n not-ready bytes to page pg's pin count, taking it off the hole
 * list if it was a hole. */
static inline void pin_page(um__pool *p, size_t pg, uint32_t n)
{
    if (p->pages[pg].pin == 0)
        hole_remove(p, (uint32_t)pg);
    p->pages[pg].pin += n;
}

/* Pins the whole pages lo..hi of a range being taken. Each is a hole (the
 * range was ready and is mapped), and pages that follow each other on the
 * hole list, as a freed block's do, leave it as one chain: a large block
 * costs a few list updates, not one per page. */
static void pin_interior(um__pool *p, size_t lo, size_t hi)
{
    um__page *pages = p->pages;
    uint32_t whole = (uint32_t)p->page;
    for (size_t pg = lo; pg <= hi; pg++) {
        size_t start = pg;
        uint32_t pv = pages[pg].hole_prev, nx;
        for (;; pg++) {
            nx = pages[pg].hole_next;
            pages[pg].pin = whole;
            pages[pg].hole_prev = pages[pg].hole_next = NO_PAGE;
            if (pg == hi || nx != pg + 1)
                break;
        }
        hole_unlink(p, pv, nx, pg - start + 1);
    }
}

static void unpin_fenced(um__pool *p, um__stream_state *ss, uint32_t sid, uint64_t epoch,
                         uintptr_t addr, size_t len);

/* Adds (sign > 0) or removes not-ready bytes of [addr, addr+len) to the
 * pages' pin counts, keeping the hole list exact. Pages gaining pins must be
 * mapped already. */
static void pin_range(um__pool *p, uintptr_t addr, size_t len, int sign)
{
    if (!len)
        return;
    if (sign < 0) {
        unpin_fenced(p, NULL, 0, 0, addr, len);
        return;
    }
    size_t first = page_of(p, addr), last = page_of(p, addr + len - 1);
    pin_page(p, first, page_share(p, first, first, last, addr, len));
    if (last > first + 1)
        pin_interior(p, first + 1, last - 1);
    if (last != first)
        pin_page(p, last, page_share(p, last, first, last, addr, len));
}

static size_t unmapped_pages(um__pool *p, uintptr_t addr, size_t len)
{
    return unmapped_count(p, page_of(p, addr), page_of(p, addr + len - 1));
}

static bool page_fence_done(um__pool *p, size_t pg);

/* True when stream sid (UM_NO_FENCE: the host, for unmapping) may use the
 * freed bytes of page pg; clears fences found completed. Inline for the
 * common answer (no fence, or the stream's own), which the placement asks
 * of every page it considers. */
static inline bool page_usable(um__pool *p, size_t pg, uint32_t sid)
{
    uint32_t u = p->pages[pg].fence_stream;
    return u == UM_NO_FENCE || u == sid || page_fence_done(p, pg);
}

/* Whether the large page starting at page head is free to move or go
 * back: no bytes of it in use and no stream that may still touch them. */
static bool compound_idle(um__pool *p, size_t head)
{
    for (size_t i = head; i < head + p->big; i++)
        if (p->pages[i].pin || !page_usable(p, i, UM_NO_FENCE))
            return false;
    return true;
}

/* True when every page under [addr, addr+len) is mapped. */
static bool fully_mapped(um__pool *p, uintptr_t addr, size_t len)
{
    return unmapped_pages(p, addr, len) == 0;
}

/* The oldest hole outside pages [first, last] that no stream may still
 * touch, or NO_PAGE. The walk is bounded: holes are in free order, so the
 * oldest are the ones whose fences have completed. */
static uint32_t hole_outside(um__pool *p, size_t first, size_t last)
{
    size_t budget = last - first + 1 + 256;
    for (uint32_t h = p->hole_head; h != NO_PAGE && budget--; h = p->pages[h].hole_next)
        if ((h < first || h > last) && !page_compound(p, h) && page_usable(p, h, UM_NO_FENCE))
            return h;
    return NO_PAGE;
}

/* The first page of an idle large page outside pages [first, last], or
 * NO_PAGE; the walk is bounded as hole_outside's. */
static uint32_t compound_outside(um__pool *p, size_t first, size_t last)
{
    if (p->big == 1)
        return NO_PAGE;
    size_t budget = last - first + 1 + 256;
    for (uint32_t h = p->hole_head; h != NO_PAGE && budget--; h = p->pages[h].hole_next) {
        size_t head = compound_head(p, h);
        if (page_compound(p, h) && (head + p->big <= first || head > last) &&
            compound_idle(p, head))
            return (uint32_t)head;
    }
    return NO_PAGE;
}

/* The pool holds delta more (or fewer) bytes of backend memory (locked). */
static void reserved_add(um__pool *p, int64_t delta)
{
    p->reserved = (size_t)((int64_t)p->reserved + delta);
    if (UM_UNLIKELY(p->events != NULL))
        um__event_instant(p->events, UM_EVENT_RESERVED, p->base.dev, p->reserved, 0);
}

/* Gives an unmapped chunk of n pages back to the backend. If the backend
 * refuses, the chunk stays reserved and parked, and later trims try again,
 * so nothing is lost. */
static void give_back(um__pool *p, um__phys ph, uint32_t n)
{
    if (um__be_release(p->base.backend, ph, n * p->page) == UM_OK) {
        reserved_add(p, -(int64_t)(n * p->page));
        return;
    }
    if (p->nparked == p->parked_cap) {
        size_t cap = p->parked_cap ? p->parked_cap * 2 : 8;
        struct um__parked *a = realloc(p->parked, cap * sizeof *a);
        if (!a) {
            um__log(UM_LOG_ERROR, "%s: a page the backend refused to release is lost (%s)",
                    dev_name(p), um_last_error());
            reserved_add(p, -(int64_t)(n * p->page));
            return;
        }
        p->parked = a;
        p->parked_cap = cap;
    }
    p->parked[p->nparked++] = (struct um__parked){ph, n};
    p->parked_pages += n;
}

static void retry_parked(um__pool *p)
{
    size_t kept = 0;
    for (size_t i = 0; i < p->nparked; i++) {
        struct um__parked c = p->parked[i];
        if (um__be_release(p->base.backend, c.phys, c.pages * p->page) == UM_OK) {
            reserved_add(p, -(int64_t)(c.pages * p->page));
            p->parked_pages -= c.pages;
        } else {
            p->parked[kept++] = c;
        }
    }
    p->nparked = kept;
}

/* Sets pages at..at+n-1 to chunk ph (0: unmapped), a large page's when
 * n > 1, and puts them on the hole list (or takes them off). */
static void chunk_place(um__pool *p, size_t at, uint32_t n, um__phys ph)
{
    for (size_t i = 0; i < n; i++) {
        if (!ph)
            hole_remove(p, (uint32_t)(at + i));
        page_set_phys(p, at + i, ph);
        if (ph)
            hole_push(p, (uint32_t)(at + i));
    }
    if (n > 1)
        compound_mark(p, at, ph != 0);
}

/* Unmaps the hole h (a single page, or the large page whose first page h
 * is, all of it holes) and gives its physical memory back to the backend. */
static um_status release_hole(um__pool *p, uint32_t h)
{
    um__backend *b = p->base.backend;
    uint32_t n = page_compound(p, h) ? p->big : 1;
    um_status s = um__be_unmap(b, page_addr(p, h), n * p->page);
    if (s != UM_OK)
        return s;
    um__phys ph = p->pages[h].phys;
    chunk_place(p, h, n, 0);
    s = um__be_release(b, ph, n * p->page);
    if (s == UM_OK) {
        reserved_add(p, -(int64_t)(n * p->page));
        return UM_OK;
    }
    /* Keep the pages as holes if they can go back where they were. */
    if (um__be_map(b, page_addr(p, h), n * p->page, ph) == UM_OK)
        chunk_place(p, h, n, ph);
    else
        give_back(p, ph, n);
    return s;
}

/* Releases the oldest holes no stream may still touch until at most keep
 * bytes of holes remain, and the parked pages. A page the backend refuses
 * does not stop the walk: the other idle pages still go back. Fails,
 * saying so, while a refused page stays reserved (a later call tries
 * again). */
static um_status release_holes(um__pool *p, size_t keep)
{
    retry_parked(p);
    um_status first = UM_OK;
    uint32_t h = p->hole_head;
    /* A refused page is mapped back at the list's tail: the walk stops
     * after as many steps as there were holes, so it does not come round
     * to such a page again. */
    for (size_t steps = p->holes; h != NO_PAGE && steps && p->holes * p->page > keep; steps--) {
        uint32_t next = p->pages[h].hole_next;
        bool idle;
        if (page_compound(p, h)) {
            /* A large page goes back whole, once all of it is idle; the
             * walk goes on past the pages it takes off the list. */
            size_t head = compound_head(p, h);
            while (next != NO_PAGE && compound_head(p, next) == head && page_compound(p, next))
                next = p->pages[next].hole_next;
            h = (uint32_t)head;
            idle = compound_idle(p, head);
        } else {
            idle = page_usable(p, h, UM_NO_FENCE);
        }
        if (idle) {
            um_status s = release_hole(p, h);
            if (s != UM_OK && first == UM_OK)
                first = s;
        }
        h = next;
    }
    if (first != UM_OK)
        return first;
    if (p->nparked)
        return um__fail(UM_ERR_BACKEND,
                        "%s: %zu page%s the backend refused to take back %s still reserved; a "
                        "later trim tries again",
                        dev_name(p), p->nparked, p->nparked == 1 ? "" : "s",
                        p->nparked == 1 ? "is" : "are");
    return UM_OK;
}

static um_status poll_all(um__pool *p, bool wait);
static bool wait_old_fences(um__pool *p, uint64_t min_age_ns);
static void bounce_flush_locked(um__pool *p, struct um__tcache *tc);
static void bounce_unlink_out_locked(struct um__tcache *tc, um__block *b);
static um__tcache *own_cache(um__pool *p);
static void release_spare_slabs(um__pool *p);
static void flush_caches_locked(um__pool *p);
static void defer_flush(um__pool *p);
static bool tcache_drain_others(um__pool *p, bool bins, bool every);
static void tcache_flush_locked(um__pool *p, um__tcache *tc);
static void flush_bin_locked(um__pool *p, um__tc_bin *bin, unsigned cls, uint32_t count);
static void plan_stop(um__pool *p);

/* Over the cache limit, free pages go back to the backend. Fresh holes are
 * fenced until their stream is seen done, and cached small slots keep
 * their slabs' pages, so when releasing holes alone is not enough the pool
 * also returns this thread's cached slots, polls fences and drops empty
 * slabs. */
static void enforce_cache_limit_slow(um__pool *p)
{
    size_t limit = p->base.cache_limit;
    if (p->reserved - active_total(p) <= limit)
        return;
    (void)release_holes(p, limit);
    if (p->reserved - active_total(p) > limit) {
        /* This thread's cache only: taking other threads' bins on a free
         * would push them onto the locked path in a steady state. */
        um__tcache *tc = own_cache(p);
        if (tc)
            tcache_flush_locked(p, tc);
        tcache_drain_others(p, false, false);
        defer_flush(p);
        poll_all(p, false);
        release_spare_slabs(p);
        (void)release_holes(p, limit);
    }
}

/* Without a cache limit (the default) a free pays one compare for it. */
static inline void enforce_cache_limit(um__pool *p)
{
    if (p->base.cache_limit != UM_NO_CACHE_LIMIT)
        enforce_cache_limit_slow(p);
}

/* Whether page q is a hole that may be moved now. */
static bool movable_hole(um__pool *p, size_t q)
{
    return q < p->npages && p->pages[q].phys && !p->pages[q].pin && !page_compound(p, q) &&
           page_usable(p, q, UM_NO_FENCE);
}

/* Physical-page recycling: moves the hole h, and the movable holes right
 * after it, onto the unmapped pages of [*pg, last] (the caller's range is
 * [first, last]). The run is unmapped with one backend call, as a freed
 * block's pages usually lie together. On a failed map the pages not yet
 * placed go back where they were (or to the backend). */
static um_status move_holes(um__pool *p, uint32_t h, size_t first, size_t *pg, size_t last)
{
    enum { MAX_RUN = 64 };
    um__backend *b = p->base.backend;
    size_t want = 0;
    for (size_t q = *pg; q <= last; q++)
        want += !p->pages[q].phys;
    size_t run = 1;
    while (run < want && run < MAX_RUN && (h + run < first || h + run > last) &&
           movable_hole(p, h + run))
        run++;
    um_status s = um__be_unmap(b, page_addr(p, h), run * p->page);
    if (s != UM_OK)
        return s;
    um__phys phys[MAX_RUN];
    for (size_t i = 0; i < run; i++) {
        phys[i] = p->pages[h + i].phys;
        page_set_phys(p, h + i, 0);
        hole_remove(p, (uint32_t)(h + i));
    }
    for (size_t i = 0; i < run; i++) {
        while (p->pages[*pg].phys)
            (*pg)++;
        s = um__be_map(b, page_addr(p, *pg), p->page, phys[i]);
        if (s != UM_OK) {
            for (size_t j = i; j < run; j++) {
                if (um__be_map(b, page_addr(p, h + j), p->page, phys[j]) == UM_OK) {
                    page_set_phys(p, h + j, phys[j]);
                    hole_push(p, (uint32_t)(h + j));
                } else {
                    give_back(p, phys[j], 1);
                }
            }
            return s;
        }
        page_set_phys(p, *pg, phys[i]);
        hole_push(p, (uint32_t)*pg); /* a hole until the caller pins it */
        (*pg)++;
    }
    return UM_OK;
}

/* Whether the pool moves free pages to where they are needed now, rather
 * than create pages while under the limit. Automatically, while the step
 * planner learns: its steps must be tight, and a plan then places them
 * with no page moves. A program with no period then runs as a caching
 * allocator (each page move costs about 55 us on a GPU), recycling at the
 * memory limit. */
static bool recycling(um__pool *p)
{
    if (p->recycle != UM_RECYCLE_AUTO)
        return p->recycle == UM_RECYCLE_ALWAYS;
    return !p->plan_on || um__plan_learning(&p->plan);
}

/* How old a fence must be for the pool to wait for it rather than grow:
 * the fence_wait_us option, or any fence while the planner learns a
 * period, so that the steps it plans from stay as tight as with no lag
 * (with recycling only: a caching pool grows rather than move pages). */
static uint64_t fence_wait_ns(um__pool *p)
{
    if (p->fence_wait_ns)
        return p->fence_wait_ns;
    return p->plan_on && recycling(p) && um__plan_learning(&p->plan) ? 1 : 0;
}

/* Moves the idle large page at page `from` to pages to..to+big-1, which
 * are unmapped: one unmap and one map, where moving as many single pages
 * takes a map each. On a failed map the large page goes back where it was
 * (or to the backend). */
static um_status move_compound(um__pool *p, size_t from, size_t to)
{
    um__backend *b = p->base.backend;
    size_t bytes = (size_t)p->big * p->page;
    um_status s = um__be_unmap(b, page_addr(p, from), bytes);
    if (s != UM_OK)
        return s;
    um__phys ph = p->pages[from].phys;
    chunk_place(p, from, p->big, 0);
    s = um__be_map(b, page_addr(p, to), bytes, ph);
    if (s == UM_OK) {
        chunk_place(p, to, p->big, ph); /* holes until the caller pins them */
        return UM_OK;
    }
    if (um__be_map(b, page_addr(p, from), bytes, ph) == UM_OK)
        chunk_place(p, from, p->big, ph);
    else
        give_back(p, ph, p->big);
    return s;
}

/* New backend memory for n pages from page pg on (unmapped): one chunk,
 * mapped there as holes, which the caller pins. */
static um_status create_chunk(um__pool *p, size_t pg, uint32_t n)
{
    um__backend *b = p->base.backend;
    size_t bytes = (size_t)n * p->page;
    um__phys ph = 0;
    um_status s = um__be_create(b, bytes, &ph);
    if (s != UM_OK)
        return s;
    /* The chunk is the driver's memory from here on, mapped or not: the
     * peak counts it even if the map fails and the chunk cannot be given
     * back (found by the stand-in driver's injected failures). */
    reserved_add(p, (int64_t)bytes);
    if (p->reserved > p->peak_reserved)
        p->peak_reserved = p->reserved;
    s = um__be_map(b, page_addr(p, pg), bytes, ph);
    if (s != UM_OK) {
        give_back(p, ph, n);
        return s;
    }
    chunk_place(p, pg, n, ph);
    return UM_OK;
}

/* Large pages back only ranges of at least this many of them. A smaller
 * block's place is soon shared by others whose lives differ, and a large
 * page stays mapped while any byte of it is in use: on the sim device
 * with 8 MiB large pages, the pipeline trace's peak went from 1.0088 to
 * 1.0234 times its live bytes with no minimum, and stayed at 1.0088 with
 * this one (BENCHMARKS.md, "Large pages"). */
#define LARGE_PAGE_MIN_RUN 4

/* The pages a chunk placed at unmapped page pg of the range [first, last]
 * may span: a large page where one fits whole (its first page a multiple
 * of its size, all of it unmapped and in a range large enough), else one. */
static uint32_t chunk_pages_at(um__pool *p, size_t pg, size_t first, size_t last)
{
    size_t k = p->big;
    if (k == 1 || (pg & (k - 1)) || pg + k - 1 > last || last - first + 1 < p->big_min_pages)
        return 1;
    return unmapped_count(p, pg, pg + k - 1) == k ? (uint32_t)k : 1;
}

/* Maps every unmapped page under [addr, addr+len), taking holes from
 * elsewhere before new backend memory (none unless may_create), and pins
 * the range. With large pages, a place a large page fits takes an idle
 * one from elsewhere, or a new one; at the limit an idle large page goes
 * back to make room for single pages. On failure the pages mapped so far
 * stay as holes and nothing is pinned. */
static um_status map_and_pin(um__pool *p, uintptr_t addr, size_t len, bool may_create)
{
    size_t first = page_of(p, addr), last = page_of(p, addr + len - 1);
    size_t pg = unmapped_count(p, first, last) ? first : last + 1;
    while (pg <= last) {
        if (p->pages[pg].phys) {
            pg++;
            continue;
        }
        uint32_t n = chunk_pages_at(p, pg, first, last);
        /* Without recycling, holes move only once the limit leaves no
         * room for a new page. */
        bool room = p->reserved + p->page <= p->base.memory_limit;
        bool moves = recycling(p) || !may_create || !room;
        bool move_large = n > 1 && (moves || p->reserved + n * p->page > p->base.memory_limit);
        uint32_t c = move_large ? compound_outside(p, first, last) : NO_PAGE;
        uint32_t h = moves && c == NO_PAGE ? hole_outside(p, first, last) : NO_PAGE;
        /* Rather than grow past the peak while holes wait for fences,
         * wait for the old fences: cheap, as the device is past them or
         * has work queued behind them. */
        uint64_t wait_ns = fence_wait_ns(p);
        if (c == NO_PAGE && h == NO_PAGE && may_create && wait_ns && p->holes &&
            p->reserved + n * p->page > p->peak_reserved && wait_old_fences(p, wait_ns)) {
            c = move_large ? compound_outside(p, first, last) : NO_PAGE;
            h = c == NO_PAGE ? hole_outside(p, first, last) : NO_PAGE;
        }
        um_status s;
        if (c != NO_PAGE) {
            if ((s = move_compound(p, c, pg)) != UM_OK)
                return s;
            pg += n;
            continue;
        }
        if (h != NO_PAGE) {
            s = move_holes(p, h, first, &pg, last);
            if (s != UM_OK)
                return s;
            continue;
        }
        if (!may_create)
            return UM_ERR_NOMEM;
        if (!room) {
            /* Single pages are needed here: an idle large page elsewhere
             * goes back to make room for them. */
            c = compound_outside(p, first, last);
            if (c == NO_PAGE)
                return UM_ERR_NOMEM;
            if ((s = release_hole(p, c)) != UM_OK)
                return s;
            continue;
        }
        if (n > 1 && p->reserved + n * p->page <= p->base.memory_limit) {
            s = create_chunk(p, pg, n);
            if (s == UM_OK) {
                pg += n;
                continue;
            }
            /* Memory for a large page may be short where a page is not. */
            if (s != UM_ERR_NOMEM)
                return s;
        }
        if ((s = create_chunk(p, pg, 1)) != UM_OK)
            return s;
        pg++;
    }
    pin_range(p, addr, len, +1);
    return UM_OK;
}

/* ----------------------------------------------------------- range records */

/* Splits b (in no index) so that it keeps its first size bytes; the rest
 * goes to the spare record r, which is linked in after b and returned. */
static um__block *split_block(um__block *b, size_t size, um__block *r)
{
    r->fi.addr = b->fi.addr + size;
    r->fi.size = b->fi.size - size;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->fi.size = size;
    return r;
}

/* Turns b (unpinned, in no index) into a ready range, merged with ready
 * neighbours. */
static void make_ready(um__pool *p, um__block *b)
{
    um__region *r = &p->region;
    b->state = UM_BLOCK_READY;
    um__block *pv = b->prev, *nx = b->next;
    if (pv && pv->state == UM_BLOCK_READY) {
        um__fi_remove(&r->ready, &pv->fi);
        pv->fi.size += b->fi.size;
        pv->next = nx;
        if (nx)
            nx->prev = pv;
        block_put(p, b);
        b = pv;
    }
    if (nx && nx->state == UM_BLOCK_READY) {
        um__fi_remove(&r->ready, &nx->fi);
        b->fi.size += nx->fi.size;
        b->next = nx->next;
        if (nx->next)
            nx->next->prev = b;
        block_put(p, nx);
    }
    um__fi_insert(&r->ready, &b->fi);
}

/* ---------------------------------------------------------------- streams */

/* stream_state's first use of a stream: grows the table, makes the state
 * and marks the stream known. */
static um__stream_state *stream_state_slow(um__pool *p, const um__stream_ref *s)
{
    if (s->id >= p->nstreams) {
        uint32_t n = p->nstreams ? p->nstreams : 8;
        while (n <= s->id)
            n *= 2;
        um__stream_state **a = realloc(p->streams, n * sizeof *a);
        if (!a)
            return NULL;
        memset(a + p->nstreams, 0, (n - p->nstreams) * sizeof *a);
        p->streams = a;
        p->nstreams = n;
    }
    um__stream_state *ss = p->streams[s->id];
    if (!ss) {
        /* The busy list grows with the states, so that listing one later
         * needs no memory. */
        if (p->nstates == p->busy_cap) {
            uint32_t cap = p->busy_cap ? 2 * p->busy_cap : 8;
            um__stream_state **b = realloc(p->busy, cap * sizeof *b);
            if (!b)
                return NULL;
            p->busy = b;
            p->busy_cap = cap;
        }
        ss = calloc(1, sizeof *ss);
        if (!ss)
            return NULL;
        ss->epoch = 1;
        p->streams[s->id] = ss;
        p->nstates++;
    }
    if (!ss->known) {
        ss->known = true;
        ss->bstream = s->bstream;
        ss->backend = s->backend;
        if (s->id < KNOWN_STREAM_BITS)
            atomic_fetch_or_explicit(&p->known_streams[s->id / 64], 1ull << (s->id % 64),
                                     memory_order_release);
    }
    return ss;
}

/* The state of stream s in this pool (locked), made on its first use; NULL
 * without host memory for it. Inline for the known stream, every large
 * allocation's and free's case. */
static inline um__stream_state *stream_state(um__pool *p, const um__stream_ref *s)
{
    um__stream_state *ss = s->id < p->nstreams ? p->streams[s->id] : NULL;
    return UM_LIKELY(ss && ss->known) ? ss : stream_state_slow(p, s);
}

/* The stream a free without one orders after: the block's allocation
 * stream sid (locked). A stream destroyed since has finished its work, and
 * the pool forgot it: the free is then ordered on the default stream.
 * Taking sid as it was re-registered the id without its backend stream, so
 * the next stream given that id had its frees fenced on the default
 * stream instead of its own, and its memory reused under its queued work. */
static um__stream_ref allocation_stream(const um__pool *p, uint32_t sid)
{
    const um__stream_state *ss = sid < p->nstreams ? p->streams[sid] : NULL;
    if (!ss || !ss->known)
        return (um__stream_ref){0, NULL, NULL};
    return (um__stream_ref){sid, ss->bstream, ss->backend};
}

static bool pending_push(um__pending_vec *v, void *ptr, uint64_t epoch)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        um__pending_obj *a = realloc(v->items, cap * sizeof *a);
        if (!a)
            return false;
        v->items = a;
        v->cap = cap;
    }
    v->items[v->n++] = (um__pending_obj){ptr, epoch};
    return true;
}

static void slot_return(um__pool *p, void *ptr);

/* Whether class cls's slabs serve allocations (medium ones only while
 * medium slabs are on). */
static inline bool medium_class_on(um__pool *p, unsigned cls)
{
    return cls < UM_NSMALL_CLASSES ||
           atomic_load_explicit(&p->slab_max, memory_order_relaxed) == UM_MEDIUM_MAX;
}

/* Everything freed on ss with epoch <= upto is now safe on every stream. */
static void migrate(um__pool *p, um__stream_state *ss, uint64_t upto)
{
    ss->completed = upto;
    for (unsigned c = 0; c < UM_NCLASSES; c++) {
        um__pending_vec *v = &ss->small[c];
        size_t k = 0;
        while (k < v->n && v->items[k].epoch <= upto)
            k++;
        if (!k)
            continue;
        for (size_t i = 0; i < k; i++)
            slot_return(p, v->items[i].ptr);
        memmove(v->items, v->items + k, (v->n - k) * sizeof *v->items);
        v->n -= k;
        ss->small_pending -= k;
    }
}

static bool stream_has_pending(const um__stream_state *ss)
{
    return ss->open_frees || ss->small_pending;
}

/* Notes frees on stream ss that no fence covers yet, and lists the stream
 * for polling. */
static inline void note_open_frees(um__pool *p, um__stream_state *ss)
{
    ss->open_frees = true;
    if (!ss->busy) {
        ss->busy = true;
        p->busy[p->nbusy++] = ss;
    }
}

/* The backend that records and answers a stream's fences: the stream's
 * own (another device's, for a GPU stream ordering host memory). */
static um__backend *fence_backend(um__pool *p, const um__stream_state *ss)
{
    return ss->backend ? ss->backend : p->base.backend;
}

/* Retires the stream's oldest fence: waits for it (wait) or finds it
 * complete, then makes what it covers reusable. False when it is still
 * running or the backend failed. */
static bool retire_fence(um__pool *p, um__stream_state *ss, bool wait)
{
    um__backend *b = fence_backend(p, ss);
    um__bevent *e = ss->fences[ss->fence_head].event;
    int done = 0;
    um_status s = wait ? um__be_event_sync(b, e) : um__be_event_query(b, e, &done);
    if (s != UM_OK || (!wait && !done))
        return false;
    migrate(p, ss, ss->fences[ss->fence_head].epoch);
    um__be_event_destroy(b, e);
    ss->fence_head = (ss->fence_head + 1) % UM_FENCE_RING;
    ss->fence_n--;
    return true;
}

/* Records a fence covering the stream's frees so far, when some are not
 * covered yet and the ring has room. */
static void record_fence(um__pool *p, um__stream_state *ss)
{
    if (!ss->open_frees || ss->fence_n == UM_FENCE_RING)
        return;
    uint32_t i = (ss->fence_head + ss->fence_n) % UM_FENCE_RING;
    if (um__be_event_record(fence_backend(p, ss), ss->bstream, &ss->fences[i].event) != UM_OK)
        return;
    ss->fences[i].epoch = ss->epoch++;
    ss->fences[i].recorded_ns = um__now_ns();
    ss->fence_n++;
    ss->open_frees = false;
}

/* Synchronizes ss's stream, then retires its fences and closes the epoch
 * of the frees no fence covers, as a fence's completion would (later frees
 * get the next epoch): slower than fences, for when one cannot be recorded
 * or waited for. False when even the synchronization fails. */
static bool sync_stream(um__pool *p, um__stream_state *ss)
{
    um__backend *b = fence_backend(p, ss);
    if (um__be_stream_sync(b, ss->bstream) != UM_OK)
        return false;
    while (ss->fence_n) {
        migrate(p, ss, ss->fences[ss->fence_head].epoch);
        um__be_event_destroy(b, ss->fences[ss->fence_head].event);
        ss->fence_head = (ss->fence_head + 1) % UM_FENCE_RING;
        ss->fence_n--;
    }
    if (ss->open_frees) {
        migrate(p, ss, ss->epoch++);
        ss->open_frees = false;
    }
    return true;
}

/* Checks (wait = false) or waits for (wait = true) the stream's fences,
 * oldest first, and makes what they cover reusable; records a new fence
 * when frees are uncovered. Waiting, where a fence cannot be recorded or
 * waited for, it waits for the stream itself, which covers every fence and
 * free on it so far (a trim, a lowered limit, a stream going away). Returns
 * true when everything freed on the stream has completed; false also when
 * the stream cannot be waited for either: its fences stay, still answered
 * by the stream's own backend. */
static bool poll_stream(um__pool *p, um__stream_state *ss, bool wait)
{
    /* The second round looks at the fence the first one recorded: a
     * stream with no work in flight is then seen idle at once. */
    for (int round = 0; round < 2; round++) {
        while (ss->fence_n && retire_fence(p, ss, wait))
            ;
        if (round == 0)
            record_fence(p, ss);
    }
    /* A trim whose fence record failed used to return with the frees it
     * had not covered still reserved. */
    if (wait && (ss->fence_n || ss->open_frees) && !sync_stream(p, ss))
        return false;
    return !ss->fence_n && !stream_has_pending(ss);
}

/* Waits for the fences of every stream that were recorded at least
 * min_age_ns ago. The device is then still busy with the work queued after
 * them, so the wait does not leave it idle, unlike waiting for the newest
 * fence. Returns true when a fence was retired. */
static bool wait_old_fences(um__pool *p, uint64_t min_age_ns)
{
    uint64_t now = um__now_ns();
    bool any = false;
    for (uint32_t i = 0; i < p->nbusy; i++) {
        um__stream_state *ss = p->busy[i];
        while (ss->fence_n && now - ss->fences[ss->fence_head].recorded_ns >= min_age_ns &&
               retire_fence(p, ss, true))
            any = true;
    }
    return any;
}

/* Polls (or, when wait, waits for) every busy stream. Waiting, fails
 * where a stream's frees could not be waited for, nor the stream itself
 * (saying why for the first): what they cover stays reserved. */
static um_status poll_all(um__pool *p, bool wait)
{
    bool idle = true;
    uint32_t stuck = 0;
    char why[256] = "";
    for (uint32_t i = 0; i < p->nbusy;) {
        um__stream_state *ss = p->busy[i];
        if (poll_stream(p, ss, wait)) {
            /* Idle: off the list until its next free. */
            ss->busy = false;
            p->busy[i] = p->busy[--p->nbusy];
        } else {
            if (wait && !stuck++)
                snprintf(why, sizeof why, "%s", um_last_error());
            idle = false;
            i++;
        }
    }
    /* Pages freed by several busy streams wait for a moment like this. */
    if (idle)
        p->full_syncs++;
    if (!stuck)
        return UM_OK;
    return um__fail(UM_ERR_BACKEND,
                    "device %d (%s): the work of the frees on %u stream%s cannot be waited for, "
                    "nor the stream itself (%s), so their memory stays reserved",
                    p->base.dev, dev_name(p), stuck, stuck == 1 ? "" : "s", why);
}

/* Whether the fence of page pg, set by another stream, has completed (it
 * is cleared then). */
static bool page_fence_done(um__pool *p, size_t pg)
{
    uint32_t u = p->pages[pg].fence_stream;
    bool done = u == UM_MIXED_FENCE ? p->full_syncs > p->pages[pg].fence_epoch
                                    : p->streams[u]->completed >= p->pages[pg].fence_epoch;
    if (done)
        p->pages[pg].fence_stream = UM_NO_FENCE;
    return done;
}

/* Notes that stream sid's frees fence pages (see um__pool's fencer). */
static inline void note_fencer(um__pool *p, uint32_t sid)
{
    if (p->fencer == UM_NO_FENCE)
        p->fencer = sid;
    else if (p->fencer != sid)
        p->fencer = UM_MIXED_FENCE;
}

/* True when no page holds a fence that stream sid (UM_NO_FENCE: the host)
 * would have to wait for. */
static inline bool all_usable(const um__pool *p, uint32_t sid)
{
    return p->fencer == UM_NO_FENCE || p->fencer == sid;
}

/* Stamps page pg as freed on stream sid in its epoch `epoch`. A fence of
 * sid's own stays when it is newer: a deferred block released late stamps
 * its older epoch, and lowering a neighbour's newer one let another stream
 * reuse the neighbour's bytes under sid's queued work. */
static inline void fence_page(um__pool *p, uint32_t sid, uint64_t epoch, size_t pg)
{
    if (page_usable(p, pg, sid) && p->pages[pg].fence_stream != UM_MIXED_FENCE) {
        if (p->pages[pg].fence_stream == sid && p->pages[pg].fence_epoch > epoch)
            epoch = p->pages[pg].fence_epoch;
        p->pages[pg].fence_stream = sid;
        p->pages[pg].fence_epoch = epoch;
    } else {
        p->pages[pg].fence_stream = UM_MIXED_FENCE;
        p->pages[pg].fence_epoch = p->full_syncs;
    }
}

/* Stamps the pages of a range freed on stream ss (id sid). */
static void fence_range(um__pool *p, um__stream_state *ss, uint32_t sid, uintptr_t addr,
                        size_t len)
{
    size_t first = page_of(p, addr), last = page_of(p, addr + len - 1);
    note_fencer(p, sid);
    for (size_t pg = first; pg <= last; pg++)
        fence_page(p, sid, ss->epoch, pg);
    note_open_frees(p, ss);
}

/* Takes n not-ready bytes off page pg's pin count, after fencing it on
 * stream ss (id sid) in epoch `epoch` when ss is set; a mapped page left
 * with none becomes the newest hole. */
static inline void unpin_page(um__pool *p, um__stream_state *ss, uint32_t sid, uint64_t epoch,
                              size_t pg, uint32_t n)
{
    if (ss)
        fence_page(p, sid, epoch, pg);
    p->pages[pg].pin -= n;
    if (p->pages[pg].pin == 0 && p->pages[pg].phys)
        hole_push(p, (uint32_t)pg);
}

/* unpin_page for the whole pages lo..hi of a freed range, with the list's
 * tail kept in a register: the mapped ones join the hole list in page
 * order, as a chain that pin_interior can take off again in one piece. */
static void unpin_interior(um__pool *p, um__stream_state *ss, uint32_t sid, uint64_t epoch,
                           size_t lo, size_t hi)
{
    um__page *pages = p->pages;
    uint32_t tail = p->hole_tail;
    size_t pushed = 0;
    /* With sid the only stream that fences, a page's fence is none or
     * sid's own, and fence_page would simply stamp it. */
    bool stamp = ss && all_usable(p, sid);
    if (stamp && unmapped_count(p, lo, hi) == 0) {
        /* The common case, every page mapped: the same records written
         * without a branch per page (two thirds of the instructions of the
         * loop below, callgrind). */
        for (size_t pg = lo; pg <= hi; pg++) {
            pages[pg].fence_stream = sid;
            pages[pg].fence_epoch = epoch;
            pages[pg].pin = 0;
            pages[pg].hole_prev = (uint32_t)pg - 1;
            pages[pg].hole_next = (uint32_t)pg + 1;
        }
        pages[lo].hole_prev = tail;
        pages[hi].hole_next = NO_PAGE;
        hole_link_after(p, tail, (uint32_t)lo);
        p->hole_tail = (uint32_t)hi;
        p->holes += hi - lo + 1;
        return;
    }
    for (size_t pg = lo; pg <= hi; pg++) {
        if (stamp) {
            pages[pg].fence_stream = sid;
            pages[pg].fence_epoch = epoch;
        } else if (ss) {
            fence_page(p, sid, epoch, pg);
        }
        pages[pg].pin = 0;
        if (!pages[pg].phys)
            continue;
        pages[pg].hole_prev = tail;
        pages[pg].hole_next = NO_PAGE;
        hole_link_after(p, tail, (uint32_t)pg);
        tail = (uint32_t)pg;
        pushed++;
    }
    p->hole_tail = tail;
    p->holes += pushed;
}

/* A freed range's pages, in one pass over their records: fenced on stream
 * ss (id sid; none when ss is NULL) in its epoch `epoch`, then unpinned. */
static void unpin_fenced(um__pool *p, um__stream_state *ss, uint32_t sid, uint64_t epoch,
                         uintptr_t addr, size_t len)
{
    size_t first = page_of(p, addr), last = page_of(p, addr + len - 1);
    if (ss)
        note_fencer(p, sid);
    unpin_page(p, ss, sid, epoch, first, page_share(p, first, first, last, addr, len));
    if (last > first + 1)
        unpin_interior(p, ss, sid, epoch, first + 1, last - 1);
    if (last != first)
        unpin_page(p, ss, sid, epoch, last, page_share(p, last, first, last, addr, len));
    if (ss)
        note_open_frees(p, ss);
}

/* ------------------------------------------------------------------ slabs */

/* A slab map entry (0: no slab) is the slab's record, aligned to
 * SLAB_ALIGN, with the slab's class in bits 0-5 and which of its 64 KiB
 * units the entry's is in bits 6-11: a small free computes its slot and
 * the slot's word (at a fixed offset in the record, slab_words) from the
 * entry alone, without first loading the record (a cache miss once many
 * blocks are live). */
#define SLAB_ALIGN 4096u
#define SLAB_HDR (((sizeof(um__slab) + 63) / 64) * 64)
#define ENTRY_CLASS(e) ((unsigned)((e) & 63u))
#define ENTRY_UNIT(e) ((uintptr_t)(((e) >> 6) & 63u))
#define ENTRY_SLAB(e) ((um__slab *)((e) & ~(uintptr_t)(SLAB_ALIGN - 1)))
_Static_assert(UM_NCLASSES <= 64, "a class fits the entry's 6 bits");
_Static_assert(SLAB_SLOTS * WIDE_CLASS_MIN / UM_SLAB_UNIT <= 64 &&
                   WIDE_SLAB_SLOTS * UM_MEDIUM_MAX / UM_SLAB_UNIT <= 64,
               "a slab's units fit the entry's 6 bits");

static inline um__slot_word *slab_words(um__slab *s)
{
    return (um__slot_word *)((char *)s + SLAB_HDR);
}

static inline uintptr_t slab_entry(um__pool *p, uintptr_t addr)
{
    size_t unit = (addr - p->slab_base) / UM_SLAB_UNIT;
    size_t top = unit / SLAB_MAP_LEAF;
    if (top >= p->slab_map_top)
        return 0;
    /* Most large blocks lie in granules that hold no slab: a bit per
     * granule answers for them (the bitmap stays in cache), where the
     * map's entry is a cache miss once many blocks are live. */
    size_t g = unit / SLAB_GRANULE_UNITS;
    if (!(atomic_load_explicit(&p->slab_granules[g / 64], memory_order_acquire) >> (g % 64) & 1))
        return 0;
    _Atomic uintptr_t *leaf = p->slab_map[top];
    return leaf ? atomic_load_explicit(&leaf[unit % SLAB_MAP_LEAF], memory_order_acquire) : 0;
}

static inline um__slab *slab_lookup(um__pool *p, uintptr_t addr)
{
    return ENTRY_SLAB(slab_entry(p, addr));
}

/* Whether any unit of granule g names a slab (its units share one leaf). */
static bool granule_has_slab(um__pool *p, size_t g)
{
    size_t unit = g * SLAB_GRANULE_UNITS;
    _Atomic uintptr_t *leaf = p->slab_map[unit / SLAB_MAP_LEAF];
    for (size_t i = 0; leaf && i < SLAB_GRANULE_UNITS; i++)
        if (atomic_load_explicit(&leaf[(unit + i) % SLAB_MAP_LEAF], memory_order_relaxed))
            return true;
    return false;
}

/* Points the slab map's units of [base, base+bytes) at s (NULL: at no
 * slab), keeping the bit of each granule that holds a slab unit. The bit is
 * set before a unit names its slab, so a lookup that finds the unit finds
 * the bit too; it is cleared once no unit of its granule names one. Under
 * the pool lock. */
static bool slab_map_set(um__pool *p, um__slab *s, uintptr_t base, size_t bytes)
{
    for (uintptr_t a = base; a < base + bytes; a += UM_SLAB_UNIT) {
        size_t unit = (a - p->slab_base) / UM_SLAB_UNIT, top = unit / SLAB_MAP_LEAF;
        if (!p->slab_map[top]) {
            if (!s)
                continue;
            p->slab_map[top] = calloc(SLAB_MAP_LEAF, sizeof(_Atomic uintptr_t));
            if (!p->slab_map[top])
                return false;
        }
        size_t g = unit / SLAB_GRANULE_UNITS;
        if (s)
            atomic_fetch_or_explicit(&p->slab_granules[g / 64], 1ull << (g % 64),
                                     memory_order_release);
        uintptr_t e = s ? (uintptr_t)s | s->cls | (uintptr_t)((a - base) / UM_SLAB_UNIT) << 6 : 0;
        atomic_store_explicit(&p->slab_map[top][unit % SLAB_MAP_LEAF], e, memory_order_release);
    }
    if (!s) {
        size_t g0 = (base - p->slab_base) / UM_SLAB_UNIT / SLAB_GRANULE_UNITS;
        size_t g1 = (base + bytes - 1 - p->slab_base) / UM_SLAB_UNIT / SLAB_GRANULE_UNITS;
        for (size_t g = g0; g <= g1; g++)
            if (!granule_has_slab(p, g))
                atomic_fetch_and_explicit(&p->slab_granules[g / 64], ~(1ull << (g % 64)),
                                          memory_order_release);
    }
    return true;
}

static inline uint32_t slot_of(const um__slab *s, uintptr_t addr)
{
    return (uint32_t)(((uint64_t)(addr - s->base) * class_recip[s->cls]) >> 40);
}

static void partial_remove(um__pool *p, um__slab *s)
{
    if (!s->on_list)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        p->partial[s->cls] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->on_list = false;
}

static void partial_push(um__pool *p, um__slab *s)
{
    s->prev = NULL;
    s->next = p->partial[s->cls];
    if (s->next)
        s->next->prev = s;
    p->partial[s->cls] = s;
    s->on_list = true;
}

static void slab_free_arrays(um__slab *s)
{
    free(s->free_stack);
    free(s);
}

static void slab_destroy(um__pool *p, um__slab *s)
{
    partial_remove(p, s);
    (void)slab_map_set(p, NULL, s->base, s->block->fi.size);
    um__block *b = s->block;
    b->slab = NULL;
    pin_range(p, b->fi.addr, b->fi.size, -1);
    make_ready(p, b);
    slab_free_arrays(s);
}

/* A slot comes back to its slab (ready on every stream). At most one empty
 * slab per class is kept; more are destroyed so their pages become holes,
 * except while take_ready maps pages (p->taking): the extra empty slab
 * then stays on its class's list, for the next allocations or
 * release_spare_slabs. */
static void slot_return(um__pool *p, void *ptr)
{
    um__slab *s = slab_lookup(p, (uintptr_t)ptr);
    uint32_t slot = slot_of(s, (uintptr_t)ptr);
    atomic_store_explicit(&slab_words(s)[slot].w, UM_SLOT_FREE, memory_order_relaxed);
    s->free_stack[s->nfree++] = slot;
    if (s->nfree == s->nslots && !p->taking) {
        um__slab *other = p->partial[s->cls];
        if (other == s)
            other = s->next;
        if (other || !medium_class_on(p, s->cls)) {
            slab_destroy(p, s);
            return;
        }
    }
    if (!s->on_list)
        partial_push(p, s);
}

static um_status take_range(um__pool *p, size_t size, size_t align, uint32_t sid,
                            um__block **out);

/* The most bytes a new slab may take: an eighth of the memory the limit
 * lets the pool map (whole pages). A slab's free slots serve only its own
 * class, and one slot held keeps the whole slab, so under a tight limit a
 * larger slab kept larger requests from fitting where their bytes did: a
 * 512 KiB slab for one acquired 32 KiB buffer, under a limit of one 2 MiB
 * page, failed a 1.56 MiB request with 32 KiB live (found by an audit).
 * The block then takes the large path (small_alloc_locked). */
static size_t slab_room(const um__pool *p)
{
    return p->base.memory_limit / p->page * p->page / 8;
}

static um_status slab_create(um__pool *p, unsigned cls, um__slab **out)
{
    size_t bytes = slab_bytes(cls);
    if (bytes > slab_room(p))
        return UM_ERR_NOMEM;
    um__block *b;
    um_status st = take_range(p, bytes, UM_SLAB_UNIT, UM_NO_FENCE, &b);
    if (st != UM_OK)
        return st;
    uint32_t n = class_nslots[cls];
    /* The record and its slot words in one allocation (slab_words). */
    size_t rec = (SLAB_HDR + n * sizeof(um__slot_word) + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
    um__slab *s = aligned_alloc(SLAB_ALIGN, rec);
    if (s) {
        memset(s, 0, rec);
        s->cls = cls;
        s->free_stack = malloc(n * sizeof *s->free_stack);
    }
    if (!s || !s->free_stack || !slab_map_set(p, s, b->fi.addr, bytes)) {
        if (s)
            slab_free_arrays(s);
        (void)slab_map_set(p, NULL, b->fi.addr, bytes);
        pin_range(p, b->fi.addr, b->fi.size, -1);
        make_ready(p, b);
        um__note_host_nomem();
        return um__fail(UM_ERR_NOMEM, "%s: out of host memory for slab records", dev_name(p));
    }
    s->base = b->fi.addr;
    s->block = b;
    s->nslots = n;
    s->nfree = n;
    for (uint32_t i = 0; i < n; i++)
        s->free_stack[i] = n - 1 - i; /* low addresses first */
    b->state = UM_BLOCK_SLAB;
    b->slab = s;
    partial_push(p, s);
    *out = s;
    return UM_OK;
}

/* Takes one slot of class cls for stream sid (state becomes CACHED): the
 * stream's own pending slots first, then slabs, then a new slab. */
static um_status small_take(um__pool *p, unsigned cls, um__stream_state *ss, void **ptr)
{
    um__pending_vec *v = &ss->small[cls];
    if (v->n) {
        *ptr = v->items[--v->n].ptr;
        ss->small_pending--;
        return UM_OK;
    }
    um__slab *s = p->partial[cls];
    if (!s) {
        /* Slots other streams freed may have become safe: look before
         * growing. */
        poll_all(p, false);
        if (v->n) {
            *ptr = v->items[--v->n].ptr;
            ss->small_pending--;
            return UM_OK;
        }
        s = p->partial[cls];
    }
    if (!s) {
        um_status st = slab_create(p, cls, &s);
        if (st != UM_OK)
            return st;
    }
    uint32_t slot = s->free_stack[--s->nfree];
    atomic_store_explicit(&slab_words(s)[slot].w, UM_SLOT_CACHED, memory_order_relaxed);
    if (!s->nfree)
        partial_remove(p, s);
    *ptr = (void *)(s->base + (uintptr_t)slot * um__class_size[cls]);
    return UM_OK;
}

/* A cached slot (state CACHED) freed on stream ss goes to its pending list. */
static bool small_park(um__pool *p, um__stream_state *ss, unsigned cls, void *ptr)
{
    if (!pending_push(&ss->small[cls], ptr, ss->epoch))
        return false;
    ss->small_pending++;
    note_open_frees(p, ss);
    return true;
}

/* ---------------------------------------------------------- range taking */

/* Takes size bytes at addr inside ready block b and pins them; the parts
 * of b before and after stay ready. Returns the block record of the taken
 * range. */
static um_status take_ready(um__pool *p, um__block *b, uintptr_t addr, size_t size,
                            bool may_create, um__block **out)
{
    um__region *r = &p->region;
    size_t front = addr - b->fi.addr, back = b->fi.size - front - size;
    um__block *mid = NULL, *rest = NULL;
    if ((front && !(mid = block_new(p))) || (back && !(rest = block_new(p)))) {
        if (mid)
            block_put(p, mid);
        um__note_host_nomem();
        return UM_ERR_NOMEM;
    }
    /* Mapping may wait for old fences, which returns their slots; a slab
     * emptied then must not become ready memory and merge with b (found
     * by test_buffer: b's record went back to the free list while it was
     * being handed out). */
    p->taking = true;
    um_status s = map_and_pin(p, addr, size, may_create);
    p->taking = false;
    if (s != UM_OK) {
        if (mid)
            block_put(p, mid);
        if (rest)
            block_put(p, rest);
        return s;
    }
    um__fi_remove(&r->ready, &b->fi);
    if (mid) {
        split_block(b, front, mid);
        b->state = UM_BLOCK_READY;
        um__fi_insert(&r->ready, &b->fi);
        b = mid;
    }
    if (rest) {
        split_block(b, size, rest);
        rest->state = UM_BLOCK_READY;
        um__fi_insert(&r->ready, &rest->fi);
    }
    *out = b;
    return UM_OK;
}

static void release_spare_slabs(um__pool *p)
{
    for (unsigned c = 0; c < UM_NCLASSES; c++) {
        um__slab *s = p->partial[c];
        while (s) {
            um__slab *nx = s->next;
            if (s->nfree == s->nslots)
                slab_destroy(p, s);
            s = nx;
        }
    }
}

/* Whether every page under [at, at+size) may be used by stream sid now. */
static bool spot_usable(um__pool *p, uintptr_t at, size_t size, uint32_t sid)
{
    if (all_usable(p, sid))
        return true;
    for (size_t pg = page_of(p, at), last = page_of(p, at + size - 1); pg <= last; pg++)
        if (!page_usable(p, pg, sid))
            return false;
    return true;
}

/* Where in ready block b stream sid can place size bytes (aligned) now: the
 * lowest address whose pages no other busy stream freed, or 0. Only the
 * first pages of a block are searched, so the cost stays bounded. */
static uintptr_t usable_spot(um__pool *p, um__block *b, size_t size, size_t align, uint32_t sid)
{
    enum { SEARCH_PAGES = 1024 };
    uintptr_t at = um__align_up(b->fi.addr, align), end = b->fi.addr + b->fi.size;
    if (all_usable(p, sid))
        return at + size <= end ? at : 0;
    size_t scanned = 0;
    while (at + size <= end && scanned < SEARCH_PAGES) {
        size_t first = page_of(p, at), last = page_of(p, at + size - 1), pg = first;
        while (pg <= last && page_usable(p, pg, sid))
            pg++;
        if (pg > last)
            return at;
        scanned += pg - first + 1;
        at = um__align_up(page_addr(p, pg + 1), align);
    }
    return 0;
}

/* A spot for size bytes in ready block b, or 0: the test of walk_fits. */
typedef uintptr_t (*fit_test)(um__pool *p, um__block *b, size_t size, size_t align,
                              uint32_t sid, size_t mapped_slack);

/* The best-fitting ready block in which test finds a spot, and the spot;
 * blocks without one are passed over (a few at most, so the search stays
 * O(1)), and with mapped_slack so are blocks over size + mapped_slack.
 * Inlined into each caller, so that test is a direct call. */
static inline __attribute__((always_inline)) um__block *
walk_fits(um__pool *p, size_t size, size_t align, uint32_t sid, size_t mapped_slack,
          fit_test test, uintptr_t *spot)
{
    enum { TRIES = 8 };
    um__region *r = &p->region;
    um__block *skipped[TRIES], *found = NULL;
    int n = 0;
    while (n < TRIES) {
        um__block *b = (um__block *)um__fi_find(&r->ready, size + align - UM_ALIGN);
        if (!b || (mapped_slack && b->fi.size > size + mapped_slack))
            break;
        uintptr_t at = test(p, b, size, align, sid, mapped_slack);
        if (at) {
            *spot = at;
            found = b;
            break;
        }
        um__fi_remove(&r->ready, &b->fi);
        skipped[n++] = b;
    }
    while (n)
        um__fi_insert(&r->ready, &skipped[--n]->fi);
    return found;
}

/* find_usable's test: the lowest spot stream sid may use now; with
 * mapped_slack, only where its low or high end needs no new page. */
static uintptr_t usable_fit(um__pool *p, um__block *b, size_t size, size_t align, uint32_t sid,
                            size_t mapped_slack)
{
    uintptr_t at = usable_spot(p, b, size, align, sid);
    if (at && mapped_slack && !fully_mapped(p, at, size)) {
        uintptr_t high = um__align_down(b->fi.addr + b->fi.size - size, align);
        at = high > at && fully_mapped(p, high, size) && spot_usable(p, high, size, sid) ? high
                                                                                        : 0;
    }
    return at;
}

/* The best-fitting ready block that stream sid may use now, and the spot in
 * it; blocks with no usable spot are passed over (a few at most, so the
 * search stays O(1)). With mapped_slack, only blocks up to size +
 * mapped_slack bytes whose low or high end needs no new page qualify. */
static um__block *find_usable(um__pool *p, size_t size, size_t align, uint32_t sid,
                              size_t mapped_slack, uintptr_t *spot)
{
    return walk_fits(p, size, align, sid, mapped_slack, usable_fit, spot);
}

/* The spot for size bytes in ready block b that needs the fewest new pages
 * (its low end, or its high end when that needs fewer), and their count. */
static uintptr_t fewest_pages_spot(um__pool *p, um__block *b, uintptr_t at, size_t size,
                                   size_t align, uint32_t sid, size_t *need)
{
    *need = unmapped_pages(p, at, size);
    size_t span = page_of(p, at + size - 1) - page_of(p, at) + 1;
    if (p->big > 1 && span >= p->big_min_pages && *need == span) {
        /* Wholly new pages: a spot on a large page's boundary takes them
         * as whole large pages. Left where the last block happened to end
         * (16 MiB past one, in the tiled GEMM's host pool), a 256 MiB
         * block took 7 of its 8 chunks and 16 single pages, slow pinned
         * ones (BENCHMARKS.md). The gap stays free address space. */
        size_t big_bytes = (size_t)p->big * p->page;
        uintptr_t up = p->va + um__align_up(at - p->va, big_bytes);
        if (up % align == 0 && up + size <= b->fi.addr + b->fi.size &&
            unmapped_pages(p, up, size) == *need &&
            spot_usable(p, up, size, sid))
            return up;
    }
    uintptr_t high = um__align_down(b->fi.addr + b->fi.size - size, align);
    if (*need && high > at) {
        size_t need_high = unmapped_pages(p, high, size);
        if (need_high < *need && spot_usable(p, high, size, sid)) {
            *need = need_high;
            return high;
        }
    }
    return at;
}

/* Whether the need unmapped pages of [at, at+size) fit: holes outside
 * the range move onto them, and the rest are created while under the
 * limit. The range's own holes cannot move into it (map_and_pin takes
 * holes outside only): counted, at the limit a block whose only holes lay
 * under its chosen spot was picked over one that others' holes could fill,
 * and the allocation failed with room for it (test_pool's
 * test_fit_needs_holes_outside). */
static bool pages_fit(um__pool *p, uintptr_t at, size_t size, size_t need)
{
    size_t first = page_of(p, at), last = page_of(p, at + size - 1), holes = p->holes;
    /* Past the range's page count, holes outside it are certain. */
    if (need && holes < last - first + 1) {
        for (size_t pg = first; pg <= last; pg++)
            holes -= p->pages[pg].phys && !p->pages[pg].pin;
    }
    return need <= holes || p->reserved + (need - holes) * p->page <= p->base.memory_limit;
}

/* The last resort before UM_ERR_NOMEM: of every ready block, the one whose
 * spot needs the fewest new pages, or NULL. take_range's attempts look at
 * the best fit only (and at mapped fits up to a page larger), so at the
 * limit they could fail while a larger, fully mapped block was free
 * (test_stress saw "nothing left to evict" with 5.6 of 28 MiB live and a
 * free range the size of the request). It walks every block, which is
 * fine after every cheaper step has failed. */
static um__block *any_fit(um__pool *p, size_t size, size_t align, uint32_t sid, uintptr_t *spot)
{
    um__block *best = NULL;
    size_t best_need = SIZE_MAX;
    for (um__block *b = p->region.first; b && best_need; b = b->next) {
        if (b->state != UM_BLOCK_READY || b->fi.size < size)
            continue;
        uintptr_t at = usable_spot(p, b, size, align, sid);
        if (!at)
            continue;
        size_t need;
        at = fewest_pages_spot(p, b, at, size, align, sid, &need);
        if (need < best_need && pages_fit(p, at, size, need)) {
            best = b;
            best_need = need;
            *spot = at;
        }
    }
    return best;
}

/* The fence of stream u's state ss that covers its frees of epoch e (the
 * first recorded with an epoch at least e), recording one when e is still
 * open; NULL when none can be had (ring full, or the record failed). */
static um__bevent *fence_covering(um__pool *p, um__stream_state *ss, uint64_t e)
{
    if (e >= ss->epoch)
        record_fence(p, ss);
    for (uint32_t k = 0; k < ss->fence_n; k++) {
        uint32_t i = (ss->fence_head + k) % UM_FENCE_RING;
        if (ss->fences[i].epoch >= e)
            return ss->fences[i].event;
    }
    return NULL;
}

/* Makes the mapped spot [at, at+size) usable by stream sid in stream order
 * rather than by waiting on the host: sid's stream is made to wait on the
 * device for the fences of the other streams that freed its pages, as
 * CUDA's pools do by default (internal dependencies). At a memory limit
 * the alternative is moving pages, and unmapping them while a GPU is busy
 * took 17 ms a call on an H100 (BENCHMARKS.md), against a wait that
 * usually ends when a copy does. False, with nothing waited for, where a
 * page was freed by several streams (no one fence covers it), sid is not
 * a device's stream (the host uses its memory at once, whatever a stream
 * waits for), or more than a few streams or no fence would be needed. The
 * caller clears the fences once it has the spot (clear_spot_fences). */
static bool adopt_fenced_spot(um__pool *p, uintptr_t at, size_t size, uint32_t sid)
{
    enum { MAX_WAITS = 4 };
    um__stream_state *mine = sid < p->nstreams ? p->streams[sid] : NULL;
    if (!mine || !mine->known || fence_backend(p, mine)->kind == UM_DEVICE_HOST)
        return false;
    uint32_t streams[MAX_WAITS];
    uint64_t epochs[MAX_WAITS];
    int n = 0;
    size_t first = page_of(p, at), last = page_of(p, at + size - 1);
    for (size_t pg = first; pg <= last; pg++) {
        uint32_t u = p->pages[pg].fence_stream;
        if (u == UM_NO_FENCE || u == sid || page_fence_done(p, pg))
            continue;
        if (u == UM_MIXED_FENCE)
            return false;
        int k = 0;
        while (k < n && streams[k] != u)
            k++;
        if (k == n) {
            if (n == MAX_WAITS)
                return false;
            streams[n] = u;
            epochs[n++] = 0;
        }
        if (p->pages[pg].fence_epoch > epochs[k])
            epochs[k] = p->pages[pg].fence_epoch;
    }
    um__bevent *events[MAX_WAITS];
    for (int k = 0; k < n; k++)
        if (!(events[k] = fence_covering(p, p->streams[streams[k]], epochs[k])))
            return false;
    for (int k = 0; k < n; k++)
        if (um__be_stream_wait(fence_backend(p, mine), mine->bstream,
                               fence_backend(p, p->streams[streams[k]]), events[k]) != UM_OK)
            return false;
    return true;
}

/* After adopt_fenced_spot, once the spot is taken: its stream's later work
 * follows those frees, so the pages wholly under it carry no fence on (its
 * own free will stamp its stream's). A page it shares with free bytes
 * around it keeps its fence, which those bytes still need; so do all of
 * them while the spot is not taken. Counts the spot in adopted_spots. */
static void clear_spot_fences(um__pool *p, uintptr_t at, size_t size)
{
    size_t whole_end = page_of(p, at + size);
    for (size_t pg = page_of(p, at) + ((at - p->va) % p->page != 0); pg < whole_end; pg++)
        p->pages[pg].fence_stream = UM_NO_FENCE;
    p->adopted_spots++;
}

/* adopt_mapped_fit's test: the block's low or high end where wholly
 * mapped, made stream sid's own by adopt_fenced_spot. */
static uintptr_t adopted_fit(um__pool *p, um__block *b, size_t size, size_t align, uint32_t sid,
                             size_t mapped_slack)
{
    UM_UNUSED(mapped_slack);
    uintptr_t low = um__align_up(b->fi.addr, align);
    uintptr_t high = um__align_down(b->fi.addr + b->fi.size - size, align);
    uintptr_t at = fully_mapped(p, low, size) ? low : fully_mapped(p, high, size) ? high : 0;
    return at && adopt_fenced_spot(p, at, size, sid) ? at : 0;
}

/* The best-fitting ready block, at most a page and 1/16 larger than size,
 * with a mapped spot that adopt_fenced_spot takes for stream sid, and the
 * spot; NULL when none of the next few fits has one. The bound is attempt
 * 0's for mapped fits: splitting a larger mapped range here left the
 * two-stream pipeline trace (lag 8) needing 1.0205x its live bytes at its
 * smallest limit instead of 1.0176x. */
static um__block *adopt_mapped_fit(um__pool *p, size_t size, size_t align, uint32_t sid,
                                   uintptr_t *spot)
{
    return walk_fits(p, size, align, sid, p->page + size / 16, adopted_fit, spot);
}

/* Finds size bytes (aligned) for stream sid:
 * 0. ready memory that is already mapped: the best fit, or else one of the
 *    next few fits, up to a page and 1/16 larger, that needs no page moved
 *    (a move costs backend calls now and tends to leave partly used pages);
 * 1. at the limit, mapped memory that other streams freed, their fences
 *    made the stream's own by a wait on the device (adopt_fenced_spot,
 *    option cross_stream_reuse); then the same as 0, moving
 *    holes that are known to be idle onto the rest (no backend call but
 *    the moves themselves);
 * 2. after polling every stream's fence: holes that became idle, then new
 *    pages while under the limit;
 * 3. after waiting for every fence and dropping empty slabs: step 2 again;
 * 4. any ready block, whichever needs the fewest new pages (any_fit).
 * Within the chosen free block the range goes to its low end, or to its
 * high end when that needs fewer new pages (the top may sit on a
 * neighbour's partly used page, and the free rest stays page-aligned).
 * The returned block is pinned and in no index; the caller sets its state. */
static um_status take_range(um__pool *p, size_t size, size_t align, uint32_t sid,
                            um__block **out)
{
    um_status last = UM_ERR_NOMEM;
    p->unwaited[0] = '\0';
    bounce_flush_locked(p, own_cache(p));
    /* Attempt 0's common case, taken directly: no other stream's fence to
     * respect, and the best fit's low end already mapped. The loop below
     * would choose the same spot through its general steps (the usable
     * spot, the search for a mapped alternative, the spot needing the
     * fewest pages): about 150 of a large allocation's 1,000 instructions
     * in bench/live_mixed.c's steady state. */
    if (all_usable(p, sid)) {
        um__block *b = (um__block *)um__fi_find(&p->region.ready, size + align - UM_ALIGN);
        if (b) {
            uintptr_t at = um__align_up(b->fi.addr, align);
            if (fully_mapped(p, at, size)) {
                last = take_ready(p, b, at, size, false, out);
                if (last != UM_ERR_NOMEM)
                    return last;
            }
        }
    }
    for (int attempt = 0; attempt < 4; attempt++) {
        /* Deferred blocks go back before a page would move or be made. */
        if (attempt == 1 && p->deferred.count) {
            defer_flush(p);
            return take_range(p, size, align, sid, out);
        }
        if (attempt == 1 && p->cross_stream_reuse && !all_usable(p, sid) &&
            p->reserved + size > p->base.memory_limit) {
            /* At the limit, where pages would move or the host wait,
             * mapped memory that other streams freed is taken in stream
             * order instead. Below it the pool makes pages rather than
             * tie one stream's work to another's. */
            uintptr_t at = 0;
            um__block *b = adopt_mapped_fit(p, size, align, sid, &at);
            if (b) {
                (void)um__host_nomem_take();
                last = take_ready(p, b, at, size, false, out);
                if (last == UM_OK)
                    clear_spot_fences(p, at, size);
                if (last != UM_ERR_NOMEM)
                    return last;
            }
        }
        if (attempt == 2)
            poll_all(p, false);
        if (attempt == 3) {
            /* This thread's own bins too, but for the one a refill is
             * filling (the caller's caller): slots cached there keep
             * their slabs' pages, and an allocation at the limit failed
             * with nothing live, its own thread's freed 1 MiB slots
             * holding the pages (found by an audit's stress test). */
            um__tcache *own = own_cache(p);
            for (unsigned c = 0; own && c < UM_NCLASSES; c++)
                if (c != p->refill_cls && own->bins[c].n)
                    flush_bin_locked(p, &own->bins[c], c, own->bins[c].n);
            tcache_drain_others(p, true, false);
            /* Memory whose frees' work can be neither fenced nor waited
             * for stays reserved: if the allocation fails, its message
             * says so, naming the driver's failure (it gave only the
             * figures, as if the device were full). */
            if (poll_all(p, true) != UM_OK) {
                const char *why = strstr(um_last_error(), "): ");
                snprintf(p->unwaited, sizeof p->unwaited, "%s", why ? why + 3 : um_last_error());
            }
            release_spare_slabs(p);
        }
        uintptr_t at = 0;
        um__block *b = find_usable(p, size, align, sid, 0, &at);
        if (b && attempt == 0 && !fully_mapped(p, at, size)) {
            uintptr_t alt = 0;
            um__block *m = find_usable(p, size, align, sid, p->page + size / 16, &alt);
            if (m) {
                b = m;
                at = alt;
            }
        }
        if (!b)
            continue;
        size_t need;
        at = fewest_pages_spot(p, b, at, size, align, sid, &need);
        if (need && (attempt == 0 || (attempt == 1 && need > p->holes)))
            continue;
        /* Without recycling, attempt 1 (moves only) is for a full device. */
        if (need && attempt == 1 && !recycling(p) &&
            p->reserved + need * p->page <= p->base.memory_limit)
            continue;
        if (!pages_fit(p, at, size, need))
            continue;
        /* Only the last try's cause counts (memory.c reads it): a record
         * the host had no memory for on an earlier try must not stop
         * reclaim after this one fails for device memory. */
        (void)um__host_nomem_take();
        last = take_ready(p, b, at, size, attempt >= 2, out);
        if (last == UM_OK)
            return UM_OK;
        if (last != UM_ERR_NOMEM)
            return last;
    }
    if (last == UM_ERR_NOMEM) {
        uintptr_t at = 0;
        um__block *b = any_fit(p, size, align, sid, &at);
        if (b) {
            (void)um__host_nomem_take();
            if ((last = take_ready(p, b, at, size, true, out)) == UM_OK)
                return UM_OK;
        }
    }
    /* The arena's free space serves only the plan: short of memory, the
     * plan gives way (once: the arena is gone after this). */
    if (last == UM_ERR_NOMEM && p->arena) {
        plan_stop(p);
        return take_range(p, size, align, sid, out);
    }
    return last;
}

/* ---------------------------------------------------------- thread caches */

static _Thread_local struct {
    uint64_t generation;
    um__tcache *tc;
} tls_cache;

static void flush_bin_locked(um__pool *p, um__tc_bin *bin, unsigned cls, uint32_t count)
{
    um__stream_state *ss = p->streams[bin->stream];
    uint32_t i = 0;
    for (; i < count; i++)
        if (!small_park(p, ss, cls, bin->items[i]))
            break;
    /* Under host-memory exhaustion the rest stays in the bin. */
    memmove(bin->items, bin->items + i, (bin->n - i) * sizeof bin->items[0]);
    memmove(bin->words, bin->words + i, (bin->n - i) * sizeof bin->words[0]);
    bin->n -= i;
}

static void tcache_flush_locked(um__pool *p, um__tcache *tc)
{
    for (unsigned c = 0; c < UM_NCLASSES; c++)
        if (tc->bins[c].n)
            flush_bin_locked(p, &tc->bins[c], c, tc->bins[c].n);
    bounce_flush_locked(p, tc);
}

/* The owner's side of the bins' handover (see um__tcache): false while
 * another thread takes them; the owner then goes the locked way. The
 * signal fence only keeps the compiler in order: the drainer's membarrier
 * stands in for the hardware fence this fast path does not pay for. */
static inline bool tc_enter(um__tcache *tc)
{
    atomic_store_explicit(&tc->in_bins, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (UM_LIKELY(!atomic_load_explicit(&tc->drain, memory_order_acquire)))
        return true;
    atomic_store_explicit(&tc->in_bins, 0, memory_order_release);
    return false;
}

static inline void tc_leave(um__tcache *tc)
{
    atomic_store_explicit(&tc->in_bins, 0, memory_order_release);
}

static void note_slots(um__tcache *tc)
{
    if (!atomic_load_explicit(&tc->has_slots, memory_order_relaxed))
        atomic_store_explicit(&tc->has_slots, true, memory_order_relaxed);
}

/* Whether this process may use membarrier's expedited barrier (asked and
 * registered once). Without it other threads' bins stay theirs. */
static bool membarrier_ready(void)
{
    static _Atomic int ready; /* 0 unknown, 1 yes, -1 no */
    int r = atomic_load_explicit(&ready, memory_order_acquire);
    if (r)
        return r > 0;
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    bool ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
              syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    atomic_store_explicit(&ready, ok ? 1 : -1, memory_order_release);
    return ok;
}

/* Takes back the blocks other live threads hold in their bounce caches
 * and, with `bins`, the slots they keep in their bins (locked), so that
 * memory short at the limit or a trim is not held by a thread that freed
 * it and went idle (found by the stress test: an allocation failed at the
 * limit with nothing live). One barrier serves every cache. With `every`,
 * caches that hold nothing yet are waited for too, so that a free into
 * one that is under way is over before this returns (see bounce_put).
 * False when some cache could not be taken (no membarrier): it keeps what
 * it holds. */
static bool tcache_drain_others(um__pool *p, bool bins, bool every)
{
    um__tcache *own = own_cache(p);
    bool any = false;
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next)
        if (tc != own && (every ||
                          (bins && atomic_load_explicit(&tc->has_slots, memory_order_relaxed)) ||
                          atomic_load_explicit(&tc->held, memory_order_relaxed))) {
            atomic_store_explicit(&tc->drain, 1, memory_order_relaxed);
            any = true;
        }
    if (!any)
        return true;
    if (!membarrier_ready() ||
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        for (um__tcache *tc = p->tcaches; tc; tc = tc->next)
            atomic_store_explicit(&tc->drain, 0, memory_order_relaxed);
        return false;
    }
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next) {
        if (!atomic_load_explicit(&tc->drain, memory_order_relaxed))
            continue;
        while (atomic_load_explicit(&tc->in_bins, memory_order_acquire))
            sched_yield();
        bounce_flush_locked(p, tc);
        if (bins) {
            atomic_store_explicit(&tc->has_slots, false, memory_order_relaxed);
            for (unsigned c = 0; c < UM_NCLASSES; c++)
                if (tc->bins[c].n)
                    flush_bin_locked(p, &tc->bins[c], c, tc->bins[c].n);
        }
        atomic_store_explicit(&tc->drain, 0, memory_order_release);
    }
    return true;
}

/* Slots a flush left in an exiting thread's bins: with the host out of
 * memory, their stream's list of pending slots had no room for them. Once
 * the stream's work is done they are safe on every stream, so they go
 * straight back to their slabs instead of being lost with the cache (a
 * slab holding one was never given back). Where even the stream cannot be
 * waited for, they stay out of use, and the log says so. */
static void bins_return_stranded_locked(um__pool *p, um__tcache *tc)
{
    for (unsigned c = 0; c < UM_NCLASSES; c++) {
        um__tc_bin *bin = &tc->bins[c];
        if (!bin->n)
            continue;
        /* The flush parked through this state, so it exists. */
        um__stream_state *ss = p->streams[bin->stream];
        if (um__be_stream_sync(fence_backend(p, ss), ss->bstream) != UM_OK) {
            um__log(UM_LOG_WARN,
                    "device %d (%s): %u freed slots of %zu bytes stay out of use: an exiting "
                    "thread's cache held them, and stream %u's work could not be waited for (%s)",
                    p->base.dev, dev_name(p), bin->n, (size_t)um__class_size[c], bin->stream,
                    um_last_error());
            continue;
        }
        for (uint32_t i = 0; i < bin->n; i++)
            slot_return(p, bin->items[i]);
        bin->n = 0;
    }
}

/* Every pool's thread caches, across pools. pthread_key_delete does not
 * wait for destructors already running, so a thread exiting while another
 * destroys the pool could flush a cache (and take the lock of a pool)
 * already freed (an audit's TSan run). The destructor therefore works
 * under this lock, on a cache it finds here, and pool_destroy takes its
 * caches out of here under it before it frees them: whichever comes first
 * does the work, and a destructor that comes second finds nothing. Lock
 * order: this lock, then a pool's. */
static pthread_mutex_t tcache_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static um__tcache *tcache_registry;

static void tcache_register(um__tcache *tc)
{
    pthread_mutex_lock(&tcache_registry_lock);
    tc->reg_prev = NULL;
    tc->reg_next = tcache_registry;
    if (tcache_registry)
        tcache_registry->reg_prev = tc;
    tcache_registry = tc;
    pthread_mutex_unlock(&tcache_registry_lock);
}

/* With tcache_registry_lock held. */
static void tcache_unregister_locked(um__tcache *tc)
{
    if (tc->reg_prev)
        tc->reg_prev->reg_next = tc->reg_next;
    else
        tcache_registry = tc->reg_next;
    if (tc->reg_next)
        tc->reg_next->reg_prev = tc->reg_prev;
}

/* Whether tc is a live cache of the calling thread (with the lock held).
 * Compared by address only, a cache freed by pool_destroy whose memory
 * went to another thread's new cache would pass: the owner tells them
 * apart. */
static bool tcache_registered_locked(const um__tcache *tc)
{
    for (const um__tcache *r = tcache_registry; r; r = r->reg_next)
        if (r == tc)
            return pthread_equal(r->owner, pthread_self());
    return false;
}

static void tcache_thread_exit(void *arg)
{
    um__tcache *tc = arg;
    pthread_mutex_lock(&tcache_registry_lock);
    if (!tcache_registered_locked(tc)) {
        /* Its pool was destroyed, and the cache with it. */
        pthread_mutex_unlock(&tcache_registry_lock);
        return;
    }
    um__pool *p = tc->pool;
    /* The thread's shortcut must not name the cache once it goes, for the
     * flush below (own_cache) and any later destructor that frees. */
    if (tls_cache.tc == tc) {
        tls_cache.tc = NULL;
        tls_cache.generation = 0;
    }
    um__lock_acquire(&p->lock);
    tcache_flush_locked(p, tc);
    bins_return_stranded_locked(p, tc);
    atomic_fetch_add_explicit(&p->active, atomic_load_explicit(&tc->live_delta, memory_order_relaxed),
                              memory_order_relaxed);
    p->dead_allocs += atomic_load_explicit(&tc->allocs, memory_order_relaxed);
    p->dead_frees += atomic_load_explicit(&tc->frees, memory_order_relaxed);
    um__block *out = atomic_load_explicit(&tc->out, memory_order_relaxed);
    if (out)
        bounce_unlink_out_locked(tc, out);
    p->large_blocks += (uint64_t)atomic_load_explicit(&tc->large_blocks_delta, memory_order_relaxed);
    p->large_requested += (size_t)atomic_load_explicit(&tc->large_req_delta, memory_order_relaxed);
    if (tc->prev)
        tc->prev->next = tc->next;
    else
        p->tcaches = tc->next;
    if (tc->next)
        tc->next->prev = tc->prev;
    um__lock_release(&p->lock);
    tcache_unregister_locked(tc);
    pthread_mutex_unlock(&tcache_registry_lock);
    free(tc);
}

/* tcache_get's first call in a thread for p (or after another pool's). */
static __attribute__((noinline)) um__tcache *tcache_find(um__pool *p)
{
    um__tcache *tc = pthread_getspecific(p->tkey);
    if (!tc) {
        tc = aligned_alloc(_Alignof(um__tcache), sizeof *tc);
        if (!tc)
            return NULL;
        memset(tc, 0, sizeof *tc);
        tc->pool = p;
        tc->owner = pthread_self();
        if (pthread_setspecific(p->tkey, tc) != 0) {
            free(tc);
            return NULL;
        }
        tcache_register(tc);
        um__lock_acquire(&p->lock);
        tc->next = p->tcaches;
        if (tc->next)
            tc->next->prev = tc;
        p->tcaches = tc;
        um__lock_release(&p->lock);
    }
    tls_cache.generation = p->generation;
    tls_cache.tc = tc;
    return tc;
}

static inline um__tcache *tcache_get(um__pool *p)
{
    if (UM_LIKELY(tls_cache.generation == p->generation))
        return tls_cache.tc;
    return tcache_find(p);
}

/* The calling thread's cache of this pool, if it has one (the one-entry
 * TLS shortcut may point at another pool's). */
static um__tcache *own_cache(um__pool *p)
{
    if (!p->thread_cache)
        return NULL;
    if (UM_LIKELY(tls_cache.generation == p->generation))
        return tls_cache.tc;
    return pthread_getspecific(p->tkey);
}

/* One stream fencing, and no step plan learning or running. */
static inline bool defer_on_rules(um__pool *p)
{
    return p->fencer != UM_MIXED_FENCE &&
           (!p->plan_on || (p->plan.state == UM_PLAN_RECORDING && !um__plan_learning(&p->plan)));
}

/* The slots a thread's bin of class c may hold now: none while a cache
 * limit of 0 asks for no cache (MLX's set_cache_limit(0): every free goes
 * back at once), and none for the medium classes while medium slabs are
 * off; else up to 2 MiB (class_bin_max). A free that finds its bin full
 * takes the locked path, where the limit is enforced. */
static uint32_t bin_max_now(const um__pool *p, unsigned c, bool medium_on)
{
    if (p->base.cache_limit == 0 || (c >= UM_NSMALL_CLASSES && !medium_on))
        return 0;
    return class_bin_max[c];
}

static void set_bin_max(um__pool *p, bool medium_on)
{
    for (unsigned c = 0; c < UM_NCLASSES; c++)
        atomic_store_explicit(&p->bin_max[c], bin_max_now(p, c, medium_on), memory_order_relaxed);
}

/* Medium slabs end (see slabs): later requests of their sizes take the
 * large path. The slots still out stay in their slabs until freed; freed
 * ones no longer stay in the thread caches, and empty slabs go. */
static __attribute__((noinline)) void medium_slabs_off(um__pool *p)
{
    atomic_store_explicit(&p->slab_max, UM_SMALL_MAX, memory_order_relaxed);
    set_bin_max(p, false);
    um__tcache *tc = own_cache(p);
    for (unsigned c = UM_NSMALL_CLASSES; tc && c < UM_NCLASSES; c++)
        if (tc->bins[c].n)
            flush_bin_locked(p, &tc->bins[c], c, tc->bins[c].n);
    if (!p->taking)
        release_spare_slabs(p);
}

/* Medium slabs start as deferred frees would (defer_on): with one stream
 * fencing and no step plan learning or running. They then stay on until a
 * second stream fences: the planner, should it learn again, must see the
 * same sequence of large allocations as the one it learns from. Called
 * after each large allocation and free, which is where those change. */
static inline void sync_medium_slabs(um__pool *p)
{
    bool was = atomic_load_explicit(&p->slab_max, memory_order_relaxed) == UM_MEDIUM_MAX;
    bool on = p->medium && (was ? p->fencer != UM_MIXED_FENCE : defer_on_rules(p));
    if (on == was)
        return;
    if (!on) {
        medium_slabs_off(p);
        return;
    }
    set_bin_max(p, true);
    atomic_store_explicit(&p->slab_max, UM_MEDIUM_MAX, memory_order_relaxed);
}

/* Bins fill to this many slots at a time; bigger classes move fewer. */
static uint32_t refill_count(unsigned cls)
{
    uint32_t n = (uint32_t)(64u * 1024u / um__class_size[cls]);
    return n < 4 ? 4 : n > UM_TC_MAX / 2 ? UM_TC_MAX / 2 : n;
}

/* ------------------------------------------------------------ alloc / free */

static size_t largest_free_locked(um__pool *p);

/* UM_ERR_NOMEM with the pool's figures (locked). When live bytes and the
 * request would fit under the limit, the free memory is in pieces too
 * small for it: said so, with the largest piece. */
static um_status nomem(um__pool *p, size_t size)
{
    char req[32], live[32], res[32], lim[32], big[32], why[96] = "";
    p->ooms++;
    size_t active = active_total(p);
    if (size > p->base.memory_limit) {
        snprintf(why, sizeof why, " (the request alone exceeds the limit)");
    } else if (um__align_up(size, p->page) > p->base.memory_limit) {
        /* Its pages alone exceed the limit: whole pages are mapped under a
         * block, so it could never be served. Not fragmentation. */
        char pg[32];
        snprintf(why, sizeof why,
                 " (the request alone exceeds the limit: it spans %s of the device's %s pages)",
                 um__format_bytes(big, sizeof big, um__align_up(size, p->page)),
                 um__format_bytes(pg, sizeof pg, p->page));
    } else if (active + size <= p->base.memory_limit) {
        size_t largest = largest_free_locked(p);
        if (largest < size)
            snprintf(why, sizeof why, " (the free memory is fragmented: its largest range is %s)",
                     um__format_bytes(big, sizeof big, largest));
    }
    char unwaited[sizeof p->unwaited];
    snprintf(unwaited, sizeof unwaited, "%s", p->unwaited);
    p->unwaited[0] = '\0';
    return um__fail(UM_ERR_NOMEM,
                    "device %d (%s): cannot allocate: requested %s, live %s, reserved %s, "
                    "limit %s%s%s%s",
                    p->base.dev, dev_name(p), um__format_bytes(req, sizeof req, size),
                    um__format_bytes(live, sizeof live, active),
                    um__format_bytes(res, sizeof res, p->reserved),
                    um__format_bytes(lim, sizeof lim, p->base.memory_limit), why,
                    unwaited[0] ? "; " : "", unwaited);
}

/* UM_ERR_NOMEM for a request that failed before it looked for device
 * memory: the host had none for the pool's record of stream `stream`
 * (locked). Counted as an out-of-memory failure, but not explained by the
 * device's figures, which say nothing about it. */
static um_status nomem_stream_state(um__pool *p, size_t size, uint32_t stream)
{
    char req[32];
    p->ooms++;
    um__note_host_nomem();
    return um__fail(UM_ERR_NOMEM,
                    "device %d (%s): cannot allocate %s: no host memory for the pool's record "
                    "of stream %u",
                    p->base.dev, dev_name(p), um__format_bytes(req, sizeof req, size), stream);
}

static um_status fail_locked(um__pool *p, um_status s, size_t size)
{
    if (s == UM_ERR_NOMEM)
        return nomem(p, size);
    return s;
}

/* The slot word of ptr, a slot of some slab. */
static um__slot_word *slot_word_of(um__pool *p, void *ptr)
{
    um__slab *s = slab_lookup(p, (uintptr_t)ptr);
    return &slab_words(s)[slot_of(s, (uintptr_t)ptr)];
}

/* Marks the slot of class cls whose word is w live (size bytes asked for
 * on stream sid). */
static inline void mark_live_slot(um__pool *p, um__tcache *tc, um__slot_word *w, unsigned cls,
                                  size_t size, uint32_t sid)
{
    atomic_store_explicit(&w->w, UM_SLOT_WORD(UM_SLOT_LIVE, sid, size), memory_order_release);
    account(p, tc, um__class_size[cls]);
}

static um_status large_alloc_locked(um__pool *p, size_t size, size_t bytes,
                                    const um__stream_ref *s, um__tcache *tc, void **ptr);

/* small_alloc when the thread's bin cannot serve: under the lock. Out of
 * line, as are the other locked paths, so that the fast paths do not
 * carry their code. */
static __attribute__((noinline)) um_status small_alloc_locked(um__pool *p, unsigned cls,
                                                              size_t size,
                                                              const um__stream_ref *s,
                                                              um__tcache *tc, void **ptr)
{
    um__lock_acquire(&p->lock);
    uint64_t calls = atomic_load_explicit(&p->base.backend->calls, memory_order_relaxed);
    um__stream_state *ss = stream_state(p, s);
    um_status st = ss ? UM_OK : UM_ERR_NOMEM;
    void *x = NULL;
    um__slot_word *w = NULL;
    /* The slots this call takes from memory shared between threads (the
     * stream's pending slots, slabs' free slots): the one it returns and
     * those it puts in the thread's bin, whose later allocations take
     * them without the lock. Copied: once the lock is let go, a drain may
     * take the bin back. */
    void *taken[UM_TC_MAX];
    uint32_t ntaken = 0;
    if (st == UM_OK && tc) {
        um__tc_bin *bin = &tc->bins[cls];
        if (bin->n)
            flush_bin_locked(p, bin, cls, bin->n);
        if (!bin->n) {
            bin->stream = s->id;
            uint32_t want = refill_count(cls);
            /* The stream's own freed slots come first, the newest on top
             * of the bin so the next allocation reuses it; slabs only when
             * there are none. */
            um__pending_vec *v = &ss->small[cls];
            uint32_t k = v->n < want ? (uint32_t)v->n : want;
            note_slots(tc);
            if (k) {
                for (uint32_t i = 0; i < k; i++)
                    bin->items[i] = v->items[v->n - k + i].ptr;
                v->n -= k;
                ss->small_pending -= k;
                bin->n = k;
            }
            p->refill_cls = cls;
            while (!k && bin->n < want) {
                st = small_take(p, cls, ss, &bin->items[bin->n]);
                if (st != UM_OK)
                    break;
                bin->n++;
            }
            p->refill_cls = UM_NCLASSES;
            for (uint32_t i = 0; i < bin->n; i++) {
                bin->words[i] = slot_word_of(p, bin->items[i]);
                taken[i] = bin->items[i];
            }
            ntaken = bin->n;
            if (bin->n)
                st = UM_OK;
        }
        if (bin->n && bin->stream == s->id) {
            bin->n--;
            x = bin->items[bin->n];
            w = bin->words[bin->n];
        } else if (st == UM_OK) {
            st = UM_ERR_NOMEM;
        }
    } else if (st == UM_OK) {
        st = small_take(p, cls, ss, &x);
        if (st == UM_OK) {
            w = slot_word_of(p, x);
            taken[ntaken++] = x;
        }
    }
    if (st == UM_OK) {
        if (!tc)
            p->central_allocs++;
        if (atomic_load_explicit(&p->base.backend->calls, memory_order_relaxed) != calls)
            p->misses++;
        if (tc)
            counter_inc(&tc->allocs);
        mark_live_slot(p, tc, w, cls, size, s->id);
        *ptr = x;
    } else if (st == UM_ERR_NOMEM && ss) {
        /* A slab is 4-16 blocks of its class, and 64 KiB at least: under a
         * tight limit it may not fit where the block alone does (a 4 MiB
         * slab for a 256 KiB block under a 3 MiB limit; a 64 KiB slab for
         * a 4 KiB block where the limit leaves only an 8 KiB gap), or may
         * not be made at all (slab_room). The block then takes the large
         * path, which frees find by its address as any large one. */
        um__lock_release(&p->lock);
        (void)um__host_nomem_take(); /* the large path's own cause counts */
        return large_alloc_locked(p, size, um__align_up(size, UM_ALIGN), s, tc, ptr);
    } else {
        st = ss ? fail_locked(p, st, size) : nomem_stream_state(p, size, s->id);
    }
    um__lock_release(&p->lock);
    if (st == UM_OK)
        um__allocator_reuse_wait(&p->base, taken, ntaken);
    return st;
}

static inline um_status small_alloc(um__pool *p, size_t size, const um__stream_ref *s, void **ptr)
{
    unsigned cls = um__class_of(size);
    um__tcache *tc = p->thread_cache ? tcache_get(p) : NULL;
    if (UM_LIKELY(tc != NULL) && UM_LIKELY(tc_enter(tc))) {
        um__tc_bin *bin = &tc->bins[cls];
        void *x = NULL;
        um__slot_word *w = NULL;
        if (UM_LIKELY(bin->n && bin->stream == s->id)) {
            bin->n--;
            x = bin->items[bin->n];
            w = bin->words[bin->n];
        }
        tc_leave(tc);
        if (UM_LIKELY(x != NULL)) {
            mark_live_slot(p, tc, w, cls, size, s->id);
            counter_inc(&tc->allocs);
            *ptr = x;
            return UM_OK;
        }
    }
    return small_alloc_locked(p, cls, size, s, tc, ptr);
}

static void plan_put_back(um__pool *p, um__block *b);

/* The bytes the planner was told of for large block b (its request
 * rounded, as large_alloc rounds it; a deferred block taken again may be
 * larger). */
static inline size_t plan_bytes(const um__block *b) { return um__align_up(b->requested, UM_ALIGN); }

/* The range of a freed large block (out of the pointer map) becomes free:
 * ready memory fenced on the freeing stream ss (id sid), or a free range of
 * the plan's arena. A planned block freed on another stream than the
 * plan's stops the plan (later planned blocks there would not wait for
 * that stream), and its range keeps the fence until the arena goes back. */
static void release_range(um__pool *p, um__block *b, um__stream_state *ss, uint32_t sid,
                          uint64_t epoch)
{
    if (b->planned) {
        bool foreign = sid != p->plan.stream;
        if (foreign && ss)
            fence_range(p, ss, sid, b->fi.addr, b->fi.size);
        plan_put_back(p, b);
        if (foreign)
            plan_stop(p);
        return;
    }
    unpin_fenced(p, ss, sid, epoch, b->fi.addr, b->fi.size);
    make_ready(p, b);
}

/* ---------------------------------------------------------- deferred frees */

/* A freed large block need not become ready memory at once. Released, it
 * is fenced and unpinned page by page, coalesced with its neighbours, and
 * the next allocation splits a best fit out of ready memory and pins its
 * pages again: most of a large pair's work (about 1,300 instructions with
 * 10,000 mixed blocks live). Deferred, it keeps its pages pinned and its
 * range whole, in an index by size, and an allocation on the stream that
 * freed it takes it back when it is at most 1/16 larger than asked for:
 * no page is touched, and no fence is needed, as the stream orders its own
 * work. This is a caching allocator's reuse, kept small and short-lived:
 * the deferred bytes stay within 1/32 of the reserved bytes (the oldest go
 * first), a block over 1/64 of that is released at once, and everything
 * deferred is released before the pool would move or create a page, so
 * deferral never makes the pool reserve more. It is off once a second
 * stream fences (a waiting block serves its own stream only, and holding
 * it from the others cost pipeline_two_streams 3.5% more memory), and
 * while the step planner learns or runs a plan (the plan places those
 * blocks). */

#define DEFER_BUDGET_SHIFT 5  /* the budget: reserved / 32 */
#define DEFER_BLOCK_SHIFT 6   /* the largest block deferred: budget / 64 */
#define DEFER_SLACK_SHIFT 4   /* a block taken is at most 1/16 larger than asked */

static bool defer_on(um__pool *p) { return p->defer && defer_on_rules(p); }

static size_t defer_budget(const um__pool *p) { return p->reserved >> DEFER_BUDGET_SHIFT; }

/* Whether the freed block b may wait. */
static bool defer_fits(um__pool *p, const um__block *b)
{
    return !b->planned && b->fi.size <= defer_budget(p) >> DEFER_BLOCK_SHIFT && defer_on(p);
}

static void defer_unlink(um__pool *p, um__block *b)
{
    um__fi_remove(&p->deferred, &b->fi);
    if (b->older)
        b->older->newer = b->newer;
    else
        p->deferred_oldest = b->newer;
    if (b->newer)
        b->newer->older = b->older;
    else
        p->deferred_newest = b->older;
    b->older = b->newer = NULL;
}

/* Releases deferred block b: ready memory fenced on the stream that freed
 * it, in that stream's epoch at the free (a later one would keep other
 * streams off it longer than needed). */
static void defer_release(um__pool *p, um__block *b)
{
    defer_unlink(p, b);
    ptr_map_del(p, b);
    release_range(p, b, p->streams[b->stream], b->stream, b->seq);
}

static void defer_flush(um__pool *p)
{
    while (p->deferred_oldest)
        defer_release(p, p->deferred_oldest);
}

/* The range of a freed large block b (still in the pointer map), freed on
 * stream ss (id sid): deferred where it may be, else released. */
static void free_range(um__pool *p, um__block *b, um__stream_state *ss, uint32_t sid)
{
    if (!ss || !defer_fits(p, b)) {
        ptr_map_del(p, b);
        release_range(p, b, ss, sid, ss ? ss->epoch : 0);
        return;
    }
    b->state = UM_BLOCK_DEFERRED;
    b->stream = sid;
    b->seq = ss->epoch;
    um__fi_insert(&p->deferred, &b->fi);
    b->newer = NULL;
    b->older = p->deferred_newest;
    if (b->older)
        b->older->newer = b;
    else
        p->deferred_oldest = b;
    p->deferred_newest = b;
    while (p->deferred.bytes > defer_budget(p))
        defer_release(p, p->deferred_oldest);
}

/* A deferred block for bytes on stream sid, out of the index (its pages
 * still pinned, in the pointer map), or NULL. */
static um__block *defer_take(um__pool *p, size_t bytes, uint32_t sid)
{
    if (!p->deferred.count)
        return NULL;
    if (!defer_on(p)) {
        defer_flush(p);
        return NULL;
    }
    um__block *b = (um__block *)um__fi_find_near(&p->deferred, bytes,
                                                 bytes + (bytes >> DEFER_SLACK_SHIFT));
    if (!b || b->stream != sid)
        return NULL;
    defer_unlink(p, b);
    return b;
}

/* ------------------------------------------------------------ bounce cache */

/* A program that frees a large block and at once asks for the same size on
 * the same stream (a loop's temporary buffer) gets it back without the
 * lock and without a locked instruction. A thread cache remembers the large
 * block it handed out last (`out`); when the thread frees that very block,
 * the cache holds it, still mapped and LIVE in the pool with tc_held set
 * (so a second free is caught), for the next allocation of its size on its
 * stream. Any placement or locked free by the thread first gives it back,
 * so the pool places every other block exactly as without the cache.
 *
 * Only the owner thread writes `out` and `held`. Another thread that frees
 * the `out` block (it was handed the pointer) clears the block's tc_owner
 * under the lock, and the owner trusts `out` only while tc_owner names its
 * cache. Another thread that needs the held block (memory short, a cache
 * limit, a trim) takes it through the bins' handover (tcache_drain_others),
 * which is why the cache is on only where that handover works. */

static bool stream_known(um__pool *p, uint32_t sid)
{
    return sid < KNOWN_STREAM_BITS &&
           (atomic_load_explicit(&p->known_streams[sid / 64], memory_order_acquire) >> (sid % 64)) &
               1;
}

/* Publishes b as the block tc (the calling thread's) handed out last. */
static void bounce_publish_out(um__tcache *tc, um__block *b)
{
    atomic_store_explicit(&b->tc_owner, tc, memory_order_relaxed);
    tc->out_addr = b->fi.addr;
    tc->out_stream = b->stream;
    atomic_store_explicit(&tc->out, b, memory_order_relaxed);
}

/* b leaves tc's `out` if it is still there: its record may already serve
 * another block, whose owner it must not disturb. Under the lock. */
static void bounce_unlink_out_locked(um__tcache *tc, um__block *b)
{
    /* A load and a store, not a compare-exchange (a locked instruction on
     * every large allocation): outside the lock only the cache tc_owner
     * names writes it, and when that is tc, it is the calling thread. */
    if (atomic_load_explicit(&b->tc_owner, memory_order_relaxed) == tc)
        atomic_store_explicit(&b->tc_owner, NULL, memory_order_relaxed);
}

/* Makes b the block tc (the calling thread's) handed out last. Under the lock. */
static void bounce_set_out_locked(um__tcache *tc, um__block *b)
{
    um__block *old = atomic_load_explicit(&tc->out, memory_order_relaxed);
    if (old)
        bounce_unlink_out_locked(tc, old);
    bounce_publish_out(tc, b);
}

/* A block leaves its owner's `out` (it is being freed by the lock path). */
static void bounce_disown_locked(um__block *b)
{
    atomic_store_explicit(&b->tc_owner, NULL, memory_order_relaxed);
}

/* Gives tc's held block back to the pool as an ordinary free. Under the
 * lock; tc is the calling thread's cache, or one whose owner is kept out
 * by the handover (tcache_drain_others). */
static void bounce_flush_held_locked(um__pool *p, um__tcache *tc, um__block *b)
{
    atomic_store_explicit(&tc->held, NULL, memory_order_relaxed);
    atomic_store_explicit(&b->tc_held, false, memory_order_relaxed);
    if (p->plan_on)
        um__plan_note_free(&p->plan, b->seq, plan_bytes(b));
    free_range(p, b, b->stream < p->nstreams ? p->streams[b->stream] : NULL, b->stream);
}

/* Most locked operations find no held block: a load and a compare. */
static inline void bounce_flush_locked(um__pool *p, um__tcache *tc)
{
    um__block *b = tc ? atomic_load_explicit(&tc->held, memory_order_relaxed) : NULL;
    if (b)
        bounce_flush_held_locked(p, tc, b);
}

static bool bounce_take(um__pool *p, um__tcache *tc, size_t size, size_t bytes, uint32_t sid,
                        void **ptr)
{
    /* The record is read only inside the handover's window: outside it,
     * another thread may take the block and reuse its record. */
    if (!atomic_load_explicit(&tc->held, memory_order_relaxed) || !tc_enter(tc))
        return false;
    um__block *b = atomic_load_explicit(&tc->held, memory_order_relaxed);
    /* The planner, which sees no hit, was told of the block as its request
     * rounded (plan_bytes); a block taken back from the deferred ones with
     * slack would be counted at its free as the new, larger request. */
    if (!b || b->fi.size != bytes || b->stream != sid ||
        plan_bytes(b) != bytes) {
        tc_leave(tc);
        return false;
    }
    atomic_store_explicit(&tc->held, NULL, memory_order_relaxed);
    tc_leave(tc);
    b->requested = size;
    atomic_store_explicit(&b->tc_held, false, memory_order_relaxed);
    bounce_publish_out(tc, b);
    delta_add(&tc->large_blocks_delta, 1);
    delta_add(&tc->large_req_delta, (int64_t)size);
    /* A free and a new allocation of the held block cancel out: the slack
     * keeps that cycle off the shared counter (two locked adds a pair). */
    account_slack(p, tc, (int64_t)bytes, (int64_t)bytes);
    counter_inc(&tc->allocs);
    *ptr = (void *)b->fi.addr;
    return true;
}

static bool bounce_put(um__pool *p, um__tcache *tc, uintptr_t addr, const um__stream_ref *s)
{
    um__block *b = atomic_load_explicit(&tc->out, memory_order_relaxed);
    if (!b || tc->out_addr != addr || atomic_load_explicit(&tc->held, memory_order_relaxed) ||
        atomic_load_explicit(&p->cache_capped, memory_order_relaxed))
        return false;
    uint32_t sid = s ? s->id : tc->out_stream;
    if (!stream_known(p, sid) || atomic_load_explicit(&b->tc_owner, memory_order_relaxed) != tc)
        return false;
    /* tc_owner still names this cache, so no other thread has freed the
     * block, and none can now without freeing it twice at once (a race in
     * the program, which the locked path reports when the two are ordered).
     * A cache limit set since the check above is seen here: setting one
     * takes every cache through the handover (its barrier orders the limit
     * before this load, or it waits for this window to close and then
     * takes the block back). A block held past a new limit stayed cached. */
    if (!tc_enter(tc))
        return false;
    if (atomic_load_explicit(&p->cache_capped, memory_order_relaxed)) {
        tc_leave(tc);
        return false;
    }
    atomic_store_explicit(&tc->out, NULL, memory_order_relaxed);
    atomic_store_explicit(&b->tc_owner, NULL, memory_order_relaxed);
    b->stream = sid;
    atomic_store_explicit(&b->tc_held, true, memory_order_relaxed);
    delta_add(&tc->large_blocks_delta, -1);
    delta_add(&tc->large_req_delta, -(int64_t)b->requested);
    account_slack(p, tc, -(int64_t)b->fi.size, (int64_t)b->fi.size);
    counter_inc(&tc->frees);
    atomic_store_explicit(&tc->held, b, memory_order_relaxed);
    tc_leave(tc);
    return true;
}

/* ------------------------------------------------------------- step plan */

/* Stops the plan. Its arena dissolves into the region: live planned
 * blocks become ordinary live blocks where they are, and the free ranges
 * between them become ready memory fenced on the plan's stream (their last
 * blocks may still be in use there). Under the lock. */
static void plan_stop(um__pool *p)
{
    um__plan *pl = &p->plan;
    um__block *a = p->arena;
    if (a) {
        um__stream_state *ss = a->stream < p->nstreams ? p->streams[a->stream] : NULL;
        uintptr_t at = a->fi.addr, end = a->fi.addr + a->fi.size;
        um__block *tail = a->prev, *gaps = NULL;
        um__block *after = a->next;
        pin_range(p, a->fi.addr, a->fi.size, -1);
        for (size_t i = 0; i <= pl->nlive; i++) {
            uintptr_t lo = i < pl->nlive ? a->fi.addr + pl->live[i].lo : end;
            um__block *run[2];
            int n = 0;
            if (lo > at) {
                /* plan_open kept a record for every gap there can be. */
                um__block *g = p->plan_spare;
                p->plan_spare = g->next;
                p->nplan_spare--;
                memset(g, 0, sizeof *g);
                g->fi.addr = at;
                g->fi.size = lo - at;
                /* Not READY until make_ready below; the gaps are listed
                 * through their (unused) slab field meanwhile. */
                g->state = UM_BLOCK_LIVE;
                g->slab = (um__slab *)gaps;
                gaps = g;
                run[n++] = g;
            }
            if (i < pl->nlive) {
                um__block *b = ptr_map_find(p, lo);
                b->planned = false;
                pin_range(p, b->fi.addr, b->fi.size, +1);
                at = b->fi.addr + b->fi.size;
                run[n++] = b;
            }
            for (int k = 0; k < n; k++) {
                run[k]->prev = tail;
                if (tail)
                    tail->next = run[k];
                else
                    p->region.first = run[k];
                tail = run[k];
            }
        }
        tail->next = after;
        if (after)
            after->prev = tail;
        while (gaps) {
            um__block *g = gaps;
            gaps = (um__block *)g->slab;
            g->slab = NULL;
            if (ss)
                fence_range(p, ss, a->stream, g->fi.addr, g->fi.size);
            make_ready(p, g);
        }
        block_put(p, a);
        p->arena = NULL;
        um__log(UM_LOG_INFO, "device %d (%s): step plan stopped; its arena is ordinary memory "
                "again", p->base.dev, dev_name(p));
    }
    um__plan_abandon(pl);
}

/* The plan starts, unless it is declined (below): one range of the
 * arena's size, mapped once. Every fence is waited for first (once), so
 * that the pages the last period used can move into the arena instead of
 * new ones being created. */
static void plan_open(um__pool *p)
{
    um__plan *pl = &p->plan;
    /* The blocks live now keep their places until they are freed, so the
     * arena comes on top of them. Those of the period that live across
     * the plan's start (as in a FIFO of tensors, where every block does)
     * would take their bytes twice during the first period: 1.6x the live
     * bytes at the peak on such a ring of GPT-2's sizes. When the live
     * bytes now and the period's peak would together exceed both peaks so
     * far by more than 1/64 of the peak live bytes, the pool stays a
     * caching pool. (The arena's packing over the period's peak is
     * build's to bound, as before.) Decided before the fences are waited
     * for, which a declined plan does not need. */
    size_t live = active_total(p);
    size_t peak_live = (size_t)atomic_load_explicit(&p->peak_active, memory_order_relaxed);
    size_t bound = p->peak_reserved > peak_live ? p->peak_reserved : peak_live;
    if (live + pl->cycle_peak > bound + peak_live / 64) {
        um__log(UM_LOG_INFO, "device %d (%s): no step plan of %" PRIu64 " allocations: its "
                "live peak of %" PRIu64 " bytes over the %zu bytes live now would raise peak "
                "reserved above %zu bytes", p->base.dev, dev_name(p), pl->period,
                pl->cycle_peak, live, bound);
        um__plan_decline(pl);
        return;
    }
    while (p->nplan_spare < pl->period + 1) {
        um__block *r = block_alloc();
        if (!r) {
            um__plan_reject(pl);
            return;
        }
        r->next = p->plan_spare;
        p->plan_spare = r;
        p->nplan_spare++;
    }
    poll_all(p, true);
    um__block *a = NULL;
    um_status s = take_range(p, pl->arena_bytes, p->page, pl->stream, &a);
    if (s != UM_OK) {
        um__log(UM_LOG_INFO, "device %d (%s): no room for a step plan's arena of %" PRIu64
                " bytes; allocations stay unplanned", p->base.dev, dev_name(p), pl->arena_bytes);
        um__plan_reject(pl);
        return;
    }
    a->state = UM_BLOCK_LIVE;
    a->stream = pl->stream;
    a->requested = 0;
    p->arena = a;
    um__plan_activate(pl);
    um__log(UM_LOG_INFO, "device %d (%s): step plan of %" PRIu64 " allocations, arena %" PRIu64
            " bytes for a live peak of %" PRIu64 " bytes", p->base.dev, dev_name(p), pl->period,
            pl->arena_bytes, pl->cycle_peak);
}

/* The planned place of allocation seq, as a block record outside the
 * region, or NULL: placed by the pool. Under the lock. */
static um__block *plan_take(um__pool *p, uint64_t seq, size_t bytes, uint32_t sid)
{
    um__plan *pl = &p->plan;
    if (pl->state == UM_PLAN_RECORDING)
        return NULL;
    /* Checked before the plan starts too: a plan the program has left
     * would otherwise wait for every fence and make its arena at its
     * start, only to dissolve it at the next allocation. */
    if (!um__plan_matches(pl, seq, bytes, sid)) {
        const um__plan_slot *want = &pl->slots[um__plan_slot_of(pl, seq)];
        um__log(UM_LOG_INFO, "device %d (%s): allocation %" PRIu64 " (%zu bytes, stream %u) "
                "is not the plan's (%" PRIu64 " bytes, stream %u)", p->base.dev, dev_name(p), seq,
                bytes, sid, want->bytes, want->stream);
        plan_stop(p);
        return NULL;
    }
    if (um__plan_starts_at(pl, seq))
        plan_open(p);
    if (pl->state != UM_PLAN_ACTIVE)
        return NULL;
    uint64_t off = um__plan_take(pl, seq, bytes, sid);
    if (off == UM_PLAN_NO_OFFSET || off == UM_PLAN_MISMATCH) /* no mismatch: checked above */
        return NULL;
    um__block *b = block_new(p);
    if (!b) {
        um__plan_release(pl, off);
        return NULL;
    }
    b->fi.addr = p->arena->fi.addr + off;
    b->fi.size = bytes;
    b->planned = true;
    return b;
}

/* A planned block's range is free for the plan again. Under the lock. */
static void plan_put_back(um__pool *p, um__block *b)
{
    um__plan_release(&p->plan, b->fi.addr - p->arena->fi.addr);
    block_put(p, b);
}

/* large_alloc when the bounce cache cannot serve: under the lock. */
static __attribute__((noinline)) um_status large_alloc_locked(um__pool *p, size_t size,
                                                              size_t bytes,
                                                              const um__stream_ref *s,
                                                              um__tcache *tc, void **ptr)
{
    um__lock_acquire(&p->lock);
    /* A block spans whole pages: one whose pages exceed the limit can never
     * be served, and the steps of a failing allocation (waiting for every
     * fence, taking other threads' caches, stopping the plan) would gain
     * nothing. */
    if (UM_UNLIKELY(um__align_up(bytes, p->page) > p->base.memory_limit)) {
        um_status st = nomem(p, size);
        um__lock_release(&p->lock);
        return st;
    }
    uint64_t calls = atomic_load_explicit(&p->base.backend->calls, memory_order_relaxed);
    um__stream_state *ss = stream_state(p, s);
    um__block *b = NULL;
    /* The thread's held block is freed first (take_range would), so that
     * the planner sees its free before this allocation. */
    bounce_flush_locked(p, tc);
    uint64_t seq = p->plan_on && ss ? um__plan_note_alloc(&p->plan, bytes, s->id, calls) : 0;
    um_status st = UM_ERR_NOMEM;
    if (ss && p->plan_on)
        b = plan_take(p, seq, bytes, s->id);
    bool in_map = false;
    if (!b && ss)
        in_map = (b = defer_take(p, bytes, s->id)) != NULL;
    if (b) {
        st = UM_OK;
    } else if (ss) {
        /* The block's own try decides whether a shortage was the host's
         * (not the plan's arena, which may have missed host memory). */
        (void)um__host_nomem_take();
        st = take_range(p, bytes, UM_ALIGN, s->id, &b);
    }
    if (st == UM_OK) {
        if (!in_map)
            ptr_map_put(p, b);
        b->state = UM_BLOCK_LIVE;
        b->stream = s->id;
        b->requested = size;
        b->seq = seq;
        atomic_store_explicit(&b->tc_held, false, memory_order_relaxed);
        if (tc)
            bounce_set_out_locked(tc, b);
        p->large_requested += size;
        p->large_blocks++;
        p->central_allocs++;
        if (atomic_load_explicit(&p->base.backend->calls, memory_order_relaxed) != calls)
            p->misses++;
        /* The block's size as slack, as the bounce cache allows: else
         * every allocation over the window would publish. */
        account_slack(p, own_cache(p), (int64_t)b->fi.size, (int64_t)b->fi.size);
        *ptr = (void *)b->fi.addr;
    } else {
        if (p->plan_on && ss)
            um__plan_note_free(&p->plan, seq, bytes);
        st = ss ? fail_locked(p, st, size) : nomem_stream_state(p, size, s->id);
    }
    sync_medium_slabs(p);
    um__lock_release(&p->lock);
    if (st == UM_OK)
        um__allocator_reuse_wait(&p->base, ptr, 1);
    return st;
}

static inline um_status large_alloc(um__pool *p, size_t size, const um__stream_ref *s,
                                    void **ptr)
{
    size_t bytes = um__align_up(size, UM_ALIGN);
    um__tcache *tc = p->bounce ? tcache_get(p) : NULL;
    if (tc && bounce_take(p, tc, size, bytes, s->id, ptr))
        return UM_OK;
    return large_alloc_locked(p, size, bytes, s, tc, ptr);
}

static um_status pool_alloc(um__allocator *a, size_t size, const um__stream_ref *s, void **ptr)
{
    um__pool *p = P(a);
    /* The limit is at most the capacity, far below SIZE_MAX, so a size
     * that passes cannot wrap when rounded up. */
    if (UM_UNLIKELY(size > p->base.memory_limit)) {
        um__lock_acquire(&p->lock);
        um_status st = nomem(p, size);
        um__lock_release(&p->lock);
        return st;
    }
    if (size <= atomic_load_explicit(&p->slab_max, memory_order_relaxed))
        return small_alloc(p, size, s, ptr);
    return large_alloc(p, size, s, ptr);
}

/* small_free when the thread's bin cannot take the slot at addr (class
 * cls; its word w is already CACHED, was `word`): under the lock. */
static __attribute__((noinline)) um_status small_free_locked(um__pool *p, unsigned cls,
                                                             uintptr_t addr, um__slot_word *w,
                                                             uint64_t word, uint32_t sid,
                                                             um__tcache *tc,
                                                             const um__stream_ref *s)
{
    um__lock_acquire(&p->lock);
    um__stream_ref ref = s ? *s : allocation_stream(p, sid);
    /* The bin goes by the stream the free is ordered on: with the block's
     * allocation stream destroyed, that is the default stream. A bin kept
     * under the dead id was later fenced on the state of whichever stream
     * took the id next, another device's, whose backend then destroyed the
     * host's event (test_faults: test_free_after_stream_destroyed). */
    sid = ref.id;
    um__stream_state *ss = stream_state(p, &ref);
    bool parked = false;
    /* A bin's slots go back through their stream's state (flush_bin_locked):
     * without one (no host memory for it) the slot may not go in a bin. */
    if (tc && ss) {
        um__tc_bin *bin = &tc->bins[cls];
        uint32_t max = atomic_load_explicit(&p->bin_max[cls], memory_order_relaxed);
        if (bin->n && bin->stream != sid)
            flush_bin_locked(p, bin, cls, bin->n);
        else if (bin->n >= max)
            flush_bin_locked(p, bin, cls, bin->n - max / 2);
        if (bin->n < max && (!bin->n || bin->stream == sid)) {
            bin->stream = sid;
            bin->words[bin->n] = w;
            bin->items[bin->n++] = (void *)addr;
            note_slots(tc);
            counter_inc(&tc->frees);
            parked = true;
        }
    }
    if (!parked && ss && small_park(p, ss, cls, (void *)addr)) {
        parked = true;
        p->central_frees++;
    }
    if (!parked) {
        /* No host memory for the record: keep the slot live rather than lose it. */
        atomic_store_explicit(&w->w, word, memory_order_relaxed);
        account(p, tc, um__class_size[cls]);
    }
    /* Small frees come here once a bin is full, so under a cache limit the
     * slabs they empty go back without waiting for a large free. */
    enforce_cache_limit(p);
    um__lock_release(&p->lock);
    return parked ? UM_OK : um__fail(UM_ERR_NOMEM, "out of host memory for free records");
}

/* The word of the slot that starts at addr, in the slab whose map entry
 * is e (not 0), or NULL when addr is inside a slot instead. */
static inline um__slot_word *slot_word_at(um__pool *p, uintptr_t e, uintptr_t addr)
{
    unsigned cls = ENTRY_CLASS(e);
    uintptr_t unit = addr - (addr - p->slab_base) % UM_SLAB_UNIT;
    uintptr_t base = unit - ENTRY_UNIT(e) * UM_SLAB_UNIT;
    uint32_t slot = (uint32_t)(((uint64_t)(addr - base) * class_recip[cls]) >> 40);
    if (UM_UNLIKELY(slot >= class_nslots[cls] ||
                    base + (uintptr_t)slot * um__class_size[cls] != addr))
        return NULL;
    return slab_words(ENTRY_SLAB(e)) + slot;
}

static um_status inside_block(um__pool *p, uintptr_t addr)
{
    return um__fail(UM_ERR_INVALID_POINTER,
                    "device %d (%s): %p points inside a block, not at its start", p->base.dev,
                    dev_name(p), (void *)addr);
}

/* Frees the small block at addr, whose slab map entry is e (not 0). */
static inline um_status small_free(um__pool *p, uintptr_t e, uintptr_t addr, const um__stream_ref *s)
{
    unsigned cls = ENTRY_CLASS(e);
    um__slot_word *w = slot_word_at(p, e, addr);
    if (UM_UNLIKELY(!w))
        return inside_block(p, addr);
    /* A load and a store, not a compare-exchange: the locked instruction
     * was about a tenth of a warm pair. Any double free in one thread, or
     * in threads the program orders, still finds the word CACHED; only two
     * threads freeing the same block at the same instant (a data race in
     * the program) could both pass, as in glibc's, jemalloc's and
     * mimalloc's fast paths. */
    uint64_t word = atomic_load_explicit(&w->w, memory_order_acquire);
    if (UM_UNLIKELY(UM_SLOT_STATE(word) != UM_SLOT_LIVE))
        return um__fail(UM_ERR_DOUBLE_FREE, "device %d (%s): %p is not a live allocation",
                        p->base.dev, dev_name(p), (void *)addr);
    atomic_store_explicit(&w->w, UM_SLOT_CACHED, memory_order_relaxed);
    uint32_t sid = s ? s->id : UM_SLOT_STREAM(word);
    um__tcache *tc = p->thread_cache ? tcache_get(p) : NULL;
    account(p, tc, -(int64_t)um__class_size[cls]);
    bool known_stream = sid < KNOWN_STREAM_BITS &&
                        (atomic_load_explicit(&p->known_streams[sid / 64],
                                              memory_order_acquire) >> (sid % 64)) & 1;
    if (UM_LIKELY(tc && known_stream) && UM_LIKELY(tc_enter(tc))) {
        um__tc_bin *bin = &tc->bins[cls];
        bool cached = UM_LIKELY((!bin->n || bin->stream == sid) &&
                                bin->n < atomic_load_explicit(&p->bin_max[cls],
                                                              memory_order_relaxed));
        if (cached) {
            bin->stream = sid;
            bin->words[bin->n] = w;
            bin->items[bin->n++] = (void *)addr;
        }
        tc_leave(tc);
        if (UM_LIKELY(cached)) {
            note_slots(tc);
            counter_inc(&tc->frees);
            return UM_OK;
        }
    }
    return small_free_locked(p, cls, addr, w, word, sid, tc, s);
}

/* The live large block whose bytes include addr, or NULL: walks the
 * block records, which is fine on error paths only. Under the lock. */
static um__block *live_block_around_locked(um__pool *p, uintptr_t addr)
{
    for (um__block *b = p->region.first; b; b = b->next) {
        if (addr < b->fi.addr || addr >= b->fi.addr + b->fi.size)
            continue;
        if (b != p->arena)
            return b->state == UM_BLOCK_LIVE ? b : NULL;
        /* The plan's arena is no block of the program's: its planned
         * blocks are in the pointer map alone, and its other bytes are
         * free. Naming the arena called a planned block freed twice a
         * pointer inside a live block. */
        for (size_t pg = page_of(p, b->fi.addr); pg <= page_of(p, addr); pg++)
            for (um__block *x = p->page_starts[pg]; x; x = x->start_next)
                if (x->planned && addr >= x->fi.addr && addr < x->fi.addr + x->fi.size)
                    return x;
        return NULL;
    }
    return NULL;
}

static um_status inside_live_block(um__pool *p, uintptr_t addr, const um__block *b)
{
    return um__fail(UM_ERR_INVALID_POINTER,
                    "device %d (%s): %p points inside the live block %p (%zu bytes), not at "
                    "its start",
                    p->base.dev, dev_name(p), (void *)addr, (void *)b->fi.addr, b->fi.size);
}

/* Why addr, inside this pool's range, is no live block start. Under the
 * lock. */
static um_status bad_free_locked(um__pool *p, uintptr_t addr)
{
    um__block *b = live_block_around_locked(p, addr);
    if (b)
        return inside_live_block(p, addr, b);
    return um__fail(UM_ERR_DOUBLE_FREE,
                    "device %d (%s): %p is not a live allocation (freed already, or never "
                    "returned by um_malloc)",
                    p->base.dev, dev_name(p), (void *)addr);
}

/* large_free when the bounce cache cannot take the block: under the lock. */
static __attribute__((noinline)) um_status large_free_locked(um__pool *p, uintptr_t addr,
                                                             const um__stream_ref *s,
                                                             um__tcache *tc)
{
    /* With thousands of blocks live, the records a free touches are cold,
     * and each is found through the one before (map entry, block record,
     * neighbours, pages). Asking for each as soon as its address is known
     * overlaps their misses with the lock and with each other (about 10%
     * of a pair with 10,000 trace-size blocks live). The page arrays are
     * fixed when the pool is made, so the map's entry and the first page
     * records can be asked for before the lock. */
    if (UM_UNLIKELY(addr < p->va || addr - p->va >= p->va_size))
        return um__fail(UM_ERR_INVALID_POINTER, "device %d (%s): %p is outside its memory",
                        p->base.dev, dev_name(p), (void *)addr);
    size_t first_pg = page_of(p, addr);
    __builtin_prefetch(&p->page_starts[first_pg], 0);
    um__lock_acquire(&p->lock);
    um__block *b = ptr_map_find(p, addr);
    if (!b) {
        um_status st = bad_free_locked(p, addr);
        um__lock_release(&p->lock);
        return st;
    }
    /* A block that waits (deferred frees) touches neither its neighbours
     * nor its pages. */
    if (!defer_fits(p, b)) {
        if (b->prev)
            __builtin_prefetch(b->prev, 1);
        if (b->next)
            __builtin_prefetch(b->next, 1);
        size_t last_pg = page_of(p, addr + b->fi.size - 1);
        for (size_t pg = first_pg; pg <= last_pg && pg < first_pg + 64; pg += 2) /* 1 KiB */
            __builtin_prefetch(&p->pages[pg], 1);
    }
    if (atomic_load_explicit(&b->tc_held, memory_order_acquire) || b->state != UM_BLOCK_LIVE) {
        um__lock_release(&p->lock);
        return um__fail(UM_ERR_DOUBLE_FREE,
                        "device %d (%s): %p is not a live allocation (freed already)",
                        p->base.dev, dev_name(p), (void *)addr);
    }
    bounce_disown_locked(b);
    /* The held block goes back first, as it would have without the cache. */
    bounce_flush_locked(p, tc);
    um__stream_ref ref = s ? *s : allocation_stream(p, b->stream);
    um__stream_state *ss = stream_state(p, &ref);
    if (!ss) {
        um__lock_release(&p->lock);
        return um__fail(UM_ERR_NOMEM, "out of host memory for stream records");
    }
    p->large_requested -= b->requested;
    p->large_blocks--;
    p->central_frees++;
    account(p, own_cache(p), -(int64_t)b->fi.size);
    if (p->plan_on)
        um__plan_note_free(&p->plan, b->seq, plan_bytes(b));
    free_range(p, b, ss, ref.id);
    enforce_cache_limit(p);
    sync_medium_slabs(p);
    um__lock_release(&p->lock);
    return UM_OK;
}

static inline um_status large_free(um__pool *p, uintptr_t addr, const um__stream_ref *s)
{
    um__tcache *tc = p->bounce ? tcache_get(p) : NULL;
    if (tc && bounce_put(p, tc, addr, s))
        return UM_OK;
    return large_free_locked(p, addr, s, tc);
}

static um_status pool_free(um__allocator *a, void *ptr, const um__stream_ref *s)
{
    um__pool *p = P(a);
    uintptr_t addr = (uintptr_t)ptr;
    uintptr_t e = slab_entry(p, addr);
    if (e)
        return small_free(p, e, addr, s);
    return large_free(p, addr, s);
}

/* UM_OK for a live block's start; a block freed into a thread's bounce
 * cache or bin is not live. */
static um_status pool_block_live(um__allocator *a, const void *ptr)
{
    um__pool *p = P(a);
    uintptr_t addr = (uintptr_t)ptr;
    uintptr_t e = slab_entry(p, addr);
    if (e) {
        um__slot_word *w = slot_word_at(p, e, addr);
        if (!w)
            return inside_block(p, addr);
        if (UM_SLOT_STATE(atomic_load_explicit(&w->w, memory_order_acquire)) == UM_SLOT_LIVE)
            return UM_OK;
    } else if (addr >= p->va && addr - p->va < p->va_size) {
        um__lock_acquire(&p->lock);
        um__block *b = ptr_map_find(p, addr);
        bool live = b && !atomic_load_explicit(&b->tc_held, memory_order_acquire) &&
                    b->state == UM_BLOCK_LIVE;
        um__block *around = b ? NULL : live_block_around_locked(p, addr);
        um_status st = around ? inside_live_block(p, addr, around) : UM_OK;
        um__lock_release(&p->lock);
        if (live || around)
            return st;
    }
    return um__fail(UM_ERR_INVALID_POINTER,
                    "device %d (%s): %p is not a live allocation (freed already, or never "
                    "returned by um_malloc)",
                    p->base.dev, dev_name(p), ptr);
}

static bool pool_owns(um__allocator *a, const void *ptr)
{
    um__pool *p = P(a);
    uintptr_t addr = (uintptr_t)ptr;
    return addr >= p->va && addr < p->va + p->va_size;
}

/* ---------------------------------------------------------- memory control */

/* Every cache of the pool goes back to it (locked): this thread's bins,
 * the other threads' bins, and all bounce caches. */
static void flush_caches_locked(um__pool *p)
{
    um__tcache *tc = own_cache(p);
    if (tc)
        tcache_flush_locked(p, tc);
    tcache_drain_others(p, true, false);
    defer_flush(p);
}

static um_status pool_trim(um__allocator *a)
{
    um__pool *p = P(a);
    uint64_t t0 = p->events ? um__now_ns() : 0;
    um__lock_acquire(&p->lock);
    size_t before = p->reserved;
    flush_caches_locked(p);
    /* The arena holds memory for the plan alone: a trim ends the plan, and
     * the arena dissolves into ordinary memory whose idle pages go back. */
    plan_stop(p);
    um_status polled = poll_all(p, true);
    char why[512] = "";
    if (polled != UM_OK)
        snprintf(why, sizeof why, "%s", um_last_error());
    release_spare_slabs(p);
    um_status s = release_holes(p, 0);
    /* What could be given back was; the streams' failure is the one to
     * report (a trim that returned UM_OK kept their memory). */
    if (s == UM_OK && polled != UM_OK)
        s = um__fail(polled, "%s", why);
    size_t after = p->reserved;
    um__lock_release(&p->lock);
    if (p->events)
        um__event_add(p->events, UM_EVENT_TRIM, p->base.dev, -1, t0, um__now_ns() - t0,
                      before > after ? before - after : 0, 0);
    return s;
}

static um_status pool_set_memory_limit(um__allocator *a, size_t bytes)
{
    um__pool *p = P(a);
    /* Never above the capacity (um_set_memory_limit caps it): the
     * placement's arithmetic (sizes rounded up, ranges of the reservation)
     * relies on requests below it. */
    size_t limit = bytes ? bytes : p->capacity;
    um__lock_acquire(&p->lock);
    um_status s = UM_OK;
    um_status polled = UM_OK;
    char why[512] = "";
    if (p->reserved > limit) {
        flush_caches_locked(p);
        plan_stop(p);
        if ((polled = poll_all(p, true)) != UM_OK)
            snprintf(why, sizeof why, "%s", um_last_error());
        release_spare_slabs(p);
        size_t excess = p->reserved - limit, hole_bytes = p->holes * p->page;
        s = release_holes(p, hole_bytes > excess ? hole_bytes - excess : 0);
    }
    if (s == UM_OK && p->reserved > limit && polled != UM_OK) {
        char lim[32];
        s = um__fail(polled, "device %d (%s): cannot lower the memory limit to %s: %s; the limit "
                     "is unchanged",
                     p->base.dev, dev_name(p), um__format_bytes(lim, sizeof lim, limit), why);
    } else if (s == UM_OK && p->reserved > limit) {
        char lim[32], res[32];
        s = um__fail(UM_ERR_BUSY,
                     "device %d (%s): cannot lower the memory limit to %s: %s are still "
                     "reserved under live data; the limit is unchanged",
                     p->base.dev, dev_name(p), um__format_bytes(lim, sizeof lim, limit),
                     um__format_bytes(res, sizeof res, p->reserved));
    } else if (s == UM_OK) {
        p->base.memory_limit = limit;
    }
    um__lock_release(&p->lock);
    return s;
}

static um_status pool_set_cache_limit(um__allocator *a, size_t bytes)
{
    um__pool *p = P(a);
    um__lock_acquire(&p->lock);
    p->base.cache_limit = bytes;
    atomic_store_explicit(&p->cache_capped, bytes != UM_NO_CACHE_LIMIT, memory_order_relaxed);
    set_bin_max(p, atomic_load_explicit(&p->slab_max, memory_order_relaxed) == UM_MEDIUM_MAX);
    /* A free into another thread's bounce cache that read no cap a moment
     * ago is over, or refused, once every cache has been through the
     * handover (bounce_put); with no cache at all, the slots in their bins
     * go back too. */
    if (bytes != UM_NO_CACHE_LIMIT)
        tcache_drain_others(p, bytes == 0, true);
    /* Cached slots and held blocks count as cached memory too. */
    enforce_cache_limit(p);
    um_status s = bytes == UM_NO_CACHE_LIMIT ? UM_OK : release_holes(p, bytes);
    um__lock_release(&p->lock);
    return s;
}

static um_status pool_stream_forget(um__allocator *a, const um__stream_ref *s)
{
    um__pool *p = P(a);
    um__lock_acquire(&p->lock);
    um__tcache *tc = own_cache(p);
    if (tc) {
        for (unsigned c = 0; c < UM_NCLASSES; c++)
            if (tc->bins[c].n && tc->bins[c].stream == s->id)
                flush_bin_locked(p, &tc->bins[c], c, tc->bins[c].n);
        um__block *held = atomic_load(&tc->held);
        if (held && held->stream == s->id)
            bounce_flush_locked(p, tc);
    }
    /* Other threads' bins and held blocks may hold memory freed on this
     * stream, unfenced: once the id names a new stream they would hand it
     * to that stream while the old one's work may still use it. Taken
     * back, it is fenced on this stream and waited for below. */
    bool taken = tcache_drain_others(p, true, false);
    defer_flush(p);
    /* Planned blocks are ordered by the plan's stream: a plan cannot
     * outlive it (and its id may go to a new stream). */
    if (p->plan.state != UM_PLAN_RECORDING && p->plan.stream == s->id) {
        plan_stop(p);
    }
    if (s->id < p->nstreams && p->streams[s->id]) {
        um__stream_state *ss = p->streams[s->id];
        /* What other threads' caches kept (no membarrier to take it) was
         * freed on the stream before now, unfenced: a fence recorded now
         * covers its work, so that the cache may hand it to the next
         * stream given this id. Without one there was nothing to wait for
         * unless some free had reached the pool. */
        if (!taken)
            note_open_frees(p, ss);
        if (!poll_stream(p, ss, true)) {
            /* Its fences are still the stream's backend's to answer (on
             * another device's stream, for host memory), and what they cover
             * must not be reused before its work is done: the stream stays,
             * known as it was. */
            char why[256];
            snprintf(why, sizeof why, "%s", um_last_error());
            uint32_t left = ss->fence_n;
            um__lock_release(&p->lock);
            return um__fail(UM_ERR_BACKEND,
                            "device %d (%s): stream %u: the work of the frees on it (%u "
                            "fence%s left) cannot be waited for, nor the stream itself (%s); "
                            "the stream stays",
                            p->base.dev, p->base.backend->name, s->id, left,
                            left == 1 ? "" : "s", why);
        }
        /* The context may hand this id to a new stream: its first use goes
         * through the locked path again and registers the new backend
         * stream. Until then fences go to the default stream. */
        ss->bstream = NULL;
        ss->backend = NULL;
        ss->known = false;
        if (s->id < KNOWN_STREAM_BITS)
            atomic_fetch_and_explicit(&p->known_streams[s->id / 64], ~(1ull << (s->id % 64)),
                                      memory_order_release);
    }
    enforce_cache_limit(p);
    um__lock_release(&p->lock);
    return UM_OK;
}

/* -------------------------------------------------------------- statistics */

/* The bytes of page pg that lie in [lo, hi). */
static size_t page_extent(um__pool *p, size_t pg, uintptr_t lo, uintptr_t hi)
{
    uintptr_t ps = page_addr(p, pg), pe = ps + p->page;
    return (hi < pe ? hi : pe) - (lo > ps ? lo : ps);
}

/* Whether page pg of the free range [lo, hi) (pages first..last) lies
 * wholly inside it. Mapped, such a page is a hole once the range is ready
 * memory; the range's partial end pages hold bytes of used neighbours. */
static inline bool page_inside(um__pool *p, size_t pg, size_t first, size_t last, uintptr_t lo,
                               uintptr_t hi)
{
    return (pg != first || lo == page_addr(p, pg)) &&
           (pg != last || hi == page_addr(p, pg) + p->page);
}

/* The largest request the free range [lo, hi) can serve without new
 * backend memory, with `holes` idle pages in the pool once it is free:
 * the longest run of its pages whose unmapped ones the holes outside it
 * can cover. Counting all its mapped bytes instead (as before) called a
 * block with an unmapped page between two mapped ones at the limit usable
 * for a request it could not hold, and the UM_ERR_NOMEM that followed
 * did not say the memory was fragmented (test_stress, 2026-12-03). This is
 * the definition, a walk over every page of the range; pool_check holds
 * ready_block_usable to it. */
static size_t ready_block_usable_walk(um__pool *p, uintptr_t lo, uintptr_t hi, size_t holes)
{
    size_t first = page_of(p, lo), last = page_of(p, hi - 1);
    size_t holes_in = 0;
    for (size_t pg = first; pg <= last; pg++)
        holes_in += p->pages[pg].phys && page_inside(p, pg, first, last, lo, hi);
    size_t spare = holes > holes_in ? holes - holes_in : 0;
    size_t best = 0, run = 0, unmapped = 0;
    for (size_t i = first, j = first; j <= last; j++) {
        run += page_extent(p, j, lo, hi);
        unmapped += !p->pages[j].phys;
        for (; unmapped > spare; i++) {
            run -= page_extent(p, i, lo, hi);
            unmapped -= !p->pages[i].phys;
        }
        best = run > best ? run : best;
    }
    return best;
}

/* The bytes of [lo, hi) in its pages i..j (its two end pages are partial). */
static size_t run_bytes(um__pool *p, uintptr_t lo, uintptr_t hi, size_t i, size_t j)
{
    uintptr_t s = page_addr(p, i), e = page_addr(p, j) + p->page;
    return (size_t)((hi < e ? hi : e) - (lo > s ? lo : s));
}

/* A run made of pages a..z of [lo, hi), grown by up to `left` pages
 * before a and `right` after z, `extra` of them in all: the most bytes
 * over the ways to share extra between the two sides (they differ only
 * where a side reaches one of the range's partial end pages, so the two
 * extremes and their neighbours are enough). */
static size_t grown_run_bytes(um__pool *p, uintptr_t lo, uintptr_t hi, size_t a, size_t z,
                              size_t left, size_t right, size_t extra)
{
    if (extra > left + right)
        extra = left + right;
    size_t lmin = extra > right ? extra - right : 0, lmax = extra < left ? extra : left;
    size_t cand[4] = {lmin, lmin + 1, lmax > 0 ? lmax - 1 : 0, lmax}, best = 0;
    for (int c = 0; c < 4; c++) {
        size_t l = cand[c];
        if (l < lmin || l > lmax)
            continue;
        size_t n = run_bytes(p, lo, hi, a - l, z + (extra - l));
        best = n > best ? n : best;
    }
    return best;
}

/* The next mapped page of pages pg..last (the bitmap of mapped pages, a
 * word at a time), or last + 1 when there is none. */
static size_t next_mapped(const um__pool *p, size_t pg, size_t last)
{
    while (pg <= last) {
        uint64_t w = p->mapped[pg / 64] >> (pg % 64);
        if (w)
            return pg + (size_t)__builtin_ctzll(w) <= last ? pg + (size_t)__builtin_ctzll(w)
                                                          : last + 1;
        pg = (pg / 64 + 1) * 64;
    }
    return last + 1;
}

/* ready_block_usable_walk's figure from the mapped pages of [lo, hi) alone,
 * found a word of the bitmap at a time. Between mapped pages lie gaps of
 * unmapped ones; a run that takes in clusters a..z of mapped pages pays
 * for the unmapped pages between them and grows into the gaps beside them
 * with what the spare holes leave. For a given first cluster, taking in
 * more clusters never yields less, so one pass with two indices finds the
 * best. The walk costs O(mapped pages of the range): a free block over most of a 141 GB
 * device's range made um_stats_get take 2.9 ms. *scratch (of *cap
 * entries, grown here; NULL after a failed growth) holds the clusters. */
static size_t ready_block_usable(um__pool *p, uintptr_t lo, uintptr_t hi, size_t holes,
                                 size_t **scratch, size_t *cap)
{
    size_t first = page_of(p, lo), last = page_of(p, hi - 1);
    /* Clusters of consecutive mapped pages, [cs[c], ce[c]]. */
    size_t nc = 0, mapped = 0, holes_in = 0;
    for (size_t pg = next_mapped(p, first, last); pg <= last; pg = next_mapped(p, pg + 1, last)) {
        mapped++;
        holes_in += page_inside(p, pg, first, last, lo, hi);
        if (nc && (*scratch)[2 * nc - 1] + 1 == pg) {
            (*scratch)[2 * nc - 1] = pg;
            continue;
        }
        if (2 * nc + 2 > *cap) {
            size_t grown = *cap ? 2 * *cap : 64;
            size_t *m = realloc(*scratch, grown * sizeof *m);
            if (!m) {
                free(*scratch);
                *scratch = NULL;
                *cap = 0;
                return ready_block_usable_walk(p, lo, hi, holes);
            }
            *scratch = m;
            *cap = grown;
        }
        (*scratch)[2 * nc] = (*scratch)[2 * nc + 1] = pg;
        nc++;
    }
    const size_t *c2 = *scratch; /* cluster c: pages c2[2c] to c2[2c + 1] */
#define CS(c) c2[2 * (c)]
#define CE(c) c2[2 * (c) + 1]
    size_t spare = holes > holes_in ? holes - holes_in : 0;
    if (last - first + 1 - mapped <= spare)
        return hi - lo;
    size_t best = 0;
    /* Runs inside one gap of unmapped pages: w of its g pages, placed at
     * either end or one page in (only b's two end pages are partial). */
    for (size_t c = 0; c <= nc && spare; c++) {
        size_t gs = c == 0 ? first : CE(c - 1) + 1, g = (c == nc ? last + 1 : CS(c)) - gs;
        if (g == 0)
            continue;
        size_t ge = gs + g - 1, w = spare < g ? spare : g;
        size_t at[4] = {gs, ge + 1 - w, gs + 1, ge - w};
        for (int k = 0; k < (g > w ? 4 : 1); k++) {
            size_t n = run_bytes(p, lo, hi, at[k], at[k] + w - 1);
            best = n > best ? n : best;
        }
    }
    /* Runs over clusters a..z: `inner` unmapped pages lie between them. */
    size_t z = 0, inner = 0;
    for (size_t a = 0; a < nc; a++) {
        if (z < a) {
            z = a;
            inner = 0;
        }
        while (z + 1 < nc && inner + (CS(z + 1) - CE(z) - 1) <= spare) {
            inner += CS(z + 1) - CE(z) - 1;
            z++;
        }
        size_t left = CS(a) - (a == 0 ? first : CE(a - 1) + 1);
        size_t right = (z + 1 == nc ? last : CS(z + 1) - 1) - CE(z);
        size_t n = grown_run_bytes(p, lo, hi, CS(a), CE(z), left, right, spare - inner);
        best = n > best ? n : best;
        if (z > a)
            inner -= CS(a + 1) - CE(a) - 1;
    }
#undef CS
#undef CE
    return best;
}

/* The calling thread's held block (the bounce cache), which any
 * placement of the thread gives back first, or NULL. A planned one goes
 * back to the plan's arena, not to ready memory. */
static const um__block *own_held_block(um__pool *p)
{
    um__tcache *own = own_cache(p);
    const um__block *b = own ? atomic_load_explicit(&own->held, memory_order_relaxed) : NULL;
    return b && !b->planned ? b : NULL;
}

/* Whether the largest free size counts block b as free memory: ready
 * memory, a deferred block (all of them are released before the pool
 * would move or make a page) or the calling thread's held block. Counting
 * ready blocks alone, a pool whose one block was freed into the bounce
 * cache said 0 bytes free and a fragmentation of 1. */
static inline bool counts_free(const um__block *b, const um__block *held)
{
    return b->state == UM_BLOCK_READY || b->state == UM_BLOCK_DEFERRED || b == held;
}

/* The first run of adjacent blocks that count as free from b on, as
 * [*lo, *hi) (empty: none); returns the block after it. */
static um__block *free_run(um__block *b, const um__block *held, uintptr_t *lo, uintptr_t *hi)
{
    while (b && !counts_free(b, held))
        b = b->next;
    *lo = *hi = b ? b->fi.addr : 0;
    for (; b && counts_free(b, held); b = b->next)
        *hi = b->fi.addr + b->fi.size;
    return b;
}

/* The idle pages the pool would have with every free run made ready: the
 * mapped pages wholly inside the runs. Only deferred and held blocks pin
 * such pages; without them, these are the holes. */
static size_t holes_once_free(um__pool *p, const um__block *held)
{
    if (!held && !p->deferred.count)
        return p->holes;
    size_t n = 0;
    uintptr_t lo, hi;
    for (um__block *b = free_run(p->region.first, held, &lo, &hi); lo != hi;
         b = free_run(b, held, &lo, &hi)) {
        uintptr_t s = um__align_up(lo, p->page), e = um__align_down(hi, p->page);
        if (e > s)
            n += (e - s) / p->page - unmapped_count(p, page_of(p, s), page_of(p, e - 1));
    }
    return n;
}

/* The largest request the pool can serve without new backend memory or
 * the slots in other threads' bins. */
static size_t largest_free_locked(um__pool *p)
{
    size_t best = 0, cap = 0, *scratch = NULL;
    const um__block *held = own_held_block(p);
    size_t holes = holes_once_free(p, held);
    uintptr_t lo, hi;
    for (um__block *b = free_run(p->region.first, held, &lo, &hi); lo != hi;
         b = free_run(b, held, &lo, &hi)) {
        if (hi - lo <= best)
            continue;
        size_t usable = ready_block_usable(p, lo, hi, holes, &scratch, &cap);
        if (usable > best)
            best = usable;
    }
    free(scratch);
    /* Only this thread's bins are read: another live thread's are its own
     * until a drain hands them over (see um__tcache). */
    um__tcache *own = own_cache(p);
    for (unsigned c = UM_NCLASSES; c-- > 0;) {
        if (um__class_size[c] <= best)
            break;
        /* With medium slabs off, their sizes take the large path: a free
         * slot of one serves no request. */
        if (!medium_class_on(p, c))
            continue;
        bool any = p->partial[c] != NULL;
        for (uint32_t i = 0; !any && i < p->nbusy; i++)
            any = p->busy[i]->small[c].n != 0;
        if (!any && own)
            any = own->bins[c].n != 0;
        if (any)
            best = um__class_size[c];
    }
    return best;
}

static size_t pool_active_bytes(um__allocator *a)
{
    um__pool *p = P(a);
    um__lock_acquire(&p->lock); /* the list of thread caches */
    size_t n = active_total(p);
    um__lock_release(&p->lock);
    return n;
}

static void pool_stats(um__allocator *a, um_stats *out)
{
    um__pool *p = P(a);
    memset(out, 0, sizeof *out);
    um__lock_acquire(&p->lock);
    size_t small_req = 0;
    uint64_t small_blocks = 0;
    for (um__block *b = p->region.first; b; b = b->next) {
        if (b->state != UM_BLOCK_SLAB)
            continue;
        um__slab *s = b->slab;
        for (uint32_t i = 0; i < s->nslots; i++) {
            uint64_t w = atomic_load_explicit(&slab_words(s)[i].w, memory_order_acquire);
            if (UM_SLOT_STATE(w) == UM_SLOT_LIVE) {
                small_req += UM_SLOT_REQUESTED(w);
                small_blocks++;
            }
        }
    }
    uint64_t allocs = p->central_allocs + p->dead_allocs, frees = p->central_frees + p->dead_frees;
    int64_t large_blocks = (int64_t)p->large_blocks, large_req = (int64_t)p->large_requested;
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next) {
        allocs += atomic_load_explicit(&tc->allocs, memory_order_relaxed);
        frees += atomic_load_explicit(&tc->frees, memory_order_relaxed);
        large_blocks += atomic_load_explicit(&tc->large_blocks_delta, memory_order_relaxed);
        large_req += atomic_load_explicit(&tc->large_req_delta, memory_order_relaxed);
    }
    out->active_bytes = active_total(p);
    out->requested_bytes = (size_t)large_req + small_req;
    out->reserved_bytes = p->reserved;
    out->cached_bytes = p->reserved > out->active_bytes ? p->reserved - out->active_bytes : 0;
    /* Live bytes seen now count toward the peak too (other threads' deltas
     * are not in the hot path's estimate), so the peak never goes back. */
    int64_t peak = atomic_load_explicit(&p->peak_active, memory_order_relaxed);
    while ((int64_t)out->active_bytes > peak &&
           !atomic_compare_exchange_weak_explicit(&p->peak_active, &peak,
                                                  (int64_t)out->active_bytes,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    out->peak_active_bytes = (size_t)atomic_load_explicit(&p->peak_active, memory_order_relaxed);
    out->peak_reserved_bytes = p->peak_reserved;
    out->largest_free_bytes = largest_free_locked(p);
    if (out->largest_free_bytes > out->cached_bytes)
        out->largest_free_bytes = out->cached_bytes;
    out->fragmentation = out->cached_bytes ? (double)(out->cached_bytes - out->largest_free_bytes) /
                                                 (double)out->cached_bytes
                                           : 0.0;
    out->active_blocks = (uint64_t)large_blocks + small_blocks;
    out->num_allocs = allocs;
    out->num_frees = frees;
    out->num_backend_calls =
        atomic_load_explicit(&p->base.backend->calls, memory_order_relaxed) - p->calls_at_create;
    out->num_cache_hits = allocs - p->misses;
    out->num_ooms = p->ooms;
    um__lock_release(&p->lock);
}

static void pool_reset_peak(um__allocator *a)
{
    um__pool *p = P(a);
    um__lock_acquire(&p->lock);
    atomic_store(&p->peak_active, (int64_t)active_total(p));
    p->peak_reserved = p->reserved;
    um__lock_release(&p->lock);
}

/* ------------------------------------------------------------------ check */

#define CHECK_THAT(cond, ...)                                                            \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            st = um__fail(UM_ERR_INTERNAL, __VA_ARGS__);                                 \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

static um_status pool_check(um__allocator *a)
{
    um__pool *p = P(a);
    um_status st = UM_OK;
    um__lock_acquire(&p->lock);
    uint32_t *pin = calloc(p->npages, sizeof *pin);
    CHECK_THAT(pin, "out of host memory for the check");
    size_t active = 0, live_large = 0, held_large = 0, cached_slots = 0;
    {
        um__region *rg = &p->region;
        uintptr_t at = rg->lo;
        size_t ready = 0, ready_bytes = 0, deferred = 0, deferred_bytes = 0;
        for (um__block *b = rg->first; b; b = b->next) {
            CHECK_THAT(b->fi.addr == at, "block at %#" PRIxPTR " expected at %#" PRIxPTR,
                       b->fi.addr, at);
            CHECK_THAT(!b->next || b->next->prev == b, "broken neighbour links at %#" PRIxPTR,
                       b->fi.addr);
            at += b->fi.size;
            if (b->state == UM_BLOCK_READY) {
                CHECK_THAT(!b->next || b->next->state != UM_BLOCK_READY,
                           "adjacent ready blocks at %#" PRIxPTR " not coalesced", b->fi.addr);
                ready++;
                ready_bytes += b->fi.size;
                continue;
            }
            size_t first = page_of(p, b->fi.addr), last = page_of(p, b->fi.addr + b->fi.size - 1);
            for (size_t pg = first; pg <= last; pg++) {
                uintptr_t ps = page_addr(p, pg), pe = ps + p->page;
                uintptr_t s = b->fi.addr > ps ? b->fi.addr : ps;
                uintptr_t e = b->fi.addr + b->fi.size < pe ? b->fi.addr + b->fi.size : pe;
                pin[pg] += (uint32_t)(e - s);
            }
            if (b == p->arena) {
                CHECK_THAT(b->state == UM_BLOCK_LIVE && p->plan.state >= UM_PLAN_ACTIVE,
                           "the plan's arena %#" PRIxPTR " is not live", b->fi.addr);
            } else if (b->state == UM_BLOCK_LIVE) {
                CHECK_THAT(ptr_map_find(p, b->fi.addr) == b, "live block %#" PRIxPTR
                           " missing from the pointer map", b->fi.addr);
                if (atomic_load(&b->tc_held)) {
                    held_large++;
                } else {
                    active += b->fi.size;
                    live_large++;
                }
            } else if (b->state == UM_BLOCK_DEFERRED) {
                CHECK_THAT(ptr_map_find(p, b->fi.addr) == b && !b->planned,
                           "deferred block %#" PRIxPTR " is missing from the pointer map or "
                           "planned", b->fi.addr);
                deferred++;
                deferred_bytes += b->fi.size;
            } else if (b->state == UM_BLOCK_SLAB) {
                um__slab *s = b->slab;
                CHECK_THAT(s && s->block == b && s->base == b->fi.addr,
                           "slab record of block %#" PRIxPTR " is wrong", b->fi.addr);
                uint32_t nfree = 0;
                for (uint32_t i = 0; i < s->nslots; i++) {
                    unsigned state = UM_SLOT_STATE(atomic_load(&slab_words(s)[i].w));
                    nfree += state == UM_SLOT_FREE;
                    cached_slots += state == UM_SLOT_CACHED;
                    if (state == UM_SLOT_LIVE)
                        active += um__class_size[s->cls];
                }
                CHECK_THAT(nfree == s->nfree, "slab %#" PRIxPTR ": %u free slots, record says %u",
                           s->base, nfree, s->nfree);
                for (uint32_t i = 0; i < s->nfree; i++)
                    CHECK_THAT(UM_SLOT_STATE(atomic_load(&slab_words(s)[s->free_stack[i]].w)) == UM_SLOT_FREE,
                               "slab %#" PRIxPTR ": free stack holds a used slot", s->base);
                for (uintptr_t u = s->base; u < s->base + b->fi.size; u += UM_SLAB_UNIT) {
                    uintptr_t e = slab_entry(p, u);
                    CHECK_THAT(ENTRY_SLAB(e) == s && ENTRY_CLASS(e) == s->cls &&
                                   ENTRY_UNIT(e) == (u - s->base) / UM_SLAB_UNIT,
                               "slab map wrong at %#" PRIxPTR, u);
                }
                CHECK_THAT(s->nslots == class_nslots[s->cls],
                           "slab %#" PRIxPTR ": slot count wrong", s->base);
                CHECK_THAT((s->nfree > 0 && s->nfree < s->nslots) ? s->on_list : true,
                           "partly free slab %#" PRIxPTR " is not on its class list", s->base);
            } else {
                CHECK_THAT(false, "block %#" PRIxPTR " in state %u", b->fi.addr, b->state);
            }
        }
        CHECK_THAT(at == rg->hi, "blocks end at %#" PRIxPTR ", not %#" PRIxPTR, at, rg->hi);
        CHECK_THAT(ready == rg->ready.count && ready_bytes == rg->ready.bytes,
                   "%zu ready blocks (%zu bytes), index has %zu (%zu bytes)", ready, ready_bytes,
                   rg->ready.count, rg->ready.bytes);
        CHECK_THAT(deferred == p->deferred.count && deferred_bytes == p->deferred.bytes,
                   "%zu deferred blocks (%zu bytes), index has %zu (%zu bytes)", deferred,
                   deferred_bytes, p->deferred.count, p->deferred.bytes);
        size_t listed = 0;
        um__block *older = NULL;
        for (um__block *b = p->deferred_oldest; b && listed <= deferred;
             older = b, b = b->newer, listed++)
            CHECK_THAT(b->state == UM_BLOCK_DEFERRED && b->older == older,
                       "the deferred list is broken at %#" PRIxPTR, b->fi.addr);
        CHECK_THAT(listed == deferred && p->deferred_newest == older,
                   "the deferred list holds %zu blocks, the index %zu", listed, deferred);
    }
    /* Planned blocks live in the arena and only in the pointer map. Every
     * block of the map is listed under its first page, and only there. */
    size_t planned = 0, in_map = 0;
    int64_t planned_req = 0;
    for (size_t pg = 0; pg < p->npages; pg++) {
        for (um__block *b = p->page_starts[pg]; b; b = b->start_next) {
            /* A list that loops would otherwise keep this walk going. */
            CHECK_THAT(++in_map <= p->map_count,
                       "the pointer map lists more blocks than the %zu it counts", p->map_count);
            CHECK_THAT(page_of(p, b->fi.addr) == pg &&
                           (b->state == UM_BLOCK_LIVE || b->state == UM_BLOCK_DEFERRED),
                       "the pointer map lists block %#" PRIxPTR " (state %u) under page %zu",
                       b->fi.addr, b->state, pg);
            if (!b->planned)
                continue;
            CHECK_THAT(p->arena && b->fi.addr >= p->arena->fi.addr &&
                           b->fi.addr + b->fi.size <= p->arena->fi.addr + p->arena->fi.size,
                       "planned block %#" PRIxPTR " lies outside the plan's arena", b->fi.addr);
            planned++;
            if (atomic_load(&b->tc_held)) {
                held_large++;
                continue;
            }
            planned_req += (int64_t)b->requested;
            active += b->fi.size;
            live_large++;
        }
    }
    CHECK_THAT(in_map == p->map_count, "the pointer map lists %zu blocks, counts %zu", in_map,
               p->map_count);
    CHECK_THAT(planned == p->plan.nlive, "%zu planned blocks live, the plan counts %zu", planned,
               p->plan.nlive);
    CHECK_THAT(!p->arena == (p->plan.state < UM_PLAN_ACTIVE),
               "plan state %d with%s an arena", (int)p->plan.state, p->arena ? "" : "out");
    size_t mapped = 0, holes = 0, pending_small = 0;
    uint32_t states = 0;
    for (size_t pg = 0; pg < p->npages; pg++) {
        CHECK_THAT(pin[pg] == p->pages[pg].pin, "page %zu: %u bytes pinned, record says %u", pg,
                   pin[pg], p->pages[pg].pin);
        CHECK_THAT(!pin[pg] || p->pages[pg].phys, "page %zu holds data but is not mapped", pg);
        CHECK_THAT(((p->mapped[pg / 64] >> (pg % 64)) & 1) == (p->pages[pg].phys != 0),
                   "page %zu: the bitmap of mapped pages disagrees with its record", pg);
        uint32_t u = p->pages[pg].fence_stream;
        CHECK_THAT(p->fencer == UM_MIXED_FENCE || u == UM_NO_FENCE || u == p->fencer,
                   "page %zu: fenced on stream %u, but the pool says only stream %u fences", pg,
                   u, p->fencer);
        bool hole = p->pages[pg].phys && !pin[pg];
        CHECK_THAT(hole || (p->pages[pg].hole_prev == NO_PAGE && p->pages[pg].hole_next == NO_PAGE),
                   "page %zu is not a hole but has hole-list links", pg);
        mapped += p->pages[pg].phys != 0;
        holes += hole;
    }
    size_t listed = 0;
    uint32_t before = NO_PAGE;
    for (uint32_t h = p->hole_head; h != NO_PAGE && listed <= p->npages;
         before = h, h = p->pages[h].hole_next, listed++) {
        CHECK_THAT(p->pages[h].phys && !p->pages[h].pin,
                   "hole list holds page %u that is not a hole", h);
        CHECK_THAT(p->pages[h].hole_prev == before, "hole %u links back to %u, not %u", h,
                   p->pages[h].hole_prev, before);
    }
    CHECK_THAT(p->hole_tail == before, "the hole list ends at %u, its tail says %u", before,
               p->hole_tail);
    CHECK_THAT(listed == holes && holes == p->holes, "%zu holes, list has %zu, count says %zu",
               holes, listed, p->holes);
    CHECK_THAT((mapped + p->parked_pages) * p->page == p->reserved,
               "%zu pages mapped and %zu parked but reserved is %zu", mapped, p->parked_pages,
               p->reserved);
    /* What a free range can serve, counted from its mapped pages, is what
     * the walk over all its pages finds. */
    {
        size_t cap = 0, *scratch = NULL, fast = 0, walk = 0;
        const um__block *held = own_held_block(p);
        size_t idle = holes_once_free(p, held);
        uintptr_t at = 0, lo, hi;
        for (um__block *b = free_run(p->region.first, held, &lo, &hi); lo != hi && !at;
             b = free_run(b, held, &lo, &hi)) {
            fast = ready_block_usable(p, lo, hi, idle, &scratch, &cap);
            walk = ready_block_usable_walk(p, lo, hi, idle);
            at = fast != walk ? lo : 0;
        }
        free(scratch);
        CHECK_THAT(!at, "free range %#" PRIxPTR ": %zu bytes usable counted from its mapped "
                   "pages, %zu by a walk over all its pages", at, fast, walk);
    }
    /* A large page covers whole, aligned groups of mapped pages that share
     * its chunk. */
    for (size_t head = 0; p->big > 1 && head < p->npages; head += p->big) {
        if (!page_compound(p, head)) {
            for (size_t i = head; i < head + p->big && i < p->npages; i++)
                CHECK_THAT(!page_compound(p, i), "page %zu is marked as a large page's, but "
                           "the large page's first page %zu is not", i, head);
            continue;
        }
        for (size_t i = head; i < head + p->big; i++)
            CHECK_THAT(page_compound(p, i) && p->pages[i].phys == p->pages[head].phys &&
                           p->pages[i].phys,
                       "page %zu of the large page at page %zu is unmarked, unmapped or has "
                       "another chunk", i, head);
    }
    CHECK_THAT(p->reserved <= p->peak_reserved, "reserved above its peak");
    for (uint32_t i = 0; i < p->nstreams; i++) {
        um__stream_state *ss = p->streams[i];
        if (!ss)
            continue;
        size_t k = 0;
        for (unsigned c = 0; c < UM_NCLASSES; c++)
            k += ss->small[c].n;
        CHECK_THAT(k == ss->small_pending, "stream %u: small pending count wrong", i);
        CHECK_THAT(ss->busy || (!ss->fence_n && !stream_has_pending(ss)),
                   "stream %u has frees to retire but is not on the busy list", i);
        pending_small += k;
        states++;
    }
    CHECK_THAT(states == p->nstates, "%u stream states, %u counted", states, p->nstates);
    CHECK_THAT(p->nbusy <= p->nstates, "%u streams on the busy list of %u", p->nbusy,
               p->nstates);
    for (uint32_t i = 0; i < p->nbusy; i++)
        CHECK_THAT(p->busy[i]->busy, "busy list entry %u is not marked busy", i);
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next)
        for (unsigned c = 0; c < UM_NCLASSES; c++)
            pending_small += tc->bins[c].n;
    CHECK_THAT(cached_slots == pending_small, "%zu slots cached, caches and lists hold %zu",
               cached_slots, pending_small);
    CHECK_THAT(active == active_total(p), "active bytes %zu, recount %zu", active_total(p),
               active);
    int64_t blocks_recorded = (int64_t)p->large_blocks, req_recorded = (int64_t)p->large_requested;
    size_t held_by_caches = 0;
    for (um__tcache *tc = p->tcaches; tc; tc = tc->next) {
        blocks_recorded += atomic_load(&tc->large_blocks_delta);
        req_recorded += atomic_load(&tc->large_req_delta);
        um__block *held = atomic_load(&tc->held);
        if (held) {
            CHECK_THAT(held->state == UM_BLOCK_LIVE && atomic_load(&held->tc_held),
                       "a thread cache holds %#" PRIxPTR ", which is not a held live block",
                       held->fi.addr);
            held_by_caches++;
        }
        /* `out` may name a record another thread freed; while tc_owner
         * names this cache, it must be this cache's live block. */
        um__block *out = atomic_load(&tc->out);
        CHECK_THAT(!out || atomic_load(&out->tc_owner) != tc ||
                       (out->state == UM_BLOCK_LIVE && out->fi.addr == tc->out_addr),
                   "a thread cache's last block %#" PRIxPTR " is not its live block",
                   out ? out->fi.addr : 0);
    }
    CHECK_THAT(held_large == held_by_caches, "%zu held large blocks, caches hold %zu", held_large,
               held_by_caches);
    CHECK_THAT((int64_t)live_large == blocks_recorded &&
                   live_large + held_large + p->deferred.count == p->map_count,
               "live large blocks: %zu counted, %" PRId64 " recorded, %zu in map (%zu held, "
               "%zu deferred)", live_large, blocks_recorded, p->map_count, held_large,
               p->deferred.count);
    int64_t req_large = planned_req;
    for (um__block *b = p->region.first; b; b = b->next)
        if (b->state == UM_BLOCK_LIVE && b != p->arena && !atomic_load(&b->tc_held))
            req_large += (int64_t)b->requested;
    CHECK_THAT(req_large == req_recorded, "requested bytes of large blocks wrong");
    CHECK_THAT(atomic_load(&p->peak_active) >= (int64_t)active, "active above its peak");
done:
    if (st == UM_OK)
        for (size_t g = 0; g < p->slab_granules_n; g++)
            if (((atomic_load(&p->slab_granules[g / 64]) >> (g % 64)) & 1) != granule_has_slab(p, g)) {
                st = um__fail(UM_ERR_INTERNAL, "slab granule %zu: its bit disagrees with the map", g);
                break;
            }
    free(pin);
    um__lock_release(&p->lock);
    return st;
}

/* ------------------------------------------------------- create / destroy */

#define TEARDOWN_TRIES 8
/* Makes backend call `call` up to TEARDOWN_TRIES times until it succeeds;
 * counts it in `refused` if it never does. */
#define TEARDOWN_CALL(refused, call)                                                               \
    do {                                                                                           \
        int tries_ = TEARDOWN_TRIES;                                                               \
        while ((call) != UM_OK && --tries_)                                                        \
            ;                                                                                      \
        (refused) += tries_ == 0;                                                                  \
    } while (0)

static void pool_destroy(um__allocator *a)
{
    um__pool *p = P(a);
    if (p->plan.plans)
        um__log(UM_LOG_DEBUG, "device %d (%s): step plans: %" PRIu64 " made, %" PRIu64
                " stopped, %" PRIu64 " not worth it; %" PRIu64 " allocations planned, %" PRIu64
                " missed (range still in use)", p->base.dev, dev_name(p), p->plan.plans,
                p->plan.abandoned, p->plan.rejected, p->plan.served, p->plan.misses);
    um__backend *b = p->base.backend;
    /* Everything goes back below: the trace's reserved memory ends at 0. */
    if (p->events)
        um__event_instant(p->events, UM_EVENT_RESERVED, p->base.dev, 0, 0);
    pthread_mutex_lock(&tcache_registry_lock);
    pthread_key_delete(p->tkey);
    while (p->tcaches) {
        um__tcache *tc = p->tcaches;
        p->tcaches = tc->next;
        tcache_unregister_locked(tc);
        free(tc);
    }
    pthread_mutex_unlock(&tcache_registry_lock);
    for (uint32_t i = 0; i < p->nstreams; i++) {
        um__stream_state *ss = p->streams[i];
        if (!ss)
            continue;
        for (uint32_t k = 0; k < ss->fence_n; k++)
            um__be_event_destroy(fence_backend(p, ss),
                                 ss->fences[(ss->fence_head + k) % UM_FENCE_RING].event);
        for (unsigned c = 0; c < UM_NCLASSES; c++)
            free(ss->small[c].items);
        free(ss);
    }
    free(p->streams);
    free(p->busy);
    /* A driver may refuse a call now and take it a moment later: each is
     * tried a few times before the memory is reported lost. */
    size_t refused = 0;
    for (size_t pg = 0; p->pages && pg < p->npages; pg++) {
        if (!p->pages[pg].phys)
            continue;
        size_t bytes = page_compound(p, pg) ? p->big * p->page : p->page;
        TEARDOWN_CALL(refused, um__be_unmap(b, page_addr(p, pg), bytes));
        TEARDOWN_CALL(refused, um__be_release(b, p->pages[pg].phys, bytes));
        pg += bytes / p->page - 1;
    }
    for (size_t i = 0; i < p->nparked; i++)
        TEARDOWN_CALL(refused, um__be_release(b, p->parked[i].phys, p->parked[i].pages * p->page));
    free(p->parked);
    free(p->compound);
    if (p->va)
        TEARDOWN_CALL(refused, um__be_unreserve(b, p->va, p->va_size));
    if (refused)
        um__log(UM_LOG_ERROR, "%s: at shutdown the backend refused %zu calls giving back pages "
                              "or reservations, %d times each (%s)",
                dev_name(p), refused, TEARDOWN_TRIES, um_last_error());
    /* Planned blocks are only in the pointer map (read before the region's
     * records, which the map also points to, are freed). */
    for (size_t pg = 0; p->page_starts && pg < p->npages; pg++) {
        for (um__block *blk = p->page_starts[pg], *nx; blk; blk = nx) {
            nx = blk->start_next;
            if (blk->planned)
                free(blk);
        }
    }
    for (um__block *blk = p->region.first, *nx; blk; blk = nx) {
        nx = blk->next;
        if (blk->state == UM_BLOCK_SLAB && blk->slab)
            slab_free_arrays(blk->slab);
        free(blk);
    }
    while (p->block_freelist) {
        um__block *nx = p->block_freelist->next;
        free(p->block_freelist);
        p->block_freelist = nx;
    }
    for (size_t t = 0; p->slab_map && t < p->slab_map_top; t++)
        free(p->slab_map[t]);
    free(p->slab_map);
    free((void *)p->slab_granules);
    free(p->mapped);
    free(p->page_starts);
    um__plan_fini(&p->plan);
    while (p->plan_spare) {
        um__block *nx = p->plan_spare->next;
        free(p->plan_spare);
        p->plan_spare = nx;
    }
    free(p->pages);
    free(p);
}

static const um__allocator_ops pool_ops = {
    .name = "pool",
    .alloc = pool_alloc,
    .free = pool_free,
    .owns = pool_owns,
    .block_live = pool_block_live,
    .trim = pool_trim,
    .set_memory_limit = pool_set_memory_limit,
    .set_cache_limit = pool_set_cache_limit,
    .stats = pool_stats,
    .active_bytes = pool_active_bytes,
    .reset_peak = pool_reset_peak,
    .stream_forget = pool_stream_forget,
    .check = pool_check,
    .destroy = pool_destroy,
};

/* Page tables cost 20 bytes a page; refuse address spaces that would need
 * more than this many pages. */
#define MAX_PAGES (64u * 1024u * 1024u)

um_status um__pool_create(um__backend *b, const um__pool_config *c, um__allocator **out)
{
    pthread_once(&class_once, class_init);
    *out = NULL;
    size_t page = b->granularity;
    if (!um__is_pow2(page) || page < UM_ALIGN)
        return um__fail(UM_ERR_INVALID, "device %d (%s): granularity %zu is not a power of two",
                        c->dev, b->name, page);
    int factor = c->va_factor > 0 ? c->va_factor : 4;
    size_t cap = um__align_up(b->capacity, page);
    if (cap > SIZE_MAX / 2 / (size_t)factor)
        return um__fail(UM_ERR_INVALID, "device %d (%s): capacity too large", c->dev, b->name);
    size_t va_size = um__align_up(cap * (size_t)factor + UM_SLAB_UNIT, page);
    if (va_size / page > MAX_PAGES)
        return um__fail(UM_ERR_INVALID,
                        "device %d (%s): %zu pages of %zu bytes is too many page records; raise "
                        "the granularity or lower va_factor",
                        c->dev, b->name, va_size / page, page);
    /* Where a large page is not larger than the device's page, there are
     * none: the device's pages already are that large. */
    uint32_t big = 1;
    if (c->large_page && (!um__is_pow2(c->large_page) || c->large_page / page > 64))
        return um__fail(UM_ERR_BAD_OPTION,
                        "device %d (%s): option '%s' is %zu bytes: not a power of two "
                        "of at most 64 of the device's %zu-byte pages",
                        c->dev, b->name, c->large_page_option ? c->large_page_option : "large_page",
                        c->large_page, page);
    if (c->large_page > page)
        big = (uint32_t)(c->large_page / page);

    /* Aligned like its most aligned member, so the fields kept on lines of
     * their own really are. */
    um__pool *p = aligned_alloc(_Alignof(um__pool), um__align_up(sizeof *p, _Alignof(um__pool)));
    if (!p)
        return um__fail(UM_ERR_NOMEM, "out of host memory for the pool of device %d", c->dev);
    memset(p, 0, sizeof *p);
    p->base.ops = &pool_ops;
    p->base.backend = b;
    p->base.dev = c->dev;
    p->base.reuse_wait = c->reuse_wait;
    p->base.reuse_arg = c->reuse_arg;
    p->events = c->events;
    p->capacity = b->capacity;
    p->base.memory_limit = c->memory_limit ? c->memory_limit : b->capacity;
    p->base.cache_limit = c->cache_limit;
    atomic_store_explicit(&p->cache_capped, c->cache_limit != UM_NO_CACHE_LIMIT,
                          memory_order_relaxed);
    p->thread_cache = c->thread_cache;
    /* Other threads take a held block back through the handover, which
     * needs membarrier (see bounce cache). */
    p->bounce = c->thread_cache && membarrier_ready();
    p->fence_wait_ns = c->fence_wait_ns;
    p->recycle = c->recycle;
    p->plan_on = !c->no_plan;
    p->defer = !c->no_defer;
    p->medium = !c->no_medium;
    p->cross_stream_reuse = !c->no_cross_stream_reuse;
    /* Medium slabs start off; sync_medium_slabs below decides. */
    atomic_init(&p->slab_max, UM_SMALL_MAX);
    p->refill_cls = UM_NCLASSES;
    for (unsigned k = 0; k < UM_NCLASSES; k++)
        atomic_init(&p->bin_max[k], bin_max_now(p, k, false));
    p->page = page;
    p->page_shift = (unsigned)__builtin_ctzll(page);
    p->big = big;
    p->big_min_pages = LARGE_PAGE_MIN_RUN * big;
    p->npages = va_size / page;
    p->va_size = va_size;
    p->hole_head = p->hole_tail = NO_PAGE;
    p->generation = atomic_fetch_add(&pool_generations, 1);
    p->calls_at_create = atomic_load(&b->calls);
    um__lock_init(&p->lock);
    if (pthread_key_create(&p->tkey, tcache_thread_exit) != 0) {
        free(p);
        return um__fail(UM_ERR_NOMEM, "no thread-specific key left for device %d", c->dev);
    }

    um_status s = um__be_reserve(b, va_size, &p->va);
    if (s != UM_OK) {
        p->va = 0;
        pool_destroy(&p->base);
        return s;
    }
    p->base.range_lo = p->va;
    p->base.range_size = va_size;
    /* Zeroed, so that a pool torn down before its records are set sees no
     * mapped page. */
    p->pages = calloc(p->npages, sizeof *p->pages);
    /* The range starts slab-aligned, so 64 KiB alignment inside it is
     * alignment of addresses. */
    p->region.lo = um__align_up(p->va, UM_SLAB_UNIT);
    p->region.hi = p->va + va_size;
    /* Units are counted from a 64 KiB-aligned address: a reservation is
     * aligned to its granularity only, and with pages under 64 KiB a slab
     * would otherwise straddle two units and its last bytes find no slab. */
    p->slab_base = um__align_down(p->va, UM_SLAB_UNIT);
    p->slab_map_top = ((p->va + va_size - p->slab_base) / UM_SLAB_UNIT + SLAB_MAP_LEAF - 1) /
                      SLAB_MAP_LEAF;
    p->slab_map = calloc(p->slab_map_top, sizeof *p->slab_map);
    p->slab_granules_n = p->slab_map_top * SLAB_MAP_LEAF / SLAB_GRANULE_UNITS;
    p->slab_granules = calloc((p->slab_granules_n + 63) / 64, sizeof *p->slab_granules);
    p->mapped = calloc((p->npages + 63) / 64, sizeof *p->mapped);
    if (p->big > 1)
        p->compound = calloc((p->npages + 63) / 64, sizeof *p->compound);
    p->page_starts = calloc(p->npages, sizeof *p->page_starts);
    bool ok = p->pages && p->slab_map && p->slab_granules && p->mapped && p->page_starts &&
              (p->big == 1 || p->compound) &&
              (!p->plan_on || um__plan_init(&p->plan));
    um__fi_init(&p->region.ready);
    um__fi_init(&p->deferred);
    um__block *blk = ok ? calloc(1, sizeof *blk) : NULL;
    ok = blk != NULL;
    if (ok) {
        blk->fi.addr = p->region.lo;
        blk->fi.size = p->region.hi - p->region.lo;
        blk->state = UM_BLOCK_READY;
        p->region.first = blk;
        um__fi_insert(&p->region.ready, &blk->fi);
    }
    if (!ok) {
        pool_destroy(&p->base);
        return um__fail(UM_ERR_NOMEM, "out of host memory for the page tables of device %d",
                        c->dev);
    }
    for (size_t pg = 0; pg < p->npages; pg++)
        p->pages[pg] = (um__page){.fence_stream = UM_NO_FENCE, .hole_prev = NO_PAGE,
                                  .hole_next = NO_PAGE};
    p->fencer = UM_NO_FENCE;
    sync_medium_slabs(p);
    /* The default stream is known from the start. */
    um__stream_ref def = {0, NULL, NULL};
    if (!stream_state(p, &def)) {
        pool_destroy(&p->base);
        return um__fail(UM_ERR_NOMEM, "out of host memory for device %d", c->dev);
    }
    *out = &p->base;
    return UM_OK;
}
