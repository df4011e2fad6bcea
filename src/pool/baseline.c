/*
 * baseline: the two allocators unimem's pool is measured against, behind
 * the same um__allocator_ops so the same API, backend and statistics drive
 * all three.
 *
 *   direct    no cache: every request reserves its own address range,
 *             creates one physical chunk of round_up(size, granularity)
 *             bytes and maps it (3 backend calls); every free unmaps,
 *             releases and unreserves (3 more).
 *   bufcache  MLX's BufferCache (mlx/backend/metal/allocator.cpp): freed
 *             buffers go whole into a cache keyed by their nominal size
 *             (the first request rounded up to UM_ALIGN); a request of
 *             aligned size s takes the smallest cached buffer of nominal
 *             size b with s <= b < min(2s, s + 2 pages); buffers are never
 *             split or merged; the oldest cached buffers are released first
 *             when the cache exceeds its limit or a new buffer would exceed
 *             the memory limit.
 *
 * Owns: every block record of one device's baseline allocator and the
 * backend memory behind it. One mutex guards everything: the baselines
 * model simple allocators and need no thread caches.
 */
#include "pool.h"
#include "../base/vtime.h"
#include "../trace/events.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ AVL tree */

/* An intrusive AVL tree keyed by (k1, k2), unique pairs. Two are used: by
 * address (k1 = start, k2 = 0), to answer owns() for interior pointers, and
 * by size (k1 = nominal size, k2 = insertion sequence), MLX's multimap of
 * cached buffers where equal sizes come out oldest first. */
typedef struct bl_node {
    struct bl_node *left, *right;
    uint64_t k1, k2;
    int height;
} bl_node;

static int avl_height(const bl_node *n)
{
    return n ? n->height : 0;
}

static bool avl_less(const bl_node *a, const bl_node *b)
{
    return a->k1 < b->k1 || (a->k1 == b->k1 && a->k2 < b->k2);
}

static void avl_fix(bl_node *n)
{
    int l = avl_height(n->left), r = avl_height(n->right);
    n->height = 1 + (l > r ? l : r);
}

static bl_node *avl_rotate_right(bl_node *n)
{
    bl_node *l = n->left;
    n->left = l->right;
    l->right = n;
    avl_fix(n);
    avl_fix(l);
    return l;
}

static bl_node *avl_rotate_left(bl_node *n)
{
    bl_node *r = n->right;
    n->right = r->left;
    r->left = n;
    avl_fix(n);
    avl_fix(r);
    return r;
}

static bl_node *avl_balance(bl_node *n)
{
    avl_fix(n);
    int bf = avl_height(n->left) - avl_height(n->right);
    if (bf > 1) {
        if (avl_height(n->left->left) < avl_height(n->left->right))
            n->left = avl_rotate_left(n->left);
        return avl_rotate_right(n);
    }
    if (bf < -1) {
        if (avl_height(n->right->right) < avl_height(n->right->left))
            n->right = avl_rotate_right(n->right);
        return avl_rotate_left(n);
    }
    return n;
}

static bl_node *avl_insert(bl_node *root, bl_node *n)
{
    if (!root) {
        n->left = n->right = NULL;
        n->height = 1;
        return n;
    }
    if (avl_less(n, root))
        root->left = avl_insert(root->left, n);
    else
        root->right = avl_insert(root->right, n);
    return avl_balance(root);
}

static bl_node *avl_remove_min(bl_node *root, bl_node **min)
{
    if (!root->left) {
        *min = root;
        return root->right;
    }
    root->left = avl_remove_min(root->left, min);
    return avl_balance(root);
}

/* Removes n, which must be in the tree. */
static bl_node *avl_remove(bl_node *root, bl_node *n)
{
    if (!root)
        return NULL;
    if (root == n) {
        if (!root->left)
            return root->right;
        if (!root->right)
            return root->left;
        bl_node *m;
        bl_node *rest = avl_remove_min(root->right, &m);
        m->left = root->left;
        m->right = rest;
        return avl_balance(m);
    }
    if (avl_less(n, root))
        root->left = avl_remove(root->left, n);
    else
        root->right = avl_remove(root->right, n);
    return avl_balance(root);
}

/* The smallest node with key >= (k1, k2). */
static bl_node *avl_lower_bound(bl_node *root, uint64_t k1, uint64_t k2)
{
    bl_node *best = NULL;
    while (root) {
        if (root->k1 > k1 || (root->k1 == k1 && root->k2 >= k2)) {
            best = root;
            root = root->left;
        } else {
            root = root->right;
        }
    }
    return best;
}

/* The node with the largest k1 <= k1. */
static bl_node *avl_floor(bl_node *root, uint64_t k1)
{
    bl_node *best = NULL;
    while (root) {
        if (root->k1 <= k1) {
            best = root;
            root = root->right;
        } else {
            root = root->left;
        }
    }
    return best;
}

static bl_node *avl_max(bl_node *root)
{
    while (root && root->right)
        root = root->right;
    return root;
}

/* ------------------------------------------------------------- blocks */

typedef enum bl_state { BL_LIVE = 0, BL_CACHED = 1, BL_LIMBO = 2 } bl_state;

/* One buffer: an address range with one chunk mapped over all of it. */
typedef struct bl_block {
    uintptr_t va;
    size_t phys;     /* bytes reserved, created and mapped */
    size_t nominal;  /* round_up(first request, UM_ALIGN): the cache key */
    size_t size;     /* live: the bytes requested */
    size_t active;   /* live: round_up(size, UM_ALIGN) */
    um__phys handle; /* 0 once released */
    bool va_held;    /* the reservation still exists */
    bool mapped;
    bl_state state;
    /* Live: the allocation stream. Cached: the stream it was freed on,
     * where it is reusable at once. stream_valid is false when that stream
     * was forgotten (its work was waited for) or the block is reusable on
     * every stream. */
    uint32_t stream;
    um__bstream *bstream;
    um__backend *sbackend;  /* bstream's backend; NULL: the allocator's own */
    bool stream_valid;
    um__bevent *event;      /* cached: completes when work on `stream` queued before the free has */
    struct bl_block *hnext; /* hash chain */
    struct bl_block *lru_prev, *lru_next; /* cached: LRU list; limbo: limbo list */
    bl_node by_addr, by_size;
} bl_block;

#define BL_OF(node, field) ((bl_block *)((char *)(node)-offsetof(bl_block, field)))

typedef struct baseline {
    um__allocator base;
    pthread_mutex_t lock;
    bool caching; /* bufcache; false for direct */
    size_t gran;
    uint64_t calls_at_create;

    /* start address -> block, for live and cached blocks */
    bl_block **buckets;
    size_t nbuckets; /* a power of two */
    unsigned hash_shift;
    size_t nblocks;

    bl_node *addr_root; /* live and cached blocks by address */
    bl_node *size_root; /* cached blocks by (nominal, sequence) */
    bl_block lru;       /* sentinel: lru.lru_next newest, lru.lru_prev oldest */
    bl_block limbo;     /* sentinel: records whose teardown failed half way */
    uint64_t seq;

    /* Events are recorded at free time only once a second stream shows up;
     * a block freed before that gets its event when another stream first
     * considers it (later, so it waits for at least the same work). */
    bool seen_stream;
    uint32_t first_stream;
    bool multi_stream;

    size_t active, requested, reserved, cached_phys;
    size_t peak_active, peak_reserved;
    struct um__events *events; /* trace_file's recorder: reserved memory goes there; or NULL */
    uint64_t live_blocks, cached_blocks, limbo_blocks;
    uint64_t num_allocs, num_frees, num_hits, num_ooms;
} baseline;

/* Reserved memory changes by delta; a recorded trace's reserved and
 * cached counters follow it, as the pool's do. */
static void bl_reserved_add(baseline *bl, int64_t delta)
{
    bl->reserved = (size_t)((int64_t)bl->reserved + delta);
    if (bl->events)
        um__event_instant(bl->events, UM_EVENT_RESERVED, bl->base.dev, bl->reserved, 0);
}

static uint64_t bl_mix(uintptr_t va)
{
    return (uint64_t)va * 0x9e3779b97f4a7c15ull;
}

static size_t bl_bucket(const baseline *bl, uintptr_t va)
{
    return (size_t)(bl_mix(va) >> bl->hash_shift);
}

static bl_block *bl_find(baseline *bl, uintptr_t va)
{
    bl_block *b = bl->buckets[bl_bucket(bl, va)];
    while (b && b->va != va)
        b = b->hnext;
    return b;
}

/* Doubles the table when it averages more than one block a bucket; if that
 * allocation fails the table keeps working with longer chains. */
static void bl_hash_grow(baseline *bl)
{
    size_t n = bl->nbuckets * 2;
    bl_block **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    unsigned shift = bl->hash_shift - 1;
    for (size_t i = 0; i < bl->nbuckets; i++) {
        bl_block *b = bl->buckets[i];
        while (b) {
            bl_block *next = b->hnext;
            size_t k = (size_t)(bl_mix(b->va) >> shift);
            b->hnext = nb[k];
            nb[k] = b;
            b = next;
        }
    }
    free(bl->buckets);
    bl->buckets = nb;
    bl->nbuckets = n;
    bl->hash_shift = shift;
}

/* Makes b findable by address (hash and tree). */
static void bl_index(baseline *bl, bl_block *b)
{
    if (bl->nblocks >= bl->nbuckets)
        bl_hash_grow(bl);
    size_t k = bl_bucket(bl, b->va);
    b->hnext = bl->buckets[k];
    bl->buckets[k] = b;
    bl->nblocks++;
    b->by_addr.k1 = b->va;
    b->by_addr.k2 = 0;
    bl->addr_root = avl_insert(bl->addr_root, &b->by_addr);
}

static void bl_unindex(baseline *bl, bl_block *b)
{
    bl_block **pp = &bl->buckets[bl_bucket(bl, b->va)];
    while (*pp != b)
        pp = &(*pp)->hnext;
    *pp = b->hnext;
    b->hnext = NULL;
    bl->nblocks--;
    bl->addr_root = avl_remove(bl->addr_root, &b->by_addr);
}

/* Whether va lies in a live or cached block. */
static bool bl_inside(baseline *bl, uintptr_t va)
{
    bl_node *n = avl_floor(bl->addr_root, va);
    return n && va - BL_OF(n, by_addr)->va < BL_OF(n, by_addr)->phys;
}

static void bl_list_push(bl_block *head, bl_block *b)
{
    b->lru_prev = head;
    b->lru_next = head->lru_next;
    head->lru_next->lru_prev = b;
    head->lru_next = b;
}

static void bl_list_unlink(bl_block *b)
{
    b->lru_prev->lru_next = b->lru_next;
    b->lru_next->lru_prev = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

static void bl_peaks(baseline *bl)
{
    if (bl->active > bl->peak_active)
        bl->peak_active = bl->active;
    if (bl->reserved > bl->peak_reserved)
        bl->peak_reserved = bl->reserved;
}

/* The backend of b's stream, which records and answers b's event. */
static um__backend *bl_event_backend(const baseline *bl, const bl_block *b)
{
    return b->sbackend ? b->sbackend : bl->base.backend;
}

/* ------------------------------------------------------ backend memory */

/* Waits for the work queued before b's free on its stream (its event,
 * else, or where the event cannot be waited for, the stream), which may
 * still use the range. Where neither can be waited for, b keeps its event
 * and stream and the range stays mapped: the retry of the teardown must
 * wait again (forgetting them let the retry unmap the range under that
 * work). A parked block's stream stays valid: bl_stream_forget waits for
 * it, or keeps the stream, before the stream goes. */
static um_status bl_wait_stream_work(baseline *bl, bl_block *b)
{
    um__backend *sbe = bl_event_backend(bl, b);
    um_status s = b->event ? um__be_event_sync(sbe, b->event) : UM_ERR_BACKEND;
    if (s != UM_OK && b->stream_valid)
        s = um__be_stream_sync(sbe, b->bstream);
    if (s != UM_OK) {
        char why[256];
        return um__fail(s,
                        "device %d (%s): %zu bytes at %#lx stay mapped: the work queued "
                        "before their free cannot be waited for (%s)",
                        bl->base.dev, bl->base.ops->name, b->phys, (unsigned long)b->va,
                        um__error_detail(s, why, sizeof why));
    }
    if (b->event)
        um__be_event_destroy(sbe, b->event);
    b->event = NULL;
    b->stream_valid = false;
    return UM_OK;
}

/* Gives back whatever of b's backend resources remain, in reverse order of
 * creation. A failure leaves the flags saying what is still held, so the
 * teardown can be retried. The unmap first waits for the device work that
 * may still use the range: unmapping does not wait for it (cuMemUnmap
 * promises no synchronization; PyTorch's expandable segments synchronize
 * before unmapping for the same reason). */
static um_status bl_teardown(baseline *bl, bl_block *b)
{
    um__backend *be = bl->base.backend;
    um_status s;
    if (b->mapped && (b->event || b->stream_valid) && (s = bl_wait_stream_work(bl, b)) != UM_OK)
        return s;
    if (b->event) {
        um__be_event_destroy(bl_event_backend(bl, b), b->event);
        b->event = NULL;
    }
    if (b->mapped) {
        if ((s = um__be_unmap(be, b->va, b->phys)) != UM_OK)
            return s;
        b->mapped = false;
    }
    if (b->handle) {
        if ((s = um__be_release(be, b->handle, b->phys)) != UM_OK)
            return s;
        b->handle = 0;
        bl_reserved_add(bl, -(int64_t)b->phys);
    }
    if (b->va_held) {
        if ((s = um__be_unreserve(be, b->va, b->phys)) != UM_OK)
            return s;
        b->va_held = false;
    }
    return UM_OK;
}

/* Tears b down; b is in no index. On success the record is freed; on
 * failure it is parked in limbo, counted in reserved while its chunk
 * exists, and retried by trim, by the next allocation that has to grow, and
 * at destroy, so nothing leaks. */
static um_status bl_dispose(baseline *bl, bl_block *b)
{
    um_status s = bl_teardown(bl, b);
    if (s == UM_OK) {
        free(b);
        return UM_OK;
    }
    um__log(UM_LOG_WARN,
            "device %d (%s): could not give back %zu bytes at %#lx (%s); retrying later",
            bl->base.dev, bl->base.ops->name, b->phys, (unsigned long)b->va, um_last_error());
    b->state = BL_LIMBO;
    bl_list_push(&bl->limbo, b);
    bl->limbo_blocks++;
    return s;
}

static um_status bl_retry_limbo(baseline *bl)
{
    um_status first = UM_OK;
    bl_block *b = bl->limbo.lru_next;
    while (b != &bl->limbo) {
        bl_block *next = b->lru_next;
        um_status s = bl_teardown(bl, b);
        if (s == UM_OK) {
            bl_list_unlink(b);
            bl->limbo_blocks--;
            free(b);
        } else if (first == UM_OK) {
            first = s;
        }
        b = next;
    }
    return first;
}

/* Reserves, creates and maps `phys` bytes for a new block. On failure the
 * partial work is undone and um_last_error() keeps the backend's message. */
static um_status bl_map_new(baseline *bl, size_t nominal, size_t phys, bl_block **out)
{
    um__backend *be = bl->base.backend;
    bl_block *b = calloc(1, sizeof *b);
    if (!b) {
        um__note_host_nomem();
        return um__fail(UM_ERR_NOMEM, "device %d (%s): cannot allocate a block record",
                        bl->base.dev, bl->base.ops->name);
    }
    b->nominal = nominal;
    b->phys = phys;
    um_status s = um__be_reserve(be, phys, &b->va);
    if (s == UM_OK) {
        b->va_held = true;
        s = um__be_create(be, phys, &b->handle);
    }
    if (s == UM_OK) {
        bl_reserved_add(bl, (int64_t)phys);
        bl_peaks(bl);
        s = um__be_map(be, b->va, phys, b->handle);
    }
    if (s == UM_OK) {
        b->mapped = true;
        *out = b;
        return UM_OK;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", um_last_error());
    bl_dispose(bl, b);
    um__fail(s, "%s", why); /* the cause, not a failed undo, is what the caller sees */
    return s;
}

/* ---------------------------------------------------------------- cache */

/* Removes a cached block from the cache structures (not from the address
 * index). */
static void bl_uncache(baseline *bl, bl_block *b)
{
    bl->size_root = avl_remove(bl->size_root, &b->by_size);
    bl_list_unlink(b);
    bl->cached_phys -= b->phys;
    bl->cached_blocks--;
}

/* Releases the oldest cached buffer. */
static void bl_evict_oldest(baseline *bl)
{
    bl_block *b = bl->lru.lru_prev;
    bl_uncache(bl, b);
    bl_unindex(bl, b);
    bl_dispose(bl, b);
}

static void bl_note_stream(baseline *bl, uint32_t id)
{
    if (!bl->seen_stream) {
        bl->seen_stream = true;
        bl->first_stream = id;
    } else if (id != bl->first_stream) {
        bl->multi_stream = true;
    }
}

/* Whether cached block b may serve a request on stream `id` now. On
 * another stream that needs its free-time event to have completed. */
static bool bl_reusable(baseline *bl, bl_block *b, uint32_t id, bool *called)
{
    um__backend *be = bl_event_backend(bl, b);
    if (!b->stream_valid || b->stream == id)
        return true;
    if (!b->event) {
        *called = true;
        if (um__be_event_record(be, b->bstream, &b->event) != UM_OK) {
            b->event = NULL;
            return false;
        }
    }
    int done = 0;
    *called = true;
    if (um__be_event_query(be, b->event, &done) != UM_OK || !done)
        return false;
    /* Its stream's work is done: reusable everywhere from now on. */
    um__be_event_destroy(be, b->event);
    b->event = NULL;
    b->stream_valid = false;
    return true;
}

/* MLX's reuse rule: the smallest cached buffer of nominal size b with
 * s <= b < min(2s, s + 2 pages) that the stream may use. */
static bl_block *bl_cache_take(baseline *bl, size_t s, uint32_t stream, bool *called)
{
    size_t twice = s > SIZE_MAX / 2 ? SIZE_MAX : 2 * s;
    size_t pages = s > SIZE_MAX - 2 * bl->gran ? SIZE_MAX : s + 2 * bl->gran;
    size_t bound = twice < pages ? twice : pages;
    bl_node *n = avl_lower_bound(bl->size_root, s, 0);
    while (n && n->k1 < bound) {
        bl_block *b = BL_OF(n, by_size);
        if (bl_reusable(bl, b, stream, called)) {
            bl_uncache(bl, b);
            if (b->event) {
                *called = true;
                um__be_event_destroy(bl_event_backend(bl, b), b->event);
                b->event = NULL;
            }
            return b;
        }
        n = avl_lower_bound(bl->size_root, n->k1, n->k2 + 1);
    }
    return NULL;
}

static void bl_enforce_cache_limit(baseline *bl)
{
    while (bl->cached_blocks && bl->cached_phys > bl->base.cache_limit)
        bl_evict_oldest(bl);
}

/* ------------------------------------------------------------ the ops */

static um_status bl_nomem(baseline *bl, size_t size, size_t phys, const char *why)
{
    bl->num_ooms++;
    return um__fail(UM_ERR_NOMEM,
                    "device %d (%s): cannot allocate %zu bytes (%zu with page rounding): "
                    "%zu bytes live, %zu reserved, memory limit %zu%s%s",
                    bl->base.dev, bl->base.ops->name, size, phys, bl->requested, bl->reserved,
                    bl->base.memory_limit, why ? "; " : "", why ? why : "");
}

/* A new block of `phys` bytes, releasing cached buffers (oldest first) when
 * the memory limit or the device is in the way. */
static um_status bl_grow(baseline *bl, size_t size, size_t nominal, size_t phys, bl_block **out)
{
    if (bl->limbo_blocks)
        bl_retry_limbo(bl);
    size_t limit = bl->base.memory_limit;
    if (phys > limit)
        return bl_nomem(bl, size, phys, "larger than the memory limit");
    while (bl->cached_blocks && bl->reserved > limit - phys)
        bl_evict_oldest(bl);
    if (bl->reserved > limit - phys)
        return bl_nomem(bl, size, phys, NULL);
    um_status s = bl_map_new(bl, nominal, phys, out);
    if (s == UM_ERR_NOMEM && bl->cached_blocks) {
        /* The device itself is full (other users, or the limit is above
         * its capacity): give the whole cache back and try once more. */
        while (bl->cached_blocks)
            bl_evict_oldest(bl);
        (void)um__host_nomem_take(); /* the retry's own cause counts */
        s = bl_map_new(bl, nominal, phys, out);
    }
    if (s == UM_ERR_NOMEM) {
        char why[512];
        snprintf(why, sizeof why, "backend: %s", um_last_error());
        return bl_nomem(bl, size, phys, why);
    }
    return s;
}

static um_status bl_alloc(um__allocator *a, size_t size, const um__stream_ref *sr, void **ptr)
{
    baseline *bl = (baseline *)a;
    if (!ptr)
        return um__fail(UM_ERR_INVALID, "device %d (%s): alloc: ptr is NULL", a->dev, a->ops->name);
    *ptr = NULL;
    if (size == 0)
        return um__fail(UM_ERR_INVALID, "device %d (%s): allocation of 0 bytes", a->dev,
                        a->ops->name);
    uint32_t sid = sr ? sr->id : 0;
    um__bstream *bs = sr ? sr->bstream : NULL;
    um__backend *sbe = sr ? sr->backend : NULL;
    um__vt_mutex_lock(&bl->lock);
    if (size > SIZE_MAX - UM_ALIGN - bl->gran) {
        um_status s = bl_nomem(bl, size, size, "larger than any address range");
        um__vt_mutex_unlock(&bl->lock);
        return s;
    }
    size_t nominal = um__align_up(size, UM_ALIGN);
    bl_note_stream(bl, sid);
    bool called = false;
    bl_block *b = bl->caching ? bl_cache_take(bl, nominal, sid, &called) : NULL;
    if (b) {
        if (!called)
            bl->num_hits++;
    } else {
        um_status s = bl_grow(bl, size, nominal, um__align_up(nominal, bl->gran), &b);
        if (s != UM_OK) {
            um__vt_mutex_unlock(&bl->lock);
            return s;
        }
        bl_index(bl, b);
    }
    b->state = BL_LIVE;
    b->size = size;
    b->active = nominal;
    b->stream = sid;
    b->bstream = bs;
    b->sbackend = sbe;
    b->stream_valid = true;
    bl->active += b->active;
    bl->requested += size;
    bl->live_blocks++;
    bl->num_allocs++;
    bl_peaks(bl);
    um__vt_mutex_unlock(&bl->lock);
    /* No cache of its own per thread: any block may be another thread's. */
    *ptr = (void *)b->va;
    um__allocator_reuse_wait(a, ptr, 1);
    return UM_OK;
}

/* Why ptr, whose block by start address is b (NULL: none), is no live
 * block's start; `freed` is the status for a cached block's start. Under
 * the lock. */
static um_status bl_not_live_locked(baseline *bl, void *ptr, const bl_block *b, um_status freed)
{
    const um__allocator *a = &bl->base;
    if (b)
        return um__fail(freed, "device %d (%s): %p was already freed", a->dev, a->ops->name, ptr);
    if (bl_inside(bl, (uintptr_t)ptr))
        return um__fail(UM_ERR_INVALID_POINTER, "device %d (%s): %p is inside a block of %s",
                        a->dev, a->ops->name, ptr, a->ops->name);
    return um__fail(UM_ERR_INVALID_POINTER, "device %d (%s): %p was not allocated here", a->dev,
                    a->ops->name, ptr);
}

static um_status bl_free(um__allocator *a, void *ptr, const um__stream_ref *sr)
{
    baseline *bl = (baseline *)a;
    uintptr_t va = (uintptr_t)ptr;
    um__vt_mutex_lock(&bl->lock);
    bl_block *b = bl_find(bl, va);
    if (!b || b->state != BL_LIVE) {
        um_status s = bl_not_live_locked(bl, ptr, b, UM_ERR_DOUBLE_FREE);
        um__vt_mutex_unlock(&bl->lock);
        return s;
    }
    if (!bl->caching) {
        /* Direct: the range goes back to the backend at once and may be
         * handed out again, so, as cudaFree waits for the device, the free
         * first waits for the work queued before it on its stream (the
         * block's own when none is given; none once that was destroyed).
         * The first steps (the wait, the unmap) failing leave the block
         * live, so the caller may try again; a later step failing parks
         * the rest (bl_dispose), and the free has still taken the block:
         * it succeeds, since the caller must not free it again, and a
         * caller that saw an error could not tell this from a block still
         * live once the parked range was given back and its address
         * reused. */
        um_status s = UM_OK;
        if (sr)
            s = um__be_stream_sync(sr->backend ? sr->backend : a->backend, sr->bstream);
        else if (b->stream_valid)
            s = um__be_stream_sync(bl_event_backend(bl, b), b->bstream);
        if (s != UM_OK ||
            (b->mapped && (s = um__be_unmap(a->backend, b->va, b->phys)) != UM_OK)) {
            um__vt_mutex_unlock(&bl->lock);
            return s;
        }
        b->mapped = false;
        bl_unindex(bl, b);
    }
    bl->active -= b->active;
    bl->requested -= b->size;
    bl->live_blocks--;
    bl->num_frees++;
    if (!bl->caching) {
        bl_dispose(bl, b);
        um__vt_mutex_unlock(&bl->lock);
        return UM_OK;
    }
    if (sr) {
        bl_note_stream(bl, sr->id);
        b->stream = sr->id;
        b->bstream = sr->bstream;
        b->sbackend = sr->backend;
        b->stream_valid = true;
    }
    b->state = BL_CACHED;
    b->size = 0;
    b->active = 0;
    b->by_size.k1 = b->nominal;
    b->by_size.k2 = bl->seq++;
    bl->size_root = avl_insert(bl->size_root, &b->by_size);
    bl_list_push(&bl->lru, b);
    bl->cached_phys += b->phys;
    bl->cached_blocks++;
    /* With several streams in use, record now what another stream must
     * wait for; if that fails the event is recorded when needed. */
    if (bl->multi_stream && b->stream_valid &&
        um__be_event_record(bl_event_backend(bl, b), b->bstream, &b->event) != UM_OK)
        b->event = NULL;
    bl_enforce_cache_limit(bl);
    um__vt_mutex_unlock(&bl->lock);
    return UM_OK;
}

/* UM_OK for a live block's start; else why not, as bl_free says it, but
 * UM_ERR_INVALID_POINTER for a freed block too (block_live's contract). */
static um_status bl_block_live(um__allocator *a, const void *ptr)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    bl_block *b = bl_find(bl, (uintptr_t)ptr);
    um_status s = b && b->state == BL_LIVE
                      ? UM_OK
                      : bl_not_live_locked(bl, (void *)ptr, b, UM_ERR_INVALID_POINTER);
    um__vt_mutex_unlock(&bl->lock);
    return s;
}

/* Live and cached blocks count as owned, so freeing a cached pointer again
 * is reported as a double free. `direct` keeps nothing of a freed block:
 * its address range goes back to the backend and may be handed to another
 * device's allocator at once, so remembering it would make this allocator
 * claim memory it no longer has. A double free there is therefore an
 * unknown pointer (UM_ERR_INVALID_POINTER from um_free). */
static bool bl_owns(um__allocator *a, const void *ptr)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    bool owned = bl_inside(bl, (uintptr_t)ptr);
    um__vt_mutex_unlock(&bl->lock);
    return owned;
}

static um_status bl_trim(um__allocator *a)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    while (bl->cached_blocks)
        bl_evict_oldest(bl);
    um_status s = bl_retry_limbo(bl);
    um__vt_mutex_unlock(&bl->lock);
    return s;
}

static um_status bl_set_memory_limit(um__allocator *a, size_t bytes)
{
    baseline *bl = (baseline *)a;
    size_t limit = bytes ? bytes : a->backend->capacity;
    um__vt_mutex_lock(&bl->lock);
    while (bl->cached_blocks && bl->reserved > limit)
        bl_evict_oldest(bl);
    if (bl->reserved > limit) {
        um_status s = um__fail(UM_ERR_BUSY,
                               "device %d (%s): cannot lower the memory limit to %zu bytes: "
                               "%zu bytes are reserved by %llu live blocks",
                               a->dev, a->ops->name, limit, bl->reserved,
                               (unsigned long long)bl->live_blocks);
        um__vt_mutex_unlock(&bl->lock);
        return s;
    }
    a->memory_limit = limit;
    um__vt_mutex_unlock(&bl->lock);
    return UM_OK;
}

static um_status bl_set_cache_limit(um__allocator *a, size_t bytes)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    a->cache_limit = bytes;
    bl_enforce_cache_limit(bl);
    um__vt_mutex_unlock(&bl->lock);
    return UM_OK;
}

static size_t bl_active_bytes(um__allocator *a)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    size_t n = bl->active;
    um__vt_mutex_unlock(&bl->lock);
    return n;
}

static void bl_stats(um__allocator *a, um_stats *out)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    memset(out, 0, sizeof *out);
    out->active_bytes = bl->active;
    out->requested_bytes = bl->requested;
    out->reserved_bytes = bl->reserved;
    out->cached_bytes = bl->reserved - bl->active;
    out->peak_active_bytes = bl->peak_active;
    out->peak_reserved_bytes = bl->peak_reserved;
    bl_node *largest = avl_max(bl->size_root);
    out->largest_free_bytes = largest ? (size_t)largest->k1 : 0;
    out->fragmentation = out->cached_bytes ? (double)(out->cached_bytes - out->largest_free_bytes) /
                                                 (double)out->cached_bytes
                                           : 0.0;
    out->active_blocks = bl->live_blocks;
    out->num_allocs = bl->num_allocs;
    out->num_frees = bl->num_frees;
    out->num_backend_calls =
        atomic_load_explicit(&a->backend->calls, memory_order_relaxed) - bl->calls_at_create;
    out->num_cache_hits = bl->num_hits;
    out->num_ooms = bl->num_ooms;
    um__vt_mutex_unlock(&bl->lock);
}

static void bl_reset_peak(um__allocator *a)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    bl->peak_active = bl->active;
    bl->peak_reserved = bl->reserved;
    um__vt_mutex_unlock(&bl->lock);
}

/* The stream goes away: live blocks allocated on it are freed later as if
 * on no particular stream, and cached and parked blocks freed on it
 * become reusable everywhere once its work is done. Where that work cannot
 * be waited for, nothing changes and the forget fails, so that the stream
 * stays: those blocks keep waiting for it (releasing them unwaited unmapped
 * memory its queued work still used). */
static um_status bl_stream_forget(um__allocator *a, const um__stream_ref *sr)
{
    baseline *bl = (baseline *)a;
    if (!sr)
        return UM_OK;
    um__vt_mutex_lock(&bl->lock);
    size_t pending = 0;
    for (size_t i = 0; i < bl->nbuckets; i++)
        for (bl_block *b = bl->buckets[i]; b; b = b->hnext)
            pending += b->state == BL_CACHED && b->stream_valid && b->stream == sr->id;
    for (bl_block *b = bl->limbo.lru_next; b != &bl->limbo; b = b->lru_next)
        pending += b->stream_valid && b->stream == sr->id;
    if (pending &&
        um__be_stream_sync(sr->backend ? sr->backend : a->backend, sr->bstream) != UM_OK) {
        char why[256];
        um_status s =
            um__fail(UM_ERR_BACKEND,
                     "device %d (%s): stream %u: %zu buffer%s freed on it stay cached "
                     "and the stream stays: its work cannot be waited for (%s)",
                     a->dev, a->ops->name, (unsigned)sr->id, pending, pending == 1 ? "" : "s",
                     um__error_detail(UM_ERR_BACKEND, why, sizeof why));
        um__vt_mutex_unlock(&bl->lock);
        return s;
    }
    for (size_t i = 0; i < bl->nbuckets; i++)
        for (bl_block *b = bl->buckets[i]; b; b = b->hnext)
            if (b->stream_valid && b->stream == sr->id) {
                if (b->event)
                    um__be_event_destroy(bl_event_backend(bl, b), b->event);
                b->event = NULL;
                b->stream_valid = false;
            }
    for (bl_block *b = bl->limbo.lru_next; b != &bl->limbo; b = b->lru_next)
        if (b->stream_valid && b->stream == sr->id) {
            if (b->event)
                um__be_event_destroy(bl_event_backend(bl, b), b->event);
            b->event = NULL;
            b->stream_valid = false;
        }
    um__vt_mutex_unlock(&bl->lock);
    return UM_OK;
}

/* Checks the AVL shape and order of a subtree; returns its node count or
 * -1, with *prev the last node visited in order. */
static long bl_check_tree(const bl_node *n, const bl_node **prev, int *height)
{
    if (!n) {
        *height = 0;
        return 0;
    }
    int hl, hr;
    long l = bl_check_tree(n->left, prev, &hl);
    if (l < 0)
        return -1;
    if (*prev && !avl_less(*prev, n))
        return -1;
    *prev = n;
    long r = bl_check_tree(n->right, prev, &hr);
    if (r < 0)
        return -1;
    *height = 1 + (hl > hr ? hl : hr);
    if (n->height != *height || hl - hr > 1 || hr - hl > 1)
        return -1;
    return l + r + 1;
}

static um_status bl_check_locked(baseline *bl)
{
    const char *who = bl->base.ops->name;
    int dev = bl->base.dev;
    size_t active = 0, requested = 0, reserved = 0, cached = 0;
    uint64_t live = 0, ncached = 0, total = 0;
    for (size_t i = 0; i < bl->nbuckets; i++) {
        for (bl_block *b = bl->buckets[i]; b; b = b->hnext) {
            total++;
            if (bl_bucket(bl, b->va) != i || bl_find(bl, b->va) != b)
                return um__fail(UM_ERR_INTERNAL,
                                "device %d (%s): block %#lx is in the wrong bucket", dev, who,
                                (unsigned long)b->va);
            if (b->va % bl->gran || b->phys != um__align_up(b->nominal, bl->gran) ||
                b->nominal % UM_ALIGN || !b->mapped || !b->handle || !b->va_held)
                return um__fail(UM_ERR_INTERNAL,
                                "device %d (%s): block %#lx: %zu bytes mapped for nominal %zu, "
                                "mapped %d, chunk %d, reserved %d",
                                dev, who, (unsigned long)b->va, b->phys, b->nominal, b->mapped,
                                b->handle != 0, b->va_held);
            reserved += b->phys;
            if (b->state == BL_LIVE) {
                if (b->active != um__align_up(b->size, UM_ALIGN) || b->active > b->nominal ||
                    b->size == 0)
                    return um__fail(UM_ERR_INTERNAL,
                                    "device %d (%s): live block %#lx of %zu bytes counts %zu "
                                    "active in a buffer of %zu",
                                    dev, who, (unsigned long)b->va, b->size, b->active, b->nominal);
                live++;
                active += b->active;
                requested += b->size;
            } else if (b->state == BL_CACHED && bl->caching) {
                ncached++;
                cached += b->phys;
            } else {
                return um__fail(UM_ERR_INTERNAL,
                                "device %d (%s): block %#lx in state %d is indexed", dev, who,
                                (unsigned long)b->va, (int)b->state);
            }
        }
    }
    for (bl_block *b = bl->limbo.lru_next; b != &bl->limbo; b = b->lru_next)
        if (b->handle)
            reserved += b->phys;
    const bl_node *prev = NULL;
    int h;
    long naddr = bl_check_tree(bl->addr_root, &prev, &h);
    if (naddr < 0 || (uint64_t)naddr != total || total != bl->nblocks)
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): address tree holds %ld blocks (or is unbalanced), hash "
                        "%llu, count %zu",
                        dev, who, naddr, (unsigned long long)total, bl->nblocks);
    /* Blocks in address order never overlap. */
    const bl_block *last = NULL;
    for (bl_node *n = avl_lower_bound(bl->addr_root, 0, 0); n;
         n = avl_lower_bound(bl->addr_root, n->k1, n->k2 + 1)) {
        const bl_block *b = BL_OF(n, by_addr);
        if (last && last->va + last->phys > b->va)
            return um__fail(UM_ERR_INTERNAL, "device %d (%s): blocks %#lx and %#lx overlap", dev,
                            who, (unsigned long)last->va, (unsigned long)b->va);
        last = b;
    }
    prev = NULL;
    long nsize = bl_check_tree(bl->size_root, &prev, &h);
    uint64_t nlru = 0;
    for (bl_block *b = bl->lru.lru_next; b != &bl->lru; b = b->lru_next) {
        if (b->state != BL_CACHED || b->by_size.k1 != b->nominal)
            return um__fail(UM_ERR_INTERNAL, "device %d (%s): LRU entry %#lx is not cached", dev,
                            who, (unsigned long)b->va);
        nlru++;
    }
    if (nsize < 0 || (uint64_t)nsize != ncached || nlru != ncached)
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): %llu cached blocks, size tree %ld (or unbalanced), "
                        "LRU %llu",
                        dev, who, (unsigned long long)ncached, nsize, (unsigned long long)nlru);
    if (active != bl->active || requested != bl->requested || reserved != bl->reserved ||
        cached != bl->cached_phys || live != bl->live_blocks || ncached != bl->cached_blocks)
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): counted active %zu/%zu, requested %zu/%zu, reserved "
                        "%zu/%zu, cached %zu/%zu, live blocks %llu/%llu, cached blocks %llu/%llu "
                        "(recount/statistics)",
                        dev, who, active, bl->active, requested, bl->requested, reserved,
                        bl->reserved, cached, bl->cached_phys, (unsigned long long)live,
                        (unsigned long long)bl->live_blocks, (unsigned long long)ncached,
                        (unsigned long long)bl->cached_blocks);
    if (bl->peak_active < bl->active || bl->peak_reserved < bl->reserved)
        return um__fail(UM_ERR_INTERNAL, "device %d (%s): peaks %zu/%zu below current %zu/%zu", dev,
                        who, bl->peak_active, bl->peak_reserved, bl->active, bl->reserved);
    if (bl->reserved > bl->base.memory_limit && bl->cached_blocks)
        return um__fail(UM_ERR_INTERNAL,
                        "device %d (%s): %zu bytes reserved over the limit of %zu with %llu "
                        "buffers still cached",
                        dev, who, bl->reserved, bl->base.memory_limit,
                        (unsigned long long)bl->cached_blocks);
    if (bl->cached_phys > bl->base.cache_limit)
        return um__fail(UM_ERR_INTERNAL, "device %d (%s): %zu bytes cached over the limit of %zu",
                        dev, who, bl->cached_phys, bl->base.cache_limit);
    return UM_OK;
}

static um_status bl_check(um__allocator *a)
{
    baseline *bl = (baseline *)a;
    um__vt_mutex_lock(&bl->lock);
    um_status s = bl_check_locked(bl);
    um__vt_mutex_unlock(&bl->lock);
    return s;
}

/* Gives every block back, live ones included (um_shutdown). */
static void bl_destroy(um__allocator *a)
{
    baseline *bl = (baseline *)a;
    if (!bl)
        return;
    for (size_t i = 0; i < bl->nbuckets; i++) {
        bl_block *b = bl->buckets[i];
        while (b) {
            bl_block *next = b->hnext;
            if (b->state == BL_CACHED)
                bl_list_unlink(b);
            if (bl_teardown(bl, b) != UM_OK)
                um__log(UM_LOG_WARN, "device %d (%s): leaking %zu bytes at %#lx at shutdown: %s",
                        a->dev, a->ops->name, b->phys, (unsigned long)b->va, um_last_error());
            free(b);
            b = next;
        }
    }
    bl_block *b = bl->limbo.lru_next;
    while (b != &bl->limbo) {
        bl_block *next = b->lru_next;
        if (bl_teardown(bl, b) != UM_OK)
            um__log(UM_LOG_WARN, "device %d (%s): leaking %zu bytes at %#lx at shutdown: %s",
                    a->dev, a->ops->name, b->phys, (unsigned long)b->va, um_last_error());
        free(b);
        b = next;
    }
    free(bl->buckets);
    pthread_mutex_destroy(&bl->lock);
    free(bl);
}

/* The two baselines share every operation; only the name (and the
 * `caching` flag given at creation) tells them apart. */
#define BL_OPS(label)                                                                              \
    {                                                                                              \
        .name = label, .alloc = bl_alloc, .free = bl_free, .owns = bl_owns,                        \
        .block_live = bl_block_live, .trim = bl_trim, .set_memory_limit = bl_set_memory_limit,     \
        .set_cache_limit = bl_set_cache_limit, .stats = bl_stats,                                  \
        .active_bytes = bl_active_bytes, .reset_peak = bl_reset_peak,                              \
        .stream_forget = bl_stream_forget, .check = bl_check, .destroy = bl_destroy,               \
    }
static const um__allocator_ops direct_ops = BL_OPS("direct");
static const um__allocator_ops bufcache_ops = BL_OPS("bufcache");

static um_status bl_create(const um__allocator_ops *ops, bool caching, um__backend *b,
                           const um__pool_config *c, um__allocator **out)
{
    if (!b || !c || !out)
        return um__fail(UM_ERR_INVALID, "%s: %s is NULL", ops->name,
                        !b   ? "backend"
                        : !c ? "config"
                             : "out");
    *out = NULL;
    if (!um__is_pow2(b->granularity) || b->granularity < UM_ALIGN)
        return um__fail(UM_ERR_INVALID,
                        "device %d (%s): granularity %zu bytes is not a power of two of at least "
                        "%u",
                        c->dev, ops->name, b->granularity, UM_ALIGN);
    baseline *bl = calloc(1, sizeof *bl);
    bl_block **buckets = calloc(256, sizeof *buckets);
    if (!bl || !buckets || pthread_mutex_init(&bl->lock, NULL) != 0) {
        free(bl);
        free(buckets);
        return um__fail(UM_ERR_NOMEM, "device %d (%s): cannot allocate the allocator (%zu bytes)",
                        c->dev, ops->name, sizeof *bl);
    }
    bl->base.ops = ops;
    bl->base.backend = b;
    bl->base.dev = c->dev;
    bl->base.memory_limit = c->memory_limit ? c->memory_limit : b->capacity;
    bl->base.cache_limit = c->cache_limit;
    bl->base.reuse_wait = c->reuse_wait;
    bl->base.reuse_arg = c->reuse_arg;
    bl->caching = caching;
    bl->events = c->events;
    bl->gran = b->granularity;
    bl->calls_at_create = atomic_load_explicit(&b->calls, memory_order_relaxed);
    bl->buckets = buckets;
    bl->nbuckets = 256;
    bl->hash_shift = 64 - 8;
    bl->lru.lru_next = bl->lru.lru_prev = &bl->lru;
    bl->limbo.lru_next = bl->limbo.lru_prev = &bl->limbo;
    *out = &bl->base;
    return UM_OK;
}

um_status um__direct_create(um__backend *b, const um__pool_config *c, um__allocator **out)
{
    return bl_create(&direct_ops, false, b, c, out);
}

um_status um__bufcache_create(um__backend *b, const um__pool_config *c, um__allocator **out)
{
    return bl_create(&bufcache_ops, true, b, c, out);
}
