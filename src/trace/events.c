/* Event recorder; see events.h. */
#include "events.h"
#include "../base/addrmap.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>
#define HAVE_TSC 1
#else
#define HAVE_TSC 0
#endif

/* Records per buffer: 512 KiB, written out in one call. */
#define CHUNK_RECS 16384
/* Full buffers waiting for the writer before recording threads wait too
 * (64 MiB): memory stays bounded when the disk is slower than the events. */
#define MAX_QUEUED 128
/* How long an allocation or free out of its address's order waits for the
 * event it must follow (block_event): far above the fraction of a
 * microsecond by which clock reads are seen out of order. */
#define HOLD_NS 1000000

/* A duration in flags' DUR_US unit is in microseconds (above 4.29 s), in
 * DUR_MS in milliseconds (above 71.6 minutes: a task or a wait in virtual
 * time can last that long; 49.7 days at most). */
enum { REC_DUR_US = 1, REC_DUR_MS = 2 };

/* One event as recorded: time in the recorder's ticks, two arguments, a
 * duration, what and where. */
typedef struct event_rec {
    uint64_t t, a0, a1;
    uint32_t dur;
    uint8_t kind;
    int8_t dev, src;
    uint8_t flags;
} event_rec;
_Static_assert(sizeof(event_rec) == 32, "an event record is 32 bytes");

typedef struct chunk {
    struct chunk *next; /* in the writer's queue or the spare list */
    uint32_t n;
    event_rec recs[CHUNK_RECS];
} chunk;

/* A recording thread's buffer in one recorder. */
typedef struct tbuf {
    struct tbuf *next;
    uint64_t thread; /* the thread's id (thread_id()) */
    chunk *c;
} tbuf;

/* A sorted run of records in the spill file. */
typedef struct run {
    uint64_t first; /* index of its first record */
    uint32_t n;
} run;

struct um__events {
    uint64_t gen;         /* tells this recorder apart from one at the same address */
    bool tsc;             /* times are TSC ticks; else um__now_ns, made unique */
    pthread_mutex_t lock; /* the lists below, the queue, the runs, the names */
    pthread_cond_t work, space;
    pthread_t writer;
    bool writer_started, stop, spill_failed;
    tbuf *threads;
    chunk *queue, *queue_tail, *spare;
    size_t queued;
    FILE *spill; /* the sorted runs, raw */
    char *spill_path;
    run *runs;
    size_t nruns, runs_cap;
    uint64_t spilled; /* records in the spill file */
    uint64_t dropped; /* events lost to a failed allocation or write */
    /* Recording threads that found the writer's queue full, and how long
     * they waited: the spill file's bandwidth bounds the events per second
     * of all threads together. */
    uint64_t stalls, stall_ns, writer_ns;
    char (*names)[32]; /* task names, by index */
    size_t nnames, names_cap;
    um__events *next_open;

    /* The clock: ns = t0_ns + (ticks - t0_ticks) * ns_per_tick. */
    uint64_t t0_ticks, t0_ns;
    double ns_per_tick, ticks_per_ns;
    /* Without the TSC, the latest time the clock handed out (logical_clock). */
    _Atomic uint64_t clock_last;

    /* The JSON writer, at close. */
    FILE *f;
    int ndevices;
    uint64_t *live, *reserved; /* per device, as of the events written */
    um__addrmap blocks;        /* live block -> its size */
    event_rec *held;           /* allocations and frees out of order (block_event) */
    size_t nheld, held_cap;
    int64_t last_ns;           /* the latest counter sample's time (held_expire) */
    struct span_track *tracks; /* per device and kind of span (span_lane) */
};

/* Open recorders, so that a thread's exit finds its buffers (g_lock). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static um__events *g_open;
static _Atomic uint64_t g_gen, g_thread;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static bool g_key_ok;

/* The recorder this thread last recorded into, and its buffer there. */
static _Thread_local struct {
    um__events *e;
    uint64_t gen;
    tbuf *tb;
} tl;
static _Thread_local uint64_t tl_thread;

/* ------------------------------------------------------------- the clock */

static bool tsc_invariant(void)
{
#if HAVE_TSC
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
        return false;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1;
#else
    return false;
#endif
}

/* The clock where the TSC is not used: clock_gettime's, or in virtual time
 * the virtual clock, which stands still while no device works. Many events
 * then read the same time, and the writer orders equal times by the order
 * in which their threads' buffers reached it, not by the order in which
 * they happened: a block freed by one thread and allocated again by
 * another could come out allocated before it was freed, with the wrong
 * size and live bytes after it. So each read returns at least one more
 * than any read before it in any thread, and every event gets a time of
 * its own, in causal order: a read that happens after another (through a
 * lock or a block handed over) sees its value or a later one, which the
 * coherence of a single atomic's modification order guarantees even with
 * relaxed operations. While the clock stands still, times move on by 1 ns
 * an event. The TSC path keeps no shared state: an atomic read-modify-write
 * on every event would cost more there than the rest of recording. */
static __attribute__((noinline)) uint64_t logical_clock(um__events *e)
{
    uint64_t now = um__now_ns();
    uint64_t last = atomic_load_explicit(&e->clock_last, memory_order_relaxed);
    uint64_t t;
    do
        t = now > last ? now : last + 1;
    while (!atomic_compare_exchange_weak_explicit(&e->clock_last, &last, t, memory_order_relaxed,
                                                  memory_order_relaxed));
    return t;
}

static inline uint64_t rec_clock(um__events *e)
{
#if HAVE_TSC
    if (UM_LIKELY(e->tsc))
        return __rdtsc();
#endif
    return logical_clock(e);
}

uint64_t um__events_clock(um__events *e)
{
    return rec_clock(e);
}

/* Ticks against um__now_ns over at least min_ns (both read close together),
 * so that the mapping holds to a few parts in a million. */
static void clock_pair(um__events *e, uint64_t *ticks, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    /* The first round always replaces these; set so that -O3 can see it. */
    *ticks = *ns = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t a = um__now_ns(), t = rec_clock(e), b = um__now_ns();
        if (b - a < best) {
            best = b - a;
            *ticks = t;
            *ns = a + (b - a) / 2;
        }
    }
}

static void clock_fit(um__events *e, uint64_t min_ns)
{
    if (!e->tsc) {
        e->ns_per_tick = e->ticks_per_ns = 1.0;
        return;
    }
    uint64_t t1, n1;
    do
        clock_pair(e, &t1, &n1);
    while (n1 - e->t0_ns < min_ns || t1 == e->t0_ticks);
    e->ns_per_tick = (double)(n1 - e->t0_ns) / (double)(t1 - e->t0_ticks);
    e->ticks_per_ns = 1.0 / e->ns_per_tick;
}

/* --------------------------------------------------- recording threads */

static uint64_t thread_id(void)
{
    if (!tl_thread)
        tl_thread = atomic_fetch_add(&g_thread, 1) + 1;
    return tl_thread;
}

static void thread_exit(void *value);

static void key_init(void)
{
    g_key_ok = pthread_key_create(&g_key, thread_exit) == 0;
}

static chunk *chunk_get_locked(um__events *e)
{
    chunk *c = e->spare;
    if (c)
        e->spare = c->next;
    else
        c = malloc(sizeof *c);
    if (c) {
        c->n = 0;
        c->next = NULL;
    }
    return c;
}

/* Queues c for the writer (locked); waits while the queue is full. */
static void chunk_queue_locked(um__events *e, chunk *c)
{
    if (e->queued >= MAX_QUEUED && !e->spill_failed) {
        uint64_t t0 = um__now_ns();
        while (e->queued >= MAX_QUEUED && !e->spill_failed)
            pthread_cond_wait(&e->space, &e->lock);
        e->stalls++;
        e->stall_ns += um__now_ns() - t0;
    }
    c->next = NULL;
    if (e->queue_tail)
        e->queue_tail->next = c;
    else
        e->queue = c;
    e->queue_tail = c;
    e->queued++;
    pthread_cond_signal(&e->work);
}

/* This thread's buffer in e, made on its first event there (locked). */
static tbuf *tbuf_find_locked(um__events *e, uint64_t thread)
{
    for (tbuf *tb = e->threads; tb; tb = tb->next)
        if (tb->thread == thread)
            return tb;
    tbuf *tb = calloc(1, sizeof *tb);
    if (!tb)
        return NULL;
    tb->thread = thread;
    tb->next = e->threads;
    e->threads = tb;
    return tb;
}

/* The next free record of this thread's buffer, after the slow cases: the
 * first event of this thread in e, a full buffer, no memory (NULL). */
static event_rec *slot_slow(um__events *e)
{
    uint64_t thread = thread_id();
    pthread_once(&g_once, key_init);
    if (g_key_ok && !pthread_getspecific(g_key))
        pthread_setspecific(g_key, (void *)(uintptr_t)thread);
    pthread_mutex_lock(&e->lock);
    tbuf *tb = tl.e == e && tl.gen == e->gen ? tl.tb : tbuf_find_locked(e, thread);
    event_rec *r = NULL;
    if (tb) {
        tl.e = e;
        tl.gen = e->gen;
        tl.tb = tb;
        if (tb->c && tb->c->n == CHUNK_RECS) {
            chunk_queue_locked(e, tb->c);
            tb->c = NULL;
        }
        if (!tb->c)
            tb->c = chunk_get_locked(e);
        if (tb->c)
            r = &tb->c->recs[tb->c->n++];
    }
    if (!r)
        e->dropped++;
    pthread_mutex_unlock(&e->lock);
    return r;
}

/* This thread's buffer in e when it has room for a record, else NULL
 * (slot_slow's cases). */
static inline chunk *room(const um__events *e)
{
    if (UM_LIKELY(tl.e == e && tl.gen == e->gen)) {
        chunk *c = tl.tb->c;
        if (UM_LIKELY(c && c->n < CHUNK_RECS))
            return c;
    }
    return NULL;
}

static inline event_rec *slot(um__events *e)
{
    chunk *c = room(e);
    return c ? &c->recs[c->n++] : slot_slow(e);
}

/* A thread that recorded is exiting: its buffers go to their recorders'
 * writers, so that short-lived threads do not pile up memory. */
static void thread_exit(void *value)
{
    uint64_t thread = (uint64_t)(uintptr_t)value;
    pthread_mutex_lock(&g_lock);
    for (um__events *e = g_open; e; e = e->next_open) {
        pthread_mutex_lock(&e->lock);
        for (tbuf **pp = &e->threads; *pp; pp = &(*pp)->next) {
            tbuf *tb = *pp;
            if (tb->thread != thread)
                continue;
            if (tb->c && tb->c->n)
                chunk_queue_locked(e, tb->c);
            else
                free(tb->c);
            *pp = tb->next;
            free(tb);
            break;
        }
        pthread_mutex_unlock(&e->lock);
    }
    pthread_mutex_unlock(&g_lock);
    tl.e = NULL;
}

static inline event_rec instant_rec(um__event_kind kind, int dev, uint64_t t, uint64_t a0,
                                    uint64_t a1)
{
    return (event_rec){t, a0, a1, 0, (uint8_t)kind, (int8_t)dev, -1, 0};
}

/* An instant whose thread has no room in its buffer: out of line, so that
 * the common case, an allocation's or a free's, saves no registers. */
static __attribute__((noinline)) void instant_slow(um__events *e, um__event_kind kind, int dev,
                                                   uint64_t t, uint64_t a0, uint64_t a1)
{
    event_rec *r = slot_slow(e);
    if (r)
        *r = instant_rec(kind, dev, t, a0, a1);
}

static inline void instant(um__events *e, um__event_kind kind, int dev, uint64_t t, uint64_t a0,
                           uint64_t a1)
{
    chunk *c = room(e);
    if (UM_LIKELY(c != NULL))
        c->recs[c->n++] = instant_rec(kind, dev, t, a0, a1);
    else
        instant_slow(e, kind, dev, t, a0, a1);
}

void um__event_instant_at(um__events *e, um__event_kind kind, int dev, uint64_t t, uint64_t a0,
                          uint64_t a1)
{
    instant(e, kind, dev, t, a0, a1);
}

/* An instant timed by the system clock (no usable TSC), made unique by
 * logical_clock: out of line for the same reason. */
static __attribute__((noinline)) void instant_now(um__events *e, um__event_kind kind, int dev,
                                                  uint64_t a0, uint64_t a1)
{
    instant(e, kind, dev, logical_clock(e), a0, a1);
}

void um__event_instant(um__events *e, um__event_kind kind, int dev, uint64_t a0, uint64_t a1)
{
#if HAVE_TSC
    if (UM_LIKELY(e->tsc)) {
        instant(e, kind, dev, __rdtsc(), a0, a1);
        return;
    }
#endif
    instant_now(e, kind, dev, a0, a1);
}

void um__event_add(um__events *e, um__event_kind kind, int dev, int src, uint64_t start_ns,
                   uint64_t dur_ns, uint64_t a0, uint64_t a1)
{
    /* The start in ticks: now, less the time since start_ns (spans are
     * recorded when they end, rarely long after they began). */
    uint64_t now_t = rec_clock(e), now_ns = um__now_ns();
    uint64_t ago = now_ns > start_ns ? now_ns - start_ns : 0;
    uint64_t t = now_t - (uint64_t)((double)ago * e->ticks_per_ns);
    uint8_t flags = 0;
    uint64_t dur = dur_ns;
    if (dur / 1000 > UINT32_MAX) {
        dur = dur / 1000000 > UINT32_MAX ? UINT32_MAX : dur / 1000000;
        flags = REC_DUR_MS;
    } else if (dur > UINT32_MAX) {
        dur /= 1000;
        flags = REC_DUR_US;
    }
    event_rec *r = slot(e);
    if (UM_LIKELY(r != NULL))
        *r = (event_rec){t, a0, a1, (uint32_t)dur, (uint8_t)kind, (int8_t)dev, (int8_t)src, flags};
}

void um__event_add_named(um__events *e, um__event_kind kind, int dev, uint64_t start_ns,
                         uint64_t dur_ns, uint64_t a0, uint64_t a1, const char *name)
{
    /* Names are rare (one a task): a table under the lock, the index in
     * a1's upper bits. */
    pthread_mutex_lock(&e->lock);
    size_t idx = SIZE_MAX;
    if (e->nnames < (1u << 24)) {
        if (e->nnames == e->names_cap) {
            size_t cap = e->names_cap ? 2 * e->names_cap : 64;
            char(*n)[32] = realloc(e->names, cap * sizeof *n);
            if (n) {
                e->names = n;
                e->names_cap = cap;
            }
        }
        if (e->nnames < e->names_cap) {
            idx = e->nnames++;
            snprintf(e->names[idx], sizeof e->names[idx], "%s", name ? name : "task");
        }
    }
    pthread_mutex_unlock(&e->lock);
    um__event_add(e, kind, dev, -1, start_ns, dur_ns, a0,
                  (a1 & 1) | (idx == SIZE_MAX ? 0 : (uint64_t)(idx + 1) << 1));
}

/* ------------------------------------------------------------ the writer */

static bool rec_before(const event_rec *a, const event_rec *b)
{
    return a->t < b->t;
}

/* Sorts recs by time, stably (a span recorded at its end lands after the
 * instants of its duration; most buffers are sorted already). */
static void sort_records(event_rec *recs, uint32_t n, event_rec *tmp)
{
    bool sorted = true;
    for (uint32_t i = 1; i < n && sorted; i++)
        sorted = !rec_before(&recs[i], &recs[i - 1]);
    if (sorted)
        return;
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = rec_before(&recs[j], &recs[i]) ? recs[j++] : recs[i++];
            while (i < mid)
                tmp[k++] = recs[i++];
            while (j < hi)
                tmp[k++] = recs[j++];
        }
        memcpy(recs, tmp, (size_t)n * sizeof *recs);
    }
}

/* Sorts c and appends it to the spill file as one run (the writer thread,
 * or the closing one once the writer has stopped). */
static void spill_chunk(um__events *e, chunk *c, event_rec *tmp)
{
    sort_records(c->recs, c->n, tmp);
    bool ok = !e->spill_failed && fwrite(c->recs, sizeof c->recs[0], c->n, e->spill) == c->n;
    pthread_mutex_lock(&e->lock);
    if (ok && e->nruns == e->runs_cap) {
        size_t cap = e->runs_cap ? 2 * e->runs_cap : 256;
        run *r = realloc(e->runs, cap * sizeof *r);
        if (r) {
            e->runs = r;
            e->runs_cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        e->runs[e->nruns++] = (run){e->spilled, c->n};
        e->spilled += c->n;
    } else {
        /* A failed write leaves the file's end unknown: stop spilling. */
        if (!e->spill_failed)
            um__log(UM_LOG_WARN,
                    "trace_file: writing events to '%s' failed (%s); later events "
                    "are dropped",
                    e->spill_path, strerror(errno));
        e->spill_failed = true;
        e->dropped += c->n;
        pthread_cond_broadcast(&e->space);
    }
    c->next = e->spare;
    e->spare = c;
    pthread_mutex_unlock(&e->lock);
}

static void *writer_main(void *arg)
{
    um__events *e = arg;
    event_rec *tmp = malloc(sizeof(event_rec) * CHUNK_RECS);
    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!e->queue && !e->stop)
            pthread_cond_wait(&e->work, &e->lock);
        chunk *c = e->queue;
        if (!c)
            break;
        e->queue = c->next;
        if (!e->queue)
            e->queue_tail = NULL;
        e->queued--;
        pthread_cond_broadcast(&e->space);
        pthread_mutex_unlock(&e->lock);
        if (tmp) {
            uint64_t t0 = um__now_ns();
            spill_chunk(e, c, tmp);
            uint64_t spent = um__now_ns() - t0;
            pthread_mutex_lock(&e->lock);
            e->writer_ns += spent;
            pthread_mutex_unlock(&e->lock);
        } else {
            pthread_mutex_lock(&e->lock);
            e->dropped += c->n;
            c->next = e->spare;
            e->spare = c;
            pthread_mutex_unlock(&e->lock);
        }
        pthread_mutex_lock(&e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    free(tmp);
    return NULL;
}

/* ------------------------------------------------------- the JSON output */

/* The length of the well-formed UTF-8 sequence at s (at most n bytes), or
 * 0: a name cut at its 31st byte can end inside one, and JSON readers
 * refuse a string holding such a fragment. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    if (s[0] < 0x80)
        len = 1;
    else if (s[0] >= 0xc2 && s[0] < 0xe0)
        len = 2;
    else if (s[0] >= 0xe0 && s[0] < 0xf0)
        len = 3;
    else if (s[0] >= 0xf0 && s[0] < 0xf5)
        len = 4;
    else
        return 0; /* a continuation byte, or a lead byte no character has */
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    /* Overlong forms, surrogates and code points above U+10FFFF. */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* name as a JSON string body: quotes, backslashes, controls and bytes
 * that are not well-formed UTF-8 dropped. */
static void json_name(char *out, size_t len, const char *name)
{
    size_t k = 0, n = strlen(name);
    for (size_t i = 0; i < n;) {
        const unsigned char *c = (const unsigned char *)name + i;
        size_t u = utf8_len(c, n - i);
        if (!u) {
            i++;
            continue;
        }
        if (k + u >= len)
            break;
        if (u > 1 || (*c >= 0x20 && *c != '"' && *c != '\\')) {
            memcpy(out + k, c, u);
            k += u;
        }
        i += u;
    }
    out[k] = '\0';
}

/* Allocations, frees and counter samples are nearly every event, so they
 * are formatted by hand into a line buffer: fprintf's %.3f made writing a
 * trace of a million events take seconds. */
typedef struct line {
    char buf[256];
    size_t n;
} line;

static void put_str(line *l, const char *s)
{
    size_t k = strlen(s);
    memcpy(l->buf + l->n, s, k);
    l->n += k;
}

static void put_u64(line *l, uint64_t v)
{
    char tmp[24];
    int k = 0;
    do
        tmp[k++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (k)
        l->buf[l->n++] = tmp[--k];
}

static void put_hex(line *l, uint64_t v)
{
    char tmp[16];
    int k = 0;
    do
        tmp[k++] = "0123456789abcdef"[v & 15];
    while ((v >>= 4) != 0);
    while (k)
        l->buf[l->n++] = tmp[--k];
}

/* A time in microseconds with three decimals, from nanoseconds. */
static void put_us(line *l, int64_t ns)
{
    if (ns < 0) {
        l->buf[l->n++] = '-';
        ns = -ns;
    }
    put_u64(l, (uint64_t)ns / 1000);
    unsigned frac = (unsigned)((uint64_t)ns % 1000);
    l->buf[l->n++] = '.';
    l->buf[l->n++] = (char)('0' + frac / 100);
    l->buf[l->n++] = (char)('0' + frac / 10 % 10);
    l->buf[l->n++] = (char)('0' + frac % 10);
}

static inline int64_t ticks_to_ns(const um__events *e, uint64_t t)
{
    return (int64_t)llround((double)(int64_t)(t - e->t0_ticks) * e->ns_per_tick);
}

/* The memory counters of dev at ts_ns, as they are after its last event. */
static void write_counters(um__events *e, int dev, int64_t ts_ns)
{
    uint64_t live = e->live[dev], res = e->reserved[dev];
    if (ts_ns > e->last_ns)
        e->last_ns = ts_ns;
    line l = {.n = 0};
    put_str(&l, ",\n{\"name\":\"memory\",\"ph\":\"C\",\"ts\":");
    put_us(&l, ts_ns);
    put_str(&l, ",\"pid\":");
    put_u64(&l, (uint64_t)dev);
    put_str(&l, ",\"args\":{\"live\":");
    put_u64(&l, live);
    put_str(&l, ",\"reserved\":");
    put_u64(&l, res);
    put_str(&l, ",\"cached\":");
    put_u64(&l, res > live ? res - live : 0);
    put_str(&l, "}}");
    fwrite(l.buf, 1, l.n, e->f);
}

static void put_i64(line *l, int64_t v)
{
    if (v < 0)
        l->buf[l->n++] = '-';
    put_u64(l, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}

/* A complete event ("X") up to its arguments' opening brace. Spans are
 * formatted by hand like the other events, since printf's %f follows the
 * program's locale, which may write a decimal comma. */
static void span_open(line *l, const char *name, const char *cat, int64_t ts_ns, int64_t dur_ns,
                      int pid, int tid)
{
    put_str(l, ",\n{\"name\":\"");
    put_str(l, name);
    put_str(l, "\",\"cat\":\"");
    put_str(l, cat);
    put_str(l, "\",\"ph\":\"X\",\"ts\":");
    put_us(l, ts_ns);
    put_str(l, ",\"dur\":");
    put_us(l, dur_ns);
    put_str(l, ",\"pid\":");
    put_i64(l, pid);
    put_str(l, ",\"tid\":");
    put_i64(l, tid);
    put_str(l, ",\"args\":{");
}

/* One argument of a span; the first has no comma before it. */
static void span_arg(line *l, bool first, const char *key, int64_t v)
{
    put_str(l, first ? "\"" : ",\"");
    put_str(l, key);
    put_str(l, "\":");
    put_i64(l, v);
}

static void span_close(um__events *e, line *l)
{
    put_str(l, "}}");
    fwrite(l->buf, 1, l->n, e->f);
}

/* Tracks of spans. A Chrome trace track shows only spans that nest, but
 * spans of one kind on one device can overlap: tasks of several workers,
 * copies on several streams, backend calls or waits for room from several
 * threads. Each kind of span on each device is therefore a set of lanes,
 * each a track of its own (tid base + LANE_TID * lane), and a span goes to
 * the first lane where it starts after that lane's open spans end or nests
 * in the innermost one. Spans come in order of their start (write_merged),
 * so this greedy choice uses as few lanes as the overlaps need. */
#define LANE_TID 10000
#define LANE_DEPTH 8 /* spans nested in one lane */
#define MAX_LANES 64 /* more overlapping spans than this share the last lane */
enum { TRACK_EVICT, TRACK_WAIT, TRACK_RECLAIMER, TRACK_TASK, TRACK_BACKEND, TRACK_COPY };

typedef struct span_lane {
    int64_t open_end[LANE_DEPTH]; /* the ends of its open spans, outermost first */
    int depth;
} span_lane;

typedef struct span_track {
    span_lane *lanes;
    int nlanes;
} span_track;

/* Tracks a device has: one per kind, copies one per sending device (and
 * one for copies from no device). */
static size_t tracks_per_device(const um__events *e)
{
    return TRACK_COPY + 1 + (size_t)e->ndevices;
}
static size_t tracks_count(const um__events *e)
{
    return (size_t)e->ndevices * tracks_per_device(e);
}

static const char *const track_names[TRACK_COPY] = {
    "evictions", "allocations waiting for room", "reclaimer", "tasks", "backend calls and trims"};

/* The lane of a span from ts_ns lasting dur_ns on track `track` of dev;
 * names a lane the first time it is used. Returns the lane's tid, or
 * base_tid where there is no track (a device out of range, no memory). */
static int span_lane_tid(um__events *e, int dev, int track, int base_tid, int64_t ts_ns,
                         int64_t dur_ns)
{
    if (dev < 0 || dev >= e->ndevices || track < 0 || (size_t)track >= tracks_per_device(e))
        return base_tid;
    if (!e->tracks && !(e->tracks = calloc(tracks_count(e), sizeof *e->tracks)))
        return base_tid;
    span_track *tr = &e->tracks[(size_t)dev * tracks_per_device(e) + (size_t)track];
    int64_t end = ts_ns + dur_ns;
    int k = 0;
    for (; k < tr->nlanes; k++) {
        span_lane *ln = &tr->lanes[k];
        while (ln->depth && ln->open_end[ln->depth - 1] <= ts_ns)
            ln->depth--;
        if (!ln->depth || (ln->depth < LANE_DEPTH && end <= ln->open_end[ln->depth - 1]))
            break;
    }
    if (k == tr->nlanes) {
        span_lane *lanes = tr->nlanes < MAX_LANES
                               ? realloc(tr->lanes, ((size_t)tr->nlanes + 1) * sizeof *lanes)
                               : NULL;
        if (!lanes) {
            /* Overlapping the last lane's spans beats losing the span. */
            if (!tr->nlanes)
                return base_tid;
            k = tr->nlanes - 1;
            tr->lanes[k].depth = 0;
        } else {
            tr->lanes = lanes;
            tr->lanes[tr->nlanes++] = (span_lane){.depth = 0};
            char name[64];
            if (track < TRACK_COPY)
                snprintf(name, sizeof name, "%s", track_names[track]);
            else if (track == TRACK_COPY)
                snprintf(name, sizeof name, "copies from no device");
            else
                snprintf(name, sizeof name, "copies from device %d", track - TRACK_COPY - 1);
            if (k)
                snprintf(name + strlen(name), sizeof name - strlen(name), " (%d)", k + 1);
            fprintf(e->f,
                    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                    "\"args\":{\"name\":\"%s\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\","
                    "\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                    dev, base_tid + LANE_TID * k, name, dev, base_tid + LANE_TID * k,
                    base_tid * MAX_LANES + k);
        }
    }
    span_lane *ln = &tr->lanes[k];
    if (ln->depth < LANE_DEPTH)
        ln->open_end[ln->depth++] = end;
    return base_tid + LANE_TID * k;
}

/* A span of r on a lane of its device's track (tid: the first lane's)
 * with two named arguments. */
static void write_span(um__events *e, const event_rec *r, int64_t ts_ns, int64_t dur_ns,
                       const char *name, const char *cat, int track, int tid, const char *arg0,
                       uint64_t a0, const char *arg1, uint64_t a1)
{
    line l = {.n = 0};
    span_open(&l, name, cat, ts_ns, dur_ns, r->dev,
              span_lane_tid(e, r->dev, track, tid, ts_ns, dur_ns));
    span_arg(&l, true, arg0, (int64_t)a0);
    span_arg(&l, false, arg1, (int64_t)a1);
    span_close(e, &l);
}

static const char *const backend_op_names[UM_BE_OP_COUNT] = {"backend reserve", "backend unreserve",
                                                             "backend create",  "backend release",
                                                             "backend map",     "backend unmap"};

/* An allocation or a free at ts_ns, with the live counter it leaves. */
static void write_block(um__events *e, const event_rec *r, int64_t ts_ns)
{
    uint64_t size = r->a0;
    /* A block the map has no room for is missing from the counters; a
     * free of an unknown block counts 0 bytes. An allocation at an address
     * still live (its free was never seen) replaces the old block. */
    if (r->kind == UM_EVENT_ALLOC) {
        uint64_t old;
        if (um__addrmap_take(&e->blocks, r->a1, &old))
            e->live[r->dev] -= old <= e->live[r->dev] ? old : e->live[r->dev];
        if (um__addrmap_put(&e->blocks, r->a1, size))
            e->live[r->dev] += size;
    } else {
        if (!um__addrmap_take(&e->blocks, r->a1, &size))
            size = 0;
        e->live[r->dev] -= size <= e->live[r->dev] ? size : e->live[r->dev];
    }
    line l = {.n = 0};
    put_str(&l, r->kind == UM_EVENT_ALLOC ? ",\n{\"name\":\"alloc\"" : ",\n{\"name\":\"free\"");
    put_str(&l, ",\"cat\":\"memory\",\"ph\":\"i\",\"s\":\"t\",\"ts\":");
    put_us(&l, ts_ns);
    put_str(&l, ",\"pid\":");
    put_u64(&l, (uint64_t)r->dev);
    put_str(&l, ",\"tid\":0,\"args\":{\"bytes\":");
    put_u64(&l, size);
    put_str(&l, ",\"block\":\"0x");
    put_hex(&l, r->a1);
    put_str(&l, "\"}}");
    fwrite(l.buf, 1, l.n, e->f);
    write_counters(e, r->dev, ts_ns);
}

/* The held event at addr of the given kind, or -1. */
static ptrdiff_t held_find(const um__events *e, uint64_t addr, uint8_t kind)
{
    for (size_t i = 0; i < e->nheld; i++)
        if (e->held[i].a1 == addr && e->held[i].kind == kind)
            return (ptrdiff_t)i;
    return -1;
}

/* Keeps the others in their order, which is their time's: held_find
 * takes the first, and two allocations held at one address must come out
 * as they were made. (Moving the last into the gap once put a later
 * allocation, with its size, before an earlier one.) */
static void held_remove(um__events *e, size_t i)
{
    e->nheld--;
    memmove(&e->held[i], &e->held[i + 1], (e->nheld - i) * sizeof *e->held);
}

/* Writes the held events recorded more than HOLD_NS before now_ns (all of
 * them with INT64_MAX), as they are, but no earlier than the events
 * already written: written at its own time, a held event went back in
 * time, and its counter sample, which holds the later events' bytes, then
 * stood for a time before them. */
static void held_expire(um__events *e, int64_t now_ns)
{
    for (size_t i = 0; i < e->nheld;) {
        int64_t t = ticks_to_ns(e, e->held[i].t);
        if (now_ns == INT64_MAX || now_ns - t > HOLD_NS) {
            event_rec r = e->held[i];
            held_remove(e, i);
            write_block(e, &r, t > e->last_ns ? t : e->last_ns);
        } else {
            i++;
        }
    }
}

/* An allocation or a free, in an order that each address's own events
 * keep. A thread's clock read is not ordered with the loads before it, so
 * a block handed to another thread and freed there at once can carry a
 * time a fraction of a microsecond before its allocation's (and likewise a
 * reuse before the free); in virtual time such events share one time. A
 * free of a block not live, or an allocation of one still live, is held
 * until the event it must follow comes, and is then written right after
 * it at that event's time; one that waited HOLD_NS in vain is written as
 * it was. */
static void block_event(um__events *e, const event_rec *r)
{
    int64_t ts_ns = ticks_to_ns(e, r->t);
    if (e->nheld)
        held_expire(e, ts_ns);
    bool live = um__addrmap_get(&e->blocks, r->a1, &(uint64_t){0});
    if ((r->kind == UM_EVENT_FREE) != live) {
        if (e->nheld == e->held_cap) {
            size_t cap = e->held_cap ? 2 * e->held_cap : 16;
            event_rec *h = realloc(e->held, cap * sizeof *h);
            if (!h) {
                write_block(e, r, ts_ns);
                return;
            }
            e->held = h;
            e->held_cap = cap;
        }
        e->held[e->nheld++] = *r;
        return;
    }
    write_block(e, r, ts_ns);
    ptrdiff_t i = held_find(e, r->a1, r->kind == UM_EVENT_ALLOC ? UM_EVENT_FREE : UM_EVENT_ALLOC);
    if (i >= 0) {
        event_rec next = e->held[i];
        held_remove(e, (size_t)i);
        block_event(e, &(event_rec){r->t > next.t ? r->t : next.t, next.a0, next.a1, next.dur,
                                    next.kind, next.dev, next.src, next.flags});
    }
}

static void write_event(um__events *e, const event_rec *r)
{
    int64_t ts_ns = ticks_to_ns(e, r->t);
    int64_t dur = (int64_t)r->dur * (r->flags & REC_DUR_MS   ? 1000000
                                     : r->flags & REC_DUR_US ? 1000
                                                             : 1);
    bool on_device = r->dev >= 0 && r->dev < e->ndevices;
    line l = {.n = 0};
    switch (r->kind) {
    case UM_EVENT_COPY: {
        char name[32];
        snprintf(name, sizeof name, "copy %d->%d", r->src, r->dev);
        span_open(&l, name, "copy", ts_ns, dur, r->dev,
                  span_lane_tid(e, r->dev, TRACK_COPY + 1 + r->src, 1000 + r->src, ts_ns, dur));
        span_arg(&l, true, "bytes", (int64_t)r->a0);
        span_arg(&l, false, "from", r->src);
        span_arg(&l, false, "to", r->dev);
        span_arg(&l, false, "staged", (int64_t)r->a1);
        span_close(e, &l);
        break;
    }
    case UM_EVENT_EVICT:
        span_open(&l, "evict", "evict", ts_ns, dur, r->dev,
                  span_lane_tid(e, r->dev, TRACK_EVICT, 1, ts_ns, dur));
        span_arg(&l, true, "bytes", (int64_t)r->a0);
        span_arg(&l, false, "written_back", (int64_t)r->a1);
        span_arg(&l, false, "to_spill_file", r->src == 1);
        span_close(e, &l);
        break;
    case UM_EVENT_RECLAIM_WAIT:
        write_span(e, r, ts_ns, dur, "alloc waits for room", "reclaim", TRACK_WAIT, 2, "bytes",
                   r->a0, "made_room", r->a1);
        break;
    case UM_EVENT_RECLAIM_RUN:
        write_span(e, r, ts_ns, dur, "reclaimer pass", "reclaim", TRACK_RECLAIMER, 3,
                   "bytes_before", r->a0, "bytes_after", r->a1);
        break;
    case UM_EVENT_TASK: {
        char name[32] = "task";
        uint64_t idx = r->a1 >> 1;
        if (idx && idx <= e->nnames)
            json_name(name, sizeof name, e->names[idx - 1]);
        write_span(e, r, ts_ns, dur, name, "task", TRACK_TASK, 4, "task", r->a0, "failed",
                   r->a1 & 1);
        break;
    }
    case UM_EVENT_BACKEND: {
        unsigned op = (unsigned)(r->a1 & 0xff);
        write_span(e, r, ts_ns, dur, op < UM_BE_OP_COUNT ? backend_op_names[op] : "backend",
                   "backend", TRACK_BACKEND, 5, "bytes", r->a0, "failed", (r->a1 >> 8) & 1);
        break;
    }
    case UM_EVENT_TRIM:
        write_span(e, r, ts_ns, dur, "trim", "trim", TRACK_BACKEND, 5, "bytes", r->a0, "device",
                   (uint64_t)r->dev);
        break;
    case UM_EVENT_ALLOC:
    case UM_EVENT_FREE:
        if (on_device)
            block_event(e, r);
        break;
    case UM_EVENT_RESERVED:
        if (!on_device)
            break;
        e->reserved[r->dev] = r->a0;
        write_counters(e, r->dev, ts_ns);
        break;
    default:
        break;
    }
}

/* Writes the spill file's runs merged by time: a binary heap of runs,
 * keyed by each run's next record. */
static void write_merged(um__events *e, const event_rec *recs)
{
    size_t n = e->nruns;
    size_t *heap = malloc((n ? n : 1) * sizeof *heap), *pos = calloc(n ? n : 1, sizeof *pos);
    if (!heap || !pos) {
        um__log(UM_LOG_WARN, "trace_file: no memory to merge the events; none written");
        free(heap);
        free(pos);
        return;
    }
#define HEAD(i) (&recs[e->runs[heap[i]].first + pos[heap[i]]])
#define LESS(i, j) (HEAD(i)->t < HEAD(j)->t || (HEAD(i)->t == HEAD(j)->t && heap[i] < heap[j]))
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!e->runs[i].n)
            continue;
        size_t k = len++;
        heap[k] = i;
        while (k && LESS(k, (k - 1) / 2)) {
            size_t p = (k - 1) / 2, t = heap[p];
            heap[p] = heap[k];
            heap[k] = t;
            k = p;
        }
    }
    while (len) {
        write_event(e, HEAD(0));
        if (++pos[heap[0]] == e->runs[heap[0]].n)
            heap[0] = heap[--len];
        for (size_t k = 0;;) {
            size_t l = 2 * k + 1, r = l + 1, m = k;
            if (l < len && LESS(l, m))
                m = l;
            if (r < len && LESS(r, m))
                m = r;
            if (m == k)
                break;
            size_t t = heap[m];
            heap[m] = heap[k];
            heap[k] = t;
            k = m;
        }
    }
#undef LESS
#undef HEAD
    held_expire(e, INT64_MAX);
    free(heap);
    free(pos);
}

/* ----------------------------------------------------------- open, close */

/* Waits for the writer to spill the buffers queued for it and end. */
static void writer_stop(um__events *e)
{
    pthread_mutex_lock(&e->lock);
    e->stop = true;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->writer, NULL);
}

static void events_free(um__events *e)
{
    while (e->spare) {
        chunk *c = e->spare;
        e->spare = c->next;
        free(c);
    }
    while (e->threads) {
        tbuf *tb = e->threads;
        e->threads = tb->next;
        free(tb->c);
        free(tb);
    }
    if (e->spill)
        fclose(e->spill);
    if (e->f)
        fclose(e->f);
    free(e->spill_path);
    free(e->runs);
    free(e->names);
    free(e->live);
    free(e->reserved);
    um__addrmap_free(&e->blocks);
    free(e->held);
    if (e->tracks)
        for (size_t i = 0; i < tracks_count(e); i++)
            free(e->tracks[i].lanes);
    free(e->tracks);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->space);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

um__events *um__events_open(const char *path, int ndevices)
{
    um__events *e = calloc(1, sizeof *e);
    if (!e) {
        um__fail(UM_ERR_NOMEM, "trace_file: no memory for the event recorder");
        return NULL;
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->space, NULL);
    e->gen = atomic_fetch_add(&g_gen, 1) + 1;
    e->ndevices = ndevices;
    e->last_ns = INT64_MIN;
    e->live = calloc((size_t)ndevices + 1, sizeof *e->live);
    e->reserved = calloc((size_t)ndevices + 1, sizeof *e->reserved);
    /* The spill file sits in the trace's directory (its size is of the
     * same order), unlinked at once so that nothing is left behind. Its
     * name is short and does not grow with the trace's: "<path>.rawXXXXXX"
     * was too long for the file system where the trace's own name was
     * near the longest legal one, and the recorder failed. */
    static const char spill_name[] = ".unimem-rawXXXXXX";
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    e->spill_path = malloc(dir_len + sizeof spill_name);
    if (!e->live || !e->reserved || !e->spill_path) {
        events_free(e);
        um__fail(UM_ERR_NOMEM, "trace_file: no memory for the event recorder");
        return NULL;
    }
    memcpy(e->spill_path, path, dir_len);
    memcpy(e->spill_path + dir_len, spill_name, sizeof spill_name);
    /* The spill file and the writer come before the trace, whose opening
     * truncates a file already at path: opened first, a recorder that then
     * failed left that file empty. The trace's opening is the last step
     * that can fail, so a failure leaves path as it was. */
    int fd = mkstemp(e->spill_path);
    if (fd >= 0) {
        unlink(e->spill_path);
        e->spill = fdopen(fd, "w+");
        if (!e->spill)
            close(fd);
    }
    /* Unbuffered: a run is counted only once fwrite has handed all of its
     * bytes to the kernel. Buffered, a short run (a thread's exit
     * hand-over) was counted while it sat in stdio's buffer, a later
     * failed flush dropped it, and close mapped past the file's end. */
    if (e->spill)
        setvbuf(e->spill, NULL, _IONBF, 0);
    if (!e->spill) {
        um__fail(UM_ERR_IO, "trace_file: cannot create the spill file '%s' for '%s' (%s)",
                 e->spill_path, path, strerror(errno));
        events_free(e);
        return NULL;
    }
    if (pthread_create(&e->writer, NULL, writer_main, e) != 0) {
        um__fail(UM_ERR_NOMEM, "trace_file: cannot start the event writer thread");
        events_free(e);
        return NULL;
    }
    e->writer_started = true;
    e->f = fopen(path, "w");
    if (!e->f) {
        um__fail(UM_ERR_IO, "trace_file: cannot open '%s' for writing (%s)", path, strerror(errno));
        writer_stop(e);
        events_free(e);
        return NULL;
    }
    /* In virtual time every event's time is the virtual clock's. */
    e->tsc = tsc_invariant() && !atomic_load(&um__vt_active);
    /* Without the TSC, ticks are the clock's ns, and the origin is the
     * clock's own reading: one of logical_clock's would stand a ns or more
     * ahead of it, and so would every time written after. */
    if (e->tsc)
        clock_pair(e, &e->t0_ticks, &e->t0_ns);
    else
        e->t0_ticks = e->t0_ns = um__now_ns();
    /* A first estimate of the tick rate, for spans' start times; close
     * fits it again over the whole run. */
    clock_fit(e, 1000000);
    um__log(UM_LOG_INFO, "trace_file: recording to '%s', event times from %s", path,
            e->tsc ? "the TSC (invariant)" : "clock_gettime (no invariant TSC)");
    pthread_mutex_lock(&g_lock);
    e->next_open = g_open;
    g_open = e;
    pthread_mutex_unlock(&g_lock);
    /* Track names: one process per device. */
    fprintf(e->f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":"
                  "\"device 0 (host)\"}}");
    for (int d = 1; d < ndevices; d++)
        fprintf(e->f,
                ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                "\"device %d\"}}",
                d, d);
    for (int d = 0; d < ndevices; d++)
        fprintf(e->f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":"
                "{\"name\":\"allocations and frees\"}}",
                d);
    return e;
}

void um__events_close(um__events *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&g_lock);
    for (um__events **pp = &g_open; *pp; pp = &(*pp)->next_open)
        if (*pp == e) {
            *pp = e->next_open;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    /* Every thread's partial buffer, then the writer drains the queue. */
    pthread_mutex_lock(&e->lock);
    for (tbuf *tb = e->threads; tb; tb = tb->next)
        if (tb->c && tb->c->n) {
            chunk_queue_locked(e, tb->c);
            tb->c = NULL;
        }
    pthread_mutex_unlock(&e->lock);
    writer_stop(e);
    clock_fit(e, 20000000);

    const event_rec *recs = NULL;
    size_t bytes = (size_t)e->spilled * sizeof(event_rec);
    struct stat sb;
    if (bytes && (fstat(fileno(e->spill), &sb) != 0 || (uint64_t)sb.st_size < bytes)) {
        /* Mapping past the file's end would fault at the first read. */
        um__log(UM_LOG_WARN,
                "trace_file: the spill file holds fewer than the %llu events "
                "written to it; no events written",
                (unsigned long long)e->spilled);
        e->dropped += e->spilled;
        bytes = 0;
    }
    if (bytes) {
        void *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fileno(e->spill), 0);
        if (m != MAP_FAILED) {
            recs = m;
        } else {
            um__log(UM_LOG_WARN, "trace_file: cannot map the spill file (%s); no events written",
                    strerror(errno));
            e->dropped += e->spilled;
        }
    }
    if (recs) {
        write_merged(e, recs);
        munmap((void *)recs, bytes);
    }
    if (e->dropped)
        um__log(UM_LOG_WARN,
                "trace_file: %llu events were dropped (no memory, or the spill "
                "file could not be written)",
                (unsigned long long)e->dropped);
    um__log(UM_LOG_INFO,
            "trace_file: %llu events spilled in %.1f ms of the writer's time "
            "(%.0f MB/s); recording threads waited %.1f ms for it, %llu times",
            (unsigned long long)e->spilled, (double)e->writer_ns / 1e6,
            e->writer_ns ? (double)bytes / ((double)e->writer_ns / 1e9) / 1e6 : 0.0,
            (double)e->stall_ns / 1e6, (unsigned long long)e->stalls);
    fprintf(e->f, "\n]}\n");
    if (fclose(e->f) != 0)
        um__log(UM_LOG_WARN, "trace_file: writing the trace failed");
    e->f = NULL;
    events_free(e);
}
