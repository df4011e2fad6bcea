/*
 * Random use of buffers from several threads at once, on two stand-in GPUs
 * and the host at tight memory limits (eviction, write-back, spill), where
 * failures of the driver calls that order GPU work (cuEventRecord,
 * cuEventSynchronize, cuEventQuery, cuStreamWaitEvent, cuStreamSynchronize)
 * and of those that queue copies and fills (cuMemcpyAsync, cuMemsetD8Async)
 * are forced at random, on the stand-in driver's lazy mode
 * (tests/gpu/fake_cuda.c, FAKE_CUDA_LAZY_QUERIES): queued work stays
 * pending until waited for, and the driver reports memory unmapped under
 * pending work ("unmap") and bytes two streams touch unordered ("race").
 * test_cuda_order's random check does this from one thread; here:
 *   - four threads each own four buffers (one of them wrapping the
 *     thread's own memory, um_buffer_wrap) and share two more (one of
 *     them wrapped), guarded by a lock of the test's (readers at once, a
 *     writer alone), so that a model of every buffer's bytes stays exact;
 *   - the driver's failure rules are the whole process's, so one thread at
 *     a time arms them, for one library call of its own, and they land in
 *     whichever thread's call comes first: a failure is accepted only
 *     where a fault was armed at some moment of the failed call (a counter
 *     odd while armed, read before and after it), and its message must
 *     name a driver call;
 *   - no race or unmap report; every buffer's bytes as the model says (a
 *     failed write's range unknown only where its error says it may be
 *     partly written); a failed release leaves the acquisition held;
 *   - a wrapped buffer's destroy leaves the newest data in the program's
 *     memory, and where it fails the buffer stays, with its bytes.
 * Before that, one case alone: a wrapped buffer's destroy whose copy back
 * into the program's memory fails names the driver call that failed.
 * Calls that must work (a release after a failed one, the checks' reads,
 * the final destroys) are tried again while each failure falls in a
 * window of armed faults. MT_TRACE=1 prints every armed fault and failure;
 * MT_STEPS=N sets the operations per thread.
 * The test sets FAKE_CUDA_LAZY_QUERIES=3 and FAKE_CUDA_GPUS=4 unless they
 * are set. Exits 77 (skipped), saying why, without the stand-in driver.
 */
#include "harness.h"
#include "lazy_driver.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define SKIP 77
/* Two stand-in GPUs (devices 1 and 2) with the model's links. */
#define TWO_GPUS "devices=cuda:0+cuda:1,links=model,link_cache=none"

/* The driver calls that order GPU work, and those that queue the copies
 * and fills they order, failed at random below. */
static const char *const mt_calls[] = {"cuEventRecord",     "cuEventSynchronize",  "cuEventQuery",
                                       "cuStreamWaitEvent", "cuStreamSynchronize", "cuMemcpyAsync",
                                       "cuMemsetD8Async"};

enum {
    MT_THREADS = 4,
    MT_OWN = 4,    /* buffers of one thread; the last wraps the thread's memory */
    MT_SHARED = 2, /* buffers every thread uses */
    MT_GPUS = 2,
    MT_STREAMS = 2, /* created streams per GPU and thread */
    MT_MIN = 128 << 10,
    MT_MAX = 1 << 20
};

/* A buffer and what it must hold: model's bytes while known. A write
 * whose error says the range may be partly written makes them unknown
 * until the next write of the whole buffer. A shared buffer's fields are
 * under its lock (read: any number of readers of the buffer; write: one
 * thread changing its bytes, or destroying it). */
typedef struct mt_buffer {
    um_buffer *b;
    size_t size;
    unsigned char *model;
    unsigned char *host; /* wrapped: the program's memory under it */
    bool known;
    bool pinned;
    bool shared;
    pthread_rwlock_t lock;
} mt_buffer;

typedef struct mt_shared mt_shared;

typedef struct mt_thread {
    mt_shared *sh;
    int id;
    uint64_t rng;
    mt_buffer own[MT_OWN];
    /* [dev][0] is NULL, the device's default stream (shared by every
     * thread); [dev][1..] are this thread's streams of GPU dev. */
    um_stream streams[1 + MT_GPUS][1 + MT_STREAMS];
    unsigned char *stage, *out;
    /* Earlier out buffers a failed read's copy may still write. */
    unsigned char *abandoned[64];
    int nabandoned;
    long op;
    bool is_armed;   /* this thread holds arm_lock, its rules armed */
    uint64_t seq0;   /* arm_seq when the call now running began */
    char what[200];  /* the operation now, for reports */
    char fault[160]; /* the rules this thread armed, for reports */
} mt_thread;

struct mt_shared {
    um_context *ctx;
    counts c0;          /* the driver's reports before the check */
    int steps;          /* per thread */
    mt_buffer buf[MT_SHARED];
    mt_thread thr[MT_THREADS];
    /* One thread at a time arms rules: they are the process's, and the
     * disarming fake_cuda_fail_clear drops every rule. arm_seq is odd
     * while rules are armed. */
    pthread_mutex_t arm_lock;
    _Atomic uint64_t arm_seq;
    _Atomic long armed, failures, failures_elsewhere, reports, violations;
    _Atomic long wrapped_destroyed, wrapped_kept, held_full;
};

static size_t mt_below(mt_thread *t, size_t n)
{
    return n ? (size_t)(harness_rand(&t->rng) % n) : 0;
}

static void mt_report(mt_thread *t, const char *fmt, const char *detail)
{
    harness_checks++;
    if (atomic_fetch_add(&t->sh->reports, 1) < 20)
        harness_report(__FILE__, __LINE__, "thread %d, op %ld (%s%s%s): %s %s", t->id, t->op,
                       t->what, t->is_armed ? "; " : "", t->is_armed ? t->fault : "", fmt, detail);
    else
        harness_failures++;
}

/* The start of a library call whose failure mt_result judges. */
static void mt_begin(mt_thread *t)
{
    t->seq0 = atomic_load(&t->sh->arm_seq);
}

/* Whether rules were armed at some moment since mt_begin. */
static bool mt_window(const mt_thread *t)
{
    return (t->seq0 & 1) || atomic_load(&t->sh->arm_seq) != t->seq0;
}

/* Failures of one of the calls above (and, one time in three, of a
 * second: most failures have a way around them through another call),
 * armed before about one library call in eight, where no other thread has
 * rules armed; then mt_begin. */
static void mt_arm(mt_thread *t)
{
    mt_shared *sh = t->sh;
    t->is_armed = false;
    if (mt_below(t, 8) == 0 && pthread_mutex_trylock(&sh->arm_lock) == 0) {
        atomic_fetch_add(&sh->arm_seq, 1); /* odd: armed */
        size_t ncalls = sizeof mt_calls / sizeof mt_calls[0];
        size_t first = mt_below(t, ncalls), rules = mt_below(t, 3) == 0 ? 2 : 1;
        int len = 0;
        for (size_t i = 0; i < rules; i++) {
            const char *call = mt_calls[(first + i * (1 + mt_below(t, ncalls - 1))) % ncalls];
            unsigned skip = (unsigned)mt_below(t, 4), times = 1 + (unsigned)mt_below(t, 3);
            /* A query may also answer "not ready" (CUDA_ERROR_NOT_READY). */
            int result = strcmp(call, "cuEventQuery") == 0 && mt_below(t, 2) ? 600 : 999;
            cuda_fail(call, skip, times, result);
            len += snprintf(t->fault + len, sizeof t->fault - (size_t)len,
                            "%s%s fails (skip %u, times %u, result %d)", i ? ", " : "", call, skip,
                            times, result);
        }
        atomic_fetch_add(&sh->armed, 1);
        t->is_armed = true;
        if (getenv("MT_TRACE"))
            printf("thread %d, op %ld (%s): %s\n", t->id, t->op, t->what, t->fault);
    }
    mt_begin(t);
}

static void mt_disarm(mt_thread *t)
{
    if (!t->is_armed)
        return;
    /* One time in four the rules stay a while longer, for the other
     * threads' calls to meet. */
    if (mt_below(t, 4) == 0)
        usleep(50);
    cuda_fail_clear();
    atomic_fetch_add(&t->sh->arm_seq, 1); /* even: no rule left */
    t->is_armed = false;
    pthread_mutex_unlock(&t->sh->arm_lock);
}

/* A library call, begun at mt_begin, that returned s: a failure must come
 * while some thread had rules armed, and its message name the driver call
 * or the cause. */
static bool mt_result(mt_thread *t, um_status s, const char *call)
{
    if (s == UM_OK)
        return true;
    atomic_fetch_add(&t->sh->failures, 1);
    if (!t->is_armed)
        atomic_fetch_add(&t->sh->failures_elsewhere, 1);
    const char *msg = um_last_error();
    if (getenv("MT_TRACE"))
        printf("thread %d, op %ld: %s failed: %s\n", t->id, t->op, call, msg);
    char detail[700];
    snprintf(detail, sizeof detail, "%s failed (%s): %s", call, um_status_name(s), msg);
    /* Four threads' acquisitions (and a pin) can hold a GPU's 6 MiB
     * between them, the rest too fragmented for the request: reclaim then
     * finds nothing left to evict, as it says, with no fault (seen once in
     * about 200 runs). Taken only where held replicas are named. */
    const char *full = strstr(msg, "nothing left to evict: ");
    int held = 0;
    if (s == UM_ERR_NOMEM && full &&
        sscanf(full, "nothing left to evict: %d acquired", &held) == 1 && held > 0) {
        atomic_fetch_add(&t->sh->held_full, 1);
        return false;
    }
    if (!mt_window(t)) {
        mt_report(t, "no fault armed in any thread, yet", detail);
        return false;
    }
    bool named = strstr(msg, "CUDA_ERROR") != NULL;
    for (size_t i = 0; i < sizeof mt_calls / sizeof mt_calls[0]; i++)
        named = named || strstr(msg, mt_calls[i]) != NULL;
    if (!named)
        mt_report(t, "the message names no driver call:", detail);
    return false;
}

/* Whether to try a call that must work again: it failed while rules were
 * armed (mt_result accepted that), and has not failed too often. A short
 * pause lets the thread with the rules go on. */
static bool mt_again(mt_thread *t, int *tries)
{
    if (!mt_window(t) || ++*tries > 1000)
        return false;
    sched_yield();
    return true;
}

/* New race or unmap reports since the last look, by any thread. */
static void mt_violations(mt_thread *t)
{
    long v = unmaps_since(t->sh->c0) + races_since(t->sh->c0);
    long seen = atomic_load(&t->sh->violations);
    while (v > seen && !atomic_compare_exchange_weak(&t->sh->violations, &seen, v))
        ;
    if (v > seen) {
        char n[64];
        snprintf(n, sizeof n, "%ld new (race %ld, unmap %ld in all)", v - seen,
                 races_since(t->sh->c0), unmaps_since(t->sh->c0));
        mt_report(t, "driver violations:", n);
    }
}

/* n bytes at got against mb's model from offset off. */
static void mt_compare(mt_thread *t, mt_buffer *mb, const char *name, const unsigned char *got,
                       size_t off, size_t n)
{
    harness_checks++;
    if (!mb->known || memcmp(got, mb->model + off, n) == 0)
        return;
    size_t i = 0;
    while (got[i] == mb->model[off + i])
        i++;
    size_t bad = 0;
    for (size_t j = i; j < n; j++)
        bad += got[j] != mb->model[off + j];
    char detail[200];
    snprintf(detail, sizeof detail, "%s, byte %zu: %u, want %u (%zu of %zu bytes wrong)", name,
             off + i, got[i], mb->model[off + i], bad, n);
    mt_report(t, "wrong bytes:", detail);
    /* Reported once; a shared buffer is only read here, under its read
     * lock, so its model stays as it was. */
    if (!mb->shared)
        mb->known = false;
}

/* New data for n bytes: words of a random key, each different. */
static void mt_pattern(mt_thread *t, unsigned char *p, size_t n)
{
    uint64_t key = harness_rand(&t->rng);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((key >> (8 * (i & 7))) + (i >> 3) * 0x9Du);
}

/* A random range of mb: the whole buffer one time in four. */
static void mt_range(mt_thread *t, const mt_buffer *mb, size_t *off, size_t *n)
{
    if (mt_below(t, 4) == 0) {
        *off = 0;
        *n = mb->size;
        return;
    }
    *off = mt_below(t, mb->size);
    *n = 1 + mt_below(t, mb->size - *off);
}

/* A new buffer in mb (its lock held for writing, if shared): zeros, or for
 * a wrapped one the program's memory, new bytes written there first. */
static void mt_create(mt_thread *t, mt_buffer *mb)
{
    mb->size = MT_MIN + mt_below(t, MT_MAX - MT_MIN + 1);
    mb->b = NULL;
    mb->pinned = false;
    mb->known = true;
    if (mb->host) {
        mt_pattern(t, mb->host, mb->size);
        memcpy(mb->model, mb->host, mb->size);
    } else {
        memset(mb->model, 0, mb->size); /* a new buffer reads as zeros */
    }
    int tries = 0;
    um_status s;
    do {
        mt_begin(t);
        s = mb->host ? um_buffer_wrap(t->sh->ctx, mb->host, mb->size, &mb->b)
                     : um_buffer_create(t->sh->ctx, mb->size, NULL, &mb->b);
    } while (!mt_result(t, s, mb->host ? "um_buffer_wrap" : "um_buffer_create") &&
             mt_again(t, &tries));
}

/* mb's name for reports. */
static void mt_name(mt_thread *t, const mt_buffer *mb, char *name, size_t len)
{
    if (mb->shared)
        snprintf(name, len, "shared buffer %d%s", (int)(mb - t->sh->buf),
                 mb->host ? " (wrapped)" : "");
    else
        snprintf(name, len, "buffer %d of thread %d%s", (int)(mb - t->own), t->id,
                 mb->host ? " (wrapped)" : "");
}

/* A um_buffer_read of n bytes at off into t->out that must work: tried
 * again while it fails with rules armed. A read whose copy may still write
 * out leaves out to that copy. Returns whether it read. */
static bool mt_must_read(mt_thread *t, mt_buffer *mb, size_t off, size_t n)
{
    int tries = 0;
    for (;;) {
        mt_begin(t);
        um_status s = um_buffer_read(mb->b, off, t->out, n);
        if (mt_result(t, s, "um_buffer_read"))
            return true;
        if (strstr(um_last_error(), "may still be writing there") &&
            t->nabandoned < (int)(sizeof t->abandoned / sizeof t->abandoned[0])) {
            /* As the error says, the copy may still write out: a program
             * leaves that memory alone. */
            t->abandoned[t->nabandoned++] = t->out;
            t->out = malloc(MT_MAX);
        }
        if (!mt_again(t, &tries))
            return false;
    }
}

/* The whole of mb read and compared (its lock held, if shared). */
static void mt_check(mt_thread *t, mt_buffer *mb)
{
    if (!mb->b || !mb->known)
        return;
    char name[64];
    mt_name(t, mb, name, sizeof name);
    if (mt_must_read(t, mb, 0, mb->size))
        mt_compare(t, mb, name, t->out, 0, mb->size);
}

static void mt_stream_sync(mt_thread *t, um_stream s)
{
    int tries = 0;
    do
        mt_begin(t);
    while (!mt_result(t, um_stream_synchronize(t->sh->ctx, s), "um_stream_synchronize") &&
           mt_again(t, &tries));
}

/* An acquisition of mb on dev in mode, the replica used on stream si
 * (read out, or written in with um_memcpy_async), and its release. */
static void mt_acquire(mt_thread *t, mt_buffer *mb, int dev, um_access mode, int si)
{
    um_context *ctx = t->sh->ctx;
    um_stream s = t->streams[dev][si];
    unsigned char *p = NULL;
    mt_arm(t);
    um_status s1 = um_buffer_acquire(mb->b, dev, mode, s, (void **)&p);
    bool ok = mt_result(t, s1, "um_buffer_acquire");
    mt_disarm(t);
    if (!ok)
        return;
    size_t off = 0, n = mb->size;
    if (mode != UM_ACCESS_WRITE_DISCARD)
        mt_range(t, mb, &off, &n);
    unsigned char *host = mode == UM_ACCESS_READ ? t->out : t->stage;
    if (mode != UM_ACCESS_READ)
        mt_pattern(t, t->stage, n);
    bool copied = true;
    if (dev == 0) {
        memcpy(mode == UM_ACCESS_READ ? host : p + off, mode == UM_ACCESS_READ ? p + off : host, n);
    } else {
        mt_begin(t);
        um_status sc = mode == UM_ACCESS_READ ? um_memcpy_async(ctx, host, p + off, n, s)
                                              : um_memcpy_async(ctx, p + off, host, n, s);
        copied = mt_result(t, sc, "um_memcpy_async");
    }
    mt_arm(t);
    um_status s2 = um_buffer_release(mb->b, dev, s);
    ok = mt_result(t, s2, "um_buffer_release");
    mt_disarm(t);
    /* A release that failed leaves the acquisition held: the next works
     * (once no other thread's rules make it fail too). */
    for (int tries = 0; !ok;) {
        if (!mt_again(t, &tries))
            break;
        mt_begin(t);
        ok = mt_result(t, um_buffer_release(mb->b, dev, s), "um_buffer_release again");
    }
    if (dev != 0)
        mt_stream_sync(t, s);
    if (mode == UM_ACCESS_READ) {
        if (copied) {
            char name[64];
            mt_name(t, mb, name, sizeof name);
            mt_compare(t, mb, name, host, off, n);
        }
    } else if (copied) {
        memcpy(mb->model + off, host, n);
        if (n == mb->size)
            mb->known = true;
    } else {
        /* A failed copy leaves the bytes at its destination undefined. */
        mb->known = false;
    }
}

static void mt_read(mt_thread *t, mt_buffer *mb)
{
    size_t off, n;
    mt_range(t, mb, &off, &n);
    mt_arm(t);
    um_status s = um_buffer_read(mb->b, off, t->out, n);
    bool ok = mt_result(t, s, "um_buffer_read");
    mt_disarm(t);
    if (ok) {
        char name[64];
        mt_name(t, mb, name, sizeof name);
        mt_compare(t, mb, name, t->out, off, n);
    } else if (strstr(um_last_error(), "may still be writing there") &&
               t->nabandoned < (int)(sizeof t->abandoned / sizeof t->abandoned[0])) {
        t->abandoned[t->nabandoned++] = t->out;
        t->out = malloc(MT_MAX);
    }
}

static void mt_write(mt_thread *t, mt_buffer *mb)
{
    size_t off, n;
    mt_range(t, mb, &off, &n);
    mt_pattern(t, t->stage, n);
    mt_arm(t);
    um_status s = um_buffer_write(mb->b, off, t->stage, n);
    bool ok = mt_result(t, s, "um_buffer_write");
    /* The documented exception: the range written may be partly so. */
    bool partly = !ok && strstr(um_last_error(), "may be partly written") != NULL;
    mt_disarm(t);
    if (ok) {
        memcpy(mb->model + off, t->stage, n);
        if (n == mb->size)
            mb->known = true;
    } else if (partly) {
        mb->known = false;
    }
}

/* A destroy (mb->b NULL once it works). A wrapped buffer's destroy leaves
 * the newest data in the program's memory; one that fails leaves the
 * buffer, with its bytes. Returns whether it failed with rules armed
 * somewhere, so that it may be tried again. */
static bool mt_destroy(mt_thread *t, mt_buffer *mb, bool armed)
{
    char name[64];
    mt_name(t, mb, name, sizeof name);
    if (armed)
        mt_arm(t);
    else
        mt_begin(t);
    bool ok = mt_result(t, um_buffer_destroy(mb->b), "um_buffer_destroy");
    bool window = mt_window(t);
    mt_disarm(t);
    if (!ok) {
        if (mb->host)
            atomic_fetch_add(&t->sh->wrapped_kept, 1);
        /* The buffer stays, whole: read back at once. */
        mt_check(t, mb);
        return window;
    }
    if (mb->host) {
        atomic_fetch_add(&t->sh->wrapped_destroyed, 1);
        mt_compare(t, mb, name, mb->host, 0, mb->size);
    }
    mb->b = NULL;
    mb->pinned = false;
    return false;
}

static const char *mt_mode_name(um_access m)
{
    return m == UM_ACCESS_READ         ? "READ"
           : m == UM_ACCESS_READ_WRITE ? "READ_WRITE"
                                       : "WRITE_DISCARD";
}

static void mt_step(mt_thread *t)
{
    mt_shared *sh = t->sh;
    int k = (int)mt_below(t, MT_OWN + MT_SHARED);
    mt_buffer *mb = k < MT_OWN ? &t->own[k] : &sh->buf[k - MT_OWN];
    char name[64];
    mt_name(t, mb, name, sizeof name);
    int dev = (int)mt_below(t, 1 + MT_GPUS);
    uint64_t r = mt_below(t, 100);
    static const um_access modes[] = {UM_ACCESS_READ, UM_ACCESS_READ, UM_ACCESS_READ_WRITE,
                                      UM_ACCESS_WRITE_DISCARD};
    um_access mode = modes[mt_below(t, 4)];
    /* Which of the shared buffer's locks the operation takes: only those
     * that change its bytes (or its handle) take it for writing. */
    bool writes = (r < 50 && mode != UM_ACCESS_READ) || (r >= 62 && r < 74) || (r >= 91 && r < 96);
    if (mb->shared) {
        if (writes)
            pthread_rwlock_wrlock(&mb->lock);
        else
            pthread_rwlock_rdlock(&mb->lock);
    }
    if (r < 50) {
        int si = dev == 0 ? 0 : (int)mt_below(t, 1 + MT_STREAMS);
        snprintf(t->what, sizeof t->what, "%s (%zu bytes) acquired for %s on device %d, stream %d",
                 name, mb->size, mt_mode_name(mode), dev, si);
        mt_acquire(t, mb, dev, mode, si);
    } else if (r < 62) {
        snprintf(t->what, sizeof t->what, "um_buffer_read of %s", name);
        mt_read(t, mb);
    } else if (r < 74) {
        snprintf(t->what, sizeof t->what, "um_buffer_write of %s", name);
        mt_write(t, mb);
    } else if (r < 84) {
        snprintf(t->what, sizeof t->what, "um_buffer_prefetch of %s to device %d", name, dev);
        mt_arm(t);
        mt_result(t, um_buffer_prefetch(mb->b, dev), "um_buffer_prefetch");
        mt_disarm(t);
    } else if (r < 91) {
        /* One pinned buffer at most, thread 0's: wherever its replica
         * lies in a GPU's 6 MiB, the rest has room for the others. Pins
         * elsewhere become unpins. */
        um_hint h = (um_hint)(1 + mt_below(t, 4));
        if (h == UM_HINT_PIN && (t->id != 0 || mb->shared))
            h = UM_HINT_UNPIN;
        for (int i = 0; h == UM_HINT_PIN && i < MT_OWN; i++)
            if (&t->own[i] != mb && t->own[i].pinned)
                h = UM_HINT_UNPIN;
        snprintf(t->what, sizeof t->what, "hint %d for %s", (int)h, name);
        mt_arm(t);
        bool ok = mt_result(t, um_buffer_hint(mb->b, h), "um_buffer_hint");
        if (ok && !mb->shared)
            mb->pinned = h == UM_HINT_PIN ? true : h == UM_HINT_UNPIN ? false : mb->pinned;
        mt_disarm(t);
    } else if (r < 96) {
        snprintf(t->what, sizeof t->what, "destroying %s", name);
        mt_destroy(t, mb, true);
        if (!mb->b)
            mt_create(t, mb);
    } else {
        snprintf(t->what, sizeof t->what, "um_trim of device %d", dev);
        mt_arm(t);
        mt_result(t, um_trim(sh->ctx, dev), "um_trim");
        mt_disarm(t);
    }
    if (mb->shared)
        pthread_rwlock_unlock(&mb->lock);
}

/* Every buffer this thread can see read whole and compared. */
static void mt_check_all(mt_thread *t)
{
    snprintf(t->what, sizeof t->what, "reading every buffer");
    for (int k = 0; k < MT_OWN; k++)
        mt_check(t, &t->own[k]);
    for (int k = 0; k < MT_SHARED; k++) {
        mt_buffer *mb = &t->sh->buf[k];
        pthread_rwlock_rdlock(&mb->lock);
        mt_check(t, mb);
        pthread_rwlock_unlock(&mb->lock);
    }
}

static void *mt_worker(void *arg)
{
    harness_thread *h = arg;
    mt_shared *sh = h->shared;
    mt_thread *t = &sh->thr[h->id];
    for (t->op = 0; t->op < sh->steps; t->op++) {
        mt_step(t);
        mt_violations(t);
        if (t->op % 64 == 63) {
            mt_check_all(t);
            mt_violations(t);
        }
    }
    mt_check_all(t);
    mt_violations(t);
    /* The thread's buffers go, with no rule of its own armed: a wrapped
     * buffer's memory then holds its newest bytes. */
    for (int k = 0; k < MT_OWN; k++) {
        mt_buffer *mb = &t->own[k];
        snprintf(t->what, sizeof t->what, "destroying buffer %d at the end", k);
        for (int tries = 0; mb->b && mt_destroy(t, mb, false) && tries < 1000; tries++)
            sched_yield();
    }
    mt_violations(t);
    return NULL;
}

/* The whole check, with the seed's streams of random operations. */
static void check_threads_event_faults(uint64_t seed)
{
    counts c0 =
        check_begin("random buffer use from four threads with the ordering and copy calls failing");
    /* The host is short of room too: the only copy of some buffers goes
     * to the spill file. */
    char dir[] = "/tmp/unimem-mt-XXXXXX", conf[200];
    if (!mkdtemp(dir)) {
        harness_report(__FILE__, __LINE__, "mkdtemp %s failed", dir);
        return;
    }
    snprintf(conf, sizeof conf, TWO_GPUS ",watermark_high=100,watermark_low=100,spill_dir=%s", dir);
    mt_shared *sh = calloc(1, sizeof *sh);
    sh->c0 = c0;
    CHECK_OK(um_init(conf, &sh->ctx));
    if (!sh->ctx) {
        free(sh);
        rmdir(dir);
        return;
    }
    pthread_mutex_init(&sh->arm_lock, NULL);
    /* A few seconds in all, and under ThreadSanitizer about 20 s. */
    sh->steps = HARNESS_SANITIZED ? 1500 : 5000;
    if (getenv("MT_STEPS"))
        sh->steps = atoi(getenv("MT_STEPS"));
    /* 6 MiB: three pages, room for every thread's acquisition at once,
     * the pinned buffer and another buffer besides, fragmented or not
     * (at 4 MiB acquisitions fail for want of room, with no fault). */
    CHECK_OK(um_set_memory_limit(sh->ctx, 0, 6 * MIB));
    for (int d = 1; d <= MT_GPUS; d++)
        CHECK_OK(um_set_memory_limit(sh->ctx, d, 6 * MIB));
    for (int i = 0; i < MT_THREADS; i++) {
        mt_thread *t = &sh->thr[i];
        t->sh = sh;
        t->id = i;
        t->rng = harness_mix64(seed ^ 0x6d74ull ^ ((uint64_t)i << 32));
        t->stage = malloc(MT_MAX);
        t->out = malloc(MT_MAX);
        for (int d = 1; d <= MT_GPUS; d++)
            for (int j = 1; j <= MT_STREAMS; j++)
                CHECK_OK(um_stream_create(sh->ctx, d, &t->streams[d][j]));
        for (int k = 0; k < MT_OWN; k++) {
            mt_buffer *mb = &t->own[k];
            mb->model = malloc(MT_MAX);
            if (k == MT_OWN - 1)
                mb->host = malloc(MT_MAX);
            mt_create(t, mb);
        }
    }
    for (int k = 0; k < MT_SHARED; k++) {
        mt_buffer *mb = &sh->buf[k];
        mb->shared = true;
        mb->model = malloc(MT_MAX);
        if (k == MT_SHARED - 1)
            mb->host = malloc(MT_MAX);
        pthread_rwlock_init(&mb->lock, NULL);
        mt_create(&sh->thr[0], mb);
    }
    harness_run_threads(MT_THREADS, mt_worker, sh);
    mt_thread *t0 = &sh->thr[0];
    uint64_t evictions = 0, spilled = 0;
    for (int d = 0; d <= MT_GPUS; d++) {
        um_reclaim_stats rs;
        CHECK_OK(um_reclaim_stats_get(sh->ctx, d, &rs));
        evictions += rs.evictions;
        spilled += rs.spilled;
    }
    for (int k = 0; k < MT_SHARED; k++) {
        mt_buffer *mb = &sh->buf[k];
        snprintf(t0->what, sizeof t0->what, "destroying shared buffer %d at the end", k);
        mt_check(t0, mb);
        if (mb->b)
            mt_destroy(t0, mb, false);
        pthread_rwlock_destroy(&mb->lock);
    }
    for (int i = 0; i < MT_THREADS; i++)
        for (int d = 1; d <= MT_GPUS; d++)
            for (int j = 1; j <= MT_STREAMS; j++)
                CHECK_OK(um_stream_destroy(sh->ctx, sh->thr[i].streams[d][j]));
    um_shutdown(sh->ctx);
    lazy_drain();
    for (int k = 0; k < MT_SHARED; k++) {
        free(sh->buf[k].model);
        free(sh->buf[k].host);
    }
    long ops = 0;
    for (int i = 0; i < MT_THREADS; i++) {
        mt_thread *t = &sh->thr[i];
        ops += t->op;
        for (int k = 0; k < MT_OWN; k++) {
            free(t->own[k].model);
            free(t->own[k].host);
        }
        free(t->stage);
        free(t->out);
        for (int j = 0; j < t->nabandoned; j++)
            free(t->abandoned[j]);
    }
    rmdir(dir);
    printf("random event faults from %d threads: %ld operations, %ld faults armed, %ld "
           "failures (%ld in a thread that had armed none), %ld wrapped buffers destroyed (%ld "
           "destroys failed, the buffer kept), %ld acquisitions refused with held replicas filling "
           "a GPU, %llu evictions (%llu spilled), %ld race and %ld unmap reports\n",
           MT_THREADS, ops, atomic_load(&sh->armed), atomic_load(&sh->failures),
           atomic_load(&sh->failures_elsewhere), atomic_load(&sh->wrapped_destroyed),
           atomic_load(&sh->wrapped_kept), atomic_load(&sh->held_full),
           (unsigned long long)evictions, (unsigned long long)spilled, races_since(sh->c0),
           unmaps_since(sh->c0));
    CHECK_EQ(unmaps_since(sh->c0), 0);
    CHECK_EQ(races_since(sh->c0), 0);
    pthread_mutex_destroy(&sh->arm_lock);
    free(sh);
}

/* A wrapped buffer whose newest data is on GPU 1 is destroyed while the
 * copy back into the program's memory fails (cuMemcpyAsync): the destroy
 * fails, its message naming the driver call, and the buffer stays, the
 * program's memory getting its bytes once destroyed again. (The message
 * was formatted over the copy's own, which it quoted, and came out as
 * itself twice with the cause cut away.) */
static void check_wrapped_destroy_message(void)
{
    counts c;
    um_context *ctx =
        check_open("a wrapped buffer's destroy whose copy back fails names the driver call",
                   TWO_GPUS, &c);
    if (!ctx)
        return;
    const size_t n = 256 << 10;
    unsigned char *host = calloc(1, n), *src = malloc(n);
    memset(src, 0xA7, n);
    um_buffer *b = NULL;
    void *p = NULL;
    CHECK_OK(um_buffer_wrap(ctx, host, n, &b));
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    if (p) {
        CHECK_OK(um_memcpy(ctx, p, src, n));
        CHECK_OK(um_buffer_release(b, 1, NULL));
    }
    cuda_fail("cuMemcpyAsync", 0, 1000, 999);
    cuda_fail("cuMemcpy", 0, 1000, 999);
    um_status st = um_buffer_destroy(b);
    CHECK_STATUS(st, UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("could not be copied back", "cuMemcpy", NULL);
    /* The message says so once. */
    const char *e = um_last_error(), *first = strstr(e, "could not be copied back");
    CHECK(first && !strstr(first + 1, "could not be copied back"));
    cuda_fail_clear();
    if (st != UM_OK)
        CHECK_OK(um_buffer_destroy(b));
    CHECK_EQ(memcmp(host, src, n), 0);
    check_end(ctx, c);
    free(host);
    free(src);
}

int main(void)
{
    if (!lazy_driver_open("test_event_faults_mt", 2))
        return SKIP;
    uint64_t seed = harness_seed("test_event_faults_mt");
    check_wrapped_destroy_message();
    check_threads_event_faults(seed);
    return harness_finish("test_event_faults_mt");
}
