/*
 * cuda: the backend of one NVIDIA GPU, and of page-locked host memory,
 * through the CUDA driver API (loaded at run time by cuda_driver.c).
 *
 * Pages come from CUDA's virtual memory management: the pool reserves one
 * address range (cuMemAddressReserve) and maps physical chunks
 * (cuMemCreate) into it with cuMemMap + cuMemSetAccess, so a page freed in
 * one place can be unmapped and mapped where it is needed. A GPU without
 * VMM (or with the `cuda_vmm` option off) gets cuMemAlloc segments
 * instead (see "cuMemAlloc segments" below).
 *
 * Every driver call runs with the device's primary context current and
 * restores the caller's context afterwards (um__cuda_enter/leave), because
 * programs such as PyTorch keep their own notion of the current device.
 *
 * Owns: the primary-context reference, the backend streams it created or
 * wrapped (their records, until destroyed or until the backend is), a
 * small cache of events (recording a fence should not cost an event
 * creation each time), and the mappings the driver would not unmap after a
 * failed map (see cuda_map), until an unmap of them succeeds.
 */
#include "backend.h"
#include "cuda_driver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_EVENT_CACHE 64
#define CUDA_MAX_ACCESS 64

typedef struct cuda_stream {
    um_cuStream native;
    bool owned; /* created here, so destroyed here */
    struct cuda_stream *prev, *next; /* the backend's list of live records */
} cuda_stream;

/* A chunk mapped by a cuda_map that then failed, whose cleanup unmap the
 * driver refused twice: the mapping (and the chunk's memory) stays. */
typedef struct cuda_stuck_map {
    uintptr_t va;
    size_t size;
    um__phys h;
} cuda_stuck_map;

typedef struct cuda_backend {
    um__backend base;
    const um__cuda_api *cu;
    um_cuDevice dev;     /* the GPU whose primary context runs the calls */
    um_cuContext ctx;
    um_cuMemAllocationProp prop;
    um_cuMemAccessDesc access[CUDA_MAX_ACCESS];
    size_t naccess;
    pthread_mutex_t lock; /* guards the event caches and the stream list */
    /* Destroyed events kept for reuse: [0] plain (made without timing,
     * which waits and queries prefer), [1] timed. */
    um_cuEvent events[2][CUDA_EVENT_CACHE];
    int nevents[2];
    cuda_stream streams; /* head of the circular list of live stream records */
    /* event_time's anchor, under anchor_lock: a timed event recorded on a
     * stream of the backend's own, idle, so that it completed at a host time
     * known within a few microseconds (anchor_ns); other timed events are
     * placed by their time from it (see cuda_event_time). */
    pthread_mutex_t anchor_lock;
    um_cuStream anchor_stream;
    um_cuEvent anchor;
    uint64_t anchor_ns;
    /* Stuck mappings, under stuck_lock; nstuck is also read without it, so
     * that the usual case (none) costs map and release no lock. */
    pthread_mutex_t stuck_lock;
    cuda_stuck_map *stuck;
    size_t stuck_cap;
    _Atomic size_t nstuck;
} cuda_backend;

static cuda_backend *cb(um__backend *b)
{
    return (cuda_backend *)b;
}

/* Runs `call` (a driver call yielding a um_cuResult) inside the device's
 * primary context and stores its result in `r`. `ctx_failed` (a const char
 * *) is set to the context call that failed ("cuCtxSetCurrent", ...), in
 * which case `call` did not run, or to NULL; cuda_fail takes it. */
#define CUDA_IN_CTX(c, r, ctx_failed, call)                                                       \
    do {                                                                                          \
        um_cuContext saved_ = NULL;                                                               \
        (ctx_failed) = NULL;                                                                      \
        (r) = um__cuda_enter((c)->cu, (c)->ctx, &saved_, &(ctx_failed));                          \
        if ((r) == UM_CU_SUCCESS)                                                                 \
            (r) = (call);                                                                         \
        um__cuda_leave((c)->cu, (c)->ctx, saved_);                                                \
    } while (0)

/* Fails with st, naming the backend and the call that failed: the call fmt
 * describes ("cuMemCreate of 2097152 bytes"), or, when ctx_failed is not
 * NULL, the context call that kept it from running, so that a failed
 * context switch is never reported as a failure of the wrapped call. */
static um_status cuda_fail(um__backend *b, um_status st, um_cuResult r, const char *ctx_failed,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static um_status cuda_fail(um__backend *b, um_status st, um_cuResult r, const char *ctx_failed,
                           const char *fmt, ...)
{
    char call[224];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    if (ctx_failed)
        return um__cuda_fail(st, r, "%s: %s, making the GPU's context current for %s", b->name,
                             ctx_failed, call);
    return um__cuda_fail(st, r, "%s: %s", b->name, call);
}

static um_status cuda_reserve(um__backend *b, size_t size, uintptr_t *va)
{
    cuda_backend *c = cb(b);
    um_cuDeviceptr p = 0;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->MemAddressReserve(&p, size, b->granularity, 0, 0));
    if (r != UM_CU_SUCCESS) {
        char bytes[32];
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuMemAddressReserve of %s",
                         um__format_bytes(bytes, sizeof bytes, size));
    }
    *va = (uintptr_t)p;
    return UM_OK;
}

/* ------------------------------------------------------ stuck mappings */

/* Whether stuck mapping m is one of those stuck_retry is asked about: those
 * overlapping [va, va+size) when size is not 0, else those of chunk h, or
 * all of them when h is 0 too. */
static bool stuck_matches(const cuda_stuck_map *m, uintptr_t va, size_t size, um__phys h)
{
    if (size)
        return m->va < va + size && va < m->va + m->size;
    return !h || m->h == h;
}

/* Tries again to unmap the stuck mappings that stuck_matches selects, and
 * forgets each one the driver unmaps now. Runs inside the GPU's context.
 * UM_CU_SUCCESS when none of them is left; otherwise the driver's result,
 * with *left (when not NULL) a mapping that stays. */
static um_cuResult stuck_retry(cuda_backend *c, uintptr_t va, size_t size, um__phys h,
                               cuda_stuck_map *left)
{
    um_cuResult first = UM_CU_SUCCESS;
    pthread_mutex_lock(&c->stuck_lock);
    size_t n = atomic_load(&c->nstuck), kept = 0;
    for (size_t i = 0; i < n; i++) {
        cuda_stuck_map m = c->stuck[i];
        if (stuck_matches(&m, va, size, h)) {
            um_cuResult r = c->cu->MemUnmap((um_cuDeviceptr)m.va, m.size);
            if (r == UM_CU_SUCCESS)
                continue;
            if (first == UM_CU_SUCCESS) {
                first = r;
                if (left)
                    *left = m;
            }
        }
        c->stuck[kept++] = m;
    }
    atomic_store(&c->nstuck, kept);
    pthread_mutex_unlock(&c->stuck_lock);
    return first;
}

/* Records a mapping the driver would not unmap; false when there is no
 * memory for the record. */
static bool stuck_add(cuda_backend *c, uintptr_t va, size_t size, um__phys h)
{
    pthread_mutex_lock(&c->stuck_lock);
    size_t n = atomic_load(&c->nstuck);
    bool ok = true;
    if (n == c->stuck_cap) {
        size_t cap = c->stuck_cap ? 2 * c->stuck_cap : 4;
        cuda_stuck_map *a = realloc(c->stuck, cap * sizeof *a);
        if (a) {
            c->stuck = a;
            c->stuck_cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        c->stuck[n] = (cuda_stuck_map){va, size, h};
        atomic_store(&c->nstuck, n + 1);
    }
    pthread_mutex_unlock(&c->stuck_lock);
    return ok;
}

/* Forgets the stuck mappings inside [va, va+size), which a successful
 * unmap of that range took away with the rest. */
static void stuck_forget(cuda_backend *c, uintptr_t va, size_t size)
{
    pthread_mutex_lock(&c->stuck_lock);
    size_t n = atomic_load(&c->nstuck), kept = 0;
    for (size_t i = 0; i < n; i++)
        if (!(c->stuck[i].va >= va && c->stuck[i].va + c->stuck[i].size <= va + size))
            c->stuck[kept++] = c->stuck[i];
    atomic_store(&c->nstuck, kept);
    pthread_mutex_unlock(&c->stuck_lock);
}

static const char *result_name(const cuda_backend *c, um_cuResult r)
{
    const char *name = NULL;
    if (c->cu->GetErrorName(r, &name) != UM_CU_SUCCESS || !name)
        return "an unknown CUDA error";
    return name;
}

/* Enters the GPU's context and, where mappings stuck, first tries again
 * to unmap those stuck_matches selects (see stuck_retry); *stuck tells
 * whether one stays, in which case the result is the unmap's. */
static um_cuResult enter_past_stuck(cuda_backend *c, uintptr_t va, size_t size, um__phys h,
                                    um_cuContext *saved, const char **ctx_failed,
                                    cuda_stuck_map *left, bool *stuck)
{
    *stuck = false;
    um_cuResult r = um__cuda_enter(c->cu, c->ctx, saved, ctx_failed);
    if (r == UM_CU_SUCCESS && atomic_load(&c->nstuck))
        *stuck = (r = stuck_retry(c, va, size, h, left)) != UM_CU_SUCCESS;
    return r;
}

/* ------------------------------------------------------------ VMM calls */

static um_status cuda_unreserve(um__backend *b, uintptr_t va, size_t size)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    cuda_stuck_map left = {0};
    bool mapped;
    /* A stuck mapping in the range is unmapped first: the driver does not
     * free a reservation with a live mapping in it. */
    um_cuResult r = enter_past_stuck(c, va, size, 0, &saved, &ctx_failed, &left, &mapped);
    if (r == UM_CU_SUCCESS)
        r = c->cu->MemAddressFree((um_cuDeviceptr)va, size);
    um__cuda_leave(c->cu, c->ctx, saved);
    if (mapped)
        return um__cuda_fail(UM_ERR_BUSY, r,
                             "%s: cuMemAddressFree of %zu bytes at 0x%lx not attempted: %zu bytes "
                             "at 0x%lx stay mapped in it after a failed map (cuMemUnmap failed "
                             "again)",
                             b->name, size, (unsigned long)va, left.size, (unsigned long)left.va);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuMemAddressFree of %zu bytes at 0x%lx",
                         size, (unsigned long)va);
    return UM_OK;
}

static um_status cuda_create(um__backend *b, size_t size, um__phys *out)
{
    cuda_backend *c = cb(b);
    um_cuMemHandle h = 0;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->MemCreate(&h, size, &c->prop, 0));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuMemCreate of %zu bytes", size);
    if (h == 0) {
        /* 0 means "no chunk" to the pool; the driver has never returned it,
         * but a silent mix-up would lose a page. */
        return um__fail(UM_ERR_BACKEND, "%s: cuMemCreate returned the handle 0", b->name);
    }
    atomic_fetch_add(&b->physical_bytes, size);
    *out = (um__phys)h;
    return UM_OK;
}

static um_status cuda_release(um__backend *b, um__phys h, size_t size)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    cuda_stuck_map left = {0};
    bool mapped;
    /* A chunk whose mapping stuck is released only once that mapping is
     * gone. The driver would take the handle and keep the memory while it
     * stays mapped, so the caller would count memory as returned that is
     * not; refused, the pool keeps the chunk counted and tries again. */
    um_cuResult r = enter_past_stuck(c, 0, 0, h, &saved, &ctx_failed, &left, &mapped);
    if (r == UM_CU_SUCCESS)
        r = c->cu->MemRelease((um_cuMemHandle)h);
    um__cuda_leave(c->cu, c->ctx, saved);
    if (mapped)
        return um__cuda_fail(UM_ERR_BUSY, r,
                             "%s: cuMemRelease of a %zu-byte chunk not attempted: it stays mapped "
                             "at 0x%lx after a failed map (cuMemUnmap failed again)",
                             b->name, size, (unsigned long)left.va);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuMemRelease of a %zu-byte chunk",
                         size);
    atomic_fetch_sub(&b->physical_bytes, size);
    return UM_OK;
}

static um_status cuda_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    cuda_stuck_map left = {0};
    bool blocked;
    um_cuResult unmap = UM_CU_SUCCESS;
    const char *what = "cuMemMap";
    /* The pool counts a range unmapped once its map failed, so a mapping
     * that stuck there (below) meets the next map of the range: it is
     * unmapped now if the driver lets it, else the range stays unusable. */
    um_cuResult r = enter_past_stuck(c, va, size, 0, &saved, &ctx_failed, &left, &blocked);
    if (r == UM_CU_SUCCESS)
        r = c->cu->MemMap((um_cuDeviceptr)va, size, 0, (um_cuMemHandle)h, 0);
    if (r == UM_CU_SUCCESS) {
        /* A new mapping starts with no access at all. */
        r = c->cu->MemSetAccess((um_cuDeviceptr)va, size, c->access, c->naccess);
        if (r != UM_CU_SUCCESS) {
            what = "cuMemSetAccess";
            /* The map must be undone: the caller, told it failed, treats
             * the range as unmapped and the chunk as free to release. A
             * refused unmap is tried once more; a mapping that still stays
             * is recorded, and the failure says so. */
            unmap = c->cu->MemUnmap((um_cuDeviceptr)va, size);
            if (unmap != UM_CU_SUCCESS)
                unmap = c->cu->MemUnmap((um_cuDeviceptr)va, size);
        }
    }
    um__cuda_leave(c->cu, c->ctx, saved);
    if (blocked)
        return um__cuda_fail(UM_ERR_BUSY, r,
                             "%s: cuMemMap of %zu bytes at 0x%lx not attempted: %zu bytes at "
                             "0x%lx stay mapped there after an earlier failed map (cuMemUnmap "
                             "failed again)",
                             b->name, size, (unsigned long)va, left.size, (unsigned long)left.va);
    if (unmap != UM_CU_SUCCESS) {
        /* Recorded, the mapping is tried again at the next map of the
         * range, at the chunk's release (refused until then) and at
         * teardown. */
        bool kept = stuck_add(c, va, size, h);
        return um__cuda_fail(UM_ERR_BUSY, unmap,
                             "%s: cuMemSetAccess of %zu bytes at 0x%lx failed (%s), and the range "
                             "stays mapped%s: cuMemUnmap, undoing the map, failed twice",
                             b->name, size, (unsigned long)va, result_name(c, r),
                             kept ? "" : " and its chunk is lost (no memory to record it)");
    }
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "%s of %zu bytes at 0x%lx", what,
                         size, (unsigned long)va);
    return UM_OK;
}

static um_status cuda_unmap(um__backend *b, uintptr_t va, size_t size)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    um_cuResult r = um__cuda_enter(c->cu, c->ctx, &saved, &ctx_failed);
    /* One call for a run of pages, each its own mapping: the driver
     * unmaps a range of whole mappings (measured on the H200; the stand-in
     * driver of the tests keeps the same rule). A failure changes nothing,
     * which the pool relies on; unmapping page by page instead could fail
     * half way, with no handles here to map the first pages back. */
    if (r == UM_CU_SUCCESS)
        r = c->cu->MemUnmap((um_cuDeviceptr)va, size);
    um__cuda_leave(c->cu, c->ctx, saved);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuMemUnmap of %zu bytes at 0x%lx",
                         size, (unsigned long)va);
    /* A stuck mapping inside the range went with it. */
    if (atomic_load(&c->nstuck))
        stuck_forget(c, va, size);
    return UM_OK;
}

/* ------------------------------------------------------------- streams */

static um_cuStream native_of(um__bstream *s)
{
    return s ? ((cuda_stream *)s)->native : NULL;
}

/* Links a new record into the backend's list, whence cuda_destroy frees
 * those never destroyed (a failed destroy at shutdown forgets them). */
static void stream_link(cuda_backend *c, cuda_stream *s)
{
    pthread_mutex_lock(&c->lock);
    s->next = c->streams.next;
    s->prev = &c->streams;
    c->streams.next->prev = s;
    c->streams.next = s;
    pthread_mutex_unlock(&c->lock);
}

static void stream_unlink(cuda_backend *c, cuda_stream *s)
{
    pthread_mutex_lock(&c->lock);
    s->prev->next = s->next;
    s->next->prev = s->prev;
    pthread_mutex_unlock(&c->lock);
}

static um_status cuda_stream_create(um__backend *b, um__bstream **out)
{
    cuda_backend *c = cb(b);
    cuda_stream *s = calloc(1, sizeof *s);
    if (!s)
        return um__fail(UM_ERR_NOMEM, "%s: no memory for a stream record", b->name);
    um_cuResult r;
    const char *ctx_failed;
    /* Non-blocking, like PyTorch's and RMM's streams: work on it does not
     * wait for the legacy default stream. */
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->StreamCreate(&s->native, UM_CU_STREAM_NON_BLOCKING));
    if (r != UM_CU_SUCCESS) {
        free(s);
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuStreamCreate");
    }
    s->owned = true;
    stream_link(c, s);
    *out = (um__bstream *)s;
    return UM_OK;
}

/* The driver's special stream handles (cuda.h's CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD). */
#define CUDA_STREAM_LEGACY ((void *)0x1)
#define CUDA_STREAM_PER_THREAD ((void *)0x2)

static um_status cuda_stream_wrap(um__backend *b, void *native, um__bstream **out)
{
    /* The per-thread default stream is another stream in each thread that
     * names it: fences recorded on it by whichever thread polls (a trim,
     * another thread's allocation) would not cover the program's work. */
    if (native == CUDA_STREAM_PER_THREAD)
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: um_stream_wrap: CU_STREAM_PER_THREAD (the per-thread default "
                        "stream) is a different stream in each thread and cannot be wrapped; "
                        "wrap a stream created with cuStreamCreate, or NULL for the legacy "
                        "default stream",
                        b->name);
    /* CU_STREAM_LEGACY is the legacy default stream, the one NULL names. */
    if (native == CUDA_STREAM_LEGACY)
        native = NULL;
    cuda_stream *s = calloc(1, sizeof *s);
    if (!s)
        return um__fail(UM_ERR_NOMEM, "%s: no memory for a stream record", b->name);
    s->native = (um_cuStream)native;
    s->owned = false;
    stream_link(cb(b), s);
    *out = (um__bstream *)s;
    return UM_OK;
}

static void *cuda_stream_native(um__backend *b, um__bstream *s)
{
    UM_UNUSED(b);
    return (void *)native_of(s);
}

/* On failure the stream stays as it was, record and all, as backend.h
 * promises: um_stream_destroy keeps it valid for a retry. A caller that
 * gives up on it (um_shutdown) leaves the record to cuda_destroy. */
static um_status cuda_stream_destroy(um__backend *b, um__bstream *bs)
{
    cuda_backend *c = cb(b);
    cuda_stream *s = (cuda_stream *)bs;
    if (!s)
        return UM_OK;
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    um_cuResult r = um__cuda_enter(c->cu, c->ctx, &saved, &ctx_failed);
    /* A wrapped stream's work is waited for too, though the stream stays
     * the program's: fences recorded on it must be complete once the
     * wrapper is gone and its memory may name another stream (a replica
     * keeps one fence per stream, and merges unfinished ones on theirs). */
    const char *what = s->owned ? "cuStreamSynchronize, waiting for a stream's work before "
                                  "destroying it"
                                : "cuStreamSynchronize, waiting for a wrapped stream's work "
                                  "before forgetting it";
    if (r == UM_CU_SUCCESS)
        r = c->cu->StreamSynchronize(s->native);
    if (r == UM_CU_SUCCESS && s->owned) {
        what = "cuStreamDestroy of a stream whose work is done";
        r = c->cu->StreamDestroy(s->native);
    }
    um__cuda_leave(c->cu, c->ctx, saved);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "%s", what);
    stream_unlink(c, s);
    free(s);
    return UM_OK;
}

static um_status cuda_stream_sync(um__backend *b, um__bstream *s)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->StreamSynchronize(native_of(s)));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuStreamSynchronize");
    return UM_OK;
}

static um_status cuda_stream_query(um__backend *b, um__bstream *s, int *idle)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->StreamQuery(native_of(s)));
    *idle = r == UM_CU_SUCCESS;
    if (r == UM_CU_SUCCESS || (r == UM_CU_ERROR_NOT_READY && !ctx_failed))
        return UM_OK;
    return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuStreamQuery");
}

/* -------------------------------------------------------------- events */

/* Records an event on s, plain or timed, taken from that kind's cache. */
static um_status record_event(um__backend *b, um__bstream *s, bool timed, um__bevent **out)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL;
    /* The context first: an event taken from the cache before a failed
     * context switch would be in neither the cache nor the caller's hands. */
    um_cuResult r = um__cuda_enter(c->cu, c->ctx, &saved, &ctx_failed);
    if (r != UM_CU_SUCCESS) {
        um__cuda_leave(c->cu, c->ctx, saved);
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuEventRecord");
    }
    um_cuEvent e = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->nevents[timed])
        e = c->events[timed][--c->nevents[timed]];
    pthread_mutex_unlock(&c->lock);
    const char *what = "cuEventCreate";
    if (!e)
        r = c->cu->EventCreate(&e, timed ? 0 : UM_CU_EVENT_DISABLE_TIMING);
    if (r == UM_CU_SUCCESS) {
        what = "cuEventRecord";
        r = c->cu->EventRecord(e, native_of(s));
        if (r != UM_CU_SUCCESS)
            (void)c->cu->EventDestroy(e);
    }
    um__cuda_leave(c->cu, c->ctx, saved);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, NULL, "%s", what);
    *out = (um__bevent *)e;
    return UM_OK;
}

static um_status cuda_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{
    return record_event(b, s, false, out);
}

static um_status cuda_event_record_timed(um__backend *b, um__bstream *s, um__bevent **out)
{
    return record_event(b, s, true, out);
}

static um_status cuda_event_elapsed(um__backend *b, um__bevent *start, um__bevent *end,
                                    uint64_t *ns)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    float ms = 0.0f;
    CUDA_IN_CTX(c, r, ctx_failed,
                c->cu->EventElapsedTime(&ms, (um_cuEvent)start, (um_cuEvent)end));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuEventElapsedTime");
    *ns = ms > 0.0f ? (uint64_t)((double)ms * 1e6) : 0;
    return UM_OK;
}

/* A new anchor is taken when the last is older than this: the driver's
 * times are float milliseconds, whose step at 2 s from the anchor is
 * 0.12 us, and the GPU's clock may drift from the host's. */
#define CUDA_ANCHOR_NS 1000000000ull

/* An anchor whose record and wait took longer than this (the thread was
 * descheduled between them) is recorded again, up to CUDA_ANCHOR_TRIES
 * times, until one is that tight: its host time is known to half the
 * span (a CI run under ASan saw one 2.3 ms off). */
#define CUDA_ANCHOR_SPAN_NS 50000ull
#define CUDA_ANCHOR_TRIES 4

/* Records a new anchor and waits for it, in the context, under
 * anchor_lock; its host time is the middle of the record and the wait,
 * which the idle stream makes a few microseconds apart. */
static um_cuResult new_anchor(cuda_backend *c, const char **what)
{
    um_cuResult r = UM_CU_SUCCESS;
    *what = "cuStreamCreate";
    if (!c->anchor_stream)
        r = c->cu->StreamCreate(&c->anchor_stream, UM_CU_STREAM_NON_BLOCKING);
    if (r == UM_CU_SUCCESS && !c->anchor) {
        *what = "cuEventCreate";
        r = c->cu->EventCreate(&c->anchor, 0);
    }
    if (r != UM_CU_SUCCESS)
        return r;
    uint64_t best = UINT64_MAX;
    c->anchor_ns = 0;
    for (int i = 0; i < CUDA_ANCHOR_TRIES && best > CUDA_ANCHOR_SPAN_NS; i++) {
        uint64_t before = um__now_ns();
        *what = "cuEventRecord";
        r = c->cu->EventRecord(c->anchor, c->anchor_stream);
        if (r == UM_CU_SUCCESS) {
            *what = "cuEventSynchronize";
            r = c->cu->EventSynchronize(c->anchor);
        }
        uint64_t after = um__now_ns();
        if (r != UM_CU_SUCCESS) {
            c->anchor_ns = 0;
            return r;
        }
        best = after - before;
        c->anchor_ns = before + best / 2;
    }
    return r;
}

/* e's time from the anchor, signed: the driver's sign for events that
 * completed before the anchor is not documented, so the other order is
 * asked where the first gives none. */
static um_cuResult from_anchor(cuda_backend *c, um_cuEvent e, int64_t *ns)
{
    float ms = 0.0f;
    um_cuResult r = c->cu->EventElapsedTime(&ms, c->anchor, e);
    if (r == UM_CU_SUCCESS && ms <= 0.0f) {
        float back = 0.0f;
        if (c->cu->EventElapsedTime(&back, e, c->anchor) == UM_CU_SUCCESS && back > 0.0f)
            ms = -back;
    }
    *ns = (int64_t)((double)ms * 1e6);
    return r;
}

static um_status cuda_event_time(um__backend *b, um__bevent *e, uint64_t *ns)
{
    cuda_backend *c = cb(b);
    um_cuContext saved = NULL;
    const char *ctx_failed = NULL, *what = "cuEventElapsedTime";
    um_cuResult r = um__cuda_enter(c->cu, c->ctx, &saved, &ctx_failed);
    int64_t off = 0;
    if (r == UM_CU_SUCCESS) {
        pthread_mutex_lock(&c->anchor_lock);
        if (!c->anchor_ns || um__now_ns() - c->anchor_ns > CUDA_ANCHOR_NS)
            r = new_anchor(c, &what);
        if (r == UM_CU_SUCCESS) {
            what = "cuEventElapsedTime";
            r = from_anchor(c, (um_cuEvent)e, &off);
        }
        if (r == UM_CU_SUCCESS)
            *ns = off >= 0 || (uint64_t)-off < c->anchor_ns ? c->anchor_ns + (uint64_t)off : 0;
        pthread_mutex_unlock(&c->anchor_lock);
    }
    um__cuda_leave(c->cu, c->ctx, saved);
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "%s", what);
    return UM_OK;
}

static um_status cuda_event_query(um__backend *b, um__bevent *e, int *done)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->EventQuery((um_cuEvent)e));
    *done = r == UM_CU_SUCCESS;
    if (r == UM_CU_SUCCESS || (r == UM_CU_ERROR_NOT_READY && !ctx_failed))
        return UM_OK;
    return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuEventQuery");
}

static um_status cuda_event_sync(um__backend *b, um__bevent *e)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->EventSynchronize((um_cuEvent)e));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuEventSynchronize");
    return UM_OK;
}

/* Keeps event e (of the kind `timed`) for reuse, or destroys it when that
 * kind's cache is full. */
static void release_event(um__backend *b, um__bevent *e, bool timed)
{
    cuda_backend *c = cb(b);
    /* NULL is nothing to destroy, as on the host and sim backends; cached,
     * it would take a real event's slot and reach cuEventDestroy. */
    if (!e)
        return;
    pthread_mutex_lock(&c->lock);
    bool kept = c->nevents[timed] < CUDA_EVENT_CACHE;
    if (kept)
        c->events[timed][c->nevents[timed]++] = (um_cuEvent)e;
    pthread_mutex_unlock(&c->lock);
    if (!kept) {
        um_cuResult r;
        const char *ctx_failed;
        CUDA_IN_CTX(c, r, ctx_failed, c->cu->EventDestroy((um_cuEvent)e));
        if (r != UM_CU_SUCCESS)
            um__log(UM_LOG_WARN, "%s: %s failed (%d)%s", b->name,
                    ctx_failed ? ctx_failed : "cuEventDestroy", r,
                    ctx_failed ? ", so an event was not destroyed" : "");
    }
}

static void cuda_event_destroy(um__backend *b, um__bevent *e)
{
    release_event(b, e, false);
}

static void cuda_event_destroy_timed(um__backend *b, um__bevent *e)
{
    release_event(b, e, true);
}

/* --------------------------------------------------------------- copies */

static um_status cuda_copy(um__backend *b, void *dst, const void *src, size_t n, int dir)
{
    cuda_backend *c = cb(b);
    um_status st = um__backend_copy_check(b, dst, src, n, dir);
    if (st != UM_OK || n == 0)
        return st;
    um_cuResult r;
    const char *ctx_failed;
    /* Unified addressing: the driver tells host from device by address. */
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->Memcpy((um_cuDeviceptr)dst, (um_cuDeviceptr)src, n));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed,
                         "cuMemcpy of %zu bytes from %p to %p", n, src, dst);
    return UM_OK;
}

static um_status cuda_copy_async(um__backend *b, void *dst, const void *src, size_t n,
                                 um__bstream *s)
{
    cuda_backend *c = cb(b);
    um_status st = um__backend_copy_check(b, dst, src, n, -1);
    if (st != UM_OK)
        return st;
    if (n == 0)
        return UM_OK;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed,
                c->cu->MemcpyAsync((um_cuDeviceptr)dst, (um_cuDeviceptr)src, n, native_of(s)));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed,
                         "cuMemcpyAsync of %zu bytes from %p to %p", n, src, dst);
    return UM_OK;
}

/* An event of another CUDA backend is waited for on the device; any other
 * backend's event (host work) is waited for by the host first. */
static um_status cuda_stream_wait(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e)
{
    if (eb->ops->event_record != cuda_event_record)
        return eb->ops->event_sync(eb, e);
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->StreamWaitEvent(native_of(s), (um_cuEvent)e, 0));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuStreamWaitEvent");
    return UM_OK;
}

static um_status cuda_memset_async(um__backend *b, void *dst, int value, size_t n,
                                   um__bstream *s)
{
    cuda_backend *c = cb(b);
    if (!dst)
        return um__fail(UM_ERR_INVALID, "%s: memset of %zu bytes: the pointer is NULL", b->name,
                        n);
    if (!n)
        return UM_OK;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed,
                c->cu->MemsetD8Async((um_cuDeviceptr)dst, (unsigned char)value, n,
                                     native_of(s)));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuMemsetD8Async of %zu bytes at %p",
                         n, dst);
    return UM_OK;
}

static um_status cuda_bind_thread(um__backend *b)
{
    cuda_backend *c = cb(b);
    um_cuResult r = c->cu->CtxSetCurrent(c->ctx);
    if (r != UM_CU_SUCCESS)
        return um__cuda_fail(UM_ERR_BACKEND, r, "%s: cuCtxSetCurrent for a worker thread",
                             b->name);
    return UM_OK;
}

static um_status cuda_mem_info(um__backend *b, size_t *free_bytes, size_t *total)
{
    cuda_backend *c = cb(b);
    if (b->kind == UM_DEVICE_HOST) {
        /* Pinned host memory is not in the GPU's figures. */
        size_t used = atomic_load(&b->physical_bytes);
        *total = b->capacity;
        *free_bytes = used < b->capacity ? b->capacity - used : 0;
        return UM_OK;
    }
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->MemGetInfo(free_bytes, total));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuMemGetInfo");
    return UM_OK;
}

/* Last tries for what the layers above could not give back: stuck
 * mappings (unmapped, and their chunks released, which their users could
 * not do) and stream records whose destruction failed at shutdown (the
 * program's own streams are only forgotten). Runs inside the context. */
static void destroy_leftovers(cuda_backend *c)
{
    um__backend *b = &c->base;
    size_t streams = 0, stuck = 0;
    for (cuda_stream *s = c->streams.next, *nx; s != &c->streams; s = nx) {
        nx = s->next;
        /* cuStreamDestroy does not wait: the driver frees the stream once
         * its work is done. */
        if (s->owned && c->cu->StreamDestroy(s->native) != UM_CU_SUCCESS)
            streams++;
        free(s);
    }
    c->streams.next = c->streams.prev = &c->streams;
    size_t n = atomic_load(&c->nstuck);
    for (size_t i = 0; i < n; i++) {
        cuda_stuck_map *m = &c->stuck[i];
        if (c->cu->MemUnmap((um_cuDeviceptr)m->va, m->size) != UM_CU_SUCCESS ||
            c->cu->MemRelease((um_cuMemHandle)m->h) != UM_CU_SUCCESS) {
            stuck++;
            continue;
        }
        atomic_fetch_sub(&b->physical_bytes, m->size);
    }
    atomic_store(&c->nstuck, 0);
    if (streams)
        um__log(UM_LOG_WARN, "%s: at teardown %zu stream%s could not be destroyed", b->name,
                streams, streams == 1 ? "" : "s");
    if (stuck)
        um__log(UM_LOG_ERROR, "%s: at teardown %zu mapping%s left by failed maps could still not "
                "be unmapped and released: their memory stays the driver's", b->name, stuck,
                stuck == 1 ? "" : "s");
}

static void cuda_destroy(um__backend *b)
{
    cuda_backend *c = cb(b);
    if (!c)
        return;
    if (c->ctx) {
        um_cuContext saved = NULL;
        if (um__cuda_enter(c->cu, c->ctx, &saved, NULL) == UM_CU_SUCCESS) {
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < c->nevents[k]; i++)
                    (void)c->cu->EventDestroy(c->events[k][i]);
            if (c->anchor)
                (void)c->cu->EventDestroy(c->anchor);
            if (c->anchor_stream)
                (void)c->cu->StreamDestroy(c->anchor_stream);
            destroy_leftovers(c);
        }
        um__cuda_leave(c->cu, c->ctx, saved);
        (void)c->cu->DevicePrimaryCtxRelease(c->dev);
    }
    /* Records only, where the context could not be entered. */
    for (cuda_stream *s = c->streams.next, *nx; s && s != &c->streams; s = nx) {
        nx = s->next;
        free(s);
    }
    free(c->stuck);
    pthread_mutex_destroy(&c->stuck_lock);
    pthread_mutex_destroy(&c->anchor_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ------------------------------------------------ cuMemAlloc segments */

/* Without VMM a device address can only come with its memory, from
 * cuMemAlloc. The segment backend keeps the vtable's shape for allocators
 * that reserve, create and map one chunk per block (the baselines): the
 * reservation is the cuMemAlloc segment itself, and create, map, unmap and
 * release only keep the books. It cannot serve the pool, whose reservation
 * is several times the device's memory; the context gives such a device
 * the buffer cache (core/context.c). */
static _Atomic uint64_t segment_handles = 1;

static um_status segment_reserve(um__backend *b, size_t size, uintptr_t *va)
{
    cuda_backend *c = cb(b);
    um_cuDeviceptr p = 0;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->MemAlloc(&p, size));
    if (r != UM_CU_SUCCESS) {
        char bytes[32];
        return cuda_fail(b, um__cuda_status(r), r, ctx_failed, "cuMemAlloc of %s",
                         um__format_bytes(bytes, sizeof bytes, size));
    }
    atomic_fetch_add(&b->physical_bytes, size);
    *va = (uintptr_t)p;
    return UM_OK;
}

static um_status segment_unreserve(um__backend *b, uintptr_t va, size_t size)
{
    cuda_backend *c = cb(b);
    um_cuResult r;
    const char *ctx_failed;
    /* cuMemFree waits for the work that may still use the segment. */
    CUDA_IN_CTX(c, r, ctx_failed, c->cu->MemFree((um_cuDeviceptr)va));
    if (r != UM_CU_SUCCESS)
        return cuda_fail(b, UM_ERR_BACKEND, r, ctx_failed, "cuMemFree of %zu bytes at 0x%lx", size,
                         (unsigned long)va);
    atomic_fetch_sub(&b->physical_bytes, size);
    return UM_OK;
}

static um_status segment_create(um__backend *b, size_t size, um__phys *out)
{
    UM_UNUSED(b);
    UM_UNUSED(size);
    *out = atomic_fetch_add(&segment_handles, 1);
    return UM_OK;
}

static um_status segment_release(um__backend *b, um__phys h, size_t size)
{
    UM_UNUSED(b);
    UM_UNUSED(h);
    UM_UNUSED(size);
    return UM_OK;
}

static um_status segment_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{
    UM_UNUSED(b);
    UM_UNUSED(va);
    UM_UNUSED(size);
    UM_UNUSED(h);
    return UM_OK;
}

static um_status segment_unmap(um__backend *b, uintptr_t va, size_t size)
{
    UM_UNUSED(b);
    UM_UNUSED(va);
    UM_UNUSED(size);
    return UM_OK;
}

/* Streams, events, copies and teardown are the same with or without VMM. */
#define CUDA_COMMON_OPS                                                                           \
    .stream_create = cuda_stream_create, .stream_destroy = cuda_stream_destroy,                   \
    .stream_sync = cuda_stream_sync, .stream_query = cuda_stream_query,                           \
    .event_record = cuda_event_record,                                                            \
    .event_query = cuda_event_query, .event_sync = cuda_event_sync,                               \
    .event_destroy = cuda_event_destroy, .event_record_timed = cuda_event_record_timed,           \
    .event_elapsed = cuda_event_elapsed, .event_time = cuda_event_time,                           \
    .event_destroy_timed = cuda_event_destroy_timed,                                              \
    .stream_wrap = cuda_stream_wrap,                                                              \
    .stream_native = cuda_stream_native, .copy = cuda_copy, .copy_async = cuda_copy_async,        \
    .stream_wait = cuda_stream_wait, .memset_async = cuda_memset_async,                           \
    .mem_info = cuda_mem_info, .bind_thread = cuda_bind_thread, .destroy = cuda_destroy

static const um__backend_ops cuda_segment_ops = {
    .reserve = segment_reserve,
    .unreserve = segment_unreserve,
    .create = segment_create,
    .release = segment_release,
    .map = segment_map,
    .unmap = segment_unmap,
    CUDA_COMMON_OPS,
};

static const um__backend_ops cuda_ops = {
    .reserve = cuda_reserve,
    .unreserve = cuda_unreserve,
    .create = cuda_create,
    .release = cuda_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    CUDA_COMMON_OPS,
};

/* ------------------------------------------------------------- creation */

static um_status driver_or_fail(const um__cuda_api **cu, const char *what)
{
    char why[256];
    *cu = um__cuda_load(why, sizeof why);
    if (!*cu)
        return um__fail(UM_ERR_UNSUPPORTED, "%s: %s", what, why);
    return UM_OK;
}

/* The common part of both constructors: the record, the primary context
 * of GPU `ordinal`, and the page size for c->prop. */
static um_status cuda_new(const um__cuda_api *cu, int ordinal, const char *what,
                          cuda_backend **out)
{
    cuda_backend *c = calloc(1, sizeof *c);
    if (!c)
        return um__fail(UM_ERR_NOMEM, "%s: no memory for the backend record", what);
    c->cu = cu;
    c->base.ops = &cuda_ops;
    atomic_init(&c->base.calls, 0);
    atomic_init(&c->base.physical_bytes, 0);
    um__backend_no_driver_info(&c->base);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->stuck_lock, NULL);
    pthread_mutex_init(&c->anchor_lock, NULL);
    c->streams.next = c->streams.prev = &c->streams;
    atomic_init(&c->nstuck, 0);
    um_cuResult r = cu->DeviceGet(&c->dev, ordinal);
    if (r == UM_CU_SUCCESS)
        r = cu->DevicePrimaryCtxRetain(&c->ctx, c->dev);
    if (r != UM_CU_SUCCESS) {
        c->ctx = NULL;
        cuda_destroy(&c->base);
        return um__cuda_fail(UM_ERR_BACKEND, r, "%s: GPU %d: cannot open its primary context",
                             what, ordinal);
    }
    *out = c;
    return UM_OK;
}

static int attr(const cuda_backend *c, int a, int fallback)
{
    int v = 0;
    return c->cu->DeviceGetAttribute(&v, a, c->dev) == UM_CU_SUCCESS ? v : fallback;
}

/* The FP32 peak: multiprocessors x clock x flops per clock of one
 * (an FMA is two; 64 FP32 lanes on compute capability 6.0, 7.x and 8.0,
 * 128 on the others since 6.1). A driver that no longer reports the clock
 * gets a typical 1.5 GHz: this is only a first guess. */
static double nominal_gflops(const cuda_backend *c, int major, int minor)
{
    double sms = attr(c, UM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
    double khz = attr(c, UM_CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0);
    if (khz <= 0)
        khz = 1500000; /* newer drivers may report 0: deprecated in CUDA 13 */
    bool narrow = (major == 6 && minor == 0) || major == 7 || (major == 8 && minor == 0);
    return sms * khz * 1e-6 * (narrow ? 128.0 : 256.0);
}

/* Asks the driver for the allocation granularity of c->prop. */
static um_status set_granularity(cuda_backend *c, const char *what)
{
    size_t g = 0;
    um_cuResult r;
    const char *ctx_failed;
    CUDA_IN_CTX(c, r, ctx_failed,
                c->cu->MemGetAllocationGranularity(&g, &c->prop,
                                                   UM_CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (r != UM_CU_SUCCESS && ctx_failed)
        return um__cuda_fail(um__cuda_status(r), r,
                             "%s: %s, making the GPU's context current for "
                             "cuMemGetAllocationGranularity",
                             what, ctx_failed);
    if (r != UM_CU_SUCCESS)
        return um__cuda_fail(um__cuda_status(r), r, "%s: cuMemGetAllocationGranularity", what);
    if (!um__is_pow2(g))
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: the driver's page size %zu is not a power of two", what, g);
    c->base.granularity = g;
    return UM_OK;
}

/* Grants read-write access to the pages to every GPU that can reach the
 * memory of `owner` (an ordinal; -1 for host memory, which all can). */
static void add_gpu_access(cuda_backend *c, int owner)
{
    for (int i = 0; i < c->cu->gpus && c->naccess < CUDA_MAX_ACCESS; i++) {
        int ok = i == owner || owner < 0;
        if (!ok) {
            um_cuDevice from, to;
            int v = 0;
            if (c->cu->DeviceGet(&from, i) == UM_CU_SUCCESS &&
                c->cu->DeviceGet(&to, owner) == UM_CU_SUCCESS &&
                c->cu->DeviceGetP2PAttribute(&v, UM_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, from,
                                             to) == UM_CU_SUCCESS)
                ok = v != 0;
        }
        if (ok) {
            um_cuMemAccessDesc *d = &c->access[c->naccess++];
            d->location.type = UM_CU_MEM_LOCATION_TYPE_DEVICE;
            d->location.id = i;
            d->flags = UM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
    }
}

um_status um__cuda_backend_create(int ordinal, int vmm, size_t page_size, um__backend **out)
{
    char what[48];
    snprintf(what, sizeof what, "cuda%d", ordinal);
    *out = NULL;
    const um__cuda_api *cu;
    um_status st = driver_or_fail(&cu, what);
    if (st != UM_OK)
        return st;
    if (ordinal < 0 || ordinal >= cu->gpus)
        return um__fail(UM_ERR_NO_DEVICE, "%s: the driver reports %d GPU%s", what, cu->gpus,
                        cu->gpus == 1 ? "" : "s");
    cuda_backend *c;
    if ((st = cuda_new(cu, ordinal, what, &c)) != UM_OK)
        return st;
    um__backend *b = &c->base;
    b->kind = UM_DEVICE_CUDA;
    snprintf(b->name, sizeof b->name, "%s", what);
    b->ordinal = ordinal;
    b->cc_major = attr(c, UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0);
    b->cc_minor = attr(c, UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
    b->nominal_gflops = nominal_gflops(c, b->cc_major, b->cc_minor);
    if (cu->DeviceGetPCIBusId(b->pci_bus_id, (int)sizeof b->pci_bus_id, c->dev) != UM_CU_SUCCESS)
        b->pci_bus_id[0] = '\0';
    if (cu->DeviceGetName(b->product, (int)sizeof b->product, c->dev) != UM_CU_SUCCESS)
        b->product[0] = '\0';
    size_t total = 0;
    um_cuResult r = cu->DeviceTotalMem(&total, c->dev);
    if (r != UM_CU_SUCCESS) {
        cuda_destroy(b);
        return um__cuda_fail(UM_ERR_BACKEND, r, "%s: cuDeviceTotalMem", what);
    }
    b->capacity = total;
    bool has_vmm = attr(c, UM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) != 0;
    if (!has_vmm || !vmm) {
        um__log(UM_LOG_INFO, "%s: %s: memory comes in cuMemAlloc segments", what,
                has_vmm ? "cuda_vmm=0" : "the GPU has no virtual memory management");
        if (page_size)
            um__log(UM_LOG_WARN, "%s: option 'cuda_page_size' applies to VMM pages only; "
                    "the segments ignore it", what);
        b->ops = &cuda_segment_ops;
        b->vmm = 0;
        b->granularity = (size_t)2 << 20;
        *out = b;
        return UM_OK;
    }
    b->vmm = 1;
    c->prop.type = UM_CU_MEM_ALLOCATION_TYPE_PINNED;
    c->prop.requestedHandleTypes = UM_CU_MEM_HANDLE_TYPE_NONE;
    c->prop.location.type = UM_CU_MEM_LOCATION_TYPE_DEVICE;
    c->prop.location.id = ordinal;
    if ((st = set_granularity(c, what)) != UM_OK) {
        cuda_destroy(b);
        return st;
    }
    /* A page of several of the driver's: one cuMemCreate, cuMemMap and
     * cuMemSetAccess where the minimum page needs one each per 2 MiB. */
    if (page_size) {
        if (!um__is_pow2(page_size) || page_size < b->granularity) {
            size_t g = b->granularity;
            cuda_destroy(b);
            return um__fail(UM_ERR_BAD_OPTION,
                            "%s: option 'cuda_page_size' is %zu bytes: not a power of two at "
                            "least the driver's granularity of %zu bytes",
                            what, page_size, g);
        }
        b->granularity = page_size;
    }
    add_gpu_access(c, ordinal);
    *out = b;
    return UM_OK;
}

um_status um__cuda_host_backend_create(int gpu, size_t capacity, um__backend **out)
{
    const char *what = "pinned host memory";
    *out = NULL;
    const um__cuda_api *cu;
    um_status st = driver_or_fail(&cu, what);
    if (st != UM_OK)
        return st;
    if (cu->gpus < 1)
        return um__fail(UM_ERR_UNSUPPORTED, "%s: the driver reports no GPU", what);
    if (gpu < 0 || gpu >= cu->gpus)
        return um__fail(UM_ERR_UNSUPPORTED, "%s: the driver reports no GPU %d (%d GPU%s)", what,
                        gpu, cu->gpus, cu->gpus == 1 ? "" : "s");
    cuda_backend *c;
    if ((st = cuda_new(cu, gpu, what, &c)) != UM_OK)
        return st;
    um__backend *b = &c->base;
    b->kind = UM_DEVICE_HOST;
    snprintf(b->name, sizeof b->name, "host");
    if (!attr(c, UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0)) {
        cuda_destroy(b);
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: the driver cannot place VMM pages in host memory (it reports "
                        "no HOST_NUMA support for cuMemCreate: device attribute 141 is 0 or "
                        "unknown to this driver)",
                        what);
    }
    if (capacity == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
        capacity = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0;
    }
    b->capacity = capacity;
    b->vmm = 1;
    b->pinned = 1;
    int numa = attr(c, UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
    c->prop.type = UM_CU_MEM_ALLOCATION_TYPE_PINNED;
    c->prop.requestedHandleTypes = UM_CU_MEM_HANDLE_TYPE_NONE;
    c->prop.location.type = UM_CU_MEM_LOCATION_TYPE_HOST_NUMA;
    c->prop.location.id = numa < 0 ? 0 : numa;
    if ((st = set_granularity(c, what)) != UM_OK) {
        cuda_destroy(b);
        return st;
    }
    /* The CPU first, then every GPU. */
    c->access[0].location.type = UM_CU_MEM_LOCATION_TYPE_HOST_NUMA;
    c->access[0].location.id = c->prop.location.id;
    c->access[0].flags = UM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    c->naccess = 1;
    add_gpu_access(c, -1);
    *out = b;
    return UM_OK;
}

um_status um__cuda_link(int from, int to, um_link_info *out)
{
    const um__cuda_api *cu;
    memset(out, 0, sizeof *out);
    um_status st = driver_or_fail(&cu, "um_device_link_get");
    if (st != UM_OK)
        return st;
    um_cuDevice a, b;
    um_cuResult r = cu->DeviceGet(&a, from);
    if (r == UM_CU_SUCCESS)
        r = cu->DeviceGet(&b, to);
    if (r != UM_CU_SUCCESS)
        return um__cuda_fail(UM_ERR_NO_DEVICE, r, "um_device_link_get: GPU %d -> GPU %d", from,
                             to);
    if (from == to) {
        out->peer_access = 1;
        out->native_atomics = 1;
        return UM_OK;
    }
    /* Each attribute is asked on its own: a driver may know one and not
     * another, and an unknown one just stays 0. */
    (void)cu->DeviceGetP2PAttribute(&out->peer_access, UM_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                                    a, b);
    (void)cu->DeviceGetP2PAttribute(&out->performance_rank,
                                    UM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, a, b);
    (void)cu->DeviceGetP2PAttribute(&out->native_atomics,
                                    UM_CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, a, b);
    return UM_OK;
}
