/*
 * test_stress: a stress and soak test (issue 9, item 5). 32 threads mix every
 * public operation on one context of the host and four simulated devices,
 * under oversubscription, for UM_STRESS_SECONDS (default 60; the soak run
 * takes 1800), against a reference model that knows the exact bytes of
 * every buffer and block. The seed is printed at the start (UM_TEST_SEED
 * reruns it; the threads' interleaving is not replayed, only their choices).
 *
 * The context: devices=sim:4x64M, each sim device's memory limit moved at
 * random between 24 and 40 MiB, starting at 24 (so the buffers, 384 MiB in
 * all, are 2.4x-4x the sum of the sim devices' limits), the host limited to
 * 1-1.5 GiB, which holds them all. Operations: um_malloc/um_free on every device (small and
 * large sizes, the default or the thread's own streams, frees on streams,
 * blocks handed between threads), um_memcpy/um_memcpy_async between blocks
 * and from replicas, buffers (create, acquire in every mode on every device
 * with and without a stream, held across other operations, conflicting
 * calls that must be BUSY,
 * release, um_buffer_write/read of parts, prefetch, hints WONT_USE,
 * WILL_USE, PIN/UNPIN, wrap, destroy), tasks (um_task_submit of host
 * functions that check their inputs and xor a generation pattern into
 * their outputs, forced or placed, um_task_cancel, um_task_wait,
 * um_wait_all), um_trim, um_set_memory_limit, um_set_cache_limit,
 * um_set_watermarks, every statistics call, stream creation and
 * destruction, and probes that cannot fit at all.
 *
 * The model. A buffer holds, per 4 KiB chunk, the pattern of (buffer id,
 * chunk, generation); generation 0 is zeros (a new buffer). So the model of
 * a buffer is one generation per chunk. A block holds harness_pattern_fill
 * of its id. A buffer is guarded by a read-write lock in its slot (readers
 * may share it: read acquisitions, reads, prefetches; anything that
 * changes it holds it alone, and a thread's pending tasks keep the lock
 * until they are waited for). Every read, every acquisition that gives
 * valid data and every block before it is freed is checked against the
 * model, in full.
 *
 * What the library guarantees (docs/DESIGN.md, "Reclaim"; include/unimem.h)
 * and the test asserts: an allocation at the memory limit evicts buffer
 * replicas (writing the only valid copy back to the host) and retries, so
 * it fails with UM_ERR_NOMEM only when what cannot be evicted (acquired or
 * pinned replicas, um_malloc blocks, replicas of buffers whose lock a call
 * waiting for memory holds, the eviction in progress) leaves no room. The test keeps a
 * budget per device of what it makes unevictable, at most the smallest
 * limit minus a slack (STRESS_SLACK: the eviction in progress, page and
 * slab rounding): an operation runs only when its bytes fit the budget,
 * counting a buffer on every sim device while a call may hold its lock. So
 * an operation within the budget must not fail with UM_ERR_NOMEM (reclaim
 * waits for candidates that calls in progress hold, and takes back what
 * other threads' caches keep), unless the pool says its free memory is
 * fragmented (no free range as large as the request while live bytes and
 * the request fit under the limit): those are counted and reported. The
 * only other UM_ERR_NOMEM accepted are
 * the documented ones of the probes: an allocation larger than the device
 * ("the request alone exceeds the limit") and an acquisition that cannot
 * fit at all. Other accepted statuses: UM_ERR_BUSY from a lowered memory
 * limit under live data (documented), from conflicting calls (checked to
 * be BUSY) and from um_task_cancel of a started task; UM_ERR_CANCELLED and
 * UM_ERR_TASK of tasks exactly as the model of the task layer predicts:
 * a task fails when it reads data whose last writer failed or was
 * cancelled, until a WRITE_DISCARD task repairs it; tasks after one that
 * ended without running still run in submission order.
 *
 * What it found in the library is listed in docs/BENCHMARKS.md ("Stress and
 * soak", F1-F13);
 * tests/test_stress_findings.c keeps each fixed finding as a regression.
 *
 * Knobs: UM_STRESS_SECONDS (default 60), UM_TEST_SEED, UM_STRESS_THREADS
 * (default 32), UM_STRESS_WATCHDOG (seconds without progress, default 60),
 * UM_STRESS_ONLY=word,word (only the operations whose names contain one of
 * them, to narrow a failure down; e.g. "task,read").
 *
 * Nothing may deadlock: a watchdog aborts with a dump (each thread's
 * operation and how long it has run, its last operation and status, every
 * device's statistics) when no thread finishes an operation for 60 s
 * (UM_STRESS_WATCHDOG), or when the test has not ended
 * UM_STRESS_SECONDS + STRESS_DRAIN_S after its start. At the end every
 * thread returns what it holds, every buffer is read and checked, then
 * destroyed, every block freed; every device must have 0 live bytes and
 * blocks; totals per operation kind, with failures by status, are printed.
 */
#include "buffer/buffer.h" /* only to say what holds a device when an allocation fails */
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

#define NSIM 4
#define NDEV (NSIM + 1)
#define SIM_CAPACITY (64 * MIB)
#define LIMIT_MIN (24 * MIB)
#define LIMIT_MAX (40 * MIB)
#define STRESS_SLACK (8 * MIB)
/* What the test may make unevictable on a sim device, and of that how much
 * in um_malloc blocks. */
#define SIM_BUDGET (LIMIT_MIN - STRESS_SLACK)
#define SIM_MALLOC_BUDGET (4 * MIB)
#define HOST_LIMIT_MIN (1 * GIB)
#define HOST_LIMIT_MAX (3 * GIB / 2)
#define HOST_MALLOC_BUDGET (128 * MIB)
#define BUF_TOTAL (384 * MIB)
#define BUF_SMALL_MAX (64 * KIB)
#define BUF_LARGE_MIN (128 * KIB)
#define BUF_LARGE_MAX (2 * MIB)
#define CHUNK ((size_t)4096)
#define CWORDS (CHUNK / 8)
#define MAX_THREADS 64
#define MAX_BLOCKS 12
#define NEXCHANGE 64
#define HOT_SLOTS 8
#define BATCH_TASKS 3
#define BATCH_SLOTS 4
#define TASK_BUFS 3
#define MAX_DETAILED_REPORTS 40
#define STRESS_DRAIN_S 60

/* ------------------------------------------------------------ operations */

#define OP_LIST(X)                                                                                 \
    X(MALLOC, "um_malloc")                                                                         \
    X(FREE, "um_free")                                                                             \
    X(HANDOVER, "block handover")                                                                  \
    X(MEMCPY, "um_memcpy")                                                                         \
    X(MEMCPY_ASYNC, "um_memcpy_async")                                                             \
    X(MEMCPY_REPLICA, "um_memcpy from a replica")                                                  \
    X(STREAM_SYNC, "um_stream_synchronize")                                                        \
    X(STREAM_CHURN, "um_stream_create/destroy")                                                    \
    X(BUF_CREATE, "um_buffer_create")                                                              \
    X(BUF_DESTROY, "um_buffer_destroy")                                                            \
    X(ACQ_READ, "acquire READ")                                                                    \
    X(ACQ_WRITE, "acquire WRITE")                                                                  \
    X(ACQ_RW, "acquire READ_WRITE")                                                                \
    X(ACQ_DISCARD, "acquire WRITE_DISCARD")                                                        \
    X(ACQ_CONFLICT, "conflicting calls (BUSY)")                                                    \
    X(RELEASE, "um_buffer_release")                                                                \
    X(BUF_WRITE, "um_buffer_write")                                                                \
    X(BUF_READ, "um_buffer_read")                                                                  \
    X(PREFETCH, "um_buffer_prefetch")                                                              \
    X(HINT_WONT, "hint WONT_USE")                                                                  \
    X(HINT_WILL, "hint WILL_USE")                                                                  \
    X(PIN, "hint PIN")                                                                             \
    X(UNPIN, "hint UNPIN")                                                                         \
    X(WRAP, "um_buffer_wrap")                                                                      \
    X(TASK_SUBMIT, "um_task_submit")                                                               \
    X(TASK_CANCEL, "um_task_cancel")                                                               \
    X(TASK_WAIT, "um_task_wait")                                                                   \
    X(WAIT_ALL, "um_wait_all")                                                                     \
    X(TRIM, "um_trim")                                                                             \
    X(SET_LIMIT, "um_set_memory_limit")                                                            \
    X(SET_CACHE, "um_set_cache_limit")                                                             \
    X(WATERMARKS, "um_set_watermarks")                                                             \
    X(STATS, "statistics calls")                                                                   \
    X(PROBE, "cannot-fit probes")

enum {
#define OP_ENUM_(e, s) OP_##e,
    OP_LIST(OP_ENUM_)
#undef OP_ENUM_
        NOPS
};
static const char *const op_names[NOPS] = {
#define OP_NAME_(e, s) s,
    OP_LIST(OP_NAME_)
#undef OP_NAME_
};

#define NSTATUS 16
typedef struct op_counts {
    _Atomic uint64_t calls;
    _Atomic uint64_t by_status[NSTATUS];
    _Atomic uint64_t unexpected;
    _Atomic uint64_t no_budget; /* skipped: its bytes did not fit the budget */
    _Atomic uint64_t contended; /* skipped: another thread had the buffer */
} op_counts;

static op_counts counts[NOPS];
static _Atomic int detailed_reports;
static _Atomic uint64_t unexpected_nomem;
/* UM_ERR_NOMEM within the budget that the pool explains by fragmentation
 * (live bytes and the request fit under the limit, but no free range is
 * that large): the one documented way it may happen (docs/DESIGN.md,
 * "Limits"); counted and reported, not a failure. */
static _Atomic uint64_t fragmented_nomem;
static _Atomic uint64_t expected_nomem_reclaimed; /* probes that failed as they must */
static _Atomic uint64_t bytes_checked;

/* ----------------------------------------------------------------- state */

typedef struct slot {
    pthread_rwlock_t lock;
    um_buffer *b; /* NULL: empty */
    uint64_t id;  /* the pattern's buffer id */
    size_t size;
    bool small;    /* its size class, kept across destroy and create */
    uint32_t *gen; /* per chunk */
    size_t nchunks;
    bool pinned;         /* pinned: holds a budget reservation */
    bool poisoned;       /* its last task writer failed or was cancelled */
    um_task_id poisoner; /* that task */
    um_status poison_status;
    /* The last writes, for the report of a mismatch. */
    struct hev {
        int16_t op, dev, thread;
        uint32_t gen;
        uint32_t c0, c1;
        uint64_t t_ns;
        uint64_t task; /* the task, for task effects */
        int16_t mode, status;
    } hist[16];
    unsigned nhist;
} slot;

typedef struct blk {
    void *p;
    size_t size;
    int dev;
    uint64_t id;
    int64_t charge;
} blk;

typedef struct need {
    int64_t b[NDEV];
    bool malloc_kind;
} need;

typedef struct tstate {
    _Atomic int op; /* -1: between operations */
    _Atomic int last_op, last_status;
    _Atomic int dev;
    _Atomic size_t size;
    _Atomic uint64_t op_start_ns;
    _Atomic uint64_t done;
    _Atomic int phase; /* 0 running, 1 draining, 2 done */
} tstate;

/* A task's view of one buffer (the snapshot the submitter predicted). */
typedef struct task_buf {
    int slot;
    uint64_t id;
    size_t size, nchunks;
    um_access mode;
    uint32_t *old;   /* generations before the task */
    uint32_t newgen; /* generation it writes */
    size_t wlo, whi; /* chunks a WRITE task writes; all for RW and WRITE_DISCARD */
} task_buf;

typedef struct task_rec {
    um_task_id id;
    int nb;
    task_buf tb[TASK_BUFS];
    bool cancelled;  /* um_task_cancel said UM_OK */
    _Atomic int ran; /* times its implementation ran */
    _Atomic int ran_ok;
} task_rec;

typedef struct batch {
    int nslots;
    int slots[BATCH_SLOTS];
    need n;
    int ntasks;
    task_rec t[BATCH_TASKS];
    int ops_since;
} batch;

typedef struct hold {
    int slot;
    int dev;
    um_access mode;
    um_stream s;
    void *ptr;
    need n;
    int ops_left;
    int op;
} hold;

typedef struct world {
    um_context *ctx;
    int nthreads;
    double seconds;
    uint64_t seed;
    uint64_t t0;
    slot *slots;
    int nslots;
    /* budget */
    pthread_mutex_t budget_lock;
    int64_t used[NDEV], malloc_used[NDEV];
    int64_t cap[NDEV], malloc_cap[NDEV];
    /* blocks handed between threads */
    pthread_mutex_t xlock;
    blk xchg[NEXCHANGE];
    /* streams of every thread, destroyed at the end */
    um_stream (*streams)[NDEV];
    _Atomic uint64_t next_id;
    _Atomic uint32_t next_gen;
    _Atomic bool stop;
    _Atomic uint64_t last_probe_ns;
    _Atomic uint64_t tasks_submitted, task_callbacks, tasks_cancelled;
    _Atomic uint64_t task_ran[NDEV];
    _Atomic int live_buffers;
    tstate ts[MAX_THREADS];
    _Atomic uint64_t main_progress;
    _Atomic int main_phase; /* 0 setup, 1 running, 2 joining, 3 final checks */
    FILE *devnull;
} world;

static world W;

typedef struct thr {
    int id;
    uint64_t rng;
    um_stream st[NDEV];
    blk blocks[MAX_BLOCKS];
    int nblocks;
    bool holding;
    hold h;
    bool batching;
    batch bt;
} thr;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(thr *t)
{
    return harness_rand(&t->rng);
}
static uint64_t below(thr *t, uint64_t n)
{
    return n ? rnd(t) % n : 0;
}
static bool chance(thr *t, unsigned percent)
{
    return below(t, 100) < percent;
}

/* -------------------------------------------------------------- patterns */

/* Chunk c of buffer id at generation gen (0: zeros), 4 KiB. */
static void chunk_pattern(uint64_t id, size_t c, uint32_t gen, uint64_t *w)
{
    if (!gen) {
        memset(w, 0, CHUNK);
        return;
    }
    uint64_t base = harness_mix64(id * 0x9e3779b97f4a7c15ull ^
                                  (uint64_t)gen * 0xc2b2ae3d27d4eb4full ^
                                  ((uint64_t)c + 1) * 0x165667b19e3779f9ull);
    for (size_t k = 0; k < CWORDS; k++)
        w[k] = base + k * 0xd6e8feb86659fd93ull;
}

static size_t nchunks_of(size_t size)
{
    return (size + CHUNK - 1) / CHUNK;
}

/* Writes chunks [c0, c1) of a buffer (id, size) at generation gen into dst,
 * the buffer's byte 0. */
static void fill_chunks(unsigned char *dst, uint64_t id, size_t size, size_t c0, size_t c1,
                        uint32_t gen)
{
    uint64_t w[CWORDS];
    for (size_t c = c0; c < c1; c++) {
        size_t off = c * CHUNK, n = size - off < CHUNK ? size - off : CHUNK;
        chunk_pattern(id, c, gen, w);
        memcpy(dst + off, w, n);
    }
}

/* Turns chunks [c0, c1) at generations old[] into generation gen, in
 * place, by xor (what the tasks compute). */
static void xor_chunks(unsigned char *dst, uint64_t id, size_t size, size_t c0, size_t c1,
                       const uint32_t *old, uint32_t gen)
{
    uint64_t a[CWORDS], b[CWORDS];
    for (size_t c = c0; c < c1; c++) {
        size_t off = c * CHUNK, n = size - off < CHUNK ? size - off : CHUNK;
        chunk_pattern(id, c, old[c], a);
        chunk_pattern(id, c, gen, b);
        const unsigned char *pa = (const unsigned char *)a, *pb = (const unsigned char *)b;
        unsigned char *d = dst + off;
        if (n == CHUNK && ((uintptr_t)d & 7) == 0) {
            uint64_t *dw = (uint64_t *)(void *)d;
            for (size_t k = 0; k < CWORDS; k++)
                dw[k] ^= a[k] ^ b[k];
        } else {
            for (size_t k = 0; k < n; k++)
                d[k] ^= (unsigned char)(pa[k] ^ pb[k]);
        }
    }
}

/* Offset (in the buffer) of the first byte of data, the buffer's bytes
 * [off, off + n), that differs from the model, or SIZE_MAX. */
static size_t model_find_bad(uint64_t id, size_t size, const uint32_t *gen,
                             const unsigned char *data, size_t off, size_t n, unsigned char *got,
                             unsigned char *want)
{
    uint64_t w[CWORDS];
    size_t pos = off, end = off + n;
    while (pos < end) {
        size_t c = pos / CHUNK, cs = c * CHUNK;
        size_t ce = cs + CHUNK < size ? cs + CHUNK : size;
        size_t e = ce < end ? ce : end;
        chunk_pattern(id, c, gen[c], w);
        const unsigned char *exp = (const unsigned char *)w + (pos - cs);
        const unsigned char *d = data + (pos - off);
        if (memcmp(d, exp, e - pos) != 0) {
            size_t i = 0;
            while (d[i] == exp[i])
                i++;
            *got = d[i];
            *want = exp[i];
            return pos + i;
        }
        pos = e;
    }
    atomic_fetch_add_explicit(&bytes_checked, n, memory_order_relaxed);
    return SIZE_MAX;
}

static _Thread_local int tl_thread = -1;
static _Thread_local const slot *tl_slot; /* the slot of the data being checked, if known */
static uint64_t now_ns(void);
static void diagnose(const slot *s, size_t c, const unsigned char *chunk, size_t n);

/* Checks data against the model of a buffer; reports the first bad byte. */
static bool model_check(const char *what, int dev, uint64_t id, size_t size, const uint32_t *gen,
                        const unsigned char *data, size_t off, size_t n)
{
    unsigned char got, want;
    size_t bad = model_find_bad(id, size, gen, data, off, n, &got, &want);
    harness_checks++;
    if (bad == SIZE_MAX)
        return true;
    size_t c = bad / CHUNK;
    bool zeros = true;
    size_t cs = c * CHUNK, ce = cs + CHUNK < size ? cs + CHUNK : size;
    if (cs >= off && ce <= off + n)
        for (size_t i = cs; i < ce && zeros; i++)
            zeros = data[i - off] == 0;
    else
        zeros = false;
    harness_report(__FILE__, __LINE__,
                   "%s: buffer id %llu (%zu bytes) on device %d: byte %zu is 0x%02x, expected "
                   "0x%02x (chunk %zu at generation %u%s)",
                   what, (unsigned long long)id, size, dev, bad, got, want, c, gen[c],
                   zeros ? "; the chunk reads as zeros" : "");
    if (tl_slot && tl_slot->id == id && cs >= off && ce <= off + n)
        diagnose(tl_slot, c, data + (cs - off), ce - cs);
    return false;
}

static bool block_check(const char *what, const blk *k)
{
    unsigned char got, want;
    size_t bad = harness_pattern_find_bad(k->p, k->size, k->id, &got, &want);
    harness_checks++;
    if (bad == SIZE_MAX) {
        atomic_fetch_add_explicit(&bytes_checked, k->size, memory_order_relaxed);
        return true;
    }
    harness_report(__FILE__, __LINE__,
                   "%s: block %p (%zu bytes, device %d, pattern %llu): byte %zu is 0x%02x, "
                   "expected 0x%02x",
                   what, k->p, k->size, k->dev, (unsigned long long)k->id, bad, got, want);
    return false;
}

/* ---------------------------------------------------------------- budget */

static int64_t charge_of(size_t size)
{
    return (int64_t)(((size + CHUNK - 1) / CHUNK) * CHUNK + CHUNK);
}

/* A buffer of `size` counts on every sim device while a call may hold its
 * lock (its replicas there cannot be evicted meanwhile). */
static need buffer_need(size_t size)
{
    need n = {{0}, false};
    for (int d = 1; d < NDEV; d++)
        n.b[d] = charge_of(size);
    return n;
}

static void need_add(need *a, const need *b)
{
    for (int d = 0; d < NDEV; d++)
        a->b[d] += b->b[d];
}

static bool budget_take(const need *n)
{
    pthread_mutex_lock(&W.budget_lock);
    bool ok = true;
    for (int d = 0; d < NDEV && ok; d++) {
        ok = W.used[d] + n->b[d] <= W.cap[d];
        if (ok && n->malloc_kind)
            ok = W.malloc_used[d] + n->b[d] <= W.malloc_cap[d];
    }
    if (ok)
        for (int d = 0; d < NDEV; d++) {
            W.used[d] += n->b[d];
            if (n->malloc_kind)
                W.malloc_used[d] += n->b[d];
        }
    pthread_mutex_unlock(&W.budget_lock);
    return ok;
}

static void budget_give(const need *n)
{
    pthread_mutex_lock(&W.budget_lock);
    for (int d = 0; d < NDEV; d++) {
        W.used[d] -= n->b[d];
        if (n->malloc_kind)
            W.malloc_used[d] -= n->b[d];
        if (W.used[d] < 0 || W.malloc_used[d] < 0)
            harness_report(__FILE__, __LINE__, "test bug: budget of device %d below 0", d);
    }
    pthread_mutex_unlock(&W.budget_lock);
}

static need block_need(int dev, size_t size)
{
    need n = {{0}, true};
    n.b[dev] = charge_of(size);
    return n;
}

/* ------------------------------------------------------------- reporting */

static void begin(thr *t, int op, int dev, size_t size)
{
    tstate *s = &W.ts[t->id];
    atomic_store(&s->dev, dev);
    atomic_store(&s->size, size);
    atomic_store(&s->op_start_ns, now_ns());
    atomic_store(&s->op, op);
}

static void end(thr *t, int op, um_status st)
{
    tstate *s = &W.ts[t->id];
    atomic_store(&s->last_op, op);
    atomic_store(&s->last_status, (int)st);
    atomic_store(&s->op, -1);
    atomic_fetch_add(&s->done, 1);
}

static void skipped(int op, bool budget)
{
    atomic_fetch_add_explicit(budget ? &counts[op].no_budget : &counts[op].contended, 1,
                              memory_order_relaxed);
    if (budget)
        usleep(200);
}

static void dump_devices(FILE *f);
static void dump_replicas(FILE *f);

/* Counts st for op; a status the model did not expect is a failure, with
 * the details of the first few. */
static void note(int op, um_status st, bool expected, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note(int op, um_status st, bool expected, const char *fmt, ...)
{
    op_counts *c = &counts[op];
    atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->by_status[(unsigned)st < NSTATUS ? st : NSTATUS - 1], 1,
                              memory_order_relaxed);
    harness_checks++;
    if (expected)
        return;
    if ((st == UM_ERR_NOMEM || st == UM_ERR_TASK) &&
        harness_error_mentions("cannot allocate", "the free memory is fragmented", NULL)) {
        if (atomic_fetch_add(&fragmented_nomem, 1) == 0)
            printf("test_stress: %s: UM_ERR_NOMEM within the budget from fragmentation (counted, "
                   "not a failure): %s\n", op_names[op], um_last_error());
        return;
    }
    atomic_fetch_add(&c->unexpected, 1);
    if (st == UM_ERR_NOMEM)
        atomic_fetch_add(&unexpected_nomem, 1);
    if (atomic_fetch_add(&detailed_reports, 1) >= MAX_DETAILED_REPORTS) {
        harness_failures++;
        return;
    }
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    harness_report(__FILE__, __LINE__, "%s: %s returned %s (%s)", op_names[op], what,
                   um_status_name(st), um_last_error());
    if (st == UM_ERR_NOMEM) {
        pthread_mutex_lock(&W.budget_lock);
        fprintf(stderr,
                "  test budget in use (bytes; cap %lld on sim devices):", (long long)W.cap[1]);
        for (int d = 0; d < NDEV; d++)
            fprintf(stderr, " dev%d %lld (malloc %lld)", d, (long long)W.used[d],
                    (long long)W.malloc_used[d]);
        fprintf(stderr, "\n");
        pthread_mutex_unlock(&W.budget_lock);
        dump_devices(stderr);
        dump_replicas(stderr);
    }
}

/* What the buffers hold on every sim device (a report, not a check):
 * replica bytes by kind, read under the slot's and the buffer's locks,
 * only tried; a buffer whose lock was taken (by a call in progress, so not
 * evictable at that moment) is counted apart, and a slot held by a thread
 * is counted as a slot. */
static void dump_replicas(FILE *f)
{
    for (int d = 1; d < NDEV; d++) {
        size_t valid = 0, invalid = 0, acquired = 0, pinned = 0, locked = 0;
        int n = 0, held_slots = 0;
        for (int i = 0; i < W.nslots; i++) {
            /* The slot's lock keeps the buffer from being destroyed
             * meanwhile. */
            if (pthread_rwlock_tryrdlock(&W.slots[i].lock) != 0) {
                held_slots++;
                continue;
            }
            um_buffer *b = W.slots[i].b;
            if (!b) {
                pthread_rwlock_unlock(&W.slots[i].lock);
                continue;
            }
            if (pthread_mutex_trylock(&b->lock) == 0) {
                const um__replica *r = &b->rep[d];
                if (r->ptr) {
                    n++;
                    if (r->readers || r->writer)
                        acquired += b->size;
                    else if (b->pinned)
                        pinned += b->size;
                    else if (r->state == UM_REPLICA_INVALID)
                        invalid += b->size;
                    else
                        valid += b->size;
                }
                pthread_mutex_unlock(&b->lock);
            } else {
                locked += b->size; /* an upper bound: its replica may be elsewhere */
            }
            pthread_rwlock_unlock(&W.slots[i].lock);
        }
        fprintf(f,
                "  device %d: %d replicas with memory: %.2f MiB valid, %.2f MiB invalid, %.2f MiB "
                "acquired, %.2f MiB pinned; buffers locked now: %.2f MiB; slots held by "
                "threads: %d\n",
                d, n, (double)valid / (double)MIB, (double)invalid / (double)MIB,
                (double)acquired / (double)MIB, (double)pinned / (double)MIB,
                (double)locked / (double)MIB, held_slots);
    }
}

static void dump_devices(FILE *f)
{
    for (int d = 0; d < NDEV; d++) {
        um_stats s;
        um_reclaim_stats r;
        um_device_info info;
        if (um_stats_get(W.ctx, d, &s) != UM_OK || um_reclaim_stats_get(W.ctx, d, &r) != UM_OK ||
            um_device_info_get(W.ctx, d, &info) != UM_OK)
            continue;
        fprintf(f,
                "  device %d (%s): limit %zu, active %zu (%llu blocks), reserved %zu, largest "
                "free %zu, ooms %llu; evictions %llu (%llu written back), sync reclaims %llu, "
                "failed %llu, reclaimer runs %llu\n",
                d, info.name, info.memory_limit, s.active_bytes,
                (unsigned long long)s.active_blocks, s.reserved_bytes, s.largest_free_bytes,
                (unsigned long long)s.num_ooms, (unsigned long long)r.evictions,
                (unsigned long long)r.written_back, (unsigned long long)r.sync_reclaims,
                (unsigned long long)r.failed, (unsigned long long)r.reclaimer_runs);
    }
    fflush(f);
}

/* ------------------------------------------------------------- watchdog */

static _Atomic bool dump_done;

static void *dump_main(void *arg)
{
    (void)arg;
    dump_devices(stderr);
    atomic_store(&dump_done, true);
    return NULL;
}

static void watchdog_dump(const char *why)
{
    static const char *const phases[] = {"running", "draining", "done"};
    static const char *const main_phases[] = {"setup", "running", "joining", "final checks"};
    uint64_t t = now_ns();
    fprintf(stderr, "test_stress: WATCHDOG: %s (%.1f s after the start; seed %llu)\n", why,
            (double)(t - W.t0) / 1e9, (unsigned long long)W.seed);
    fprintf(stderr, "  main thread: %s\n", main_phases[atomic_load(&W.main_phase)]);
    for (int i = 0; i < W.nthreads; i++) {
        tstate *s = &W.ts[i];
        int op = atomic_load(&s->op), last = atomic_load(&s->last_op);
        fprintf(stderr, "  thread %2d: %-8s ops %8llu; ", i, phases[atomic_load(&s->phase)],
                (unsigned long long)atomic_load(&s->done));
        if (op >= 0)
            fprintf(stderr, "in %s (device %d, %zu bytes) for %.1f s; ", op_names[op],
                    atomic_load(&s->dev), atomic_load(&s->size),
                    (double)(t - atomic_load(&s->op_start_ns)) / 1e9);
        else
            fprintf(stderr, "between operations; ");
        fprintf(stderr, "last %s -> %s\n", last >= 0 ? op_names[last] : "none",
                um_status_name((um_status)atomic_load(&s->last_status)));
    }
    fflush(stderr);
    /* The statistics take the pools' locks: from another thread, given 5 s. */
    pthread_t tid;
    if (pthread_create(&tid, NULL, dump_main, NULL) == 0) {
        pthread_detach(tid);
        for (int i = 0; i < 50 && !atomic_load(&dump_done); i++)
            usleep(100000);
        if (!atomic_load(&dump_done))
            fprintf(stderr, "  (the device statistics did not come within 5 s: a pool lock is "
                            "held)\n");
    }
    fflush(stderr);
}

static _Atomic bool watchdog_stop;

static void *watchdog_main(void *arg)
{
    (void)arg;
    double quiet_limit = 60;
    const char *e = getenv("UM_STRESS_WATCHDOG");
    if (e && *e)
        quiet_limit = atof(e);
    uint64_t last = 0, last_change = now_ns();
    while (!atomic_load(&watchdog_stop)) {
        usleep(100000);
        uint64_t sum = atomic_load(&W.main_progress);
        for (int i = 0; i < W.nthreads; i++)
            sum += atomic_load(&W.ts[i].done);
        uint64_t t = now_ns();
        if (sum != last) {
            last = sum;
            last_change = t;
        }
        if ((double)(t - last_change) / 1e9 > quiet_limit) {
            char why[128];
            snprintf(why, sizeof why, "no operation finished for %.0f s", quiet_limit);
            watchdog_dump(why);
            abort();
        }
        if ((double)(t - W.t0) / 1e9 > W.seconds + STRESS_DRAIN_S) {
            char why[128];
            snprintf(why, sizeof why, "not done %d s after UM_STRESS_SECONDS=%.0f", STRESS_DRAIN_S,
                     W.seconds);
            watchdog_dump(why);
            abort();
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- blocks */

static um_stream pick_stream(thr *t, int dev)
{
    /* NULL, the thread's stream of dev, or for host memory any device's. */
    unsigned r = (unsigned)below(t, 10);
    if (r < 4)
        return NULL;
    if (dev == 0 && r >= 8)
        return t->st[below(t, NDEV)];
    return t->st[dev];
}

static size_t malloc_size(thr *t, int dev)
{
    unsigned r = (unsigned)below(t, 10);
    if (r < 4)
        return 1 + below(t, 32 * KIB);
    if (dev == 0)
        return r < 7 ? 32 * KIB + below(t, 480 * KIB) : 512 * KIB + below(t, 7680 * KIB);
    return 32 * KIB + below(t, 992 * KIB);
}

/* um_malloc of a block of dev into t's blocks (a free slot needed), filled
 * with pattern id; false when it was not allocated. */
static bool block_alloc(thr *t, int dev, size_t size, uint64_t id, um_stream s, int op, blk *out)
{
    need n = block_need(dev, size);
    if (!budget_take(&n)) {
        skipped(op, true);
        return false;
    }
    begin(t, OP_MALLOC, dev, size);
    void *p = NULL;
    um_status st = um_malloc(W.ctx, dev, size, s, &p);
    note(OP_MALLOC, st, st == UM_OK, "device %d, %zu bytes, stream %p", dev, size, (void *)s);
    end(t, OP_MALLOC, st);
    if (st != UM_OK) {
        budget_give(&n);
        return false;
    }
    CHECK_EQ((uintptr_t)p % 256, 0);
    CHECK_EQ(um_pointer_device(W.ctx, p), dev);
    *out = (blk){p, size, dev, id, n.b[dev]};
    return true;
}

static void block_free(thr *t, blk *k, um_stream s)
{
    block_check("block before its free", k);
    begin(t, OP_FREE, k->dev, k->size);
    um_status st = um_free(W.ctx, k->p, s);
    note(OP_FREE, st, st == UM_OK, "%p (device %d, %zu bytes), stream %p", k->p, k->dev, k->size,
         (void *)s);
    end(t, OP_FREE, st);
    need n = {{0}, true};
    n.b[k->dev] = k->charge;
    budget_give(&n);
    k->p = NULL;
}

static void op_malloc(thr *t)
{
    if (t->nblocks == MAX_BLOCKS)
        return;
    int dev = (int)below(t, NDEV);
    size_t size = malloc_size(t, dev);
    blk k;
    uint64_t id = atomic_fetch_add(&W.next_id, 1);
    if (!block_alloc(t, dev, size, id, pick_stream(t, dev), OP_MALLOC, &k))
        return;
    harness_pattern_fill(k.p, k.size, k.id);
    t->blocks[t->nblocks++] = k;
}

static void drop_block(thr *t, int i)
{
    t->blocks[i] = t->blocks[--t->nblocks];
}

static void op_free(thr *t)
{
    if (!t->nblocks)
        return;
    int i = (int)below(t, (uint64_t)t->nblocks);
    block_free(t, &t->blocks[i], pick_stream(t, t->blocks[i].dev));
    drop_block(t, i);
}

/* Hands a block to the exchange, or takes one from it (another thread's,
 * checked, then freed here or kept). */
static void op_handover(thr *t)
{
    begin(t, OP_HANDOVER, -1, 0);
    pthread_mutex_lock(&W.xlock);
    int i = (int)(rnd(t) % NEXCHANGE);
    blk k = W.xchg[i];
    bool put = false, took = false;
    if (!k.p && t->nblocks) {
        int j = (int)below(t, (uint64_t)t->nblocks);
        W.xchg[i] = t->blocks[j];
        drop_block(t, j);
        put = true;
    } else if (k.p && t->nblocks < MAX_BLOCKS) {
        W.xchg[i].p = NULL;
        took = true;
    }
    pthread_mutex_unlock(&W.xlock);
    note(OP_HANDOVER, UM_OK, true, "exchange");
    end(t, OP_HANDOVER, UM_OK);
    (void)put;
    if (took) {
        block_check("block taken from another thread", &k);
        if (chance(t, 60))
            block_free(t, &k, pick_stream(t, k.dev));
        else
            t->blocks[t->nblocks++] = k;
    }
}

/* um_memcpy (or _async on a stream, then synchronised) of a block into a
 * new one on another device; both checked. */
static void op_memcpy(thr *t, bool async)
{
    if (!t->nblocks)
        return;
    int op = async ? OP_MEMCPY_ASYNC : OP_MEMCPY;
    blk *a = &t->blocks[below(t, (uint64_t)t->nblocks)];
    int dev = (int)below(t, NDEV);
    blk b;
    if (!block_alloc(t, dev, a->size, a->id, pick_stream(t, dev), op, &b))
        return;
    um_stream s = async ? (chance(t, 80) ? t->st[dev] : NULL) : NULL;
    begin(t, op, dev, a->size);
    um_status st = async ? um_memcpy_async(W.ctx, b.p, a->p, a->size, s)
                         : um_memcpy(W.ctx, b.p, a->p, a->size);
    note(op, st, st == UM_OK, "%zu bytes from device %d to device %d", a->size, a->dev, dev);
    if (async && st == UM_OK) {
        /* NULL: every device's default stream. */
        um_status s2 = um_stream_synchronize(W.ctx, s);
        note(OP_STREAM_SYNC, s2, s2 == UM_OK, "device %d", dev);
    }
    end(t, op, st);
    if (st == UM_OK) {
        block_check("copy of a block", &b);
        block_check("source of a copy", a);
    } else {
        harness_pattern_fill(b.p, b.size, b.id);
    }
    if (t->nblocks < MAX_BLOCKS && chance(t, 50))
        t->blocks[t->nblocks++] = b;
    else
        block_free(t, &b, NULL);
}

/* ----------------------------------------------------------------- slots */

/* A slot locked for reading (shared) or writing; -1 if the one picked was
 * taken. full: a buffer must be there; empty: it must not. */
static int slot_lock(thr *t, bool write, int want, int op)
{
    int i;
    if (want == 1 && chance(t, 15))
        i = (int)below(t, HOT_SLOTS);
    else
        i = (int)below(t, (uint64_t)W.nslots);
    slot *s = &W.slots[i];
    int e = write ? pthread_rwlock_trywrlock(&s->lock) : pthread_rwlock_tryrdlock(&s->lock);
    if (e != 0) {
        skipped(op, false);
        return -1;
    }
    if ((want == 1 && !s->b) || (want == 0 && s->b)) {
        pthread_rwlock_unlock(&s->lock);
        return -1;
    }
    return i;
}

static void slot_unlock(int i)
{
    pthread_rwlock_unlock(&W.slots[i].lock);
}

static uint32_t new_gen(void)
{
    uint32_t g = atomic_fetch_add(&W.next_gen, 1);
    while (g == 0)
        g = atomic_fetch_add(&W.next_gen, 1);
    return g;
}

static void slot_fill_model_op(slot *s, size_t c0, size_t c1, uint32_t g, int op, int dev)
{
    for (size_t c = c0; c < c1; c++)
        s->gen[c] = g;
    struct hev *e = &s->hist[s->nhist++ % 16];
    *e = (struct hev){(int16_t)op,
                      (int16_t)dev,
                      (int16_t)tl_thread,
                      g,
                      (uint32_t)c0,
                      (uint32_t)c1,
                      now_ns(),
                      0,
                      0,
                      0};
}

/* A task's outcome in the slot's history (its effect, if any, is already
 * there: this notes the task, its mode and its status). */
static void slot_note_task(slot *s, uint64_t task, int mode, um_status st, uint32_t gen)
{
    struct hev *e = &s->hist[s->nhist++ % 16];
    *e = (struct hev){
        OP_TASK_SUBMIT, -1,         (int16_t)tl_thread, st == UM_OK ? gen : 0, 0, 0, now_ns(), task,
        (int16_t)mode,  (int16_t)st};
}

/* Which of the slot's last writes chunk c holds. */
static void diagnose(const slot *s, size_t c, const unsigned char *chunk, size_t n)
{
    uint64_t w[CWORDS];
    fprintf(stderr, "  thread %d; chunk %zu of buffer id %llu: the last writes (newest first):\n",
            tl_thread, c, (unsigned long long)s->id);
    unsigned k = s->nhist < 16 ? s->nhist : 16;
    fprintf(stderr, "    (model: chunk %zu at generation %u)\n", c, s->gen[c]);
    bool found = false;
    for (unsigned i = 0; i < k; i++) {
        const struct hev *e = &s->hist[(s->nhist - 1 - i) % 16];
        bool covers = c >= e->c0 && c < e->c1;
        bool match = false;
        if (covers) {
            chunk_pattern(s->id, c, e->gen, w);
            match = memcmp(chunk, w, n) == 0;
            found |= match;
        }
        if (e->task) {
            fprintf(stderr, "    task %llu mode %d -> %s (gen %u), thread %d, %.3f s ago\n",
                    (unsigned long long)e->task, e->mode, um_status_name((um_status)e->status),
                    e->gen, e->thread, (double)(now_ns() - e->t_ns) / 1e9);
            continue;
        }
        fprintf(stderr, "    gen %u chunks [%u,%u) by %s on device %d, thread %d, %.3f s ago%s%s\n",
                e->gen, e->c0, e->c1, e->op >= 0 ? op_names[e->op] : "?", e->dev, e->thread,
                (double)(now_ns() - e->t_ns) / 1e9, covers ? "" : " (not this chunk)",
                match ? "  <== THE DATA HOLDS THIS ONE" : "");
    }
    chunk_pattern(s->id, c, 0, w);
    if (memcmp(chunk, w, n) == 0)
        fprintf(stderr, "    the chunk is zeros\n");
    else if (!found)
        fprintf(stderr, "    the chunk matches none of them\n");
}

/* A random range of chunks [*c0, *c1): the whole buffer half the time. */
static void chunk_range(thr *t, size_t nchunks, size_t *c0, size_t *c1)
{
    if (nchunks == 1 || chance(t, 50)) {
        *c0 = 0;
        *c1 = nchunks;
        return;
    }
    *c0 = below(t, nchunks);
    *c1 = *c0 + 1 + below(t, nchunks - *c0);
}

static size_t buffer_size(thr *t, bool small)
{
    if (small)
        return 1 + below(t, BUF_SMALL_MAX);
    return BUF_LARGE_MIN + below(t, BUF_LARGE_MAX - BUF_LARGE_MIN + 1);
}

/* ------------------------------------------------------------- acquires */

static int acquire_op(um_access mode)
{
    switch (mode) {
    case UM_ACCESS_READ:
        return OP_ACQ_READ;
    case UM_ACCESS_WRITE:
        return OP_ACQ_WRITE;
    case UM_ACCESS_READ_WRITE:
        return OP_ACQ_RW;
    default:
        return OP_ACQ_DISCARD;
    }
}

/* The end of an acquisition: a held read is checked again (nothing may
 * change it meanwhile), then the release. */
static void finish_hold(thr *t, hold *h)
{
    slot *s = &W.slots[h->slot];
    tl_slot = s;
    if (h->mode == UM_ACCESS_READ && h->ptr)
        model_check("read acquisition at its release", h->dev, s->id, s->size, s->gen, h->ptr, 0,
                    s->size);
    begin(t, OP_RELEASE, h->dev, s->size);
    um_status st = um_buffer_release(s->b, h->dev, h->s);
    note(OP_RELEASE, st, st == UM_OK, "buffer id %llu on device %d", (unsigned long long)s->id,
         h->dev);
    end(t, OP_RELEASE, st);
    slot_unlock(h->slot);
    budget_give(&h->n);
}

/* While t holds a read acquisition: calls that conflict with it must fail
 * with UM_ERR_BUSY and change nothing. */
static void conflict_checks(thr *t, hold *h)
{
    slot *s = &W.slots[h->slot];
    void *p = NULL;
    int dev = (int)below(t, NDEV);
    um_status st;
    begin(t, OP_ACQ_CONFLICT, dev, s->size);
    switch (below(t, 3)) {
    case 0:
        st = um_buffer_acquire(
            s->b, dev, chance(t, 50) ? UM_ACCESS_READ_WRITE : UM_ACCESS_WRITE_DISCARD, NULL, &p);
        note(OP_ACQ_CONFLICT, st, st == UM_ERR_BUSY,
             "a write acquisition on device %d of a "
             "buffer acquired for reading",
             dev);
        if (st == UM_OK)
            (void)um_buffer_release(s->b, dev, NULL);
        break;
    case 1: {
        unsigned char x = 0;
        st = um_buffer_write(s->b, 0, &x, 1);
        note(OP_ACQ_CONFLICT, st, st == UM_ERR_BUSY,
             "um_buffer_write of a buffer acquired for "
             "reading");
        break;
    }
    default:
        /* Refused, it must also keep the buffer's task record (a failed
         * last writer included: stress finding F2, fixed in cdb0042), which
         * the model of the task layer then checks. */
        st = um_buffer_destroy(s->b);
        note(OP_ACQ_CONFLICT, st, st == UM_ERR_BUSY, "um_buffer_destroy of an acquired buffer");
        if (st == UM_OK) {
            /* Gone under our feet: the slot forgets it (a failure already). */
            s->b = NULL;
            h->ptr = NULL;
        }
        break;
    }
    end(t, OP_ACQ_CONFLICT, st);
}

static void op_acquire(thr *t)
{
    unsigned r = (unsigned)below(t, 100);
    um_access mode = r < 40   ? UM_ACCESS_READ
                     : r < 55 ? UM_ACCESS_WRITE
                     : r < 80 ? UM_ACCESS_READ_WRITE
                              : UM_ACCESS_WRITE_DISCARD;
    int op = acquire_op(mode);
    int i = slot_lock(t, mode != UM_ACCESS_READ, 1, op);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    tl_slot = s;
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(op, true);
        return;
    }
    int dev = (int)below(t, NDEV);
    um_stream us = chance(t, 50) ? t->st[dev] : NULL;
    void *p = NULL;
    begin(t, op, dev, s->size);
    um_status st = um_buffer_acquire(s->b, dev, mode, us, &p);
    note(op, st, st == UM_OK, "buffer id %llu (%zu bytes) on device %d, stream %p",
         (unsigned long long)s->id, s->size, dev, (void *)us);
    if (st == UM_OK && us) {
        um_status s2 = um_stream_synchronize(W.ctx, us);
        note(OP_STREAM_SYNC, s2, s2 == UM_OK, "device %d", dev);
    }
    end(t, op, st);
    if (st != UM_OK || !p) {
        CHECK(st != UM_OK || p != NULL);
        slot_unlock(i);
        budget_give(&n);
        return;
    }
    /* Acquired, the replica cannot be evicted: valid, and the owner after
     * a write acquisition. */
    um_replica_state rs = um_buffer_replica_state(s->b, dev);
    if (mode == UM_ACCESS_READ)
        CHECK(rs == UM_REPLICA_SHARED || rs == UM_REPLICA_OWNER);
    else
        CHECK_EQ(rs, UM_REPLICA_OWNER);
    if (mode != UM_ACCESS_WRITE_DISCARD)
        model_check(mode == UM_ACCESS_READ ? "read acquisition" : "write acquisition (copied in)",
                    dev, s->id, s->size, s->gen, p, 0, s->size);
    if (mode != UM_ACCESS_READ) {
        size_t c0 = 0, c1 = s->nchunks;
        if (mode == UM_ACCESS_WRITE)
            chunk_range(t, s->nchunks, &c0, &c1);
        uint32_t g = new_gen();
        fill_chunks(p, s->id, s->size, c0, c1, g);
        slot_fill_model_op(s, c0, c1, g, op, dev);
    }
    hold h = {i, dev, mode, us, p, n, 1 + (int)below(t, 5), op};
    if (!t->holding && chance(t, 20)) {
        if (mode == UM_ACCESS_READ && chance(t, 50))
            conflict_checks(t, &h);
        if (h.ptr) {
            t->h = h;
            t->holding = true;
            return;
        }
    }
    if (h.ptr)
        finish_hold(t, &h);
    else {
        slot_unlock(i);
        budget_give(&n);
    }
}

/* Acquire READ on one device, um_memcpy of the replica into a new block on
 * another, checked against the buffer's model. */
static void op_memcpy_replica(thr *t)
{
    int i = slot_lock(t, false, 1, OP_MEMCPY_REPLICA);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    tl_slot = s;
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(OP_MEMCPY_REPLICA, true);
        return;
    }
    int dev = (int)below(t, NDEV), bdev = (int)below(t, NDEV);
    blk k;
    if (block_alloc(t, bdev, s->size, 0, NULL, OP_MEMCPY_REPLICA, &k)) {
        void *p = NULL;
        begin(t, OP_ACQ_READ, dev, s->size);
        um_status st = um_buffer_acquire(s->b, dev, UM_ACCESS_READ, NULL, &p);
        note(OP_ACQ_READ, st, st == UM_OK, "buffer id %llu on device %d (for a copy)",
             (unsigned long long)s->id, dev);
        end(t, OP_ACQ_READ, st);
        if (st == UM_OK) {
            begin(t, OP_MEMCPY_REPLICA, bdev, s->size);
            um_status s2 = um_memcpy(W.ctx, k.p, p, s->size);
            note(OP_MEMCPY_REPLICA, s2, s2 == UM_OK,
                 "%zu bytes from a replica on device %d to "
                 "device %d",
                 s->size, dev, bdev);
            end(t, OP_MEMCPY_REPLICA, s2);
            begin(t, OP_RELEASE, dev, s->size);
            um_status s3 = um_buffer_release(s->b, dev, NULL);
            note(OP_RELEASE, s3, s3 == UM_OK, "buffer id %llu on device %d",
                 (unsigned long long)s->id, dev);
            end(t, OP_RELEASE, s3);
            if (s2 == UM_OK)
                model_check("copy of a replica", bdev, s->id, s->size, s->gen, k.p, 0, s->size);
        }
        /* The block now holds the buffer's bytes: refill it for its free. */
        k.id = atomic_fetch_add(&W.next_id, 1);
        harness_pattern_fill(k.p, k.size, k.id);
        block_free(t, &k, NULL);
    }
    slot_unlock(i);
    budget_give(&n);
}

/* ------------------------------------------------------ buffer calls */

static void op_buf_write(thr *t)
{
    int i = slot_lock(t, true, 1, OP_BUF_WRITE);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(OP_BUF_WRITE, true);
        return;
    }
    size_t c0, c1;
    chunk_range(t, s->nchunks, &c0, &c1);
    size_t off = c0 * CHUNK, end_b = c1 * CHUNK < s->size ? c1 * CHUNK : s->size;
    unsigned char *h = malloc(s->nchunks * CHUNK);
    uint32_t g = new_gen();
    fill_chunks(h, s->id, s->size, c0, c1, g);
    begin(t, OP_BUF_WRITE, -1, end_b - off);
    um_status st = um_buffer_write(s->b, off, h + off, end_b - off);
    note(OP_BUF_WRITE, st, st == UM_OK, "buffer id %llu, %zu bytes at %zu",
         (unsigned long long)s->id, end_b - off, off);
    end(t, OP_BUF_WRITE, st);
    if (st == UM_OK)
        slot_fill_model_op(s, c0, c1, g, OP_BUF_WRITE, -1);
    free(h);
    slot_unlock(i);
    budget_give(&n);
}

static void op_buf_read(thr *t)
{
    int i = slot_lock(t, false, 1, OP_BUF_READ);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    tl_slot = s;
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(OP_BUF_READ, true);
        return;
    }
    size_t off = 0, len = s->size;
    if (chance(t, 60)) {
        off = below(t, s->size);
        len = 1 + below(t, s->size - off);
    }
    unsigned char *h = malloc(len);
    begin(t, OP_BUF_READ, -1, len);
    um_status st = um_buffer_read(s->b, off, h, len);
    note(OP_BUF_READ, st, st == UM_OK, "buffer id %llu, %zu bytes at %zu",
         (unsigned long long)s->id, len, off);
    end(t, OP_BUF_READ, st);
    if (st == UM_OK)
        model_check("um_buffer_read", 0, s->id, s->size, s->gen, h, off, len);
    free(h);
    slot_unlock(i);
    budget_give(&n);
}

/* Prefetch, WONT_USE and WILL_USE hints, replica states: shared. */
static void op_shared_call(thr *t, int op)
{
    int i = slot_lock(t, false, 1, op);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(op, true);
        return;
    }
    int dev = (int)below(t, NDEV);
    um_status st;
    begin(t, op, dev, s->size);
    if (op == OP_PREFETCH) {
        st = um_buffer_prefetch(s->b, dev);
        note(op, st, st == UM_OK, "buffer id %llu to device %d", (unsigned long long)s->id, dev);
    } else {
        st = um_buffer_hint(s->b, op == OP_HINT_WONT ? UM_HINT_WONT_USE : UM_HINT_WILL_USE);
        note(op, st, st == UM_OK, "buffer id %llu", (unsigned long long)s->id);
    }
    end(t, op, st);
    slot_unlock(i);
    budget_give(&n);
}

static void op_pin(thr *t, bool pin)
{
    int op = pin ? OP_PIN : OP_UNPIN;
    int i = -1;
    if (pin) {
        i = slot_lock(t, true, 1, op);
    } else {
        /* A pinned slot, looked for from a random place. */
        int start = (int)below(t, (uint64_t)W.nslots);
        for (int k = 0; k < 64 && i < 0; k++) {
            int j = (start + k) % W.nslots;
            if (pthread_rwlock_trywrlock(&W.slots[j].lock) != 0)
                continue;
            if (W.slots[j].b && W.slots[j].pinned)
                i = j;
            else
                pthread_rwlock_unlock(&W.slots[j].lock);
        }
    }
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    if (pin == s->pinned) {
        slot_unlock(i);
        return;
    }
    need n = buffer_need(s->size);
    if (pin && !budget_take(&n)) {
        slot_unlock(i);
        skipped(op, true);
        return;
    }
    begin(t, op, -1, s->size);
    um_status st = um_buffer_hint(s->b, pin ? UM_HINT_PIN : UM_HINT_UNPIN);
    note(op, st, st == UM_OK, "buffer id %llu", (unsigned long long)s->id);
    end(t, op, st);
    if (st == UM_OK) {
        s->pinned = pin;
        if (!pin)
            budget_give(&n);
    } else if (pin) {
        budget_give(&n);
    }
    slot_unlock(i);
}

static void slot_new_buffer(thr *t, slot *s, int dev)
{
    (void)t;
    free(s->gen);
    s->nchunks = nchunks_of(s->size);
    s->gen = calloc(s->nchunks, sizeof *s->gen);
    s->id = atomic_fetch_add(&W.next_id, 1);
    s->pinned = false;
    s->poisoned = false;
    s->nhist = 0;
    (void)dev;
}

static void op_create(thr *t)
{
    if (atomic_load(&W.live_buffers) >= W.nslots)
        return;
    int i = -1;
    int start = (int)below(t, (uint64_t)W.nslots);
    for (int k = 0; k < 64 && i < 0; k++) {
        int j = (start + k) % W.nslots;
        if (pthread_rwlock_trywrlock(&W.slots[j].lock) != 0)
            continue;
        if (!W.slots[j].b)
            i = j;
        else
            pthread_rwlock_unlock(&W.slots[j].lock);
    }
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    s->size = buffer_size(t, s->small);
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(OP_BUF_CREATE, true);
        return;
    }
    /* With a first device (made at once, zeros) or not (-1, or no
     * options). The first used to race with reclaim (stress finding F1, fixed
     * in cdb0042). */
    um_buffer_opts o = {chance(t, 30) ? (int)below(t, NDEV) : -1};
    begin(t, OP_BUF_CREATE, o.device, s->size);
    um_buffer *b = NULL;
    um_status st = um_buffer_create(W.ctx, s->size, o.device >= 0 || chance(t, 50) ? &o : NULL, &b);
    note(OP_BUF_CREATE, st, st == UM_OK, "%zu bytes, first device %d", s->size, o.device);
    end(t, OP_BUF_CREATE, st);
    if (st == UM_OK) {
        slot_new_buffer(t, s, o.device);
        s->b = b;
        atomic_fetch_add(&W.live_buffers, 1);
        CHECK_EQ(um_buffer_size(b), s->size);
        if (o.device >= 0) {
            /* Its first replica is made there (it may be evicted at once). */
            um_replica_state rs = um_buffer_replica_state(b, o.device);
            CHECK(rs == UM_REPLICA_OWNER || rs == UM_REPLICA_INVALID);
        }
    }
    slot_unlock(i);
    budget_give(&n);
}

static void op_destroy(thr *t)
{
    if (atomic_load(&W.live_buffers) < W.nslots * 9 / 10)
        return;
    int i = slot_lock(t, true, 1, OP_BUF_DESTROY);
    if (i < 0)
        return;
    slot *s = &W.slots[i];
    need n = buffer_need(s->size);
    if (!budget_take(&n)) {
        slot_unlock(i);
        skipped(OP_BUF_DESTROY, true);
        return;
    }
    begin(t, OP_BUF_DESTROY, -1, s->size);
    um_status st = um_buffer_destroy(s->b);
    note(OP_BUF_DESTROY, st, st == UM_OK, "buffer id %llu", (unsigned long long)s->id);
    end(t, OP_BUF_DESTROY, st);
    if (st == UM_OK) {
        s->b = NULL;
        atomic_fetch_sub(&W.live_buffers, 1);
        if (s->pinned)
            budget_give(&n);
        s->pinned = false;
    }
    slot_unlock(i);
    budget_give(&n);
}

/* A buffer of the program's memory: written on one device, read on
 * another, destroyed: the memory must hold the newest data. */
static void op_wrap(thr *t)
{
    size_t size = 1 + below(t, MIB);
    need n = buffer_need(size);
    if (!budget_take(&n)) {
        skipped(OP_WRAP, true);
        return;
    }
    size_t nc = nchunks_of(size);
    uint32_t *gen = calloc(nc, sizeof *gen);
    unsigned char *mem = aligned_alloc(256, nc * CHUNK);
    uint64_t id = atomic_fetch_add(&W.next_id, 1);
    uint32_t g = new_gen();
    fill_chunks(mem, id, size, 0, nc, g);
    for (size_t c = 0; c < nc; c++)
        gen[c] = g;
    um_buffer *b = NULL;
    begin(t, OP_WRAP, 0, size);
    um_status st = um_buffer_wrap(W.ctx, mem, size, &b);
    note(OP_WRAP, st, st == UM_OK, "%zu bytes", size);
    if (st == UM_OK) {
        int d1 = 1 + (int)below(t, NSIM), d2 = (int)below(t, NDEV);
        void *p = NULL;
        st = um_buffer_acquire(b, d1, UM_ACCESS_READ_WRITE, NULL, &p);
        note(OP_ACQ_RW, st, st == UM_OK, "wrapped buffer on device %d", d1);
        if (st == UM_OK) {
            model_check("wrapped buffer", d1, id, size, gen, p, 0, size);
            size_t c0, c1;
            chunk_range(t, nc, &c0, &c1);
            g = new_gen();
            fill_chunks(p, id, size, c0, c1, g);
            for (size_t c = c0; c < c1; c++)
                gen[c] = g;
            st = um_buffer_release(b, d1, NULL);
            note(OP_RELEASE, st, st == UM_OK, "wrapped buffer on device %d", d1);
        }
        st = um_buffer_acquire(b, d2, UM_ACCESS_READ, NULL, &p);
        note(OP_ACQ_READ, st, st == UM_OK, "wrapped buffer on device %d", d2);
        if (st == UM_OK) {
            model_check("wrapped buffer", d2, id, size, gen, p, 0, size);
            st = um_buffer_release(b, d2, NULL);
            note(OP_RELEASE, st, st == UM_OK, "wrapped buffer on device %d", d2);
        }
        st = um_buffer_destroy(b);
        note(OP_BUF_DESTROY, st, st == UM_OK, "wrapped buffer");
        if (st == UM_OK)
            model_check("wrapped memory after um_buffer_destroy", 0, id, size, gen, mem, 0, size);
    }
    end(t, OP_WRAP, st);
    free(mem);
    free(gen);
    budget_give(&n);
}

/* ----------------------------------------------------------------- tasks */

static void task_done_cb(um_task_id id, um_status st, void *user)
{
    (void)id;
    (void)st;
    (void)user;
    atomic_fetch_add(&W.task_callbacks, 1);
}

/* The host implementation (host and sim devices): checks what it reads,
 * then xors the next generation into what it writes. */
static int task_cpu_body(const um_task_exec *e);
static int task_cpu(const um_task_exec *e)
{
    task_rec *tr = e->user;
    atomic_fetch_add(&tr->ran, 1);
    int rc = task_cpu_body(e);
    if (!rc)
        atomic_fetch_add(&tr->ran_ok, 1);
    return rc;
}

static int task_cpu_body(const um_task_exec *e)
{
    const task_rec *tr = e->user;
    if (e->device >= 0 && e->device < NDEV)
        atomic_fetch_add(&W.task_ran[e->device], 1);
    if (e->nbuffers != tr->nb)
        return 1;
    for (int i = 0; i < tr->nb; i++) {
        const task_buf *tb = &tr->tb[i];
        if (e->sizes[i] != tb->size || !e->ptrs[i]) {
            harness_report(__FILE__, __LINE__, "task: buffer %d has %zu bytes at %p, expected %zu",
                           i, e->sizes[i], e->ptrs[i], tb->size);
            return 1;
        }
        tl_slot = &W.slots[tb->slot];
        if (tb->mode == UM_ACCESS_READ && !model_check("task input", e->device, tb->id, tb->size,
                                                       tb->old, e->ptrs[i], 0, tb->size))
            return 1;
    }
    for (int i = 0; i < tr->nb; i++) {
        const task_buf *tb = &tr->tb[i];
        if (tb->mode == UM_ACCESS_WRITE_DISCARD)
            fill_chunks(e->ptrs[i], tb->id, tb->size, 0, tb->nchunks, tb->newgen);
        else if (tb->mode != UM_ACCESS_READ)
            xor_chunks(e->ptrs[i], tb->id, tb->size, tb->wlo, tb->whi, tb->old, tb->newgen);
    }
    return 0;
}

static void batch_release(thr *t)
{
    batch *bt = &t->bt;
    for (int k = 0; k < bt->ntasks; k++)
        for (int j = 0; j < bt->t[k].nb; j++)
            free(bt->t[k].tb[j].old);
    for (int j = 0; j < bt->nslots; j++)
        slot_unlock(bt->slots[j]);
    budget_give(&bt->n);
    t->batching = false;
}

/* Waits for every task of t's batch and checks each outcome against the
 * model of the task layer, then applies their effects. */
static void op_task_wait(thr *t)
{
    batch *bt = &t->bt;
    /* The poison of the batch's slots as tasks finish, in order. */
    bool poisoned[BATCH_SLOTS];
    um_task_id poisoner[BATCH_SLOTS];
    um_status poison_status[BATCH_SLOTS];
    for (int j = 0; j < bt->nslots; j++) {
        poisoned[j] = W.slots[bt->slots[j]].poisoned;
        poisoner[j] = W.slots[bt->slots[j]].poisoner;
        poison_status[j] = W.slots[bt->slots[j]].poison_status;
    }
    for (int k = 0; k < bt->ntasks; k++) {
        task_rec *tr = &bt->t[k];
        begin(t, OP_TASK_WAIT, -1, 0);
        um_status st = um_task_wait(W.ctx, tr->id);
        end(t, OP_TASK_WAIT, st);
        /* What the task layer must say: a task fails when it reads data
         * whose last writer failed or was cancelled (it is poisoned);
         * writing after a failed reader, or replacing the data whole
         * (WRITE_DISCARD), runs, whenever the failure happened. */
        bool must_fail = false;
        for (int i = 0; i < tr->nb; i++) {
            int j = 0;
            while (bt->slots[j] != tr->tb[i].slot)
                j++;
            if (tr->tb[i].mode != UM_ACCESS_WRITE_DISCARD && poisoned[j])
                must_fail = true;
        }
        bool ok = tr->cancelled ? st == UM_ERR_CANCELLED
                  : must_fail   ? st == UM_ERR_TASK
                                : st == UM_OK;
        /* It ran exactly once if it succeeded, and not at all if it was
         * cancelled or failed for a dependency. */
        int ran = atomic_load(&tr->ran);
        if ((st == UM_OK && ran != 1) || (st == UM_ERR_CANCELLED && ran != 0) ||
            (st == UM_ERR_TASK && ran > 1))
            harness_report(__FILE__, __LINE__,
                           "task %llu ended with %s but its implementation ran %d times (%d "
                           "successfully)%s",
                           (unsigned long long)tr->id, um_status_name(st), ran,
                           atomic_load(&tr->ran_ok), tr->cancelled ? " (cancelled)" : "");
        char modes[64] = "";
        for (int i = 0; i < tr->nb; i++) {
            int j = 0;
            while (bt->slots[j] != tr->tb[i].slot)
                j++;
            char one[48];
            snprintf(one, sizeof one, "%s%d%s(p%llu:%s)", i ? "," : "", (int)tr->tb[i].mode,
                     poisoned[j] ? "*" : "", (unsigned long long)poisoner[j],
                     poisoned[j] ? um_status_name(poison_status[j]) : "-");
            strncat(modes, one, sizeof modes - strlen(modes) - 1);
        }
        note(OP_TASK_WAIT, st, ok, "task %llu (%d buffers %s, batch task %d of %d%s%s)",
             (unsigned long long)tr->id, tr->nb, modes, k + 1, bt->ntasks,
             tr->cancelled ? ", cancelled" : "", must_fail ? ", reads a poisoned buffer" : "");
        for (int i = 0; i < tr->nb; i++) {
            task_buf *tb = &tr->tb[i];
            int j = 0;
            while (bt->slots[j] != tb->slot)
                j++;
            slot *s = &W.slots[tb->slot];
            slot_note_task(s, tr->id, tb->mode, st, tb->newgen);
            if (tb->mode == UM_ACCESS_READ)
                continue;
            if (st == UM_OK) {
                if (tb->mode == UM_ACCESS_WRITE_DISCARD) {
                    slot_fill_model_op(s, 0, s->nchunks, tb->newgen, OP_TASK_WAIT, -1);
                } else {
                    slot_fill_model_op(s, tb->wlo, tb->whi, tb->newgen, OP_TASK_WAIT, -1);
                }
                poisoned[j] = false;
            } else {
                /* It did not run (or failed running): the data is as
                 * before, but poisoned for readers. */
                poisoned[j] = true;
                poisoner[j] = tr->id;
                poison_status[j] = st;
            }
        }
    }
    for (int j = 0; j < bt->nslots; j++) {
        W.slots[bt->slots[j]].poisoned = poisoned[j];
        W.slots[bt->slots[j]].poisoner = poisoner[j];
        W.slots[bt->slots[j]].poison_status = poison_status[j];
    }
    batch_release(t);
}

/* 1-3 tasks over 1-4 buffers that t holds alone until it waits for them. */
static void op_task_submit(thr *t)
{
    batch *bt = &t->bt;
    memset(bt, 0, sizeof *bt);
    int want = 1 + (int)below(t, BATCH_SLOTS);
    for (int k = 0; k < want; k++) {
        int i = slot_lock(t, true, 1, OP_TASK_SUBMIT);
        if (i < 0)
            continue;
        bool dup = false;
        for (int j = 0; j < bt->nslots; j++)
            dup |= bt->slots[j] == i;
        if (dup) { /* cannot happen: the lock is held */
            slot_unlock(i);
            continue;
        }
        bt->slots[bt->nslots++] = i;
    }
    if (!bt->nslots)
        return;
    need n = {{0}, false};
    for (int j = 0; j < bt->nslots; j++) {
        need b = buffer_need(W.slots[bt->slots[j]].size);
        need_add(&n, &b);
    }
    bt->n = n;
    if (!budget_take(&bt->n)) {
        bt->n = (need){{0}, false};
        batch_release(t);
        skipped(OP_TASK_SUBMIT, true);
        return;
    }
    t->batching = true;
    /* The generations each task will see, assuming the earlier ones of the
     * batch succeed (if one fails, those after it on the same buffer fail
     * too and their view does not matter). */
    uint32_t *pred[BATCH_SLOTS];
    for (int j = 0; j < bt->nslots; j++) {
        slot *s = &W.slots[bt->slots[j]];
        pred[j] = malloc(s->nchunks * sizeof *pred[j]);
        memcpy(pred[j], s->gen, s->nchunks * sizeof *pred[j]);
    }
    int ntasks = 1 + (int)below(t, BATCH_TASKS);
    for (int k = 0; k < ntasks; k++) {
        task_rec *tr = &bt->t[bt->ntasks];
        memset(tr, 0, sizeof *tr);
        um_task ut;
        memset(&ut, 0, sizeof ut);
        ut.name = chance(t, 50) ? "stress_xor" : "stress_check";
        ut.cpu = task_cpu;
        ut.device = chance(t, 60) ? -1 : (int)below(t, NDEV);
        ut.flops = (double)(1 + below(t, 4)) * 1e5;
        ut.user = tr;
        ut.done = task_done_cb;
        int nb = 1 + (int)below(t, (uint64_t)(bt->nslots < TASK_BUFS ? bt->nslots : TASK_BUFS));
        int first = (int)below(t, (uint64_t)bt->nslots);
        for (int i = 0; i < nb; i++) {
            int j = (first + i) % bt->nslots;
            slot *s = &W.slots[bt->slots[j]];
            task_buf *tb = &tr->tb[i];
            unsigned r = (unsigned)below(t, 100);
            um_access m = r < 35   ? UM_ACCESS_READ
                          : r < 65 ? UM_ACCESS_READ_WRITE
                          : r < 80 ? UM_ACCESS_WRITE
                                   : UM_ACCESS_WRITE_DISCARD;
            if (s->poisoned && chance(t, 80))
                m = UM_ACCESS_WRITE_DISCARD; /* the repair */
            tb->slot = bt->slots[j];
            tb->id = s->id;
            tb->size = s->size;
            tb->nchunks = s->nchunks;
            tb->mode = m;
            tb->old = malloc(s->nchunks * sizeof *tb->old);
            memcpy(tb->old, pred[j], s->nchunks * sizeof *tb->old);
            tb->wlo = 0;
            tb->whi = s->nchunks;
            if (m == UM_ACCESS_WRITE)
                chunk_range(t, s->nchunks, &tb->wlo, &tb->whi);
            if (m != UM_ACCESS_READ) {
                tb->newgen = new_gen();
                size_t lo = m == UM_ACCESS_WRITE_DISCARD ? 0 : tb->wlo;
                size_t hi = m == UM_ACCESS_WRITE_DISCARD ? s->nchunks : tb->whi;
                for (size_t c = lo; c < hi; c++)
                    pred[j][c] = tb->newgen;
            }
            ut.buffers[i] = s->b;
            ut.modes[i] = m;
        }
        ut.nbuffers = nb;
        tr->nb = nb;
        begin(t, OP_TASK_SUBMIT, ut.device, 0);
        um_status st = um_task_submit(W.ctx, &ut, &tr->id);
        note(OP_TASK_SUBMIT, st, st == UM_OK, "a task of %d buffers on device %d", nb, ut.device);
        end(t, OP_TASK_SUBMIT, st);
        if (st != UM_OK) {
            for (int i = 0; i < nb; i++)
                free(tr->tb[i].old);
            break;
        }
        atomic_fetch_add(&W.tasks_submitted, 1);
        bt->ntasks++;
        if (chance(t, 5)) {
            begin(t, OP_TASK_CANCEL, -1, 0);
            um_status c = um_task_cancel(W.ctx, tr->id);
            note(OP_TASK_CANCEL, c, c == UM_OK || c == UM_ERR_BUSY, "task %llu",
                 (unsigned long long)tr->id);
            end(t, OP_TASK_CANCEL, c);
            tr->cancelled = c == UM_OK;
            if (c == UM_OK)
                atomic_fetch_add(&W.tasks_cancelled, 1);
        }
    }
    for (int j = 0; j < bt->nslots; j++)
        free(pred[j]);
    bt->ops_since = 0;
    if (!bt->ntasks)
        batch_release(t);
}

static void op_task_cancel(thr *t)
{
    batch *bt = &t->bt;
    if (!t->batching || !bt->ntasks)
        return;
    task_rec *tr = &bt->t[below(t, (uint64_t)bt->ntasks)];
    if (tr->cancelled)
        return;
    begin(t, OP_TASK_CANCEL, -1, 0);
    um_status c = um_task_cancel(W.ctx, tr->id);
    note(OP_TASK_CANCEL, c, c == UM_OK || c == UM_ERR_BUSY, "task %llu",
         (unsigned long long)tr->id);
    end(t, OP_TASK_CANCEL, c);
    tr->cancelled = c == UM_OK;
    if (c == UM_OK)
        atomic_fetch_add(&W.tasks_cancelled, 1);
}

/* ------------------------------------------------------- memory control */

static void op_control(thr *t, int op)
{
    um_status st = UM_OK;
    bool ok = true;
    int dev;
    switch (op) {
    case OP_TRIM:
        dev = (int)below(t, NDEV);
        begin(t, op, dev, 0);
        st = um_trim(W.ctx, dev);
        ok = st == UM_OK;
        break;
    case OP_SET_LIMIT: {
        size_t lim;
        if (chance(t, 10)) {
            dev = 0;
            lim = HOST_LIMIT_MIN + below(t, (HOST_LIMIT_MAX - HOST_LIMIT_MIN) / MIB + 1) * MIB;
        } else {
            dev = 1 + (int)below(t, NSIM);
            /* The lower half more often: raising always works, lowering
             * often waits (below). */
            size_t span = (LIMIT_MAX - LIMIT_MIN) / (2 * MIB) + 1;
            lim = LIMIT_MIN + below(t, span) * 2 * MIB;
            /* Raising always works and lowering often does not (reserved
             * memory in partly used pages stays): raise a quarter of the
             * time only, so that the limits do not all end at the top. */
            um_device_info info;
            if (um_device_info_get(W.ctx, dev, &info) == UM_OK && lim > info.memory_limit &&
                chance(t, 75))
                lim = info.memory_limit > LIMIT_MIN ? info.memory_limit - 2 * MIB : LIMIT_MIN;
        }
        begin(t, op, dev, lim);
        st = um_set_memory_limit(W.ctx, dev, lim);
        /* Lowering it under live data is refused, documented (replicas are
         * not evicted for it); watermarks under the new limit make the
         * background reclaimer bring the device down, and it is tried
         * again for a while. */
        ok = st == UM_OK || st == UM_ERR_BUSY;
        if (st == UM_ERR_BUSY && dev > 0) {
            um_status s2 = um_set_watermarks(W.ctx, dev, lim / 2, lim * 3 / 4);
            note(OP_WATERMARKS, s2, s2 == UM_OK, "device %d, under a refused limit", dev);
            for (int k = 0; k < 10 && st == UM_ERR_BUSY; k++) {
                note(op, st, true, "device %d", dev);
                usleep(2000);
                st = um_set_memory_limit(W.ctx, dev, lim);
            }
        }
        break;
    }
    case OP_SET_CACHE: {
        static const size_t choices[] = {0,        1 * MIB,  4 * MIB,
                                         16 * MIB, 64 * MIB, UM_NO_CACHE_LIMIT};
        dev = (int)below(t, NDEV);
        size_t c = choices[below(t, 6)];
        begin(t, op, dev, c);
        st = um_set_cache_limit(W.ctx, dev, c);
        ok = st == UM_OK;
        break;
    }
    default: { /* OP_WATERMARKS */
        size_t lo = 0, hi = 0;
        if (chance(t, 10)) {
            dev = 0;
            if (chance(t, 70)) {
                lo = 512 * MIB + below(t, 256) * MIB;
                hi = lo + below(t, 256) * MIB;
            }
        } else {
            dev = 1 + (int)below(t, NSIM);
            if (chance(t, 70)) {
                lo = LIMIT_MIN / 2 + below(t, (LIMIT_MAX - LIMIT_MIN / 2) / MIB) * MIB;
                hi = lo + below(t, 8) * MIB;
            }
        }
        begin(t, op, dev, hi);
        st = um_set_watermarks(W.ctx, dev, lo, hi);
        ok = st == UM_OK;
        break;
    }
    }
    note(op, st, ok, "device %d", dev);
    end(t, op, st);
}

static void check_stats_shape(int dev, const um_stats *s, const um_device_info *info)
{
    CHECK_EQ(s->version, UM_STATS_VERSION);
    CHECK(s->reserved_bytes <= info->capacity);
    CHECK(s->peak_reserved_bytes <= info->capacity);
    CHECK(s->fragmentation >= 0.0 && s->fragmentation <= 1.0);
    CHECK(s->num_cache_hits <= s->num_allocs);
    if (dev > 0)
        CHECK(info->memory_limit >= LIMIT_MIN && info->memory_limit <= LIMIT_MAX);
}

static void op_stats(thr *t)
{
    int dev = (int)below(t, NDEV);
    um_status st = UM_OK;
    begin(t, OP_STATS, dev, 0);
    switch (below(t, 9)) {
    case 0: {
        um_stats s;
        um_device_info info;
        st = um_stats_get(W.ctx, dev, &s);
        if (st == UM_OK)
            st = um_device_info_get(W.ctx, dev, &info);
        if (st == UM_OK)
            check_stats_shape(dev, &s, &info);
        break;
    }
    case 1: {
        char buf[1024], want[32];
        size_t needed = 0;
        st = um_stats_json(W.ctx, dev, buf, sizeof buf, &needed);
        snprintf(want, sizeof want, "{\"device\":%d,", dev);
        if (st == UM_OK) {
            CHECK(strncmp(buf, want, strlen(want)) == 0);
            CHECK_EQ(needed, strlen(buf));
        }
        break;
    }
    case 2: {
        um_reclaim_stats r;
        st = um_reclaim_stats_get(W.ctx, dev, &r);
        if (st == UM_OK) {
            /* written_back is counted before evictions, one eviction at a time. */
            CHECK(r.written_back <= r.evictions + 1);
            CHECK_EQ(r.spilled, 0);
        }
        break;
    }
    case 3: {
        um_link_stats l;
        int from = (int)below(t, NDEV + 1) - 1, to = (int)below(t, NDEV + 1) - 1;
        st = um_link_stats_get(W.ctx, from, to, &l);
        break;
    }
    case 4: {
        um_task_stats ts;
        st = um_task_stats_get(W.ctx, dev, &ts);
        break;
    }
    case 5: {
        size_t fr = 0, tot = 0;
        st = um_device_memory_get(W.ctx, dev, &fr, &tot);
        if (st == UM_OK)
            CHECK(fr <= tot);
        break;
    }
    case 6:
        st = um_reset_peak(W.ctx, dev);
        break;
    case 7: {
        /* A replica state, and a block's device. */
        int i = slot_lock(t, false, 1, OP_STATS);
        if (i >= 0) {
            um_replica_state rs = um_buffer_replica_state(W.slots[i].b, dev);
            CHECK(rs == UM_REPLICA_INVALID || rs == UM_REPLICA_SHARED || rs == UM_REPLICA_OWNER);
            slot_unlock(i);
        }
        if (t->nblocks) {
            blk *k = &t->blocks[below(t, (uint64_t)t->nblocks)];
            CHECK_EQ(um_pointer_device(W.ctx, k->p), k->dev);
            CHECK_EQ(um_pointer_device(W.ctx, (char *)k->p + k->size - 1), k->dev);
        }
        break;
    }
    default: {
        if (W.devnull && chance(t, 10))
            um_stats_print(W.ctx, W.devnull); /* every device; rare */
        break;
    }
    }
    note(OP_STATS, st, st == UM_OK, "device %d", dev);
    end(t, OP_STATS, st);
}

/* Streams made and destroyed while work goes on. */
static void op_stream_churn(thr *t)
{
    int dev = (int)below(t, NDEV);
    um_stream s = NULL;
    begin(t, OP_STREAM_CHURN, dev, 0);
    um_status st = um_stream_create(W.ctx, dev, &s);
    note(OP_STREAM_CHURN, st, st == UM_OK, "create on device %d", dev);
    end(t, OP_STREAM_CHURN, st);
    if (st != UM_OK)
        return;
    CHECK_EQ(um_stream_device(s), dev);
    blk k;
    size_t size = 1 + below(t, 256 * KIB);
    if (block_alloc(t, dev, size, atomic_fetch_add(&W.next_id, 1), s, OP_STREAM_CHURN, &k)) {
        harness_pattern_fill(k.p, k.size, k.id);
        block_free(t, &k, s);
    }
    begin(t, OP_STREAM_CHURN, dev, 0);
    st = um_stream_synchronize(W.ctx, s);
    note(OP_STREAM_SYNC, st, st == UM_OK, "device %d", dev);
    st = um_stream_destroy(W.ctx, s);
    note(OP_STREAM_CHURN, st, st == UM_OK, "destroy on device %d", dev);
    end(t, OP_STREAM_CHURN, st);
}

/* Requests that cannot fit at all, at most one every 2 s: more than a
 * device has, and a buffer larger than any limit. Both must fail with
 * UM_ERR_NOMEM saying why, and leave everything else as it was. */
static void op_probe(thr *t)
{
    uint64_t now = now_ns(), last = atomic_load(&W.last_probe_ns);
    if (now - last < 2000000000ull || !atomic_compare_exchange_strong(&W.last_probe_ns, &last, now))
        return;
    int dev = 1 + (int)below(t, NSIM);
    begin(t, OP_PROBE, dev, SIM_CAPACITY + 1);
    if (chance(t, 50)) {
        void *p = NULL;
        um_status st = um_malloc(W.ctx, dev, SIM_CAPACITY + 1, NULL, &p);
        bool ok = st == UM_ERR_NOMEM &&
                  harness_error_mentions("the request alone exceeds the limit", NULL, NULL);
        note(OP_PROBE, st, ok, "um_malloc of %zu bytes on device %d", SIM_CAPACITY + 1, dev);
        if (st == UM_ERR_NOMEM)
            atomic_fetch_add(&expected_nomem_reclaimed, 1);
        if (st == UM_OK)
            (void)um_free(W.ctx, p, NULL);
        end(t, OP_PROBE, st);
        return;
    }
    um_buffer *b = NULL;
    size_t size = SIM_CAPACITY + 2 * MIB;
    um_status st = um_buffer_create(W.ctx, size, NULL, &b);
    note(OP_BUF_CREATE, st, st == UM_OK, "a probe of %zu bytes", size);
    if (st == UM_OK) {
        void *p = NULL;
        st = um_buffer_acquire(b, dev, UM_ACCESS_WRITE_DISCARD, NULL, &p);
        bool ok = st == UM_ERR_NOMEM;
        note(OP_PROBE, st, ok, "acquire of %zu bytes on device %d", size, dev);
        if (st == UM_ERR_NOMEM)
            atomic_fetch_add(&expected_nomem_reclaimed, 1);
        if (st == UM_OK)
            (void)um_buffer_release(b, dev, NULL);
        st = um_buffer_destroy(b);
        note(OP_BUF_DESTROY, st, st == UM_OK, "the probe");
    }
    end(t, OP_PROBE, st);
}

/* --------------------------------------------------------------- threads */

static void drain(thr *t)
{
    if (t->holding) {
        finish_hold(t, &t->h);
        t->holding = false;
    }
    if (t->batching)
        op_task_wait(t);
    while (t->nblocks) {
        block_free(t, &t->blocks[t->nblocks - 1], NULL);
        t->nblocks--;
    }
}

static void *thread_main(void *arg)
{
    harness_thread *ht = arg;
    thr *t = calloc(1, sizeof *t);
    t->id = ht->id;
    t->rng = W.seed ^ harness_mix64(0x51ab5eed + (uint64_t)t->id);
    tstate *ts = &W.ts[t->id];
    tl_thread = t->id;
    atomic_store(&ts->op, -1);
    atomic_store(&ts->last_op, -1);
    for (int d = 0; d < NDEV; d++) {
        um_status st = um_stream_create(W.ctx, d, &t->st[d]);
        note(OP_STREAM_CHURN, st, st == UM_OK, "the thread's stream on device %d", d);
        W.streams[t->id][d] = t->st[d];
    }
    /* Weights per 1000. */
    static const struct {
        int op;
        int w;
    } mix[] = {
        {OP_MALLOC, 90},       {OP_FREE, 80},           {OP_HANDOVER, 30},   {OP_MEMCPY, 25},
        {OP_MEMCPY_ASYNC, 15}, {OP_MEMCPY_REPLICA, 15}, {OP_BUF_CREATE, 12}, {OP_BUF_DESTROY, 10},
        {OP_ACQ_READ, 220},    {OP_BUF_WRITE, 60},      {OP_BUF_READ, 80},   {OP_PREFETCH, 40},
        {OP_HINT_WONT, 15},    {OP_HINT_WILL, 15},      {OP_PIN, 8},         {OP_UNPIN, 8},
        {OP_WRAP, 6},          {OP_TASK_SUBMIT, 70},    {OP_TASK_CANCEL, 8}, {OP_WAIT_ALL, 1},
        {OP_TRIM, 10},         {OP_SET_LIMIT, 12},      {OP_SET_CACHE, 8},   {OP_WATERMARKS, 8},
        {OP_STATS, 40},        {OP_STREAM_CHURN, 8},    {OP_PROBE, 6},
    };
    /* UM_STRESS_ONLY=name,name: only the operations whose names contain one
     * of them (to narrow a failure down). */
    int weight[sizeof mix / sizeof mix[0]];
    int total = 0;
    const char *only = getenv("UM_STRESS_ONLY");
    for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++) {
        weight[i] = mix[i].w;
        if (only && *only) {
            bool keep = false;
            char list[256];
            snprintf(list, sizeof list, "%s", only);
            for (char *sv = NULL, *w = strtok_r(list, ",", &sv); w; w = strtok_r(NULL, ",", &sv))
                keep |= strstr(op_names[mix[i].op], w) != NULL;
            if (!keep)
                weight[i] = 0;
        }
        total += weight[i];
    }
    if (!total)
        total = 1;
    while (!atomic_load(&W.stop)) {
        if (t->holding && --t->h.ops_left <= 0) {
            finish_hold(t, &t->h);
            t->holding = false;
            continue;
        }
        if (t->batching && ++t->bt.ops_since > 8) {
            op_task_wait(t);
            continue;
        }
        int r = (int)below(t, (uint64_t)total), op = OP_STATS;
        for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++) {
            if (r < weight[i]) {
                op = mix[i].op;
                break;
            }
            r -= weight[i];
        }
        switch (op) {
        case OP_MALLOC:
            op_malloc(t);
            break;
        case OP_FREE:
            op_free(t);
            break;
        case OP_HANDOVER:
            op_handover(t);
            break;
        case OP_MEMCPY:
            op_memcpy(t, false);
            break;
        case OP_MEMCPY_ASYNC:
            op_memcpy(t, true);
            break;
        case OP_MEMCPY_REPLICA:
            op_memcpy_replica(t);
            break;
        case OP_BUF_CREATE:
            op_create(t);
            break;
        case OP_BUF_DESTROY:
            op_destroy(t);
            break;
        case OP_ACQ_READ:
            op_acquire(t);
            break;
        case OP_BUF_WRITE:
            op_buf_write(t);
            break;
        case OP_BUF_READ:
            op_buf_read(t);
            break;
        case OP_PREFETCH:
        case OP_HINT_WONT:
        case OP_HINT_WILL:
            op_shared_call(t, op);
            break;
        case OP_PIN:
            op_pin(t, true);
            break;
        case OP_UNPIN:
            op_pin(t, false);
            break;
        case OP_WRAP:
            op_wrap(t);
            break;
        case OP_TASK_SUBMIT:
            if (t->batching)
                op_task_wait(t);
            else
                op_task_submit(t);
            break;
        case OP_TASK_CANCEL:
            op_task_cancel(t);
            break;
        case OP_WAIT_ALL: {
            /* Every task of every thread: what failed or was cancelled
             * anywhere may be reported here. */
            begin(t, OP_WAIT_ALL, -1, 0);
            um_status st = um_wait_all(W.ctx);
            note(OP_WAIT_ALL, st, st == UM_OK || st == UM_ERR_TASK || st == UM_ERR_CANCELLED,
                 "all tasks");
            end(t, OP_WAIT_ALL, st);
            break;
        }
        case OP_TRIM:
        case OP_SET_LIMIT:
        case OP_SET_CACHE:
        case OP_WATERMARKS:
            op_control(t, op);
            break;
        case OP_STREAM_CHURN:
            op_stream_churn(t);
            break;
        case OP_PROBE:
            op_probe(t);
            break;
        default:
            op_stats(t);
            break;
        }
    }
    atomic_store(&ts->phase, 1);
    drain(t);
    atomic_store(&ts->phase, 2);
    atomic_fetch_add(&ts->done, 1);
    free(t);
    return NULL;
}

/* ------------------------------------------------------------------ main */

static void print_totals(void)
{
    printf("test_stress: operations (calls, then the statuses other than UM_OK; skipped: "
           "over the budget / buffer taken):\n");
    uint64_t all = 0;
    for (int op = 0; op < NOPS; op++) {
        op_counts *c = &counts[op];
        uint64_t calls = atomic_load(&c->calls);
        all += calls;
        printf("  %-28s %10llu  ok %10llu", op_names[op], (unsigned long long)calls,
               (unsigned long long)atomic_load(&c->by_status[UM_OK]));
        for (int s = 1; s < NSTATUS; s++) {
            uint64_t n = atomic_load(&c->by_status[s]);
            if (n)
                printf("  %s %llu", um_status_name((um_status)s), (unsigned long long)n);
        }
        uint64_t u = atomic_load(&c->unexpected);
        if (u)
            printf("  UNEXPECTED %llu", (unsigned long long)u);
        uint64_t nb = atomic_load(&c->no_budget), ct = atomic_load(&c->contended);
        if (nb || ct)
            printf("  (skipped %llu / %llu)", (unsigned long long)nb, (unsigned long long)ct);
        printf("\n");
    }
    printf("test_stress: %llu calls, %.1f GiB of data checked against the model; %llu "
           "UM_ERR_NOMEM within the budget from fragmentation\n",
           (unsigned long long)all, (double)atomic_load(&bytes_checked) / (double)GIB,
           (unsigned long long)atomic_load(&fragmented_nomem));
}

static double env_seconds(void)
{
    const char *e = getenv("UM_STRESS_SECONDS");
    double s = e && *e ? atof(e) : 60.0;
    return s > 0 ? s : 60.0;
}

int main(void)
{
    W.t0 = now_ns();
    W.seed = harness_seed("test_stress");
    W.seconds = env_seconds();
    const char *nt = getenv("UM_STRESS_THREADS");
    W.nthreads = nt && *nt ? atoi(nt) : 32;
    if (W.nthreads < 1 || W.nthreads > MAX_THREADS)
        W.nthreads = 32;
    atomic_store(&W.next_id, 1);
    atomic_store(&W.next_gen, 1);
    pthread_mutex_init(&W.budget_lock, NULL);
    pthread_mutex_init(&W.xlock, NULL);

    um_status st = um_init("devices=sim:4x64M,links=model", &W.ctx);
    CHECK_OK(st);
    if (st != UM_OK)
        return harness_finish("test_stress");
    CHECK_EQ(um_device_count(W.ctx), NDEV);
    for (int d = 1; d < NDEV; d++)
        CHECK_OK(um_set_memory_limit(W.ctx, d, LIMIT_MIN));
    CHECK_OK(um_set_memory_limit(W.ctx, 0, HOST_LIMIT_MIN));
    W.cap[0] = HOST_MALLOC_BUDGET;
    W.malloc_cap[0] = HOST_MALLOC_BUDGET;
    for (int d = 1; d < NDEV; d++) {
        W.cap[d] = SIM_BUDGET;
        W.malloc_cap[d] = SIM_MALLOC_BUDGET;
    }
    printf("test_stress: %d threads for %.0f s; host + %d sim devices of %zu MiB, limits "
           "%zu-%zu MiB; buffers of %zu MiB in all (%.1fx-%.1fx the sim limits); budget %zu MiB "
           "per sim device\n",
           W.nthreads, W.seconds, NSIM, SIM_CAPACITY / MIB, LIMIT_MIN / MIB, LIMIT_MAX / MIB,
           BUF_TOTAL / MIB, (double)BUF_TOTAL / (double)(NSIM * LIMIT_MAX),
           (double)BUF_TOTAL / (double)(NSIM * LIMIT_MIN), SIM_BUDGET / MIB);
    fflush(stdout);

    /* The buffers: a quarter small, the rest large, 384 MiB in all; three
     * quarters written (on the host) before the threads start. */
    thr setup = {.id = 0, .rng = W.seed ^ 0x5e7u};
    size_t cap = 1024, total = 0;
    W.slots = calloc(cap, sizeof *W.slots);
    while (total < BUF_TOTAL) {
        if ((size_t)W.nslots == cap) {
            W.slots = realloc(W.slots, 2 * cap * sizeof *W.slots);
            memset(W.slots + cap, 0, cap * sizeof *W.slots);
            cap *= 2;
        }
        slot *s = &W.slots[W.nslots++];
        pthread_rwlock_init(&s->lock, NULL);
        s->small = chance(&setup, 25);
        s->size = buffer_size(&setup, s->small);
        total += s->size;
    }
    /* Room to create buffers again after destroys. */
    int nbuf = W.nslots;
    W.nslots += nbuf / 10;
    if ((size_t)W.nslots > cap) {
        W.slots = realloc(W.slots, (size_t)W.nslots * sizeof *W.slots);
        memset(W.slots + cap, 0, ((size_t)W.nslots - cap) * sizeof *W.slots);
    }
    for (int i = nbuf; i < W.nslots; i++) {
        pthread_rwlock_init(&W.slots[i].lock, NULL);
        W.slots[i].small = chance(&setup, 25);
        W.slots[i].size = buffer_size(&setup, W.slots[i].small);
    }
    unsigned char *h = malloc(BUF_LARGE_MAX + CHUNK);
    for (int i = 0; i < nbuf; i++) {
        slot *s = &W.slots[i];
        slot_new_buffer(&setup, s, -1);
        CHECK_OK(um_buffer_create(W.ctx, s->size, NULL, &s->b));
        if (!s->b)
            break;
        atomic_fetch_add(&W.live_buffers, 1);
        if (chance(&setup, 75)) {
            uint32_t g = new_gen();
            fill_chunks(h, s->id, s->size, 0, s->nchunks, g);
            CHECK_OK(um_buffer_write(s->b, 0, h, s->size));
            slot_fill_model_op(s, 0, s->nchunks, g, OP_BUF_WRITE, -2);
        }
        atomic_fetch_add(&W.main_progress, 1);
    }
    free(h);
    printf("test_stress: %d buffers (%.0f MiB) in %d slots, set up in %.1f s\n", nbuf,
           (double)total / (double)MIB, W.nslots, (double)(now_ns() - W.t0) / 1e9);
    fflush(stdout);

    W.streams = calloc((size_t)W.nthreads, sizeof *W.streams);
    pthread_t wd;
    CHECK_EQ(pthread_create(&wd, NULL, watchdog_main, NULL), 0);
    atomic_store(&W.main_phase, 1);

    /* The threads run until the deadline; the main thread reports. */
    W.devnull = fopen("/dev/null", "w");
    harness_thread args[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started = 0;
    for (int i = 0; i < W.nthreads; i++) {
        args[i] = (harness_thread){&W, i};
        if (pthread_create(&tids[i], NULL, thread_main, &args[i]) != 0) {
            harness_report(__FILE__, __LINE__, "pthread_create failed for thread %d", i);
            break;
        }
        started++;
    }
    uint64_t deadline = W.t0 + (uint64_t)(W.seconds * 1e9);
    uint64_t next_report = now_ns() + 10000000000ull;
    while (now_ns() < deadline) {
        usleep(50000);
        if (now_ns() >= next_report) {
            next_report += W.seconds >= 600 ? 60000000000ull : 10000000000ull;
            uint64_t ops = 0, ev = 0;
            for (int i = 0; i < started; i++)
                ops += atomic_load(&W.ts[i].done);
            for (int d = 1; d < NDEV; d++) {
                um_reclaim_stats r;
                if (um_reclaim_stats_get(W.ctx, d, &r) == UM_OK)
                    ev += r.evictions;
            }
            size_t lims = 0;
            char ls[64] = "";
            for (int d = 1; d < NDEV; d++) {
                um_device_info info;
                if (um_device_info_get(W.ctx, d, &info) == UM_OK) {
                    lims += info.memory_limit;
                    snprintf(ls + strlen(ls), sizeof ls - strlen(ls), "%s%zu", d > 1 ? "/" : "",
                             info.memory_limit / MIB);
                }
            }
            printf("test_stress: %5.0f s: %llu operations, %llu evictions, %llu tasks, %d "
                   "failures so far; limits %s MiB (buffers %.1fx their sum)\n",
                   (double)(now_ns() - W.t0) / 1e9, (unsigned long long)ops, (unsigned long long)ev,
                   (unsigned long long)atomic_load(&W.tasks_submitted), (int)harness_failures, ls,
                   lims ? (double)BUF_TOTAL / (double)lims : 0.0);
            fflush(stdout);
        }
    }
    atomic_store(&W.stop, true);
    atomic_store(&W.main_phase, 2);
    uint64_t t_stop = now_ns();
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    printf("test_stress: threads stopped and drained in %.2f s\n",
           (double)(now_ns() - t_stop) / 1e9);
    atomic_store(&W.main_phase, 3);

    /* Every task is done (each thread waited for its own). */
    um_status wa = um_wait_all(W.ctx);
    CHECK(wa == UM_OK || wa == UM_ERR_TASK || wa == UM_ERR_CANCELLED);
    CHECK_EQ(atomic_load(&W.task_callbacks), atomic_load(&W.tasks_submitted));
    /* Every buffer is read whole and checked, then destroyed. */
    unsigned char *rb = malloc(BUF_LARGE_MAX);
    int checked = 0;
    for (int i = 0; i < W.nslots; i++) {
        slot *s = &W.slots[i];
        if (!s->b)
            continue;
        st = um_buffer_read(s->b, 0, rb, s->size);
        CHECK_OK(st);
        tl_slot = s;
        if (st == UM_OK && model_check("final read", 0, s->id, s->size, s->gen, rb, 0, s->size))
            checked++;
        if (s->pinned)
            CHECK_OK(um_buffer_hint(s->b, UM_HINT_UNPIN));
        CHECK_OK(um_buffer_destroy(s->b));
        s->b = NULL;
        atomic_fetch_add(&W.main_progress, 1);
    }
    free(rb);
    printf("test_stress: %d buffers read back whole and matching the model\n", checked);
    for (int i = 0; i < NEXCHANGE; i++) {
        blk *k = &W.xchg[i];
        if (!k->p)
            continue;
        block_check("block left in the exchange", k);
        CHECK_OK(um_free(W.ctx, k->p, NULL));
        k->p = NULL;
    }
    for (int i = 0; i < started; i++)
        for (int d = 0; d < NDEV; d++)
            if (W.streams[i][d])
                CHECK_OK(um_stream_destroy(W.ctx, W.streams[i][d]));
    /* Nothing is live anywhere. */
    uint64_t failed = 0;
    printf("test_stress: per device (after um_trim):\n");
    for (int d = 0; d < NDEV; d++) {
        CHECK_OK(um_trim(W.ctx, d));
        um_stats s;
        um_reclaim_stats r;
        um_task_stats ts;
        CHECK_OK(um_stats_get(W.ctx, d, &s));
        CHECK_OK(um_reclaim_stats_get(W.ctx, d, &r));
        CHECK_OK(um_task_stats_get(W.ctx, d, &ts));
        CHECK_EQ(s.active_bytes, 0);
        CHECK_EQ(s.active_blocks, 0);
        CHECK_EQ(s.requested_bytes, 0);
        CHECK_EQ(s.num_allocs, s.num_frees);
        failed += r.failed;
        printf("  device %d: %llu allocs, %llu frees, peak reserved %.1f MiB, reserved now %.1f "
               "MiB, %llu ooms; evictions %llu (%llu written back, %.1f MiB), refetched %.1f MiB, "
               "reclaimer runs %llu, sync reclaims %llu, failed %llu; tasks %llu (failed %llu)\n",
               d, (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees,
               (double)s.peak_reserved_bytes / (double)MIB, (double)s.reserved_bytes / (double)MIB,
               (unsigned long long)s.num_ooms, (unsigned long long)r.evictions,
               (unsigned long long)r.written_back, (double)r.written_back_bytes / (double)MIB,
               (double)r.refetched_bytes / (double)MIB, (unsigned long long)r.reclaimer_runs,
               (unsigned long long)r.sync_reclaims, (unsigned long long)r.failed,
               (unsigned long long)ts.tasks, (unsigned long long)ts.failed);
    }
    /* Reclaim's failures: the task workers' prefetches that found no room,
     * and the probes that cannot fit at all. */
    printf("test_stress: reclaim failed %llu times (%llu probes that cannot fit at all were "
           "made)\n",
           (unsigned long long)failed, (unsigned long long)atomic_load(&expected_nomem_reclaimed));
    printf("test_stress: tasks: %llu submitted, %llu cancelled; run per device:",
           (unsigned long long)atomic_load(&W.tasks_submitted),
           (unsigned long long)atomic_load(&W.tasks_cancelled));
    for (int d = 0; d < NDEV; d++)
        printf(" %llu", (unsigned long long)atomic_load(&W.task_ran[d]));
    printf("\n");
    print_totals();
    atomic_store(&watchdog_stop, true);
    pthread_join(wd, NULL);
    um_shutdown(W.ctx);
    for (int i = 0; i < W.nslots; i++) {
        free(W.slots[i].gen);
        pthread_rwlock_destroy(&W.slots[i].lock);
    }
    free(W.slots);
    free(W.streams);
    if (W.devnull)
        fclose(W.devnull);
    printf("test_stress: %.1f s in all (seed %llu)\n", (double)(now_ns() - W.t0) / 1e9,
           (unsigned long long)W.seed);
    return harness_finish("test_stress");
}
