/*
 * fuzz_api: the bytes are a program of API calls on a context of the host
 * and two small sim devices (devices=sim:64M+sim:32M, host_capacity=64M),
 * with small memory limits (fuzzed too), so that buffers are evicted,
 * written back and fetched again, and allocations fail at the limit.
 *
 * Byte 0 picks the configuration (page size of the sim devices, thread
 * caches, eviction policy, first memory limits, whether the program ends
 * by freeing everything or leaves it to um_shutdown); then each operation
 * is an opcode byte and its argument bytes: um_malloc / um_free (sizes 0
 * to huge, any stream), um_buffer_create (with or without a first device)
 * / um_buffer_wrap / acquire (every mode, any device, any stream) /
 * release / write / read / prefetch / hint / destroy, um_record_stream
 * before some frees, um_trim,
 * um_set_memory_limit, um_set_cache_limit, simulated stream work, stream
 * synchronisation and re-creation, and misuse: double free, foreign and
 * interior pointers, release without acquire, stale (destroyed) buffer
 * handles, bad devices, modes, hints, ranges and streams, each of which
 * must return its documented status and change nothing.
 *
 * A reference model keeps every live um_malloc block (device, size, a
 * pattern seed) and every buffer's bytes and acquisitions. Checked after
 * every operation (for one device in turn; for every device after every
 * 4th operation and at the end): um_stats_get is self-consistent
 * (cached = reserved - active, reserved >= active, reserved <= the memory
 * limit, peaks >= current values, largest free <= cached, fragmentation
 * in 0..1, hits <= allocations, counters never go back, active blocks =
 * allocations - frees) and its requested bytes and active blocks equal the
 * model's um_malloc blocks plus the buffers' replicas there (at least that
 * while simulated work leaves destroyed buffers' memory held); the
 * allocator's own check (ops->check) passes on every device (after every
 * 4th operation, and at the end); a buffer has
 * at most one owner replica and exactly one once any replica is valid, its
 * acquired replicas stay valid (owner while written); one buffer and one
 * block are verified byte for byte in rotation (every buffer at the end).
 * Acquired replicas are read in place (sim memory is host memory), must
 * hold the model's bytes, and stay unchanged until released. A wrapped
 * buffer's program memory holds the newest bytes once it is destroyed.
 * um_shutdown must leave nothing behind (the leak check of
 * -fsanitize=fuzzer,address).
 */
#include "fuzz_common.h"

#include "buffer/buffer.h"
#include "core/core.h"

#define NDEV 3
#define MAX_BLOCKS 48
#define MAX_BUFS 12
#define MAX_STALE 16
#define MAX_OPS 400
#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

typedef struct mblock {
    void *p;
    int dev;
    size_t size;
    uint64_t seed;
} mblock;

typedef struct mbuf {
    um_buffer *b;
    size_t size;
    uint8_t *data;       /* the bytes the buffer must hold */
    uint8_t *home;       /* a wrapped buffer's program memory, else NULL */
    uint32_t readers[NDEV];
    bool writer[NDEV];
    void *ptr[NDEV];     /* the pointer of the acquisition held on a device */
    uint32_t holders;
} mbuf;

typedef struct world {
    um_context *ctx;
    um_stream streams[NDEV]; /* one created stream per device */
    um_device_info info[NDEV];
    um_stats last[NDEV];
    mblock blocks[MAX_BLOCKS];
    int nblocks;
    mbuf bufs[MAX_BUFS];
    int nbufs;
    um_buffer *stale[MAX_STALE];
    int nstale;
    bool pending;        /* simulated work may hold destroyed buffers' memory */
    uint64_t seed;
    unsigned rot_buf, rot_block;
    unsigned op;
    fuzz_reader in;
} world;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsetenv("UNIMEM_CONF");
    unsetenv("UNIMEM_SHOW_STATS");
    return 0;
}

/* ------------------------------------------------------------ patterns */

/* The harness's own bulk loops are left out of coverage: their compares
 * say nothing about the library and cost most of the time. */
#define FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))

FUZZ_NO_COVERAGE static uint8_t pattern_byte(uint64_t seed, size_t i)
{
    uint64_t s = seed + i / 8;
    return (uint8_t)(fuzz_mix(&s) >> (8 * (i % 8)));
}

/* dst[0..n) = bytes from..from+n of the pattern of `seed`. */
FUZZ_NO_COVERAGE static void pattern_into(uint8_t *dst, size_t from, size_t n, uint64_t seed)
{
    size_t i = from, to = from + n;
    for (; i < to && i % 8; i++)
        dst[i - from] = pattern_byte(seed, i);
    for (; i + 8 <= to; i += 8) {
        uint64_t s = seed + i / 8;
        uint64_t v = fuzz_mix(&s);
        memcpy(dst + (i - from), &v, 8); /* little-endian: byte k is v >> 8k */
    }
    for (; i < to; i++)
        dst[i - from] = pattern_byte(seed, i);
}

/* Byte i of p is byte i of the pattern, for i in [from, to). */
static void pattern(uint8_t *p, size_t from, size_t to, uint64_t seed)
{
    pattern_into(p + from, from, to - from, seed);
}

/* The first index in [from, to) where p differs from the pattern, or to. */
FUZZ_NO_COVERAGE static size_t pattern_mismatch(const uint8_t *p, size_t from, size_t to,
                                                uint64_t seed)
{
    uint8_t chunk[4096];
    for (size_t i = from; i < to; i += sizeof chunk) {
        size_t n = to - i < sizeof chunk ? to - i : sizeof chunk;
        pattern_into(chunk, i, n, seed);
        if (memcmp(chunk, p + i, n) != 0)
            for (size_t k = 0; k < n; k++)
                if (chunk[k] != p[i + k])
                    return i + k;
    }
    return to;
}

/* The first index where a and b differ (they do). */
FUZZ_NO_COVERAGE static size_t first_diff(const uint8_t *a, const uint8_t *b)
{
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    return i;
}

/* A block's pattern covers it whole up to 64 KiB, else its first and
 * last 4 KiB (filling megabytes per step would make runs slow). */
static void block_fill(mblock *b)
{
    uint8_t *p = b->p;
    if (b->size <= 64 * KIB) {
        pattern(p, 0, b->size, b->seed);
    } else {
        pattern(p, 0, 4 * KIB, b->seed);
        pattern(p, b->size - 4 * KIB, b->size, b->seed);
    }
}

static void block_verify(world *w, const mblock *b, const char *when)
{
    const uint8_t *p = b->p;
    size_t ranges[2][2] = {{0, b->size}, {0, 0}};
    if (b->size > 64 * KIB) {
        ranges[0][1] = 4 * KIB;
        ranges[1][0] = b->size - 4 * KIB;
        ranges[1][1] = b->size;
    }
    for (int r = 0; r < 2; r++) {
        size_t i = pattern_mismatch(p, ranges[r][0], ranges[r][1], b->seed);
        FUZZ_CHECK(i == ranges[r][1],
                   "op %u (%s): block %p of device %d (%zu bytes): byte %zu is 0x%02x, "
                   "expected 0x%02x",
                   w->op, when, b->p, b->dev, b->size, i, p[i], pattern_byte(b->seed, i));
    }
}

/* ------------------------------------------------------------- choices */

static int pick_dev(world *w)
{
    return fuzz_u8(&w->in) % NDEV;
}

static size_t pick_malloc_size(world *w)
{
    uint8_t c = fuzz_u8(&w->in);
    switch (c % 10) {
    case 0: return 0;
    case 1: return 1 + fuzz_u8(&w->in);
    case 2:
    case 3: return 1 + fuzz_u16(&w->in);
    case 4: return 64 * KIB + (size_t)fuzz_u16(&w->in) * 32;
    case 5: return MIB + (size_t)fuzz_u16(&w->in) * 64;
    case 6: return (size_t)(1 + fuzz_u8(&w->in) % 8) * MIB;
    case 7: {
        static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX / 2 + 1,
                                      (size_t)1 << 40, (size_t)65 << 20, (size_t)256 << 20};
        return huge[fuzz_u8(&w->in) % 6];
    }
    default: return 1 + fuzz_u16(&w->in) % 4096;
    }
}

static size_t pick_buffer_size(world *w)
{
    uint8_t c = fuzz_u8(&w->in);
    switch (c % 8) {
    case 0: return 1;
    case 1: return 256;
    case 2: return 4096;
    case 3: return 64 * KIB;
    case 4: return 1 + fuzz_u16(&w->in);
    case 5: return 1 + fuzz_u16(&w->in) % 4096;
    case 6: return (size_t)(1 + fuzz_u8(&w->in) % 16) * 64 * KIB;
    default: return MIB + 1 + fuzz_u16(&w->in);
    }
}

static size_t pick_limit(world *w)
{
    uint8_t c = fuzz_u8(&w->in);
    switch (c % 6) {
    case 0: return 0;
    case 1: return (size_t)(1 + fuzz_u8(&w->in) % 16) * MIB;
    case 2: return (size_t)(1 + fuzz_u8(&w->in)) * 64 * KIB;
    case 3: return fuzz_u32(&w->in);
    case 4: return SIZE_MAX;
    default: return (size_t)(2 + fuzz_u8(&w->in) % 6) * MIB;
    }
}

static mbuf *pick_buf(world *w)
{
    uint8_t c = fuzz_u8(&w->in);
    return w->nbufs ? &w->bufs[c % w->nbufs] : NULL;
}

/* A range of a buffer: sometimes the whole, sometimes a piece. */
static void pick_range(world *w, size_t size, size_t *off, size_t *n)
{
    uint8_t c = fuzz_u8(&w->in);
    if (c % 4 == 0) {
        *off = 0;
        *n = size;
        return;
    }
    *off = fuzz_u32(&w->in) % size;
    size_t left = size - *off;
    *n = 1 + fuzz_u32(&w->in) % left;
}

/* ------------------------------------------------------------ checking */

static bool is_live_handle(const world *w, const um_buffer *b)
{
    for (int i = 0; i < w->nbufs; i++)
        if (w->bufs[i].b == b)
            return true;
    return false;
}

static void check_stats(world *w, int dev)
{
    um_stats s;
    FUZZ_CHECK(um_stats_get(w->ctx, dev, &s) == UM_OK, "um_stats_get %d", dev);
    um_device_info info;
    FUZZ_CHECK(um_device_info_get(w->ctx, dev, &info) == UM_OK, "um_device_info_get %d", dev);
    um_stats *l = &w->last[dev];
    const unsigned op = w->op;
    FUZZ_CHECK(s.version == UM_STATS_VERSION, "version %u", s.version);
    FUZZ_CHECK(s.reserved_bytes >= s.active_bytes,
               "op %u: device %d: reserved %zu < active %zu", op, dev, s.reserved_bytes,
               s.active_bytes);
    FUZZ_CHECK(s.cached_bytes == s.reserved_bytes - s.active_bytes,
               "op %u: device %d: cached %zu != reserved %zu - active %zu", op, dev,
               s.cached_bytes, s.reserved_bytes, s.active_bytes);
    FUZZ_CHECK(s.active_bytes >= s.requested_bytes,
               "op %u: device %d: active %zu < requested %zu", op, dev, s.active_bytes,
               s.requested_bytes);
    FUZZ_CHECK(s.reserved_bytes <= info.memory_limit,
               "op %u: device %d: reserved %zu above the limit %zu", op, dev, s.reserved_bytes,
               info.memory_limit);
    FUZZ_CHECK(s.reserved_bytes <= info.capacity,
               "op %u: device %d: reserved %zu above the capacity %zu", op, dev, s.reserved_bytes,
               info.capacity);
    FUZZ_CHECK(s.peak_active_bytes >= s.active_bytes && s.peak_reserved_bytes >= s.reserved_bytes,
               "op %u: device %d: peaks below current values", op, dev);
    FUZZ_CHECK(s.largest_free_bytes <= s.cached_bytes,
               "op %u: device %d: largest free %zu > cached %zu", op, dev, s.largest_free_bytes,
               s.cached_bytes);
    FUZZ_CHECK(s.fragmentation >= 0.0 && s.fragmentation <= 1.0,
               "op %u: device %d: fragmentation %g", op, dev, s.fragmentation);
    FUZZ_CHECK(s.num_cache_hits <= s.num_allocs, "op %u: device %d: hits %llu > allocs %llu", op,
               dev, (unsigned long long)s.num_cache_hits, (unsigned long long)s.num_allocs);
    FUZZ_CHECK(s.num_allocs >= l->num_allocs && s.num_frees >= l->num_frees &&
                   s.num_backend_calls >= l->num_backend_calls && s.num_ooms >= l->num_ooms &&
                   s.num_cache_hits >= l->num_cache_hits,
               "op %u: device %d: a counter went back", op, dev);
    FUZZ_CHECK(s.num_allocs - s.num_frees == s.active_blocks,
               "op %u: device %d: %llu allocs - %llu frees != %llu live blocks", op, dev,
               (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees,
               (unsigned long long)s.active_blocks);

    /* What lives there: the model's blocks and the buffers' replicas. */
    size_t want = 0;
    uint64_t nwant = 0;
    for (int i = 0; i < w->nblocks; i++)
        if (w->blocks[i].dev == dev)
            want += w->blocks[i].size, nwant++;
    for (int i = 0; i < w->nbufs; i++) {
        const mbuf *m = &w->bufs[i];
        if (m->b->rep[dev].ptr && !(dev == 0 && m->home))
            want += m->size, nwant++;
    }
    /* Freed blocks marked for a busy stream stay live until it is done. */
    if (w->pending || atomic_load(&w->ctx->devices[dev].deferred))
        FUZZ_CHECK(s.requested_bytes >= want && s.active_blocks >= nwant,
                   "op %u: device %d: %zu bytes in %llu blocks live, the model has %zu in %llu",
                   op, dev, s.requested_bytes, (unsigned long long)s.active_blocks, want,
                   (unsigned long long)nwant);
    else
        FUZZ_CHECK(s.requested_bytes == want && s.active_blocks == nwant,
                   "op %u: device %d: %zu bytes in %llu blocks live, the model has %zu in %llu",
                   op, dev, s.requested_bytes, (unsigned long long)s.active_blocks, want,
                   (unsigned long long)nwant);
    *l = s;
}

static void check_allocators(world *w)
{
    for (int d = 0; d < NDEV; d++) {
        um__allocator *a = w->ctx->devices[d].alloc;
        um_status st = a->ops->check(a);
        FUZZ_CHECK(st == UM_OK, "op %u: device %d: the allocator's check failed", w->op, d);
    }
}

/* Replica states: one owner once anything is valid; held replicas valid,
 * and the owner while written; an acquired replica keeps its bytes. */
static void check_buffer_states(world *w, mbuf *m)
{
    int owners = 0, valid = 0;
    for (int d = 0; d < NDEV; d++) {
        um_replica_state s = um_buffer_replica_state(m->b, d);
        FUZZ_CHECK(s == UM_REPLICA_INVALID || s == UM_REPLICA_SHARED || s == UM_REPLICA_OWNER,
                   "state %d", (int)s);
        owners += s == UM_REPLICA_OWNER;
        valid += s != UM_REPLICA_INVALID;
        if (m->writer[d])
            FUZZ_CHECK(s == UM_REPLICA_OWNER, "op %u: buffer %p written on device %d is %s",
                       w->op, (void *)m->b, d, um_replica_state_name(s));
        if (m->readers[d])
            FUZZ_CHECK(s != UM_REPLICA_INVALID, "op %u: buffer %p read on device %d is invalid",
                       w->op, (void *)m->b, d);
        if (m->readers[d] || m->writer[d])
            FUZZ_CHECK(m->b->rep[d].ptr == m->ptr[d],
                       "op %u: buffer %p acquired on device %d moved from %p to %p", w->op,
                       (void *)m->b, d, m->ptr[d], m->b->rep[d].ptr);
    }
    FUZZ_CHECK(owners <= 1, "op %u: buffer %p has %d owners", w->op, (void *)m->b, owners);
    FUZZ_CHECK(!valid || owners == 1, "op %u: buffer %p has %d valid replicas and %d owners",
               w->op, (void *)m->b, valid, owners);
    FUZZ_CHECK(um_buffer_size(m->b) == m->size, "size");
}

/* The bytes at an acquired replica. */
static void check_in_place(world *w, const mbuf *m, int dev, const char *when)
{
    const uint8_t *p = m->ptr[dev];
    if (memcmp(p, m->data, m->size) != 0) {
        size_t i = first_diff(p, m->data);
        FUZZ_CHECK(false, "op %u (%s): buffer %p on device %d (%zu bytes): byte %zu is 0x%02x, "
                          "expected 0x%02x",
                   w->op, when, (void *)m->b, dev, m->size, i, p[i], m->data[i]);
    }
}

static bool written_anywhere(const mbuf *m)
{
    for (int d = 0; d < NDEV; d++)
        if (m->writer[d])
            return true;
    return false;
}

/* The buffer's bytes through um_buffer_read (BUSY while written). */
static void verify_buffer(world *w, mbuf *m)
{
    uint8_t *tmp = malloc(m->size);
    FUZZ_CHECK(tmp != NULL, "out of memory");
    memset(tmp, 0xee, m->size);
    um_status st = um_buffer_read(m->b, 0, tmp, m->size);
    if (written_anywhere(m)) {
        FUZZ_CHECK(st == UM_ERR_BUSY, "op %u: a read of a buffer held for writing gave %s",
                   w->op, um_status_name(st));
    } else {
        FUZZ_CHECK(st == UM_OK, "op %u: um_buffer_read of buffer %p gave %s", w->op,
                   (void *)m->b, um_status_name(st));
        if (memcmp(tmp, m->data, m->size) != 0) {
            size_t i = first_diff(tmp, m->data);
            FUZZ_CHECK(false, "op %u: buffer %p (%zu bytes) reads 0x%02x at %zu, expected 0x%02x",
                       w->op, (void *)m->b, m->size, tmp[i], i, m->data[i]);
        }
    }
    free(tmp);
}

static void check_all(world *w)
{
    /* The statistics and the allocators' own recount walk every slab and
     * cost most of a run: one device's statistics after each operation,
     * every device's and the recount after every 4th (and at the end). */
    if (w->op % 4 == 0) {
        for (int d = 0; d < NDEV; d++)
            check_stats(w, d);
        check_allocators(w);
    } else {
        check_stats(w, (int)(w->op % NDEV));
    }
    for (int i = 0; i < w->nbufs; i++)
        check_buffer_states(w, &w->bufs[i]);
    if (w->nbufs)
        verify_buffer(w, &w->bufs[w->rot_buf++ % (unsigned)w->nbufs]);
    if (w->nblocks)
        block_verify(w, &w->blocks[w->rot_block++ % (unsigned)w->nblocks], "rotation");
}

/* ------------------------------------------------------------- helpers */

/* No two live things of one device overlap. */
static void check_no_overlap(world *w, int dev, const void *p, size_t size, const void *self)
{
    uintptr_t a = (uintptr_t)p, e = a + size;
    for (int i = 0; i < w->nblocks; i++) {
        const mblock *b = &w->blocks[i];
        if (b->dev != dev || b->p == self)
            continue;
        uintptr_t x = (uintptr_t)b->p;
        FUZZ_CHECK(e <= x || x + b->size <= a, "op %u: %p (%zu bytes) overlaps block %p (%zu)",
                   w->op, p, size, b->p, b->size);
    }
    for (int i = 0; i < w->nbufs; i++) {
        const mbuf *m = &w->bufs[i];
        const void *r = m->b->rep[dev].ptr;
        if (!r || r == self || (dev == 0 && m->home))
            continue;
        uintptr_t x = (uintptr_t)r;
        FUZZ_CHECK(e <= x || x + m->size <= a,
                   "op %u: %p (%zu bytes) overlaps buffer %p's replica %p (%zu) on device %d",
                   w->op, p, size, (void *)m->b, r, m->size, dev);
    }
}

static void forget_buf(world *w, mbuf *m)
{
    if (w->nstale < MAX_STALE)
        w->stale[w->nstale++] = m->b;
    else
        w->stale[w->seed++ % MAX_STALE] = m->b;
    free(m->data);
    free(m->home);
    *m = w->bufs[--w->nbufs];
}

/* ------------------------------------------------------------ operations */

static void op_malloc(world *w)
{
    int dev = pick_dev(w);
    size_t size = pick_malloc_size(w);
    uint8_t sc = fuzz_u8(&w->in);
    /* Host memory may be ordered by any device's stream. */
    int sdev = dev == 0 ? sc % NDEV : dev;
    um_stream s = sc & 8 ? w->streams[sdev] : NULL;
    void *p = (void *)0x1;
    um_reclaim_stats before, after;
    FUZZ_CHECK(um_reclaim_stats_get(w->ctx, dev, &before) == UM_OK, "reclaim stats");
    um_status st = um_malloc(w->ctx, dev, size, s, &p);
    FUZZ_CHECK(um_reclaim_stats_get(w->ctx, dev, &after) == UM_OK, "reclaim stats");
    /* A request above the limit cannot be helped by evicting (F2 of the
     * first fuzzing run, tests/test_fuzz_findings.c). */
    if (size > w->info[dev].memory_limit)
        FUZZ_CHECK(after.evictions == before.evictions,
                   "op %u: um_malloc of %zu bytes, more than device %d's limit of %zu, evicted "
                   "%llu replicas before failing",
                   w->op, size, dev, w->info[dev].memory_limit,
                   (unsigned long long)(after.evictions - before.evictions));
    if (size == 0) {
        FUZZ_CHECK(st == UM_ERR_INVALID && p == NULL, "um_malloc of 0 bytes gave %s",
                   um_status_name(st));
        return;
    }
    if (size > w->info[dev].capacity) {
        FUZZ_CHECK(st == UM_ERR_NOMEM && p == NULL && fuzz_error_names(st),
                   "op %u: um_malloc of %zu bytes on device %d (capacity %zu) gave %s", w->op,
                   size, dev, w->info[dev].capacity, um_status_name(st));
        return;
    }
    if (st == UM_ERR_NOMEM) {
        FUZZ_CHECK(p == NULL && fuzz_error_names(st), "a failed um_malloc left %p", p);
        return;
    }
    FUZZ_CHECK(st == UM_OK, "op %u: um_malloc(%d, %zu) gave %s", w->op, dev, size,
               um_status_name(st));
    FUZZ_CHECK(p && (uintptr_t)p % 256 == 0, "op %u: um_malloc returned %p", w->op, p);
    FUZZ_CHECK(um_pointer_device(w->ctx, p) == dev, "op %u: %p is of device %d, not %d", w->op,
               p, um_pointer_device(w->ctx, p), dev);
    check_no_overlap(w, dev, p, size, NULL);
    if (w->nblocks == MAX_BLOCKS) {
        FUZZ_CHECK(um_free(w->ctx, p, NULL) == UM_OK, "free of a new block");
        return;
    }
    mblock *b = &w->blocks[w->nblocks++];
    *b = (mblock){p, dev, size, w->seed++ * 0x9e3779b97f4a7c15ull};
    block_fill(b);
}

static void op_free(world *w)
{
    if (!w->nblocks)
        return;
    int i = fuzz_u8(&w->in) % w->nblocks;
    uint8_t how = fuzz_u8(&w->in);
    mblock b = w->blocks[i];
    block_verify(w, &b, "before free");
    um_stream s = NULL;
    if (how & 1)
        s = w->streams[b.dev == 0 ? (how >> 1) % NDEV : b.dev];
    if ((how & 6) == 6 && b.size > 256) {
        /* An interior pointer: not a block, nothing changes. */
        um_status si = um_free(w->ctx, (char *)b.p + 256, NULL);
        FUZZ_CHECK(si == UM_ERR_INVALID_POINTER || si == UM_ERR_DOUBLE_FREE,
                   "op %u: free of an interior pointer gave %s", w->op, um_status_name(si));
        FUZZ_CHECK(fuzz_error_names(si), "no message");
        block_verify(w, &b, "after a free of an interior pointer");
    }
    if (b.dev != 0 && (how & 24) == 24) {
        /* Another device's stream for an accelerator's memory. */
        int other = b.dev == 1 ? 2 : 1;
        um_status sw = um_free(w->ctx, b.p, w->streams[other]);
        FUZZ_CHECK(sw == UM_ERR_WRONG_DEVICE, "op %u: free with another device's stream gave %s",
                   w->op, um_status_name(sw));
    }
    if (how & 64) {
        /* Marked for a stream first (um_record_stream): the free then
         * waits for that stream's simulated work before the memory goes
         * back. An accelerator's block refuses another device's stream. */
        int sd = b.dev == 0 ? (how >> 1) % NDEV : b.dev;
        um_status sm = um_record_stream(w->ctx, b.p, how & 128 ? NULL : w->streams[sd]);
        FUZZ_CHECK(sm == UM_OK, "op %u: um_record_stream(%p) gave %s", w->op, b.p,
                   um_status_name(sm));
        if (b.dev != 0) {
            sm = um_record_stream(w->ctx, b.p, w->streams[b.dev == 1 ? 2 : 1]);
            FUZZ_CHECK(sm == UM_ERR_WRONG_DEVICE && fuzz_error_names(sm),
                       "op %u: um_record_stream with another device's stream gave %s", w->op,
                       um_status_name(sm));
        }
    }
    um_status st = um_free(w->ctx, b.p, s);
    FUZZ_CHECK(st == UM_OK, "op %u: um_free(%p) gave %s", w->op, b.p, um_status_name(st));
    w->blocks[i] = w->blocks[--w->nblocks];
    if (how & 32) {
        /* At once a second time: nothing can have taken the address. */
        um_status s2 = um_free(w->ctx, b.p, NULL);
        FUZZ_CHECK(s2 == UM_ERR_DOUBLE_FREE && fuzz_error_names(s2),
                   "op %u: a double free of %p gave %s", w->op, b.p, um_status_name(s2));
    }
}

static void op_create(world *w)
{
    size_t size = pick_buffer_size(w);
    uint8_t c = fuzz_u8(&w->in);
    if (w->nbufs == MAX_BUFS)
        return;
    um_buffer *b = (um_buffer *)0x1;
    um_buffer_opts o = {.device = c % 5 == 4 ? NDEV + (c >> 3) % 3 : (int)(c % 5) - 1};
    bool with_opts = c & 0x80;
    if (c % 7 == 6) {
        FUZZ_CHECK(um_buffer_create(w->ctx, 0, NULL, &b) == UM_ERR_INVALID && b == NULL,
                   "a buffer of 0 bytes");
        return;
    }
    um_status st = um_buffer_create(w->ctx, size, with_opts ? &o : NULL, &b);
    if (with_opts && o.device >= NDEV) {
        FUZZ_CHECK(st == UM_ERR_NO_DEVICE && b == NULL, "op %u: a buffer on device %d gave %s",
                   w->op, o.device, um_status_name(st));
        return;
    }
    if (st == UM_ERR_NOMEM) {
        FUZZ_CHECK(with_opts && o.device >= 0 && b == NULL && fuzz_error_names(st),
                   "op %u: um_buffer_create(%zu) failed without a first replica", w->op, size);
        return;
    }
    FUZZ_CHECK(st == UM_OK && b, "op %u: um_buffer_create(%zu) gave %s", w->op, size,
               um_status_name(st));
    mbuf *m = &w->bufs[w->nbufs++];
    memset(m, 0, sizeof *m);
    m->b = b;
    m->size = size;
    m->data = calloc(1, size);
    FUZZ_CHECK(m->data, "out of memory");
    if (with_opts && o.device >= 0) {
        FUZZ_CHECK(um_buffer_replica_state(b, o.device) == UM_REPLICA_OWNER,
                   "op %u: the first replica on %d is not the owner", w->op, o.device);
        check_no_overlap(w, o.device, b->rep[o.device].ptr, size, b->rep[o.device].ptr);
    }
}

static void op_wrap(world *w)
{
    size_t size = pick_buffer_size(w);
    if (w->nbufs == MAX_BUFS)
        return;
    uint8_t *home = malloc(size);
    FUZZ_CHECK(home, "out of memory");
    pattern(home, 0, size, w->seed++);
    um_buffer *b = NULL;
    um_status st = um_buffer_wrap(w->ctx, home, size, &b);
    FUZZ_CHECK(st == UM_OK && b, "op %u: um_buffer_wrap(%zu) gave %s", w->op, size,
               um_status_name(st));
    mbuf *m = &w->bufs[w->nbufs++];
    memset(m, 0, sizeof *m);
    m->b = b;
    m->size = size;
    m->home = home;
    m->data = malloc(size);
    FUZZ_CHECK(m->data, "out of memory");
    memcpy(m->data, home, size);
}

static void op_acquire(world *w)
{
    mbuf *m = pick_buf(w);
    int dev = pick_dev(w);
    uint8_t c = fuzz_u8(&w->in);
    if (!m)
        return;
    um_access mode = (um_access)(1 + c % 4);
    um_stream s = c & 8 ? w->streams[dev] : NULL;
    void *p = (void *)0x1;
    bool writes = mode != UM_ACCESS_READ;
    bool busy = written_anywhere(m) || (writes && m->holders);
    um_status st = um_buffer_acquire(m->b, dev, mode, s, &p);
    if (busy) {
        FUZZ_CHECK(st == UM_ERR_BUSY && p == NULL && fuzz_error_names(st),
                   "op %u: a conflicting acquire gave %s", w->op, um_status_name(st));
        return;
    }
    if (st == UM_ERR_NOMEM) {
        FUZZ_CHECK(p == NULL && fuzz_error_names(st), "a failed acquire left %p", p);
        return;
    }
    FUZZ_CHECK(st == UM_OK && p, "op %u: um_buffer_acquire(dev %d, mode %d) gave %s", w->op, dev,
               (int)mode, um_status_name(st));
    FUZZ_CHECK(m->holders == 0 || !writes, "acquired");
    if (m->readers[dev] || m->writer[dev])
        FUZZ_CHECK(p == m->ptr[dev], "op %u: a second acquire on %d gave %p, not %p", w->op, dev,
                   p, m->ptr[dev]);
    m->ptr[dev] = p;
    m->holders++;
    if (mode == UM_ACCESS_WRITE_DISCARD) {
        /* Undefined contents: the program overwrites it all. */
        pattern(m->data, 0, m->size, w->seed++);
        memcpy(p, m->data, m->size);
        m->writer[dev] = true;
    } else {
        check_in_place(w, m, dev, "after acquire");
        if (writes) {
            size_t off, n;
            pick_range(w, m->size, &off, &n);
            pattern(m->data, off, off + n, w->seed++);
            memcpy((uint8_t *)p + off, m->data + off, n);
            m->writer[dev] = true;
        } else {
            m->readers[dev]++;
        }
    }
    if (writes && (c & 16)) {
        /* Everything else conflicts now. */
        void *q = (void *)0x1;
        int other = (dev + 1) % NDEV;
        FUZZ_CHECK(um_buffer_acquire(m->b, other, UM_ACCESS_READ, NULL, &q) == UM_ERR_BUSY &&
                       q == NULL,
                   "op %u: a read beside a write", w->op);
        uint8_t byte = 0;
        FUZZ_CHECK(um_buffer_write(m->b, 0, &byte, 1) == UM_ERR_BUSY, "a write beside a write");
        FUZZ_CHECK(um_buffer_destroy(m->b) == UM_ERR_BUSY, "a destroy of an acquired buffer");
    }
}

static void op_release(world *w)
{
    mbuf *m = pick_buf(w);
    int dev = pick_dev(w);
    uint8_t c = fuzz_u8(&w->in);
    if (!m)
        return;
    um_stream s = c & 1 ? w->streams[dev] : NULL;
    if (c & 2) {
        /* A stream of another device. */
        um_status sw = um_buffer_release(m->b, dev, w->streams[(dev + 1) % NDEV]);
        FUZZ_CHECK(sw == UM_ERR_WRONG_DEVICE, "op %u: release with another device's stream: %s",
                   w->op, um_status_name(sw));
    }
    um_status st = um_buffer_release(m->b, dev, s);
    if (!m->readers[dev] && !m->writer[dev]) {
        FUZZ_CHECK(st == UM_ERR_INVALID && fuzz_error_names(st),
                   "op %u: a release without an acquire gave %s", w->op, um_status_name(st));
        return;
    }
    FUZZ_CHECK(st == UM_OK, "op %u: um_buffer_release gave %s", w->op, um_status_name(st));
    check_in_place(w, m, dev, "at release");
    if (m->writer[dev])
        m->writer[dev] = false;
    else
        m->readers[dev]--;
    m->holders--;
}

static void op_write(world *w)
{
    mbuf *m = pick_buf(w);
    if (!m)
        return;
    size_t off, n;
    pick_range(w, m->size, &off, &n);
    uint8_t c = fuzz_u8(&w->in);
    if (c % 8 == 7) {
        uint8_t byte = 0;
        FUZZ_CHECK(um_buffer_write(m->b, m->size, &byte, 1) == UM_ERR_INVALID, "write past end");
        FUZZ_CHECK(um_buffer_write(m->b, 1, NULL, 1) == UM_ERR_INVALID, "write from NULL");
        FUZZ_CHECK(um_buffer_write(m->b, SIZE_MAX, &byte, 2) == UM_ERR_INVALID, "write wraps");
        FUZZ_CHECK(um_buffer_write(m->b, 0, &byte, 0) == UM_OK, "write of 0 bytes");
        return;
    }
    uint8_t *src = malloc(n);
    FUZZ_CHECK(src, "out of memory");
    pattern_into(src, off, n, w->seed++);
    um_status st = um_buffer_write(m->b, off, src, n);
    if (m->holders) {
        FUZZ_CHECK(st == UM_ERR_BUSY, "op %u: a write of an acquired buffer gave %s", w->op,
                   um_status_name(st));
    } else if (st != UM_ERR_NOMEM) {
        FUZZ_CHECK(st == UM_OK, "op %u: um_buffer_write(%zu, %zu) gave %s", w->op, off, n,
                   um_status_name(st));
        memcpy(m->data + off, src, n);
    }
    free(src);
}

static void op_read(world *w)
{
    mbuf *m = pick_buf(w);
    if (!m)
        return;
    size_t off, n;
    pick_range(w, m->size, &off, &n);
    uint8_t c = fuzz_u8(&w->in);
    uint8_t byte;
    if (c % 8 == 7) {
        FUZZ_CHECK(um_buffer_read(m->b, 0, &byte, m->size + 1) == UM_ERR_INVALID, "read past end");
        FUZZ_CHECK(um_buffer_read(m->b, 0, NULL, 1) == UM_ERR_INVALID, "read into NULL");
        return;
    }
    uint8_t *dst = malloc(n);
    FUZZ_CHECK(dst, "out of memory");
    um_status st = um_buffer_read(m->b, off, dst, n);
    if (written_anywhere(m)) {
        FUZZ_CHECK(st == UM_ERR_BUSY, "op %u: a read of a written buffer gave %s", w->op,
                   um_status_name(st));
    } else {
        FUZZ_CHECK(st == UM_OK, "op %u: um_buffer_read gave %s", w->op, um_status_name(st));
        if (memcmp(dst, m->data + off, n) != 0) {
            size_t i = first_diff(dst, m->data + off);
            FUZZ_CHECK(false, "op %u: buffer %p reads 0x%02x at %zu, expected 0x%02x", w->op,
                       (void *)m->b, dst[i], off + i, m->data[off + i]);
        }
    }
    free(dst);
}

static void op_destroy(world *w)
{
    mbuf *m = pick_buf(w);
    if (!m)
        return;
    um_status st = um_buffer_destroy(m->b);
    if (m->holders) {
        FUZZ_CHECK(st == UM_ERR_BUSY, "op %u: destroy of an acquired buffer gave %s", w->op,
                   um_status_name(st));
        return;
    }
    FUZZ_CHECK(st == UM_OK, "op %u: um_buffer_destroy gave %s", w->op, um_status_name(st));
    if (m->home)
        FUZZ_CHECK(memcmp(m->home, m->data, m->size) == 0,
                   "op %u: a destroyed wrapped buffer left old bytes in its program memory",
                   w->op);
    forget_buf(w, m);
}

static void op_hint(world *w)
{
    mbuf *m = pick_buf(w);
    uint8_t c = fuzz_u8(&w->in);
    if (!m)
        return;
    int h = c % 6; /* 0 and 5 are no hint */
    um_status st = um_buffer_hint(m->b, (um_hint)h);
    if (h < 1 || h > 4)
        FUZZ_CHECK(st == UM_ERR_INVALID, "op %u: hint %d gave %s", w->op, h, um_status_name(st));
    else
        FUZZ_CHECK(st == UM_OK, "op %u: hint %d gave %s", w->op, h, um_status_name(st));
}

static void op_prefetch(world *w)
{
    mbuf *m = pick_buf(w);
    int dev = pick_dev(w);
    if (!m)
        return;
    um_status st = um_buffer_prefetch(m->b, dev);
    if (written_anywhere(m))
        FUZZ_CHECK(st == UM_ERR_BUSY, "op %u: prefetch of a written buffer gave %s", w->op,
                   um_status_name(st));
    else
        FUZZ_CHECK(st == UM_OK || st == UM_ERR_NOMEM, "op %u: prefetch gave %s", w->op,
                   um_status_name(st));
    if (st == UM_OK)
        FUZZ_CHECK(um_buffer_replica_state(m->b, dev) != UM_REPLICA_INVALID,
                   "op %u: a prefetched replica is invalid", w->op);
}

static void op_trim(world *w)
{
    int dev = pick_dev(w);
    um_stats before;
    um_stats_get(w->ctx, dev, &before);
    FUZZ_CHECK(um_trim(w->ctx, dev) == UM_OK, "op %u: um_trim(%d): %s", w->op, dev,
               um_last_error());
    um_stats after;
    um_stats_get(w->ctx, dev, &after);
    FUZZ_CHECK(after.reserved_bytes <= before.reserved_bytes, "op %u: um_trim grew device %d",
               w->op, dev);
}

static void op_memory_limit(world *w)
{
    int dev = pick_dev(w);
    size_t bytes = pick_limit(w);
    um_device_info before;
    um_device_info_get(w->ctx, dev, &before);
    um_status st = um_set_memory_limit(w->ctx, dev, bytes);
    um_device_info after;
    um_device_info_get(w->ctx, dev, &after);
    if (st == UM_OK) {
        size_t want = bytes && bytes < after.capacity ? bytes : after.capacity;
        FUZZ_CHECK(after.memory_limit == want, "op %u: limit %zu set, device %d has %zu", w->op,
                   want, dev, after.memory_limit);
    } else {
        FUZZ_CHECK(st == UM_ERR_BUSY && fuzz_error_names(st),
                   "op %u: um_set_memory_limit(%d, %zu) gave %s", w->op, dev, bytes,
                   um_status_name(st));
        FUZZ_CHECK(after.memory_limit == before.memory_limit, "op %u: a refused limit changed it",
                   w->op);
    }
    w->info[dev] = after;
}

static void op_cache_limit(world *w)
{
    int dev = pick_dev(w);
    static const size_t limits[] = {0, 1, 64 * KIB, MIB, 4 * MIB, UM_NO_CACHE_LIMIT};
    size_t bytes = limits[fuzz_u8(&w->in) % 6];
    um_status st = um_set_cache_limit(w->ctx, dev, bytes);
    FUZZ_CHECK(st == UM_OK, "op %u: um_set_cache_limit(%d, %zu) gave %s", w->op, dev, bytes,
               um_status_name(st));
    um_device_info info;
    um_device_info_get(w->ctx, dev, &info);
    FUZZ_CHECK(info.cache_limit == bytes, "op %u: cache limit %zu, set %zu", w->op,
               info.cache_limit, bytes);
}

static void op_stream_work(world *w)
{
    int dev = pick_dev(w);
    uint8_t c = fuzz_u8(&w->in);
    um_stream s = c & 1 ? w->streams[dev] : NULL;
    unsigned launch = (c >> 1) % 4, complete = (c >> 3) % 4;
    uint64_t before = 0, after = 0;
    um_status qst = um_sim_stream_queued(w->ctx, dev, s, &before);
    um_status st = um_sim_stream_work(w->ctx, dev, s, launch, complete);
    if (dev == 0) {
        FUZZ_CHECK(st == UM_ERR_UNSUPPORTED || (launch == 0 && complete == 0 && st == UM_OK),
                   "op %u: simulated work on the host gave %s", w->op, um_status_name(st));
        FUZZ_CHECK(qst == UM_ERR_UNSUPPORTED, "op %u: the host's queued work gave %s", w->op,
                   um_status_name(qst));
        return;
    }
    FUZZ_CHECK(st == UM_OK, "op %u: um_sim_stream_work gave %s", w->op, um_status_name(st));
    /* One thread: nothing else completes the stream's work meanwhile. */
    FUZZ_CHECK(qst == UM_OK && um_sim_stream_queued(w->ctx, dev, s, &after) == UM_OK &&
                   after == before + launch - (complete < before + launch ? complete : before + launch),
               "op %u: %llu units queued, %u launched, %u completed, then %llu queued", w->op,
               (unsigned long long)before, launch, complete, (unsigned long long)after);
    if (launch)
        w->pending = true;
}

/* Every stream synchronised, then a trim (which frees what destroyed
 * buffers held): the model's count is exact again. */
static void op_sync(world *w)
{
    for (int d = 0; d < NDEV; d++)
        FUZZ_CHECK(um_stream_synchronize(w->ctx, w->streams[d]) == UM_OK, "sync");
    FUZZ_CHECK(um_stream_synchronize(w->ctx, NULL) == UM_OK, "sync of the default streams");
    FUZZ_CHECK(um_trim(w->ctx, 0) == UM_OK, "trim");
    w->pending = false;
}

/* The created stream of a device replaced by a new one. */
static void op_restream(world *w)
{
    int dev = pick_dev(w);
    um_stream old = w->streams[dev];
    FUZZ_CHECK(um_stream_destroy(w->ctx, old) == UM_OK, "op %u: um_stream_destroy: %s", w->op,
               um_last_error());
    FUZZ_CHECK(um_stream_destroy(w->ctx, old) == UM_ERR_INVALID, "a stream destroyed twice");
    FUZZ_CHECK(um_stream_create(w->ctx, dev, &w->streams[dev]) == UM_OK, "um_stream_create: %s",
               um_last_error());
    FUZZ_CHECK(um_stream_device(w->streams[dev]) == dev, "stream device");
}

static void op_misuse(world *w)
{
    uint8_t c = fuzz_u8(&w->in);
    int dev = pick_dev(w);
    void *p = (void *)0x1;
    int local = 0;
    um_status st;
    switch (c % 10) {
    case 0: /* foreign pointers */
        FUZZ_CHECK(um_free(w->ctx, &local, NULL) == UM_ERR_INVALID_POINTER, "free of a stack "
                                                                            "address");
        FUZZ_CHECK(um_pointer_device(w->ctx, &local) == -1, "a stack address has a device");
        if (w->nbufs && w->bufs[0].home)
            FUZZ_CHECK(um_free(w->ctx, w->bufs[0].home, NULL) == UM_ERR_INVALID_POINTER,
                       "free of wrapped program memory");
        FUZZ_CHECK(um_free(w->ctx, NULL, NULL) == UM_OK, "free of NULL");
        break;
    case 1: /* bad devices */
        FUZZ_CHECK(um_malloc(w->ctx, NDEV + dev, 64, NULL, &p) == UM_ERR_NO_DEVICE && p == NULL,
                   "um_malloc on no device");
        FUZZ_CHECK(um_malloc(w->ctx, -1 - dev, 64, NULL, &p) == UM_ERR_NO_DEVICE, "device -1");
        FUZZ_CHECK(um_trim(w->ctx, NDEV) == UM_ERR_NO_DEVICE, "trim of no device");
        FUZZ_CHECK(um_set_memory_limit(w->ctx, -1, MIB) == UM_ERR_NO_DEVICE, "limit of no device");
        FUZZ_CHECK(um_set_cache_limit(w->ctx, NDEV, MIB) == UM_ERR_NO_DEVICE, "cache of no device");
        um_stats s;
        FUZZ_CHECK(um_stats_get(w->ctx, NDEV, &s) == UM_ERR_NO_DEVICE, "stats of no device");
        break;
    case 2: /* another device's stream */
        if (dev != 0) {
            st = um_malloc(w->ctx, dev, 64, w->streams[dev == 1 ? 2 : 1], &p);
            FUZZ_CHECK(st == UM_ERR_WRONG_DEVICE && p == NULL, "um_malloc with another "
                                                               "device's stream gave %s",
                       um_status_name(st));
        }
        break;
    case 3: /* buffer calls on a device that is not there */
        if (w->nbufs) {
            mbuf *m = &w->bufs[dev % w->nbufs];
            FUZZ_CHECK(um_buffer_acquire(m->b, NDEV, UM_ACCESS_READ, NULL, &p) ==
                           UM_ERR_NO_DEVICE,
                       "acquire on no device");
            FUZZ_CHECK(um_buffer_release(m->b, -1, NULL) == UM_ERR_NO_DEVICE,
                       "release on no device");
            FUZZ_CHECK(um_buffer_prefetch(m->b, NDEV) == UM_ERR_NO_DEVICE, "prefetch");
            FUZZ_CHECK(um_buffer_replica_state(m->b, NDEV) == UM_REPLICA_INVALID, "state");
        }
        break;
    case 4: /* a bad mode, a bad stream */
        if (w->nbufs) {
            mbuf *m = &w->bufs[dev % w->nbufs];
            FUZZ_CHECK(um_buffer_acquire(m->b, dev, (um_access)(5 + c / 16), NULL, &p) ==
                           UM_ERR_INVALID,
                       "a bad mode");
            FUZZ_CHECK(um_buffer_acquire(m->b, dev, UM_ACCESS_READ, NULL, NULL) == UM_ERR_INVALID,
                       "a NULL out-pointer");
            st = um_buffer_acquire(m->b, dev, UM_ACCESS_READ, w->streams[(dev + 1) % NDEV], &p);
            FUZZ_CHECK(st == UM_ERR_WRONG_DEVICE && p == NULL,
                       "acquire with another device's stream gave %s", um_status_name(st));
        }
        break;
    case 5: /* stale buffer handles */
        for (int i = 0; i < w->nstale; i++) {
            um_buffer *b = w->stale[i];
            if (is_live_handle(w, b))
                continue; /* its record was reused for a live buffer */
            uint8_t byte = 0;
            FUZZ_CHECK(um_buffer_acquire(b, dev, UM_ACCESS_READ, NULL, &p) == UM_ERR_INVALID,
                       "acquire of a destroyed buffer");
            FUZZ_CHECK(um_buffer_release(b, dev, NULL) == UM_ERR_INVALID, "release");
            FUZZ_CHECK(um_buffer_read(b, 0, &byte, 1) == UM_ERR_INVALID, "read");
            FUZZ_CHECK(um_buffer_write(b, 0, &byte, 1) == UM_ERR_INVALID, "write");
            FUZZ_CHECK(um_buffer_hint(b, UM_HINT_PIN) == UM_ERR_INVALID, "hint");
            FUZZ_CHECK(um_buffer_prefetch(b, dev) == UM_ERR_INVALID, "prefetch");
            FUZZ_CHECK(um_buffer_destroy(b) == UM_ERR_INVALID, "destroy twice");
            FUZZ_CHECK(um_buffer_size(b) == 0, "size of a destroyed buffer");
            FUZZ_CHECK(um_buffer_replica_state(b, dev) == UM_REPLICA_INVALID, "state");
        }
        break;
    case 6: /* size 0, NULL out-pointers */
        FUZZ_CHECK(um_malloc(w->ctx, dev, 0, NULL, &p) == UM_ERR_INVALID && p == NULL, "size 0");
        FUZZ_CHECK(um_malloc(w->ctx, dev, 64, NULL, NULL) == UM_ERR_INVALID, "NULL ptr");
        FUZZ_CHECK(um_buffer_create(w->ctx, 64, NULL, NULL) == UM_ERR_INVALID, "NULL out");
        FUZZ_CHECK(um_buffer_wrap(w->ctx, NULL, 64, (um_buffer **)&p) == UM_ERR_INVALID,
                   "wrap of NULL");
        FUZZ_CHECK(um_buffer_destroy(NULL) == UM_OK, "destroy of NULL");
        break;
    case 7: /* a free of a freed block's address, once nothing else can be there */
        if (w->nblocks) {
            mblock *b = &w->blocks[dev % w->nblocks];
            block_verify(w, b, "before free");
            FUZZ_CHECK(um_free(w->ctx, b->p, NULL) == UM_OK, "free");
            FUZZ_CHECK(um_free(w->ctx, b->p, NULL) == UM_ERR_DOUBLE_FREE, "double free");
            *b = w->blocks[--w->nblocks];
        }
        break;
    case 8: /* simulated work on a stream of another device */
        if (dev != 0)
            FUZZ_CHECK(um_sim_stream_work(w->ctx, dev, w->streams[dev == 1 ? 2 : 1], 1, 1) ==
                           UM_ERR_WRONG_DEVICE,
                       "sim work on another device's stream");
        break;
    default: /* a release without an acquire */
        if (w->nbufs) {
            mbuf *m = &w->bufs[dev % w->nbufs];
            if (!m->readers[dev] && !m->writer[dev])
                FUZZ_CHECK(um_buffer_release(m->b, dev, NULL) == UM_ERR_INVALID,
                           "release without acquire");
        }
        break;
    }
}

/* ------------------------------------------------------------- program */

static void teardown_clean(world *w)
{
    for (int i = 0; i < w->nbufs; i++) {
        mbuf *m = &w->bufs[i];
        for (int d = 0; d < NDEV; d++) {
            while (m->readers[d] || m->writer[d]) {
                FUZZ_CHECK(um_buffer_release(m->b, d, NULL) == UM_OK, "release at the end");
                if (m->writer[d])
                    m->writer[d] = false;
                else
                    m->readers[d]--;
                m->holders--;
            }
        }
    }
    for (int i = 0; i < w->nbufs; i++)
        verify_buffer(w, &w->bufs[i]);
    while (w->nbufs) {
        mbuf *m = &w->bufs[0];
        FUZZ_CHECK(um_buffer_destroy(m->b) == UM_OK, "destroy at the end: %s", um_last_error());
        if (m->home)
            FUZZ_CHECK(memcmp(m->home, m->data, m->size) == 0, "wrapped memory at the end");
        forget_buf(w, m);
    }
    while (w->nblocks) {
        mblock *b = &w->blocks[w->nblocks - 1];
        block_verify(w, b, "at the end");
        FUZZ_CHECK(um_free(w->ctx, b->p, NULL) == UM_OK, "free at the end");
        w->nblocks--;
    }
    op_sync(w);
    for (int d = 0; d < NDEV; d++) {
        FUZZ_CHECK(um_trim(w->ctx, d) == UM_OK, "trim at the end");
        check_stats(w, d);
        FUZZ_CHECK(w->last[d].active_blocks == 0 && w->last[d].requested_bytes == 0,
                   "device %d holds %llu blocks at the end", d,
                   (unsigned long long)w->last[d].active_blocks);
    }
    check_allocators(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return -1;
    static world w;
    memset(&w, 0, sizeof w);
    w.in = (fuzz_reader){data, size};
    uint8_t cfg = fuzz_u8(&w.in);
    char conf[512];
    snprintf(conf, sizeof conf,
             "devices=sim:64M+sim:32M,host_capacity=64M,sim_granularity=%s,"
             "host_granularity=%s,thread_cache=%d,evict_policy=%s,links=model,"
             "link_cache=none,copy_threads=1,log_level=error,watermark_high=100,"
             "watermark_low=100",
             cfg & 1 ? "64K" : "2M", cfg & 2 ? "64K" : "2M", (cfg >> 2) & 1,
             cfg & 8 ? "lru" : "cost");
    um_status st = um_init(conf, &w.ctx);
    FUZZ_CHECK(st == UM_OK, "um_init(%s): %s", conf, um_last_error());
    FUZZ_CHECK(um_device_count(w.ctx) == NDEV, "devices");
    for (int d = 0; d < NDEV; d++) {
        FUZZ_CHECK(um_device_info_get(w.ctx, d, &w.info[d]) == UM_OK, "info");
        FUZZ_CHECK(um_stream_create(w.ctx, d, &w.streams[d]) == UM_OK, "stream");
        /* No background eviction: the checks read the allocators. */
        FUZZ_CHECK(um_set_watermarks(w.ctx, d, SIZE_MAX, SIZE_MAX) == UM_OK, "watermarks");
    }
    /* First limits on the sim devices. */
    static const size_t first[4] = {0, 4 * MIB, 8 * MIB, 2 * MIB};
    for (int d = 1; d < NDEV; d++) {
        size_t lim = first[((cfg >> 4) + (unsigned)d) % 4];
        FUZZ_CHECK(um_set_memory_limit(w.ctx, d, lim) == UM_OK, "first limit");
        um_device_info_get(w.ctx, d, &w.info[d]);
    }
    bool clean = !(cfg & 0x40);

    typedef void (*op_fn)(world *);
    static const op_fn ops[] = {op_malloc, op_free,    op_create,  op_wrap,   op_acquire,
                                op_release, op_write,  op_read,    op_destroy, op_hint,
                                op_prefetch, op_trim,  op_memory_limit, op_cache_limit,
                                op_stream_work, op_sync, op_restream, op_misuse,
                                op_acquire, op_release, op_malloc, op_create};
    const unsigned nops = sizeof ops / sizeof ops[0];
    static const char *const names[] = {
        "malloc", "free", "create", "wrap", "acquire", "release", "write", "read",
        "destroy", "hint", "prefetch", "trim", "memory_limit", "cache_limit", "stream_work",
        "sync", "restream", "misuse", "acquire", "release", "malloc", "create"};
    _Static_assert(sizeof names / sizeof names[0] == sizeof ops / sizeof ops[0], "names");
    /* FUZZ_API_VERBOSE=1: the operations as they run, for reproducers. */
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("FUZZ_API_VERBOSE") && atoi(getenv("FUZZ_API_VERBOSE")) > 0;
    if (verbose)
        fprintf(stderr, "fuzz_api: %s (%s)\n", conf, clean ? "clean teardown" : "um_shutdown");
    for (w.op = 1; fuzz_more(&w.in) && w.op <= MAX_OPS; w.op++) {
        unsigned k = fuzz_u8(&w.in) % nops;
        if (verbose) {
            fprintf(stderr, "op %u: %s (%d buffers, %d blocks)\n", w.op, names[k], w.nbufs,
                    w.nblocks);
            um__clear_error();
        }
        ops[k](&w);
        if (verbose && um_last_error()[0])
            fprintf(stderr, "  last error: %s\n", um_last_error());
        check_all(&w);
    }
    if (verbose) {
        for (int d = 0; d < NDEV; d++) {
            um_reclaim_stats rs;
            um_reclaim_stats_get(w.ctx, d, &rs);
            fprintf(stderr, "device %d: %llu evictions (%llu written back), %llu sync reclaims, "
                            "%llu failed; limit %zu\n",
                    d, (unsigned long long)rs.evictions, (unsigned long long)rs.written_back,
                    (unsigned long long)rs.sync_reclaims, (unsigned long long)rs.failed,
                    w.info[d].memory_limit);
        }
    }
    for (int d = 0; d < NDEV; d++)
        check_stats(&w, d);
    check_allocators(&w);
    if (clean)
        teardown_clean(&w);
    um_shutdown(w.ctx);
    for (int i = 0; i < w.nbufs; i++) {
        free(w.bufs[i].data);
        free(w.bufs[i].home);
    }
    return 0;
}
