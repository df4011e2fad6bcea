/*
 * A stand-in for the CUDA driver (built as libcuda.so.1 in the build tree),
 * so that CI, which has no GPU, runs the CUDA backend itself: the loader,
 * context handling, VMM reserve/create/map/unmap, access, events, streams,
 * copies, cuMemAlloc segments and every error path that checks a result.
 *
 * Memory is host memory: physical chunks live in one memfd, reservations
 * are PROT_NONE ranges and cuMemMap maps the memfd there, as the sim
 * backend does. It keeps CUDA's rules that the backend relies on (unmap
 * covers whole mappings, map only into a reservation and never over a
 * mapping) and answers anything else with CUDA_ERROR_INVALID_VALUE. Work
 * completes at once: every event is complete when recorded. Kernels are
 * not supported (cuModuleLoadData fails with CUDA_ERROR_NOT_SUPPORTED).
 *
 * FAKE_CUDA_GPUS=N (default 1) sets the GPU count, FAKE_CUDA_NO_VMM=1 takes
 * VMM away, FAKE_CUDA_MEM=BYTES sets each GPU's memory (default 4 GiB).
 * FAKE_CUDA_FAIL_EVERY=N makes every Nth call of cuMemCreate, cuMemMap,
 * cuMemSetAccess, cuMemUnmap, cuMemRelease and cuEventRecord fail (each
 * counted on its own), for the backend's and the pool's error paths.
 *
 * A test can also fail chosen calls, by name, through entry points only
 * this driver has (found with dlsym): fake_cuda_fail("cuMemUnmap", skip,
 * times, result) makes the calls of cuMemUnmap after the next `skip` fail
 * `times` times with `result` (rules add up; fake_cuda_fail_clear drops
 * them), and fake_cuda_live("mappings") counts what is live: "mappings",
 * "chunks" (not released, or released but still mapped), "streams",
 * "events" or "reservations".
 *
 * As on CUDA, releasing a chunk that is still mapped keeps its memory until
 * its last unmap, and a reservation with a mapping in it is not freed.
 *
 * FAKE_CUDA_OPAQUE=1 makes GPU memory unreachable from the host, as a real
 * GPU's is: a GPU's mapping stays PROT_NONE at its device address (a host
 * access faults) and the driver's copies and memsets reach it through a
 * second mapping of the same memory, so a test that reads or writes GPU
 * memory in place crashes instead of passing only here. (cuMemAlloc
 * segments and pinned host memory stay readable.)
 *
 * FAKE_CUDA_LAZY_QUERIES=N turns on lazy mode, for tests of stream order
 * (tests/gpu/test_cuda_order.c): work completing at once hides every bug
 * of memory unmapped while queued work still uses it. Bytes still move at
 * once, but each cuMemcpyAsync, cuMemsetD8Async and fake_lazy_launch stays
 * pending, with the addresses it touches, until cuStreamSynchronize of its
 * stream, cuEventSynchronize of an event recorded after it, or the Nth
 * cuEventQuery of such an event (the ones before answer
 * CUDA_ERROR_NOT_READY; N=0: a query never completes work). Completion
 * carries through cuStreamWaitEvent: finishing a stream's wait finishes
 * the work the event stood for. The driver then reports, on stderr (the
 * first 20 of each kind) and in counters:
 *   - "unmap": a cuMemUnmap or cuMemFree over bytes that pending work
 *     touches;
 *   - "race": an operation on bytes that another stream's pending work
 *     touches (one of them writing) with no event ordering the two.
 * NULL and CU_STREAM_LEGACY (0x1) are each GPU's legacy default stream (the
 * GPU of the current context, GPU 0 with none) and CU_STREAM_PER_THREAD
 * (0x2) a stream of the calling thread's own; every stream is taken to be
 * non-blocking (the legacy stream's implicit synchronisation is not
 * modelled). A destroyed stream's pending work stays pending, as it still
 * runs on a GPU. FAKE_CUDA_LAZY_ABORT=1 aborts at the first violation,
 * for a debugger; FAKE_CUDA_LAZY_BACKTRACE=1 keeps the call stack that
 * queued each pending operation and prints it, with the stack of the
 * offending call, at each race report (resolve with addr2line);
 * FAKE_CUDA_LAZY_LOG=1 prints every stream operation, event record, wait,
 * query and synchronization, and every forced failure, one line each
 * ("fake_cuda log: T<thread> ..."), to follow a race back to its cause.
 * Entry points for tests (found with dlsym): fake_lazy_launch(stream, p,
 * n) queues a "kernel" writing [p, p+n) on stream; fake_lazy_wait(waiter,
 * on) makes stream `waiter` wait for the work queued on `on` so far, as an
 * event would; fake_lazy_drain() completes everything pending;
 * fake_lazy_violations("unmap" or "race") counts the reports so far. The
 * first three return -1 when lazy mode is off. Tables are fixed (256
 * streams, 65,536 pending operations): a test that outgrows one stops
 * with a message, never with a record overwritten.
 *
 * fake_lazy_retains(gpu) counts the cuDevicePrimaryCtxRetain calls for a
 * GPU so far, in either mode, for tests of which GPUs a context touches.
 */
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda_driver.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_MAPS 65536
#define MAX_RES 256
#define PAGE ((size_t)2 << 20)
/* The granularity of pinned host (HOST_NUMA) memory: PAGE, or a smaller
 * power of two from FAKE_CUDA_HOST_PAGE, as on a host of small pages.
 * Sizes and addresses are checked against it, the smaller of the two. */
static size_t host_page = PAGE;

typedef struct chunk {
    size_t off, size; /* in the memfd */
    int gpu;          /* -1: host */
    size_t maps;      /* mappings of it */
    int released;     /* cuMemRelease'd while mapped: freed by its last unmap */
} chunk;

typedef struct mapping {
    uintptr_t va;
    size_t size;
    char *shadow; /* FAKE_CUDA_OPAQUE: the host's way to a GPU's mapping */
    chunk *c;
} mapping;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fd = -1;
static size_t fd_end;
static mapping maps[MAX_MAPS];
static size_t nmaps;
static mapping res[MAX_RES];
static size_t nres;
static int gpus = 1;
static int vmm = 1;
static int host_numa = 1; /* VMM pages in host memory (attribute 141) */
static size_t gpu_mem = (size_t)4 << 30;
static size_t used[64]; /* bytes created or cuMemAlloc'ed per GPU */
static __thread um_cuContext current;
static unsigned fail_every;
static int opaque;
static size_t live_chunks; /* under lock */

enum { F_CREATE, F_MAP, F_ACCESS, F_UNMAP, F_RELEASE, F_RECORD, F_COUNT };
static _Atomic unsigned fail_calls[F_COUNT];

/* True when this call of op is one the FAKE_CUDA_FAIL_EVERY rule fails. */
static int injected(int op)
{
    return fail_every && (atomic_fetch_add(&fail_calls[op], 1) + 1) % fail_every == 0;
}

/* fake_cuda_fail's rules, under their own lock (the driver's lock may be
 * held by the caller of forced()). */
#define MAX_RULES 32
typedef struct rule {
    char call[48];
    unsigned skip, times;
    um_cuResult result;
} rule;
static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;
static rule rules[MAX_RULES];
static _Atomic int nrules;
static _Atomic long live_streams, live_events;

EXPORT int fake_cuda_fail(const char *call, unsigned skip, unsigned times, int result)
{
    pthread_mutex_lock(&rules_lock);
    int n = atomic_load(&nrules);
    if (n == MAX_RULES || strlen(call) >= sizeof rules[0].call) {
        pthread_mutex_unlock(&rules_lock);
        return -1;
    }
    rules[n] = (rule){"", skip, times, result};
    strcpy(rules[n].call, call);
    atomic_store(&nrules, n + 1);
    pthread_mutex_unlock(&rules_lock);
    return 0;
}

EXPORT void fake_cuda_fail_clear(void)
{
    pthread_mutex_lock(&rules_lock);
    atomic_store(&nrules, 0);
    pthread_mutex_unlock(&rules_lock);
}

/* FAKE_CUDA_LAZY_LOG: one line per driver event of lazy mode, prefixed
 * with a small number of the calling thread. */
static int lazy_log_on;
static _Atomic int lazy_log_threads;
static __thread int lazy_log_thread;

static void lazy_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void lazy_log(const char *fmt, ...)
{
    if (!lazy_log_on)
        return;
    if (!lazy_log_thread)
        lazy_log_thread = atomic_fetch_add(&lazy_log_threads, 1) + 1;
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(line, sizeof line, "fake_cuda log: T%d ", lazy_log_thread);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

/* The result a rule forces on this call of `call`, or UM_CU_SUCCESS. */
static um_cuResult forced(const char *call)
{
    if (!atomic_load_explicit(&nrules, memory_order_relaxed))
        return UM_CU_SUCCESS;
    um_cuResult r = UM_CU_SUCCESS;
    pthread_mutex_lock(&rules_lock);
    int n = atomic_load(&nrules), kept = 0;
    for (int i = 0; i < n; i++) {
        rule *x = &rules[i];
        if (r == UM_CU_SUCCESS && strcmp(x->call, call) == 0) {
            if (x->skip)
                x->skip--;
            else if (x->times) {
                x->times--;
                r = x->result;
            }
        }
        if (x->times)
            rules[kept++] = *x;
    }
    atomic_store(&nrules, kept);
    pthread_mutex_unlock(&rules_lock);
    if (r != UM_CU_SUCCESS)
        lazy_log("forced %s -> %d", call, (int)r);
    return r;
}

/* Returns the forced result of this call of `call`, if any. */
#define FORCED(call)                                                                              \
    do {                                                                                          \
        um_cuResult forced_ = forced(call);                                                       \
        if (forced_ != UM_CU_SUCCESS)                                                             \
            return forced_;                                                                       \
    } while (0)
static char ctx_tokens[64];

/* The GPU of the calling thread's current context, or -1 with none. */
static int current_gpu(void)
{
    return current ? (int)((char *)current - ctx_tokens) : -1;
}

/* cuDevicePrimaryCtxRetain calls per GPU, so that a test can tell which
 * GPUs a context touched (fake_lazy_retains). */
static _Atomic int primary_retains[64];

EXPORT int fake_lazy_retains(int gpu)
{
    return gpu >= 0 && gpu < 64 ? atomic_load(&primary_retains[gpu]) : -1;
}

/* ---------------------------------------------------------------- lazy mode
 *
 * The header comment says what lazy mode does. How: every queued operation
 * takes a number from one counter of the whole driver, so numbers grow
 * along each stream and across streams, and a stream's work "up to n" is
 * its pending operations numbered n or less. Each stream keeps its pending
 * operations oldest first; completing a stream up to n drops them from the
 * front. A stream that waits for an event gets an operation of its own, a
 * wait, whose completion completes the event's stream up to the event, so
 * completion carries along chains of waits exactly as far as the GPU's
 * would, no further.
 *
 * For the race check each stream also keeps, per other stream, the number
 * up to which its next operation is ordered after that stream's work (what
 * its waits so far have told it; an event takes a copy when recorded). Two
 * operations on the same bytes from different streams, one writing, are a
 * race when the older is not covered by that number.
 *
 * A record of a destroyed stream (or of an exited thread's per-thread
 * stream) stays while it has pending work, then its slot is reused. Since
 * numbers never repeat, what an event or another stream remembers of the
 * slot's old stream is below every number of the new one, so it orders
 * nothing of the new stream and completes nothing of it. */

enum {
    LAZY_MAX_STREAMS = 256,
    LAZY_MAX_OPS = 1 << 16,
    LAZY_MAX_GPUS = 64,
    LAZY_REPORTS_SHOWN = 20,
    LAZY_STREAM_LEGACY = 1,     /* CU_STREAM_LEGACY */
    LAZY_STREAM_PER_THREAD = 2, /* CU_STREAM_PER_THREAD */
};

typedef enum lazy_op_kind {
    LAZY_KERNEL,
    LAZY_COPY_READ,
    LAZY_COPY_WRITE,
    LAZY_MEMSET,
    LAZY_WAIT,
} lazy_op_kind;

static const char *const lazy_op_names[] = {"kernel", "copy (read)", "copy (write)", "memset",
                                            "wait"};

typedef struct lazy_op {
    uint64_t seq;
    lazy_op_kind kind;
    uintptr_t lo, hi;    /* the bytes it touches (not for a wait) */
    int waited_stream;   /* a wait: the stream slot it waits for, */
    uint64_t waited_seq; /* up to this number */
    int next;            /* the stream's next newer op, or the next free op; -1: none */
    int depth;           /* frames in lazy_op_stacks[this op], with FAKE_CUDA_LAZY_BACKTRACE */
} lazy_op;

typedef struct lazy_stream {
    bool in_use;
    bool orphaned; /* destroyed, or its thread exited: the slot goes once its work is done */
    void *handle;  /* the CUstream it stands for; NULL for legacy and per-thread streams */
    int gpu;
    const char *kind;
    int oldest, newest; /* its pending ops; -1: none */
    uint64_t last_seq;  /* the number of the newest op ever queued on it; 0: none */
    uint64_t ordered_after[LAZY_MAX_STREAMS];
} lazy_stream;

/* What an event of lazy mode is: the work of one stream up to a number. */
typedef struct lazy_event {
    bool recorded;
    int stream;
    uint64_t seq;
    int queries; /* cuEventQuery calls since it was recorded */
    uint64_t ordered_after[LAZY_MAX_STREAMS];
} lazy_event;

/* Per-thread streams of one thread, a slot + 1 per GPU (0: none yet). Kept
 * in malloc'ed memory, the thread key's value, so that the key's
 * destructor can orphan them when the thread exits. */
typedef struct lazy_thread_streams {
    int slot_plus_one[LAZY_MAX_GPUS];
} lazy_thread_streams;

/* Set once by setup(), before any other thread can call the driver. */
static int lazy;
static int lazy_queries_to_complete;
static int lazy_abort_on_violation;
/* With FAKE_CUDA_LAZY_BACKTRACE: the stack that queued each op. */
enum { LAZY_STACK_DEPTH = 24 };
static void *(*lazy_op_stacks)[LAZY_STACK_DEPTH];
static pthread_key_t lazy_thread_key;

/* Lock order: the driver's lock, then lazy_lock; nothing here takes the
 * driver's lock while holding lazy_lock. Everything below is under it. */
static pthread_mutex_t lazy_lock = PTHREAD_MUTEX_INITIALIZER;
static lazy_stream lazy_streams[LAZY_MAX_STREAMS];
static lazy_op lazy_ops[LAZY_MAX_OPS];
static int lazy_free_ops = -1;
static uint64_t lazy_last_seq;
static int lazy_legacy_plus_one[LAZY_MAX_GPUS];
/* Completion's work list: (stream, up to) pairs still to complete. Each
 * entry after the first comes from a wait op taken out of the table, so it
 * never holds more than the table plus one. */
static struct {
    int stream;
    uint64_t upto;
} lazy_todo[LAZY_MAX_OPS + 1];

static __thread lazy_thread_streams *lazy_this_thread;
static _Atomic long lazy_unmap_violations, lazy_race_violations;

/* A full table means a test that never waits for its streams or leaks
 * them; going on would lose records and with them the reports. */
static _Noreturn void lazy_table_full(const char *what, int limit)
{
    fprintf(stderr,
            "fake_cuda: lazy mode: more than %d %s at once (a stream never synchronized, or "
            "streams never destroyed?); stopping rather than losing track\n",
            limit, what);
    abort();
}

static void lazy_report(_Atomic long *count, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Counts a violation and prints the first few of each kind. */
static void lazy_report(_Atomic long *count, const char *fmt, ...)
{
    long n = atomic_fetch_add(count, 1) + 1;
    if (n <= LAZY_REPORTS_SHOWN) {
        va_list ap;
        va_start(ap, fmt);
        fputs("fake_cuda: LAZY VIOLATION: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    if (lazy_abort_on_violation)
        abort();
}

/* Gives an orphaned stream's slot back once its work is done. */
static void lazy_forget_if_done(int slot)
{
    lazy_stream *s = &lazy_streams[slot];
    if (s->orphaned && s->oldest < 0)
        s->in_use = false;
}

static void lazy_orphan(int slot)
{
    lazy_streams[slot].orphaned = true;
    lazy_streams[slot].handle = NULL;
    lazy_forget_if_done(slot);
}

/* The key's destructor: an exited thread's per-thread streams are
 * orphaned, their pending work still to complete. */
static void lazy_thread_exit(void *streams)
{
    lazy_thread_streams *t = streams;
    pthread_mutex_lock(&lazy_lock);
    for (int g = 0; g < LAZY_MAX_GPUS; g++)
        if (t->slot_plus_one[g])
            lazy_orphan(t->slot_plus_one[g] - 1);
    pthread_mutex_unlock(&lazy_lock);
    lazy_this_thread = NULL;
    free(t);
}

/* Reads the lazy-mode variables and links the free ops (from setup(),
 * under the driver's lock). */
static int lazy_setup(void)
{
    const char *queries = getenv("FAKE_CUDA_LAZY_QUERIES");
    if (!queries || !*queries)
        return 0;
    lazy = 1;
    lazy_queries_to_complete = atoi(queries) > 0 ? atoi(queries) : 0;
    lazy_abort_on_violation =
        getenv("FAKE_CUDA_LAZY_ABORT") && atoi(getenv("FAKE_CUDA_LAZY_ABORT"));
    lazy_log_on = getenv("FAKE_CUDA_LAZY_LOG") && atoi(getenv("FAKE_CUDA_LAZY_LOG"));
    if (getenv("FAKE_CUDA_LAZY_BACKTRACE") && atoi(getenv("FAKE_CUDA_LAZY_BACKTRACE"))) {
        lazy_op_stacks = calloc(LAZY_MAX_OPS, sizeof *lazy_op_stacks);
        if (!lazy_op_stacks)
            return -1;
    }
    for (int i = 0; i < LAZY_MAX_OPS; i++)
        lazy_ops[i].next = i + 1 < LAZY_MAX_OPS ? i + 1 : -1;
    lazy_free_ops = 0;
    return pthread_key_create(&lazy_thread_key, lazy_thread_exit) == 0 ? 0 : -1;
}

static int lazy_stream_new(int gpu, const char *kind, void *handle)
{
    for (int i = 0; i < LAZY_MAX_STREAMS; i++) {
        lazy_stream *s = &lazy_streams[i];
        if (s->in_use)
            continue;
        s->in_use = true;
        s->orphaned = false;
        s->handle = handle;
        s->gpu = gpu;
        s->kind = kind;
        s->oldest = s->newest = -1;
        s->last_seq = 0;
        memset(s->ordered_after, 0, sizeof s->ordered_after);
        lazy_log("stream %d: %s, GPU %d, handle %p", i, kind, gpu, handle);
        return i;
    }
    lazy_table_full("streams", LAZY_MAX_STREAMS);
}

/* The slot of a stream cuStreamCreate made, or -1. */
static int lazy_created_stream(um_cuStream handle)
{
    for (int i = 0; i < LAZY_MAX_STREAMS; i++)
        if (lazy_streams[i].in_use && lazy_streams[i].handle == (void *)handle)
            return i;
    return -1;
}

/* The slot of the stream a handle names, made on first use. */
static int lazy_stream_of(um_cuStream handle)
{
    int gpu = current_gpu() < 0 ? 0 : current_gpu();
    uintptr_t h = (uintptr_t)handle;
    if (h == 0 || h == LAZY_STREAM_LEGACY) {
        if (!lazy_legacy_plus_one[gpu])
            lazy_legacy_plus_one[gpu] = 1 + lazy_stream_new(gpu, "legacy default", NULL);
        return lazy_legacy_plus_one[gpu] - 1;
    }
    if (h == LAZY_STREAM_PER_THREAD) {
        if (!lazy_this_thread) {
            lazy_this_thread = calloc(1, sizeof *lazy_this_thread);
            if (!lazy_this_thread) {
                fputs("fake_cuda: lazy mode: no memory for a thread's streams\n", stderr);
                abort();
            }
            (void)pthread_setspecific(lazy_thread_key, lazy_this_thread);
        }
        int *slot = &lazy_this_thread->slot_plus_one[gpu];
        if (!*slot)
            *slot = 1 + lazy_stream_new(gpu, "per-thread default", NULL);
        return *slot - 1;
    }
    int created = lazy_created_stream(handle);
    if (created >= 0)
        return created;
    /* Not one of cuStreamCreate's: a test's own handle, or one used after
     * its stream was destroyed. It gets a stream of its own. */
    return lazy_stream_new(gpu, "unknown handle", (void *)handle);
}

/* True when the stream in `slot` has no pending work numbered `seq` or
 * less (a slot given to another stream since has none). */
static bool lazy_done(int slot, uint64_t seq)
{
    lazy_stream *s = &lazy_streams[slot];
    return !s->in_use || s->oldest < 0 || lazy_ops[s->oldest].seq > seq;
}

/* Queues op `i` (filled in but for its number) on stream `slot`. */
static void lazy_append(int slot, int i)
{
    lazy_stream *s = &lazy_streams[slot];
    lazy_ops[i].seq = ++lazy_last_seq;
    lazy_ops[i].next = -1;
    if (s->newest >= 0)
        lazy_ops[s->newest].next = i;
    else
        s->oldest = i;
    s->newest = i;
    s->last_seq = lazy_ops[i].seq;
}

static int lazy_take_op(void)
{
    int i = lazy_free_ops;
    if (i < 0)
        lazy_table_full("pending stream operations", LAZY_MAX_OPS);
    lazy_free_ops = lazy_ops[i].next;
    return i;
}

/* Completes stream `slot` up to `upto`, and through its waits whatever
 * they waited for. */
static void lazy_complete(int slot, uint64_t upto)
{
    int todo = 0;
    lazy_todo[todo].stream = slot;
    lazy_todo[todo++].upto = upto;
    while (todo) {
        todo--;
        int t = lazy_todo[todo].stream;
        uint64_t until = lazy_todo[todo].upto;
        lazy_stream *s = &lazy_streams[t];
        while (s->in_use && s->oldest >= 0 && lazy_ops[s->oldest].seq <= until) {
            int i = s->oldest;
            s->oldest = lazy_ops[i].next;
            if (s->oldest < 0)
                s->newest = -1;
            if (lazy_ops[i].kind == LAZY_WAIT) {
                lazy_todo[todo].stream = lazy_ops[i].waited_stream;
                lazy_todo[todo++].upto = lazy_ops[i].waited_seq;
            }
            lazy_ops[i].next = lazy_free_ops;
            lazy_free_ops = i;
        }
        if (s->in_use)
            lazy_forget_if_done(t);
    }
}

/* Stream `waiter` waits for stream `on` up to `seq`, `on` having been
 * ordered after others as `on_ordered_after` says. */
static void lazy_wait_for(int waiter, int on, uint64_t seq, const uint64_t *on_ordered_after)
{
    lazy_stream *w = &lazy_streams[waiter];
    for (int i = 0; i < LAZY_MAX_STREAMS; i++)
        if (on_ordered_after[i] > w->ordered_after[i])
            w->ordered_after[i] = on_ordered_after[i];
    if (waiter == on)
        return;
    if (seq > w->ordered_after[on])
        w->ordered_after[on] = seq;
    lazy_log("stream %d waits for stream %d up to %llu%s", waiter, on, (unsigned long long)seq,
             lazy_done(on, seq) ? " (done)" : "");
    if (lazy_done(on, seq))
        return;
    int i = lazy_take_op();
    lazy_ops[i].kind = LAZY_WAIT;
    lazy_ops[i].lo = lazy_ops[i].hi = 0;
    lazy_ops[i].waited_stream = on;
    lazy_ops[i].waited_seq = seq;
    lazy_append(waiter, i);
}

static bool lazy_writes(lazy_op_kind kind)
{
    return kind != LAZY_COPY_READ && kind != LAZY_WAIT;
}

/* Queues an access of [lo, lo+n) on stream `slot`, reporting pending work
 * of other streams on those bytes that nothing orders it after. */
static void lazy_enqueue(int slot, lazy_op_kind kind, uintptr_t lo, size_t n)
{
    if (!n)
        return;
    uintptr_t hi = lo + n;
    lazy_stream *s = &lazy_streams[slot];
    for (int t = 0; t < LAZY_MAX_STREAMS; t++) {
        lazy_stream *other = &lazy_streams[t];
        if (t == slot || !other->in_use)
            continue;
        for (int j = other->oldest; j >= 0; j = lazy_ops[j].next) {
            lazy_op *o = &lazy_ops[j];
            if (o->kind == LAZY_WAIT || o->hi <= lo || hi <= o->lo ||
                !(lazy_writes(kind) || lazy_writes(o->kind)) || o->seq <= s->ordered_after[t])
                continue;
            if (lazy_op_stacks) {
                void *now[LAZY_STACK_DEPTH];
                int depth = backtrace(now, LAZY_STACK_DEPTH);
                fprintf(stderr, "fake_cuda: the pending %s was queued from:\n",
                        lazy_op_names[o->kind]);
                backtrace_symbols_fd(lazy_op_stacks[j], o->depth, 2);
                fprintf(stderr, "fake_cuda: the unordered %s comes from:\n", lazy_op_names[kind]);
                backtrace_symbols_fd(now, depth, 2);
            }
            lazy_report(&lazy_race_violations,
                        "unordered %s on stream %d (%s, GPU %d) of [%#lx, +%#zx) while stream %d "
                        "(%s, GPU %d) has a pending %s of [%#lx, +%#zx)",
                        lazy_op_names[kind], slot, s->kind, s->gpu, (unsigned long)lo, n, t,
                        other->kind, other->gpu, lazy_op_names[o->kind], (unsigned long)o->lo,
                        (size_t)(o->hi - o->lo));
            break;
        }
    }
    int i = lazy_take_op();
    lazy_ops[i].kind = kind;
    lazy_ops[i].lo = lo;
    lazy_ops[i].hi = hi;
    lazy_ops[i].waited_stream = -1;
    lazy_ops[i].waited_seq = 0;
    if (lazy_op_stacks)
        lazy_ops[i].depth = backtrace(lazy_op_stacks[i], LAZY_STACK_DEPTH);
    lazy_append(slot, i);
    lazy_log("op %llu on stream %d: %s of [%#lx, +%#zx)", (unsigned long long)lazy_ops[i].seq, slot,
             lazy_op_names[kind], (unsigned long)lo, n);
}

/* Reports a `call` giving up [lo, lo+n) while pending work touches it. */
static void lazy_check_release(uintptr_t lo, size_t n, const char *call)
{
    uintptr_t hi = lo + n;
    pthread_mutex_lock(&lazy_lock);
    for (int t = 0; t < LAZY_MAX_STREAMS; t++) {
        lazy_stream *s = &lazy_streams[t];
        if (!s->in_use)
            continue;
        for (int j = s->oldest; j >= 0; j = lazy_ops[j].next) {
            lazy_op *o = &lazy_ops[j];
            if (o->kind == LAZY_WAIT || o->hi <= lo || hi <= o->lo)
                continue;
            lazy_report(&lazy_unmap_violations,
                        "%s of [%#lx, +%#zx) while stream %d (%s, GPU %d%s) still has a "
                        "pending %s of [%#lx, +%#zx)",
                        call, (unsigned long)lo, n, t, s->kind, s->gpu,
                        s->orphaned ? ", destroyed" : "", lazy_op_names[o->kind],
                        (unsigned long)o->lo, (size_t)(o->hi - o->lo));
            pthread_mutex_unlock(&lazy_lock);
            return;
        }
    }
    pthread_mutex_unlock(&lazy_lock);
}

/* The stream operations' hook: queues an access in lazy mode. */
static void lazy_access(um_cuStream stream, lazy_op_kind kind, uintptr_t lo, size_t n)
{
    if (!lazy)
        return;
    pthread_mutex_lock(&lazy_lock);
    lazy_enqueue(lazy_stream_of(stream), kind, lo, n);
    pthread_mutex_unlock(&lazy_lock);
}

/* A "kernel" on `stream` that writes [p, p+n). */
EXPORT int fake_lazy_launch(um_cuStream stream, void *p, size_t n)
{
    if (!lazy)
        return -1;
    lazy_access(stream, LAZY_KERNEL, (uintptr_t)p, n);
    return 0;
}

/* Stream `waiter` waits for the work queued on `on` so far, as after an
 * event recorded on `on` and waited for on `waiter`. */
EXPORT int fake_lazy_wait(um_cuStream waiter, um_cuStream on)
{
    if (!lazy)
        return -1;
    pthread_mutex_lock(&lazy_lock);
    int w = lazy_stream_of(waiter), o = lazy_stream_of(on);
    lazy_wait_for(w, o, lazy_streams[o].last_seq, lazy_streams[o].ordered_after);
    pthread_mutex_unlock(&lazy_lock);
    return 0;
}

/* Completes all pending work, as synchronizing every GPU would: a test
 * starts its next check from idle GPUs whatever the last one left
 * pending (a destroyed stream's work would otherwise stay pending). */
EXPORT int fake_lazy_drain(void)
{
    if (!lazy)
        return -1;
    pthread_mutex_lock(&lazy_lock);
    for (int t = 0; t < LAZY_MAX_STREAMS; t++)
        if (lazy_streams[t].in_use)
            lazy_complete(t, lazy_last_seq);
    pthread_mutex_unlock(&lazy_lock);
    return 0;
}

/* Violations so far: "unmap" or "race"; -1 for another word. */
EXPORT long fake_lazy_violations(const char *what)
{
    if (strcmp(what, "unmap") == 0)
        return atomic_load(&lazy_unmap_violations);
    if (strcmp(what, "race") == 0)
        return atomic_load(&lazy_race_violations);
    return -1;
}

/* A summary at exit, since the first reports may have scrolled away. */
__attribute__((destructor)) static void lazy_summary(void)
{
    long unmaps = atomic_load(&lazy_unmap_violations), races = atomic_load(&lazy_race_violations);
    if (unmaps || races)
        fprintf(stderr,
                "fake_cuda: lazy mode found %ld unmap(s) of memory in use and %ld unordered "
                "access(es)\n",
                unmaps, races);
}

static int setup(void)
{
    if (fd >= 0)
        return 0;
    const char *g = getenv("FAKE_CUDA_GPUS");
    if (g)
        gpus = atoi(g);
    if (gpus < 0 || gpus > 64)
        gpus = 1;
    vmm = !(getenv("FAKE_CUDA_NO_VMM") && atoi(getenv("FAKE_CUDA_NO_VMM")));
    host_numa = vmm && !(getenv("FAKE_CUDA_NO_HOST_NUMA") && atoi(getenv("FAKE_CUDA_NO_HOST_NUMA")));
    if (getenv("FAKE_CUDA_MEM"))
        gpu_mem = strtoull(getenv("FAKE_CUDA_MEM"), NULL, 0);
    if (getenv("FAKE_CUDA_FAIL_EVERY"))
        fail_every = (unsigned)atoi(getenv("FAKE_CUDA_FAIL_EVERY"));
    opaque = getenv("FAKE_CUDA_OPAQUE") && atoi(getenv("FAKE_CUDA_OPAQUE"));
    if (getenv("FAKE_CUDA_HOST_PAGE")) {
        size_t hp = strtoull(getenv("FAKE_CUDA_HOST_PAGE"), NULL, 0);
        if (hp >= 4096 && hp <= PAGE && !(hp & (hp - 1)))
            host_page = hp;
    }
    if (lazy_setup() != 0)
        return -1;
    fd = memfd_create("fake_cuda", 0);
    return fd < 0 ? -1 : 0;
}

EXPORT um_cuResult cuInit(unsigned flags)
{
    if (flags)
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int r = setup();
    pthread_mutex_unlock(&lock);
    return r ? UM_CU_ERROR_OUT_OF_MEMORY : UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuGetErrorName(um_cuResult r, const char **s)
{
    switch (r) {
    case UM_CU_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case UM_CU_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case UM_CU_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case UM_CU_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case UM_CU_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *s = NULL; return UM_CU_ERROR_INVALID_VALUE;
    }
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuGetErrorString(um_cuResult r, const char **s)
{
    const char *name;
    if (cuGetErrorName(r, &name) != UM_CU_SUCCESS) {
        *s = NULL;
        return UM_CU_ERROR_INVALID_VALUE;
    }
    *s = r == UM_CU_ERROR_OUT_OF_MEMORY ? "out of memory (fake driver)" : "fake driver";
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetCount(int *n)
{
    *n = gpus;
    return UM_CU_SUCCESS;
}

static int valid_gpu(int d)
{
    return d >= 0 && d < gpus;
}

EXPORT um_cuResult cuDeviceGet(um_cuDevice *d, int ordinal)
{
    if (!valid_gpu(ordinal))
        return UM_CU_ERROR_INVALID_VALUE;
    *d = ordinal;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetName(char *name, int len, um_cuDevice d)
{
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceTotalMem_v2(size_t *bytes, um_cuDevice d)
{
    *bytes = gpu_mem;
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceGetAttribute(int *v, int attr, um_cuDevice d)
{
    if (!valid_gpu(d))
        return UM_CU_ERROR_INVALID_VALUE;
    switch (attr) {
    case UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case UM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case UM_CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
    case UM_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case UM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = vmm; break;
    case UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = host_numa; break;
    case UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *v = 0; break;
    default: return UM_CU_ERROR_INVALID_VALUE;
    }
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetPCIBusId(char *id, int len, um_cuDevice d)
{
    snprintf(id, (size_t)len, "0000:%02x:00.0", d + 0x10);
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceGetP2PAttribute(int *v, int attr, um_cuDevice a, um_cuDevice b)
{
    if (!valid_gpu(a) || !valid_gpu(b))
        return UM_CU_ERROR_INVALID_VALUE;
    *v = attr == UM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ? 0 : 1;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDevicePrimaryCtxRetain(um_cuContext *c, um_cuDevice d)
{
    if (!valid_gpu(d))
        return UM_CU_ERROR_INVALID_VALUE;
    atomic_fetch_add(&primary_retains[d], 1);
    *c = (um_cuContext)&ctx_tokens[d];
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDevicePrimaryCtxRelease_v2(um_cuDevice d)
{
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuCtxGetCurrent(um_cuContext *c)
{
    FORCED("cuCtxGetCurrent");
    *c = current;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuCtxSetCurrent(um_cuContext c)
{
    FORCED("cuCtxSetCurrent");
    current = c;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FORCED("cuMemGetInfo");
    int g = current_gpu();
    if (g < 0)
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *total = gpu_mem;
    *free_bytes = gpu_mem - used[g];
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemGetAllocationGranularity(size_t *g, const um_cuMemAllocationProp *prop,
                                                 int option)
{
    (void)option;
    if (!vmm || prop->type != UM_CU_MEM_ALLOCATION_TYPE_PINNED)
        return UM_CU_ERROR_NOT_SUPPORTED;
    *g = prop->location.type == UM_CU_MEM_LOCATION_TYPE_HOST_NUMA ? host_page : PAGE;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemAddressReserve(um_cuDeviceptr *p, size_t size, size_t align,
                                       um_cuDeviceptr addr, unsigned long long flags)
{
    FORCED("cuMemAddressReserve");
    if (!size || size % host_page || (align && align % host_page) || addr || flags)
        return UM_CU_ERROR_INVALID_VALUE;
    /* Aligned as the driver aligns a reservation: to `align`, else to the
     * largest granularity that divides the size (mmap alone gives pages of
     * 4 KiB, and the 2 MiB it often gives large sizes is luck). */
    size_t a = align ? align : size % PAGE == 0 ? PAGE : host_page;
    char *raw = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    char *m = (char *)(((uintptr_t)raw + a - 1) & ~(uintptr_t)(a - 1));
    if (m > raw)
        munmap(raw, (size_t)(m - raw));
    if (raw + a > m)
        munmap(m + size, (size_t)(raw + a - m));
    pthread_mutex_lock(&lock);
    if (nres == MAX_RES) {
        pthread_mutex_unlock(&lock);
        munmap(m, size);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    res[nres++] = (mapping){(uintptr_t)m, size, NULL, NULL};
    pthread_mutex_unlock(&lock);
    *p = (um_cuDeviceptr)(uintptr_t)m;
    return UM_CU_SUCCESS;
}

static int overlaps_mapping(uintptr_t va, size_t size);

EXPORT um_cuResult cuMemAddressFree(um_cuDeviceptr p, size_t size)
{
    FORCED("cuMemAddressFree");
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nres; i++) {
        if (res[i].va == (uintptr_t)p && res[i].size == size) {
            /* A mapping must be unmapped first. */
            if (overlaps_mapping((uintptr_t)p, size))
                break;
            res[i] = res[--nres];
            pthread_mutex_unlock(&lock);
            munmap((void *)(uintptr_t)p, size);
            return UM_CU_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuMemCreate(um_cuMemHandle *h, size_t size,
                               const um_cuMemAllocationProp *prop, unsigned long long flags)
{
    FORCED("cuMemCreate");
    if (!vmm || flags || !size || size % host_page)
        return UM_CU_ERROR_INVALID_VALUE;
    if (injected(F_CREATE))
        return UM_CU_ERROR_OUT_OF_MEMORY;
    int gpu = prop->location.type == UM_CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    if (prop->location.type == UM_CU_MEM_LOCATION_TYPE_DEVICE && !valid_gpu(gpu))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (gpu >= 0 && used[gpu] + size > gpu_mem) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    chunk *c = malloc(sizeof *c);
    if (!c || ftruncate(fd, (off_t)(fd_end + size)) != 0) {
        pthread_mutex_unlock(&lock);
        free(c);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    *c = (chunk){fd_end, size, gpu, 0, 0};
    fd_end += size;
    live_chunks++;
    if (gpu >= 0)
        used[gpu] += size;
    pthread_mutex_unlock(&lock);
    *h = (um_cuMemHandle)(uintptr_t)c;
    return UM_CU_SUCCESS;
}

/* Gives chunk c's memory back (under the lock). */
static void chunk_free(chunk *c)
{
    if (c->gpu >= 0)
        used[c->gpu] -= c->size;
    (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)c->off,
                    (off_t)c->size);
    live_chunks--;
    free(c);
}

EXPORT um_cuResult cuMemRelease(um_cuMemHandle h)
{
    chunk *c = (chunk *)(uintptr_t)h;
    FORCED("cuMemRelease");
    if (!c || c->released)
        return UM_CU_ERROR_INVALID_VALUE;
    if (injected(F_RELEASE))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* Like CUDA: a mapped chunk's memory stays until its last unmap. */
    if (c->maps)
        c->released = 1;
    else
        chunk_free(c);
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

static int in_reservation(uintptr_t va, size_t size)
{
    for (size_t i = 0; i < nres; i++)
        if (va >= res[i].va && va + size <= res[i].va + res[i].size)
            return 1;
    return 0;
}

static int overlaps_mapping(uintptr_t va, size_t size)
{
    for (size_t i = 0; i < nmaps; i++)
        if (va < maps[i].va + maps[i].size && maps[i].va < va + size)
            return 1;
    return 0;
}

EXPORT um_cuResult cuMemMap(um_cuDeviceptr p, size_t size, size_t offset, um_cuMemHandle h,
                            unsigned long long flags)
{
    chunk *c = (chunk *)(uintptr_t)h;
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemMap");
    if (!c || c->released || flags || offset + size > c->size || size % host_page ||
        va % host_page ||
        injected(F_MAP))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!in_reservation(va, size) || overlaps_mapping(va, size) || nmaps == MAX_MAPS) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_INVALID_VALUE;
    }
    /* Opaque: the device address stays PROT_NONE (the reservation's) and
     * the memory is mapped elsewhere, for the driver's copies only. */
    char *shadow = NULL;
    void *m;
    if (opaque && c->gpu >= 0) {
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(c->off + offset));
        shadow = m;
    } else {
        m = mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 (off_t)(c->off + offset));
    }
    if (m == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    maps[nmaps++] = (mapping){va, size, shadow, c};
    c->maps++;
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

/* Like CUDA: the range must consist of whole mappings. */
EXPORT um_cuResult cuMemUnmap(um_cuDeviceptr p, size_t size)
{
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemUnmap");
    if (injected(F_UNMAP))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t covered = 0;
    for (size_t i = 0; i < nmaps; i++) {
        if (maps[i].va < va + size && va < maps[i].va + maps[i].size) {
            if (maps[i].va < va || maps[i].va + maps[i].size > va + size) {
                pthread_mutex_unlock(&lock);
                return UM_CU_ERROR_INVALID_VALUE;
            }
            covered += maps[i].size;
        }
    }
    if (covered != size) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < nmaps;) {
        if (maps[i].va >= va && maps[i].va < va + size) {
            if (maps[i].shadow)
                munmap(maps[i].shadow, maps[i].size);
            chunk *c = maps[i].c;
            if (--c->maps == 0 && c->released)
                chunk_free(c);
            maps[i] = maps[--nmaps];
        } else {
            i++;
        }
    }
    mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    pthread_mutex_unlock(&lock);
    if (lazy)
        lazy_check_release(va, size, "cuMemUnmap");
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemSetAccess(um_cuDeviceptr p, size_t size, const um_cuMemAccessDesc *desc,
                                  size_t count)
{
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemSetAccess");
    if (!count || !desc || injected(F_ACCESS))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t covered = 0;
    for (size_t i = 0; i < nmaps; i++)
        if (maps[i].va >= va && maps[i].va + maps[i].size <= va + size)
            covered += maps[i].size;
    pthread_mutex_unlock(&lock);
    return covered == size ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

/* cuMemAlloc segments: a size header in front, so cuMemFree knows it. */
EXPORT um_cuResult cuMemAlloc_v2(um_cuDeviceptr *p, size_t size)
{
    FORCED("cuMemAlloc");
    int g = current_gpu();
    if (g < 0 || !size)
        return UM_CU_ERROR_INVALID_VALUE;
    size_t rounded = (size + PAGE - 1) / PAGE * PAGE;
    pthread_mutex_lock(&lock);
    if (used[g] + rounded > gpu_mem) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    used[g] += rounded;
    pthread_mutex_unlock(&lock);
    char *m = mmap(NULL, rounded + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    ((size_t *)m)[0] = rounded;
    ((size_t *)m)[1] = (size_t)g;
    *p = (um_cuDeviceptr)(uintptr_t)(m + PAGE);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemFree_v2(um_cuDeviceptr p)
{
    FORCED("cuMemFree");
    char *m = (char *)(uintptr_t)p - PAGE;
    size_t rounded = ((size_t *)m)[0], g = ((size_t *)m)[1];
    pthread_mutex_lock(&lock);
    used[g] -= rounded;
    pthread_mutex_unlock(&lock);
    if (lazy)
        lazy_check_release((uintptr_t)p, rounded, "cuMemFree");
    munmap(m, rounded + PAGE);
    return UM_CU_SUCCESS;
}

/* Where the host reaches the byte at address p: p itself, or in opaque
 * mode the second mapping of the GPU mapping p is in. *run gets the bytes
 * from p on that stay in the same mapping (SIZE_MAX outside any). */
static char *host_addr(uintptr_t p, size_t *run)
{
    *run = SIZE_MAX;
    if (!opaque)
        return (char *)p;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nmaps; i++) {
        if (maps[i].shadow && p >= maps[i].va && p < maps[i].va + maps[i].size) {
            char *h = maps[i].shadow + (p - maps[i].va);
            *run = maps[i].va + maps[i].size - p;
            pthread_mutex_unlock(&lock);
            return h;
        }
    }
    pthread_mutex_unlock(&lock);
    return (char *)p;
}

/* memmove and memset through host_addr, a mapping at a time (a block of
 * several pages has one mapping per page, and their second mappings are
 * not contiguous). */
static void copy_bytes(uintptr_t dst, uintptr_t src, size_t n)
{
    while (n) {
        size_t rd, rs;
        char *d = host_addr(dst, &rd), *s = host_addr(src, &rs);
        size_t k = n < rd ? n : rd;
        k = k < rs ? k : rs;
        memmove(d, s, k);
        dst += k;
        src += k;
        n -= k;
    }
}

static void set_bytes(uintptr_t dst, unsigned char v, size_t n)
{
    while (n) {
        size_t rd;
        char *d = host_addr(dst, &rd);
        size_t k = n < rd ? n : rd;
        memset(d, v, k);
        dst += k;
        n -= k;
    }
}

EXPORT um_cuResult cuMemcpy(um_cuDeviceptr dst, um_cuDeviceptr src, size_t n)
{
    FORCED("cuMemcpy");
    copy_bytes((uintptr_t)dst, (uintptr_t)src, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemcpyAsync(um_cuDeviceptr dst, um_cuDeviceptr src, size_t n, um_cuStream s)
{
    FORCED("cuMemcpyAsync");
    lazy_access(s, LAZY_COPY_READ, (uintptr_t)src, n);
    lazy_access(s, LAZY_COPY_WRITE, (uintptr_t)dst, n);
    copy_bytes((uintptr_t)dst, (uintptr_t)src, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemsetD8Async(um_cuDeviceptr dst, unsigned char v, size_t n, um_cuStream s)
{
    FORCED("cuMemsetD8Async");
    lazy_access(s, LAZY_MEMSET, (uintptr_t)dst, n);
    set_bytes((uintptr_t)dst, v, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamCreate(um_cuStream *s, unsigned flags)
{
    (void)flags;
    FORCED("cuStreamCreate");
    *s = malloc(1);
    if (!*s)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    live_streams++;
    if (lazy) {
        pthread_mutex_lock(&lazy_lock);
        (void)lazy_stream_new(current_gpu() < 0 ? 0 : current_gpu(), "created", *s);
        pthread_mutex_unlock(&lazy_lock);
    }
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamDestroy_v2(um_cuStream s)
{
    FORCED("cuStreamDestroy");
    if (!s)
        return UM_CU_ERROR_INVALID_VALUE;
    if (lazy) {
        /* Like CUDA: the stream's pending work still runs, so its record
         * stays until that work is done. */
        pthread_mutex_lock(&lazy_lock);
        int slot = lazy_created_stream(s);
        if (slot >= 0)
            lazy_orphan(slot);
        pthread_mutex_unlock(&lazy_lock);
    }
    free(s);
    live_streams--;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamSynchronize(um_cuStream s)
{
    FORCED("cuStreamSynchronize");
    if (!current)
        return UM_CU_ERROR_INVALID_VALUE;
    if (lazy) {
        pthread_mutex_lock(&lazy_lock);
        int slot = lazy_stream_of(s);
        lazy_log("stream %d synchronized (up to %llu)", slot,
                 (unsigned long long)lazy_streams[slot].last_seq);
        lazy_complete(slot, lazy_streams[slot].last_seq);
        pthread_mutex_unlock(&lazy_lock);
    }
    return UM_CU_SUCCESS;
}

/* Idle unless lazy mode holds work of the stream pending. */
EXPORT um_cuResult cuStreamQuery(um_cuStream s)
{
    FORCED("cuStreamQuery");
    if (!current)
        return UM_CU_ERROR_INVALID_VALUE;
    um_cuResult r = UM_CU_SUCCESS;
    if (lazy) {
        pthread_mutex_lock(&lazy_lock);
        int slot = lazy_stream_of(s);
        if (!lazy_done(slot, lazy_streams[slot].last_seq))
            r = UM_CU_ERROR_NOT_READY;
        pthread_mutex_unlock(&lazy_lock);
    }
    return r;
}

EXPORT um_cuResult cuStreamWaitEvent(um_cuStream s, um_cuEvent e, unsigned flags)
{
    (void)flags;
    FORCED("cuStreamWaitEvent");
    lazy_event *ev = (lazy_event *)e;
    if (lazy && ev) {
        pthread_mutex_lock(&lazy_lock);
        lazy_log("event %p waited for on a stream%s", (void *)e,
                 ev->recorded ? "" : " (never recorded)");
        if (ev->recorded)
            lazy_wait_for(lazy_stream_of(s), ev->stream, ev->seq, ev->ordered_after);
        pthread_mutex_unlock(&lazy_lock);
    }
    return UM_CU_SUCCESS;
}

/* An event: lazy mode's record of the work it stands for (first, so that
 * the lazy code reads it as a lazy_event), and for cuEventElapsedTime
 * whether it was made with timing and when it was last recorded. Work
 * completes when queued here (outside lazy mode), so an event completes
 * at its recording. */
typedef struct fake_event {
    lazy_event lazy;
    bool timing, recorded;
    uint64_t recorded_ns;
} fake_event;

static uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

EXPORT um_cuResult cuEventCreate(um_cuEvent *e, unsigned flags)
{
    FORCED("cuEventCreate");
    fake_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    ev->timing = !(flags & UM_CU_EVENT_DISABLE_TIMING);
    *e = (um_cuEvent)ev;
    live_events++;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuEventDestroy_v2(um_cuEvent e)
{
    FORCED("cuEventDestroy");
    if (!e)
        return UM_CU_ERROR_INVALID_VALUE;
    lazy_log("event %p destroyed", (void *)e);
    free(e);
    live_events--;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuEventRecord(um_cuEvent e, um_cuStream s)
{
    FORCED("cuEventRecord");
    if (injected(F_RECORD))
        return UM_CU_ERROR_INVALID_VALUE;
    if (!e || !current)
        return UM_CU_ERROR_INVALID_VALUE;
    ((fake_event *)e)->recorded = true;
    ((fake_event *)e)->recorded_ns = fake_now_ns();
    if (lazy) {
        lazy_event *ev = (lazy_event *)e;
        pthread_mutex_lock(&lazy_lock);
        ev->stream = lazy_stream_of(s);
        ev->seq = lazy_streams[ev->stream].last_seq;
        ev->queries = 0;
        ev->recorded = true;
        memcpy(ev->ordered_after, lazy_streams[ev->stream].ordered_after, sizeof ev->ordered_after);
        lazy_log("event %p recorded on stream %d at %llu", (void *)e, ev->stream,
                 (unsigned long long)ev->seq);
        pthread_mutex_unlock(&lazy_lock);
    }
    return UM_CU_SUCCESS;
}

/* In lazy mode an event's work completes at the Nth query since it was
 * recorded (FAKE_CUDA_LAZY_QUERIES=N), so that a caller polling for it
 * sees it unfinished first. */
EXPORT um_cuResult cuEventQuery(um_cuEvent e)
{
    FORCED("cuEventQuery");
    if (!e)
        return UM_CU_ERROR_INVALID_VALUE;
    if (!lazy)
        return UM_CU_SUCCESS;
    lazy_event *ev = (lazy_event *)e;
    um_cuResult r = UM_CU_SUCCESS;
    pthread_mutex_lock(&lazy_lock);
    if (ev->recorded && !lazy_done(ev->stream, ev->seq)) {
        if (lazy_queries_to_complete && ++ev->queries >= lazy_queries_to_complete)
            lazy_complete(ev->stream, ev->seq);
        else
            r = UM_CU_ERROR_NOT_READY;
    }
    lazy_log("event %p (stream %d at %llu) queried: %d", (void *)e, ev->stream,
             (unsigned long long)ev->seq, (int)r);
    pthread_mutex_unlock(&lazy_lock);
    return r;
}

EXPORT um_cuResult cuEventSynchronize(um_cuEvent e)
{
    FORCED("cuEventSynchronize");
    if (!e)
        return UM_CU_ERROR_INVALID_VALUE;
    lazy_event *ev = (lazy_event *)e;
    if (lazy && ev->recorded) {
        pthread_mutex_lock(&lazy_lock);
        lazy_log("event %p (stream %d at %llu) synchronized", (void *)e, ev->stream,
                 (unsigned long long)ev->seq);
        lazy_complete(ev->stream, ev->seq);
        pthread_mutex_unlock(&lazy_lock);
    }
    return UM_CU_SUCCESS;
}

/* As CUDA's: both events made with timing (else CUDA_ERROR_INVALID_HANDLE,
 * as for one never recorded), both completed (else CUDA_ERROR_NOT_READY);
 * the time between their recordings, when their work completed. */
EXPORT um_cuResult cuEventElapsedTime(float *ms, um_cuEvent start, um_cuEvent end)
{
    FORCED("cuEventElapsedTime");
    fake_event *a = (fake_event *)start, *z = (fake_event *)end;
    if (!ms || !a || !z)
        return UM_CU_ERROR_INVALID_VALUE;
    if (!a->timing || !z->timing || !a->recorded || !z->recorded)
        return UM_CU_ERROR_INVALID_HANDLE;
    if (lazy) {
        pthread_mutex_lock(&lazy_lock);
        bool done = lazy_done(a->lazy.stream, a->lazy.seq) && lazy_done(z->lazy.stream, z->lazy.seq);
        pthread_mutex_unlock(&lazy_lock);
        if (!done)
            return UM_CU_ERROR_NOT_READY;
    }
    *ms = (float)((double)((int64_t)(z->recorded_ns - a->recorded_ns)) / 1e6);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuModuleLoadData(um_cuModule *m, const void *image)
{
    (void)image;
    *m = NULL;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

EXPORT um_cuResult cuModuleUnload(um_cuModule m)
{
    (void)m;
    return UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuModuleGetFunction(um_cuFunction *f, um_cuModule m, const char *name)
{
    (void)m;
    (void)name;
    *f = NULL;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

EXPORT um_cuResult cuLaunchKernel(um_cuFunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                  um_cuStream s, void **params, void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)s, (void)params, (void)extra;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

/* How many of `what` are live: "mappings", "chunks", "streams", "events"
 * or "reservations"; -1 for another word. */
EXPORT long fake_cuda_live(const char *what)
{
    long n = -1;
    pthread_mutex_lock(&lock);
    if (strcmp(what, "mappings") == 0)
        n = (long)nmaps;
    else if (strcmp(what, "chunks") == 0)
        n = (long)live_chunks;
    else if (strcmp(what, "reservations") == 0)
        n = (long)nres;
    else if (strcmp(what, "streams") == 0)
        n = atomic_load(&live_streams);
    else if (strcmp(what, "events") == 0)
        n = atomic_load(&live_events);
    pthread_mutex_unlock(&lock);
    return n;
}
